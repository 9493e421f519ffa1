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
	kd := hoststat.Kdamond()
	var out backend.Output
	var all, quiet []time.Duration
	var near []bool
	var sampled time.Time
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
		k0 := kd.CPU()
		t := time.Now()
		if err := be.Forward(bt, &out); err != nil {
			b.Fatal(err)
		}
		d := time.Since(t)
		pos++
		all = append(all, d)
		if kd.CPU()-k0 >= time.Millisecond {
			sampled = time.Now()
			near = append(near, true)
		} else if t.Sub(sampled) <= kdamondAftermath {
			near = append(near, true)
		} else {
			near = append(near, false)
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
