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
//
// Adding an architecture. Read its graph builder in llama.cpp
// (src/models/<arch>.cpp in llama.cpp, scripts/llama-lib.sh's tree) for three
// things: the residual after each block must be tagged l_out (the capture
// point); nothing but that residual and each layer's own KV may cross from
// one layer to the next (no per-model state such as Gemma 3n's AltUp
// streams); and an injected embd input must enter layer 0 as it is (check
// what the builder does to inpL when ubatch.token is null: Gemma 2 scales
// it, which a shard cannot undo bit for bit). Hyperparameters set from the
// layer index (set_swa_pattern, n_layer_dense_lead, ...) decide where a
// shard may start (Meta.Align). Then add the name to SupportedArchs and its
// tensors to Generate, and run `shardd verify` on a generated model:
// verify/arch_test.go and route/arch_e2e_test.go pick it up.
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
