// Package gguf reads, writes, generates and splits the GGUF model files
// shardd serves.
//
// llama.cpp cannot load a whole model and run only some layers (a file with
// more block tensors than block_count fails to load), so every shard is its
// own GGUF: blocks [s,e) renumbered from 0, <arch>.block_count = e-s, and
// metadata under "shardd." recording the source model's SHA-256, the range
// and the total layer count, so a worker knows its Fingerprint and ShardRange
// from the file alone.
//
// The first shard keeps the token embedding (its input is token ids); the last
// keeps output_norm and the output head (its output is logits); a middle shard
// carries a one-token zero embedding and a ones output_norm, which the loader
// requires but which are never used, and no tokenizer.
package gguf

// Metadata keys written by Split.
const (
	KeySourceDigest = "shardd.source_sha256"
	KeyStartLayer   = "shardd.start_layer"
	KeyEndLayer     = "shardd.end_layer"
	KeyTotalLayers  = "shardd.total_layers"
	// KeySourceWeights: the whole model's weight types (Meta.FileType), so
	// every shard of it names the same ones, whichever tensors it holds.
	KeySourceWeights = "shardd.source_weights"
)
