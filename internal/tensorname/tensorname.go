// Package tensorname is the one home of the boundary tensor names a head
// and a worker exchange in a TensorBundle (engine reads and writes them,
// route writes and reads them). The optional ones are named for the
// feature that asks for them (internal/feature).
package tensorname

import "github.com/meshnet/shardd/internal/feature"

const (
	// InputIDs: a first shard's input, token ids (INT32, [rows]).
	InputIDs = "input_ids"
	// Hidden: the activations between shards (BF16 or FLOAT32, [rows,
	// hidden]).
	Hidden = "hidden_states"
	// Logits: a last shard's whole output rows (FLOAT32, [rows, vocab]).
	Logits = "logits"
	// OutputPositions: the absolute positions whose rows the last shard
	// returns (INT32); absent, the chunk's last row only.
	OutputPositions = "output_positions"
	// SessionTokens: in a prefill chunk at position 0, the length the
	// session will reach; the worker reserves that many KV tokens.
	SessionTokens = feature.SessionTokens
	// LogitsTopK asks a last shard for the best K logits of each output
	// row instead of the whole row; TopValues (FLOAT32) and TopIDs
	// (INT32), both [rows, K], are its answer.
	LogitsTopK = feature.LogitsTopK
	TopValues  = "logits_top_values"
	TopIDs     = "logits_top_ids"
)
