// Package backendtest has the test double of the compute backend that the
// engine, route and load tests share: a forward whose outputs are a
// deterministic function of its rows, that can take a fixed time, be held at
// a gate, fail, or be preempted. Tests only: the shipped daemon always runs
// llama.cpp. engine/enginetest serves routes of them.
package backendtest

import (
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/stages/dtype"
)

// Fake is the test double. Set its fields before the engine starts; Calls
// is appended to by Forward (on the engine's scheduler goroutine).
type Fake struct {
	// Shape is what Info returns.
	Shape backend.Info
	// Delay is slept at the start of every Forward, whatever the batch.
	Delay time.Duration
	// Gate, when set, makes each Forward wait for a value or a close.
	Gate chan struct{}
	// Entered, when set, receives once per Forward, before the gate.
	Entered chan struct{}
	// Err, when set, is what every Forward returns.
	Err error
	// Preempt is used by Preemptible: a held preemptible forward returns
	// ErrPreempted when a value arrives.
	Preempt chan struct{}
	// OneHot: a logits row peaks at (input + position) mod Vocab, so a
	// greedy route generates varying tokens; otherwise logit v of a row is
	// input + v + position/100.
	OneHot bool
	// Quiet: Forward records no Calls (so that it allocates nothing).
	Quiet bool
	// Calls records, per Forward, how many rows each sequence had.
	Calls []map[int]int

	pos      map[int]int // next position per sequence
	hidden   []float32
	openOnce sync.Once
}

// New returns a Fake for a shard that holds the first and/or last layer,
// small enough that the engine's limits are reached in a unit test.
func New(first, last bool) *Fake {
	return &Fake{pos: map[int]int{}, Shape: backend.Info{TokensIn: first, LogitsOut: last, Hidden: 8, Vocab: 16,
		Layers: 1, MaxSeqs: 5, CtxTokens: 256, MaxBatch: 64, Threads: 1, Name: "fake", Device: "test"}}
}

// NewDelay returns a Fake whose every forward takes d, sized for route and
// load tests (64 sessions, 64k cells), with one-hot logits.
func NewDelay(first, last bool, d time.Duration) *Fake {
	return &Fake{pos: map[int]int{}, Delay: d, OneHot: true, Shape: backend.Info{TokensIn: first, LogitsOut: last,
		Hidden: 16, Vocab: 64, Layers: 1, MaxSeqs: 64, CtxTokens: 1 << 16, MaxBatch: 512, Threads: 1,
		Name: "delay-test", Device: "test"}}
}

// Open closes the gate for good.
func (f *Fake) Open() { f.openOnce.Do(func() { close(f.Gate) }) }

func (f *Fake) Info() backend.Info { return f.Shape }
func (f *Fake) NewBatch() (backend.Batch, error) {
	return &batch{max: f.Shape.MaxBatch}, nil
}
func (f *Fake) FreeBatch(backend.Batch) {}
func (f *Fake) Close() error            { return nil }

func (f *Fake) SeqTrim(seq, from int) error {
	if f.pos[seq] > from {
		f.pos[seq] = from
	}
	return nil
}

// Forward sleeps Delay, passes the gate, checks positions and fills the
// outputs: hidden element j of a row is input + j.
func (f *Fake) Forward(bb backend.Batch, out *backend.Output) error {
	time.Sleep(f.Delay)
	if f.Entered != nil {
		f.Entered <- struct{}{}
	}
	if f.Gate != nil {
		<-f.Gate
	}
	if f.Err != nil {
		return f.Err
	}
	b := bb.(*batch)
	if !f.Quiet {
		f.record(b)
	}
	for _, r := range b.rows {
		if f.pos[r.seq] != r.pos {
			return fmt.Errorf("%w: seq %d at %d, row at %d", backend.ErrPosition, r.seq, f.pos[r.seq], r.pos)
		}
		f.pos[r.seq]++
	}
	out.Logits, f.hidden = out.Logits[:0], f.hidden[:0]
	for _, r := range b.rows {
		switch {
		case f.Shape.LogitsOut && r.out:
			out.Logits = f.logits(out.Logits, r)
		case !f.Shape.LogitsOut:
			for j := range f.Shape.Hidden {
				f.hidden = append(f.hidden, r.val+float32(j))
			}
		}
	}
	out.Hidden = f.hidden
	return nil
}

// record appends the forward's rows per sequence to Calls.
func (f *Fake) record(b *batch) {
	perSeq := map[int]int{}
	for _, r := range b.rows {
		perSeq[r.seq]++
	}
	f.Calls = append(f.Calls, perSeq)
}

func (f *Fake) logits(dst []float32, r row) []float32 {
	if f.OneHot {
		peak := (int(r.val) + r.pos) % f.Shape.Vocab
		for v := range f.Shape.Vocab {
			l := float32(0)
			if v == peak {
				l = 1
			}
			dst = append(dst, l)
		}
		return dst
	}
	for v := range f.Shape.Vocab {
		dst = append(dst, r.val+float32(v)+float32(r.pos)/100)
	}
	return dst
}

// Preemptible is a Fake whose forwards can be preempted through Preempt.
type Preemptible struct{ *Fake }

func (f Preemptible) Preempt() {
	select {
	case f.Fake.Preempt <- struct{}{}:
	default:
	}
}

func (f Preemptible) ForwardPreemptible(bb backend.Batch, out *backend.Output) error {
	select { // drop requests from before the call
	case <-f.Fake.Preempt:
	default:
	}
	if f.Entered != nil {
		f.Entered <- struct{}{}
	}
	select {
	case <-f.Gate:
	case <-f.Fake.Preempt:
		return backend.ErrPreempted
	}
	// Already through the gate: run without waiting at it again.
	g, e := f.Gate, f.Entered
	f.Gate, f.Entered = nil, nil
	defer func() { f.Gate, f.Entered = g, e }()
	return f.Fake.Forward(bb, out)
}

type row struct {
	seq, pos int
	val      float32
	out      bool
}

type batch struct {
	rows []row
	max  int
	outs int
}

func (b *batch) add(seq, pos int, v float32, out bool) error {
	if len(b.rows) >= b.max {
		return backend.ErrBatchFull
	}
	b.rows = append(b.rows, row{seq, pos, v, out})
	if out {
		b.outs++
	}
	return nil
}

func (b *batch) AddToken(seq, pos int, tok int32, out bool) error {
	return b.add(seq, pos, float32(tok), out)
}

func (b *batch) AddHiddenBF16(seq, pos int, r []byte, out bool) error {
	return b.add(seq, pos, dtype.BF16ToF32(uint16(r[0])|uint16(r[1])<<8), out)
}

func (b *batch) AddHiddenF32(seq, pos int, r []float32, out bool) error {
	return b.add(seq, pos, r[0], out)
}

func (b *batch) Len() int     { return len(b.rows) }
func (b *batch) Outputs() int { return b.outs }
func (b *batch) Reset()       { b.rows, b.outs = b.rows[:0], 0 }

// Stater is a Fake that saves and loads sequences (backend.SeqStater), so
// an engine over it keeps a prefix cache. A state is the positions held
// and how many of them are in order; OrderFrom makes a sequence's cells
// from that position on count as out of order, as a shared KV buffer lays
// them when other sessions come and go.
type Stater struct {
	*Fake
	// OrderFrom maps a sequence to the position from which its cells are
	// out of cache order (until the sequence is freed).
	OrderFrom map[int]int
	// LoadFull makes every SeqLoad find no room (ErrKVFull).
	LoadFull bool
	// Saves and Loads count the calls.
	Saves, Loads int
}

// NewStater returns a Stater over f.
func NewStater(f *Fake) *Stater { return &Stater{Fake: f, OrderFrom: map[int]int{}} }

func (f *Stater) SeqTrim(seq, from int) error {
	if from == 0 {
		delete(f.OrderFrom, seq)
	}
	return f.Fake.SeqTrim(seq, from)
}

func (f *Stater) SeqSave(dst []byte, seq int) ([]byte, error) {
	held := f.pos[seq]
	if held == 0 {
		return dst, fmt.Errorf("%w: saving an empty sequence %d", backend.ErrForward, seq)
	}
	order := held
	if from, ok := f.OrderFrom[seq]; ok {
		order = min(order, from)
	}
	f.Saves++
	dst = binary.LittleEndian.AppendUint32(dst, uint32(held))
	return binary.LittleEndian.AppendUint32(dst, uint32(order)), nil
}

func (f *Stater) SeqLoad(seq int, state []byte) error {
	if f.pos[seq] != 0 {
		return fmt.Errorf("%w: loading into sequence %d, which holds %d positions", backend.ErrInput, seq, f.pos[seq])
	}
	if len(state) != 8 {
		return fmt.Errorf("%w: a state of %d bytes", backend.ErrInput, len(state))
	}
	if f.LoadFull {
		return backend.ErrKVFull
	}
	f.Loads++
	f.pos[seq] = int(binary.LittleEndian.Uint32(state))
	if order := int(binary.LittleEndian.Uint32(state[4:])); order < f.pos[seq] {
		f.OrderFrom[seq] = order
	}
	return nil
}

func (f *Stater) SeqInOrder(state []byte) int {
	if len(state) != 8 {
		return 0
	}
	return int(binary.LittleEndian.Uint32(state[4:]))
}

// SeqNext is the position seq's next row must have.
func (f *Fake) SeqNext(seq int) int { return f.pos[seq] }

func (f *Stater) SeqCut(dst, state []byte, n int) ([]byte, error) {
	if len(state) != 8 {
		return dst, fmt.Errorf("%w: a state of %d bytes", backend.ErrInput, len(state))
	}
	held := min(int(binary.LittleEndian.Uint32(state)), n)
	order := min(int(binary.LittleEndian.Uint32(state[4:])), held)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(held))
	return binary.LittleEndian.AppendUint32(dst, uint32(order)), nil
}
