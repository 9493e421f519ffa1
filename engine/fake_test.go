package engine

import (
	"fmt"
	"sync"
	"testing"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/stages/dtype"
)

// fakeBackend is a deterministic test double for timing corner cases: a
// forward can be held at a gate, and can fail. Tests only; the daemon always
// runs llama.cpp.
type fakeBackend struct {
	info    backend.Info
	gate    chan struct{} // when set, each Forward waits for a value or close
	entered chan struct{} // receives once per Forward when set
	err     error
	pos     map[int]int // next position per sequence
	hidden  []float32
	// calls records, per Forward, how many rows each sequence had.
	calls    []map[int]int
	openOnce sync.Once
	// preempt, when set, makes the fake Preemptible: a held preemptible
	// forward returns ErrPreempted when Preempt is called.
	preempt chan struct{}
	// quiet: Forward records no calls (so that it allocates nothing).
	quiet bool
}

type preemptibleFake struct{ *fakeBackend }

func (f preemptibleFake) Preempt() {
	select {
	case f.preempt <- struct{}{}:
	default:
	}
}

func (f preemptibleFake) ForwardPreemptible(bb backend.Batch, out *backend.Output) error {
	select { // drop requests from before the call
	case <-f.preempt:
	default:
	}
	if f.entered != nil {
		f.entered <- struct{}{}
	}
	select {
	case <-f.gate:
	case <-f.preempt:
		return backend.ErrPreempted
	}
	// Already through the gate: run without waiting at it again.
	g, e := f.gate, f.entered
	f.gate, f.entered = nil, nil
	defer func() { f.gate, f.entered = g, e }()
	return f.fakeBackend.Forward(bb, out)
}

// callsSeen copies calls on the scheduler goroutine (which appends to it).
func (f *fakeBackend) callsSeen(t testing.TB, e *Engine) []map[int]int {
	var out []map[int]int
	waitFor(t, e, func() bool { out = append(out, f.calls...); return true })
	return out
}

// open closes the gate for good.
func (f *fakeBackend) open() { f.openOnce.Do(func() { close(f.gate) }) }

type fakeBatch struct {
	rows []fakeRow
	max  int
	outs int
}

type fakeRow struct {
	seq, pos int
	out      bool
	val      float32
}

func newFake(first, last bool) *fakeBackend {
	return &fakeBackend{
		info: backend.Info{TokensIn: first, LogitsOut: last, Hidden: 8, Vocab: 16, Layers: 1,
			MaxSeqs: 5, CtxTokens: 256, MaxBatch: 64, Threads: 1, Name: "fake", Device: "test"},
		pos: map[int]int{},
	}
}

// fakeMeta is metadata consistent with a fake backend.
func fakeMeta() gguf.Meta {
	return gguf.Meta{Arch: "llama", BlockCount: 1, Start: 0, End: 1, Total: 1, FileType: "f32",
		SourceDigest: "0000000000000000000000000000000000000000000000000000000000000000"}
}

func (f *fakeBackend) Info() backend.Info { return f.info }
func (f *fakeBackend) NewBatch() (backend.Batch, error) {
	return &fakeBatch{max: f.info.MaxBatch}, nil
}
func (f *fakeBackend) FreeBatch(backend.Batch) {}
func (f *fakeBackend) Close() error            { return nil }

func (f *fakeBackend) SeqTrim(seq, from int) error {
	if f.pos[seq] > from {
		f.pos[seq] = from
	}
	return nil
}

func (f *fakeBackend) Forward(bb backend.Batch, out *backend.Output) error {
	if f.entered != nil {
		f.entered <- struct{}{}
	}
	if f.gate != nil {
		<-f.gate
	}
	if f.err != nil {
		return f.err
	}
	b := bb.(*fakeBatch)
	if !f.quiet {
		perSeq := map[int]int{}
		for _, r := range b.rows {
			perSeq[r.seq]++
		}
		f.calls = append(f.calls, perSeq)
	}
	for _, r := range b.rows {
		if f.pos[r.seq] != r.pos {
			return fmt.Errorf("%w: seq %d at %d, row at %d", backend.ErrPosition, r.seq, f.pos[r.seq], r.pos)
		}
		f.pos[r.seq]++
	}
	out.Logits = out.Logits[:0]
	f.hidden = f.hidden[:0]
	for _, r := range b.rows {
		if f.info.LogitsOut {
			if r.out {
				for v := range f.info.Vocab {
					out.Logits = append(out.Logits, r.val+float32(v)+float32(r.pos)/100)
				}
			}
		} else {
			for j := range f.info.Hidden {
				f.hidden = append(f.hidden, r.val+float32(j))
			}
		}
	}
	out.Hidden = f.hidden
	return nil
}

func (b *fakeBatch) add(seq, pos int, v float32, out bool) error {
	if len(b.rows) >= b.max {
		return backend.ErrBatchFull
	}
	b.rows = append(b.rows, fakeRow{seq, pos, out, v})
	if out {
		b.outs++
	}
	return nil
}

func (b *fakeBatch) AddToken(seq, pos int, tok int32, out bool) error {
	return b.add(seq, pos, float32(tok), out)
}

func (b *fakeBatch) AddHiddenBF16(seq, pos int, row []byte, out bool) error {
	return b.add(seq, pos, dtype.BF16ToF32(uint16(row[0])|uint16(row[1])<<8), out)
}

func (b *fakeBatch) AddHiddenF32(seq, pos int, row []float32, out bool) error {
	return b.add(seq, pos, row[0], out)
}

func (b *fakeBatch) Len() int     { return len(b.rows) }
func (b *fakeBatch) Outputs() int { return b.outs }
func (b *fakeBatch) Reset()       { b.rows, b.outs = b.rows[:0], 0 }
