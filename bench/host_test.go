package bench

import (
	"testing"
	"time"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/internal/hoststat"
)

// BenchmarkForwardTail: one-row forwards of one sequence on the bench
// preset (2 threads, pinned as in DecodeUnderPrefill) in a plain loop, with
// no engine, no wire and nothing else in the process: the tail the host
// alone gives a forward. It reports the p50 and p99, the forwards that ran
// while kdamond ran or within kdamondAftermath after it (kdamond-forwards),
// the p99 of the others (quiet-p99-ns), and how many forwards took over 3x
// the p50 (slow) and how many of those were kdamond's (slow-kdamond).
func BenchmarkForwardTail(b *testing.B) {
	model := benchModel(b)
	be, err := llamacpp.Open(llamacpp.Config{Path: model, Threads: 2, MaxSeqs: 2, CtxTokens: 2048, MaxBatch: 64, PinThreads: routePin()})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	bt, err := be.NewBatch()
	if err != nil {
		b.Fatal(err)
	}
	defer be.FreeBatch(bt)
	kd := watchKdamond()
	var out backend.Output
	var all, quiet []time.Duration
	var near []bool
	pos := 0
	for b.Loop() {
		if pos == 1000 {
			be.SeqTrim(0, 0)
			pos = 0
		}
		bt.Reset()
		if err := bt.AddToken(0, pos, int32(pos%100+5), true); err != nil {
			b.Fatal(err)
		}
		k0 := kd.cpu()
		t := time.Now()
		if err := be.Forward(bt, &out); err != nil {
			b.Fatal(err)
		}
		d := time.Since(t)
		pos++
		all = append(all, d)
		n := kd.near(k0, t)
		near = append(near, n)
		if !n {
			quiet = append(quiet, d)
		}
	}
	p50 := percentile(all, 0.5)
	b.ReportMetric(p50, "p50-ns")
	b.ReportMetric(percentile(all, 0.99), "p99-ns")
	var slow, slowNear int
	for i, d := range all {
		if float64(d) > 3*p50 {
			slow++
			if near[i] {
				slowNear++
			}
		}
	}
	b.ReportMetric(float64(slow), "slow")
	if kd.Found() && len(quiet) > 0 {
		b.ReportMetric(float64(len(all)-len(quiet)), "kdamond-forwards")
		b.ReportMetric(float64(slowNear), "slow-kdamond")
		b.ReportMetric(percentile(quiet, 0.99), "quiet-p99-ns")
	}
}

// kdamondWatch tells the timed steps kdamond came near: it ran during the
// step, or ended within kdamondAftermath before the step began.
type kdamondWatch struct {
	hoststat.Threads
	sampled time.Time // when a step last saw it run
}

func watchKdamond() *kdamondWatch { return &kdamondWatch{Threads: hoststat.Kdamond()} }

// cpu is kdamond's CPU time so far: read it before a step.
func (w *kdamondWatch) cpu() time.Duration { return w.CPU() }

// near reports whether kdamond came near the step that began at t, when
// its CPU time read k0.
func (w *kdamondWatch) near(k0 time.Duration, t time.Time) bool {
	if w.CPU()-k0 >= time.Millisecond {
		w.sampled = time.Now()
		return true
	}
	return t.Sub(w.sampled) <= kdamondAftermath
}

// kdamondAftermath: forwards stay slow for a while after a kdamond sample
// ends (in BenchmarkForwardTail's loop the forward after the one it ran
// during was as slow in most samples), so a step that starts within this
// long of one counts as near it too.
const kdamondAftermath = 100 * time.Millisecond
