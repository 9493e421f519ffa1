// Package backend defines what the engine needs from the compute that runs a
// shard's layers: load a shard, keep one sequence per session, and run one
// forward call over rows from many sessions at once.
//
// The shipped daemon always uses backend/llamacpp. Unit tests of the engine
// may use a deterministic fake that implements Backend; nothing outside
// tests may.
package backend

import (
	"errors"
)

// Sentinels a backend returns; the engine maps them to wire codes.
var (
	// ErrKVFull: no KV cells left for the batch (RESOURCE_EXHAUSTED).
	ErrKVFull = errors.New("backend: KV cache full")
	// ErrPosition: a row's position does not continue its sequence.
	ErrPosition = errors.New("backend: position does not continue the sequence")
	// ErrBatchFull: more rows than the batch holds.
	ErrBatchFull = errors.New("backend: batch full")
	// ErrInput: a row's input has the wrong kind or size for this shard.
	ErrInput = errors.New("backend: input does not fit this shard")
	// ErrForward: the forward pass failed.
	ErrForward = errors.New("backend: forward failed")
	// ErrPreempted: a preemptible forward stopped early because Preempt was
	// called. Rows of that call are not in the KV cache; positions before it
	// are untouched.
	ErrPreempted = errors.New("backend: forward preempted")
)

// Info describes the loaded shard.
type Info struct {
	// TokensIn: the shard takes token ids (it holds layer 0); otherwise it
	// takes hidden states.
	TokensIn bool
	// LogitsOut: the shard produces logits (it holds the last layer);
	// otherwise it produces hidden states.
	LogitsOut bool
	Hidden    int // n_embd
	Vocab     int // logits width (LogitsOut only)
	Layers    int // layers this shard executes
	// MaxSeqs is how many sequences (sessions) may hold state at once.
	MaxSeqs int
	// CtxTokens is the KV capacity in tokens, shared by all sequences.
	CtxTokens int
	// MaxBatch is the most rows one Forward takes.
	MaxBatch int
	Threads  int
	// Name identifies the backend and its build for the recipe digest and
	// the capability report, e.g. "llama.cpp/0c1e57098 cpu".
	Name   string
	Device string
	// Kernels are recipe lines ("key=value") that name what chooses the
	// backend's kernels and rounding: how it was compiled, for which
	// instruction set. Two backends whose lines differ may compute other
	// bits; the thread count and the CPU's model name are not among them.
	Kernels []string
}

// Batch is one forward call's input, filled row by row. Rows of one
// sequence must be added in position order.
type Batch interface {
	// AddToken adds a token-id row (TokensIn shards).
	AddToken(seq, pos int, token int32, output bool) error
	// AddHiddenBF16 adds a hidden-state row given as little-endian bf16
	// (Hidden elements), converted straight into the batch's memory.
	AddHiddenBF16(seq, pos int, row []byte, output bool) error
	// AddHiddenF32 adds a hidden-state row given as float32.
	AddHiddenF32(seq, pos int, row []float32, output bool) error
	// Len is the number of rows added.
	Len() int
	// Outputs is the number of rows flagged output (every row, on a shard
	// that produces hidden states).
	Outputs() int
	// Reset empties the batch for reuse.
	Reset()
}

// Output receives a forward call's results.
type Output struct {
	// Hidden holds Hidden float32 per batch row, in batch order
	// (hidden-producing shards): the residual stream after the shard's last
	// layer, before any tail norm. It is a view of the backend's memory,
	// valid until the next Forward; the caller converts it to the wire dtype.
	Hidden []float32
	// Logits holds Vocab float32 per output row, in batch order
	// (logit-producing shards). Forward appends after truncating to zero, so
	// the caller's storage is reused.
	Logits []float32
}

// Backend runs one shard. It is not safe for concurrent use: the engine's
// scheduler is its only caller.
type Backend interface {
	Info() Info
	// NewBatch returns an empty batch of up to MaxBatch rows. The caller
	// frees it with FreeBatch.
	NewBatch() (Batch, error)
	FreeBatch(Batch)
	// Forward runs the batch and fills out.
	Forward(b Batch, out *Output) error
	// SeqTrim removes positions >= from of seq; from 0 frees the sequence.
	SeqTrim(seq, from int) error
	// Close frees the model and context.
	Close() error
}

// Preemptible is a backend whose forward pass can be stopped part way, so a
// decode step arriving during a prefill-only iteration need not wait for it.
type Preemptible interface {
	// ForwardPreemptible is Forward that returns ErrPreempted when Preempt
	// is called while it runs (requests from before it started are dropped).
	ForwardPreemptible(b Batch, out *Output) error
	// Preempt asks the running (or next) preemptible forward to stop. It is
	// safe to call from any goroutine.
	Preempt()
}

// SeqStater is a backend that can copy a sequence's KV cells out and back
// into a sequence, as a prefix cache needs: the cells come back with the
// same bits, so a forward over them computes what it would have.
type SeqStater interface {
	// SeqSave appends the KV state of seq (every cell it holds) to dst.
	SeqSave(dst []byte, seq int) ([]byte, error)
	// SeqLoad puts a state from SeqSave into seq, which must hold no
	// cells. ErrKVFull: no room for it.
	SeqLoad(seq int, state []byte) error
	// SeqInOrder reports how many positions from 0 a state from SeqSave
	// holds in position order: the largest n such that the cells of
	// positions [0, n) are all there and lie in the cache in that order.
	// Attention sums a row's cells in cache order, and cells do not move
	// once written, so every row up to n was computed over its cells in
	// the order a sequence alone in the cache lays them: the cells and the
	// outputs of positions [0, n) are the bits a lone run computes, and
	// those past n need not be. 0 for a state it cannot read.
	SeqInOrder(state []byte) int
	// SeqCut appends to dst a state with only the cells of positions
	// [0, n) of state.
	SeqCut(dst, state []byte, n int) ([]byte, error)
}

// SeqCounter is a backend that reports the positions a sequence holds,
// for the engine's consistency checks (-tags invariants).
type SeqCounter interface {
	// SeqNext is the position seq's next row must have: its last cell's
	// position + 1, 0 when it holds none.
	SeqNext(seq int) int
}

// StreamStater is a backend that keeps each sequence on a KV stream of its
// own and reports what laying out forwards of several streams cost.
type StreamStater interface {
	// StreamStats reports the placeholder rows run between the streams
	// of a forward's rows, and the streams copied to bring a forward's
	// sequences onto consecutive streams, since the backend opened. Safe
	// to call from any goroutine.
	StreamStats() (placeholders, copies int64)
}
