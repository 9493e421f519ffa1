package bufpool

import (
	"fmt"
	"io"
	"math/bits"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

const (
	minClassShift = 9  // 512 B
	maxClassShift = 26 // 64 MiB
	numClasses    = maxClassShift - minClassShift + 1
)

// MaxPooled is the largest buffer size kept in a pool.
const MaxPooled = 1 << maxClassShift

// Pool is a size-classed free list of byte slices. The zero value is not
// usable; call New. A Pool is safe for concurrent use.
type Pool struct {
	classes [numClasses]sync.Pool

	tracking    bool
	outstanding atomic.Int64 // Gets minus Puts of pooled sizes, only when tracking

	// traced, when set (Trace), records where each outstanding buffer
	// was taken: a leak hunt, not for production load.
	traced  atomic.Bool
	traceMu sync.Mutex
	taken   map[*byte][]uintptr // first byte of the backing array -> stack at Get
}

// Option configures a Pool.
type Option func(*Pool)

// Tracking makes the pool count buffers handed out and not yet returned, so a
// test can assert that nothing leaked (Outstanding, CheckLeaks).
func Tracking() Option { return func(p *Pool) { p.tracking = true } }

// New returns an empty pool.
func New(opts ...Option) *Pool {
	p := &Pool{}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Default is the process-wide pool used by the daemon's receive and send
// paths. It counts outstanding buffers (one atomic add per Get and Put), so
// the daemon can export them as a metric and a soak can tell a leak from a
// cache.
var Default = New(Tracking())

// classOf returns the size class index for n bytes, or -1 when n is above the
// largest class.
func classOf(n int) int {
	if n <= 1<<minClassShift {
		return 0
	}
	if n > MaxPooled {
		return -1
	}
	return bits.Len(uint(n-1)) - minClassShift
}

// Get returns a slice of length n from the pool (mem.BufferPool). The caller
// owns it until it passes it, or a prefix of it, to Put.
func (p *Pool) Get(n int) *[]byte {
	c := classOf(n)
	if c < 0 {
		b := make([]byte, n)
		return &b
	}
	if p.tracking {
		p.outstanding.Add(1)
	}
	var bp *[]byte
	if v := p.classes[c].Get(); v != nil {
		bp = v.(*[]byte)
		*bp = (*bp)[:n]
	} else {
		b := make([]byte, n, 1<<(c+minClassShift))
		bp = &b
	}
	if p.traced.Load() {
		p.record(bp)
	}
	return bp
}

// Put returns a slice obtained from Get (mem.BufferPool). Slices whose
// capacity is not exactly a size class (unpooled large buffers, foreign
// slices) are dropped for the garbage collector.
func (p *Pool) Put(bp *[]byte) {
	c := cap(*bp)
	if c < 1<<minClassShift || c > MaxPooled || c&(c-1) != 0 {
		return
	}
	if p.tracking {
		p.outstanding.Add(-1)
	}
	if p.traced.Load() {
		p.forget(bp)
	}
	*bp = (*bp)[:c]
	poison(*bp)
	p.classes[bits.Len(uint(c))-1-minClassShift].Put(bp)
}

// Outstanding reports pooled buffers handed out and not returned. It is only
// counted for a pool made with Tracking.
func (p *Pool) Outstanding() int64 { return p.outstanding.Load() }

// Trace turns on recording where each buffer handed out was taken (a
// stack per buffer, under a lock: slow), so DumpOutstanding can say where
// buffers that never came back were taken. For hunting a leak.
func (p *Pool) Trace() {
	p.traceMu.Lock()
	if p.taken == nil {
		p.taken = map[*byte][]uintptr{}
	}
	p.traceMu.Unlock()
	p.traced.Store(true)
}

func (p *Pool) record(bp *[]byte) {
	pcs := make([]uintptr, 24)
	pcs = pcs[:runtime.Callers(3, pcs)]
	p.traceMu.Lock()
	p.taken[unsafe.SliceData(*bp)] = pcs
	p.traceMu.Unlock()
}

func (p *Pool) forget(bp *[]byte) {
	p.traceMu.Lock()
	delete(p.taken, unsafe.SliceData(*bp))
	p.traceMu.Unlock()
}

// DumpOutstanding writes the stack that took each buffer still out
// (buffers taken before Trace are not known), grouped by stack, and
// returns how many it knows of.
func (p *Pool) DumpOutstanding(w io.Writer) int {
	p.traceMu.Lock()
	stacks := map[string]int{}
	n := 0
	for _, pcs := range p.taken {
		var b strings.Builder
		frames := runtime.CallersFrames(pcs)
		for {
			f, more := frames.Next()
			fmt.Fprintf(&b, "    %s\n        %s:%d\n", f.Function, f.File, f.Line)
			if !more {
				break
			}
		}
		stacks[b.String()]++
		n++
	}
	p.traceMu.Unlock()
	for st, c := range stacks {
		fmt.Fprintf(w, "bufpool: %d outstanding buffer(s) taken at:\n%s", c, st)
	}
	return n
}
