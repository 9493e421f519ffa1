// Package stages holds the type that flows through the receive and send
// stages of the data plane; each stage is its own package.
//
// Receive, per named tensor of an incoming chunk:
//
//	decode (vtproto, stages/decode)   frame -> message, payloads alias the gRPC buffer
//	reassemble (stages/reassemble)    fragments -> Tensor; proves exact tiling, checks
//	                                  dtype/byte order/shape/size and the byte budget
//	decompress (stages/decompress)    zstd wire body -> pooled buffer of total_bytes
//	checksum (stages/checksum)        CRC32C over the uncompressed bytes
//	dtype (stages/dtype)              bf16/f16 <-> f32 into the backend's memory
//
// The design card lists checksum before decompress. The contract checksums the
// *uncompressed* bytes, so for a compressed tensor the check can only run after
// decompression; for an uncompressed one (the usual case: bf16 activations do
// not compress) the two orders are the same thing.
//
// Send is the inverse (stages/frameout): checksum, compress when the peer
// accepts zstd and it pays, split into fragments within max_chunk_bytes.
//
// Memory: a Tensor's segments alias the received message until a stage must
// transform them. Aliased bytes are read-only. A stage that produces new bytes
// (multi-fragment zstd input, decompressed output, a contiguous copy) puts
// them in a pooled buffer the Tensor owns; Tensor.Release returns it.
package stages
