// Package decompress turns a tensor's zstd wire body into its uncompressed
// bytes, bounded by the declared total_bytes.
//
// The output buffer is sized from total_bytes before decoding and the decoder
// may not write past it (zstd's DecodeAll capacity limit), so a decompression
// bomb or a lying header costs at most the declared size, which reassembly
// already held to the byte budget. A frame that decodes to fewer bytes, or is
// truncated, is corrupt. One zstd.Decoder with GOMAXPROCS internal decoders is
// shared: DecodeAll is safe for concurrent use and pools its state.
package decompress

import (
	"runtime"

	"github.com/klauspost/compress/zstd"

	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/wireerr"
	"github.com/meshnet/shardd/stages"
)

const corrupt = shardv1.ErrorCode_ERROR_CODE_PAYLOAD_CORRUPT

// Refusals.
var (
	ErrNotNegotiated = wireerr.New(corrupt, "decompress: compression was not negotiated for this session")
	ErrFrame         = wireerr.New(corrupt, "decompress: zstd frame is corrupt or truncated")
	ErrSize          = wireerr.New(corrupt, "decompress: zstd frame does not decode to total_bytes")
)

// Decompressor decodes zstd wire bodies. It is safe for concurrent use.
type Decompressor struct {
	dec  *zstd.Decoder
	pool *bufpool.Pool
}

// New returns a Decompressor that takes its output buffers from pool.
// maxBytes bounds any single frame's output (the tensor byte budget).
func New(pool *bufpool.Pool, maxBytes uint64) *Decompressor {
	dec, err := zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(runtime.GOMAXPROCS(0)),
		zstd.WithDecodeAllCapLimit(true),
		zstd.WithDecoderMaxMemory(max(maxBytes, 1)),
	)
	if err != nil {
		panic("decompress: static zstd options rejected: " + err.Error())
	}
	return &Decompressor{dec: dec, pool: pool}
}

// Close releases the decoder's resources.
func (d *Decompressor) Close() { d.dec.Close() }

// Into decompresses t's wire body in place: on success t's body is one
// pooled buffer of exactly TotalBytes uncompressed bytes. accepted says
// whether the session negotiated zstd. An uncompressed tensor is left as is.
// On error t still owns what it owned before.
func (d *Decompressor) Into(t *stages.Tensor, accepted bool) error {
	if t.Compression != shardv1.Compression_COMPRESSION_ZSTD {
		return nil
	}
	if !accepted {
		return ErrNotNegotiated
	}
	src := t.Contiguous(d.pool) // one copy when the frame arrived in several fragments
	var hdr zstd.Header
	if err := hdr.Decode(src); err != nil {
		return wireerr.Wrap(ErrFrame, err)
	}
	if hdr.HasFCS && hdr.FrameContentSize != t.TotalBytes {
		return wireerr.Errorf(ErrSize, "frame declares %d bytes, total_bytes is %d", hdr.FrameContentSize, t.TotalBytes)
	}
	n := int(t.TotalBytes)
	out := d.pool.Alloc(n)
	dst := out.Bytes()[:0:n]
	got, err := d.dec.DecodeAll(src, dst)
	if err != nil {
		out.Release()
		return wireerr.Wrap(ErrFrame, err)
	}
	if len(got) != n || (n > 0 && &got[0] != &out.Bytes()[0]) {
		out.Release()
		return wireerr.Errorf(ErrSize, "decoded %d bytes, total_bytes is %d", len(got), n)
	}
	t.SetBody(got, out)
	return nil
}
