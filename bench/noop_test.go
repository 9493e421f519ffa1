package bench

import (
	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/gguf"
)

// noopBackend does no compute: it isolates the cost of the hop (receive
// stages, scheduling, frame out, gRPC) from the cost of the model. It is
// used only by benchmarks.
type noopBackend struct {
	info   backend.Info
	hidden []float32
	logits []float32
}

type noopBatch struct{ n, outs, max int }

func newNoop(hidden int, logitsOut bool) *noopBackend {
	return &noopBackend{info: backend.Info{Hidden: hidden, Vocab: 32, Layers: 1, LogitsOut: logitsOut,
		MaxSeqs: 9, CtxTokens: 1 << 20, MaxBatch: 4096, Threads: 1, Name: "noop", Device: "none"}}
}

func noopMeta() gguf.Meta {
	return gguf.Meta{Arch: "llama", BlockCount: 1, Start: 1, End: 2, Total: 3, FileType: "f32",
		SourceDigest: "1111111111111111111111111111111111111111111111111111111111111111"}
}

func (n *noopBackend) Info() backend.Info               { return n.info }
func (n *noopBackend) NewBatch() (backend.Batch, error) { return &noopBatch{max: n.info.MaxBatch}, nil }
func (n *noopBackend) FreeBatch(backend.Batch)          {}
func (n *noopBackend) SeqTrim(int, int) error           { return nil }
func (n *noopBackend) Close() error                     { return nil }

func (n *noopBackend) Forward(bb backend.Batch, out *backend.Output) error {
	b := bb.(*noopBatch)
	if n.info.LogitsOut {
		need := b.outs * n.info.Vocab
		if cap(n.logits) < need {
			n.logits = make([]float32, need)
		}
		out.Logits = append(out.Logits[:0], n.logits[:need]...)
		return nil
	}
	need := b.n * n.info.Hidden
	if cap(n.hidden) < need {
		n.hidden = make([]float32, need)
	}
	out.Hidden = n.hidden[:need]
	return nil
}

func (b *noopBatch) add(out bool) error {
	if b.n >= b.max {
		return backend.ErrBatchFull
	}
	b.n++
	if out {
		b.outs++
	}
	return nil
}
func (b *noopBatch) AddToken(_, _ int, _ int32, out bool) error         { return b.add(out) }
func (b *noopBatch) AddHiddenBF16(_, _ int, _ []byte, out bool) error   { return b.add(out) }
func (b *noopBatch) AddHiddenF32(_, _ int, _ []float32, out bool) error { return b.add(out) }
func (b *noopBatch) Len() int                                           { return b.n }
func (b *noopBatch) Outputs() int                                       { return b.outs }
func (b *noopBatch) Reset()                                             { b.n, b.outs = 0, 0 }
