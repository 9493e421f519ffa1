package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/backend/llamacpp"
)

// kernelThreads are kernel threads whose CPU time a benchmark watches: what
// the host runs beside it on the same CPUs, outside anything the process
// controls.
//
// Why: the VMs these benchmarks run on have DAMON on (kdamond, monitoring
// physical memory with a pageout scheme). Each of its samples, every
// 500 ms, walks the reverse map of thousands of pages and clears their
// accessed bits; with a model's pages mapped and in use that takes it
// 20-40 ms of CPU a sample (400 ms in a 14 s run, against 20 ms in 10 s with
// the machine idle), and a llama.cpp forward whose threads meet at spinning
// barriers stalls for as long: in a plain loop of one-row forwards with
// nothing else running, one every 530-570 ms took 35-90 ms against a p50 of
// 9 ms (PERF.md, "What sets the decode p99 on these machines"). A latency
// p99 over a few seconds of 8-15 ms steps is then set by those stalls.
type kernelThreads struct{ stats []string }

// findKernelThreads returns the kernel threads whose name starts with
// prefix (none where there are none, or /proc cannot be read).
func findKernelThreads(prefix string) kernelThreads {
	var k kernelThreads
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		comm, err := os.ReadFile(filepath.Join(d, "comm"))
		if err != nil || !strings.HasPrefix(string(comm), prefix) {
			continue
		}
		k.stats = append(k.stats, filepath.Join(d, "schedstat"))
	}
	return k
}

// ok reports whether there is anything to watch.
func (k kernelThreads) ok() bool { return len(k.stats) > 0 }

// cpu is the threads' CPU time so far (schedstat's first field: time on a
// CPU, in nanoseconds).
func (k kernelThreads) cpu() time.Duration {
	var sum time.Duration
	for _, p := range k.stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		f, _, _ := bytes.Cut(b, []byte(" "))
		n, _ := strconv.ParseInt(string(f), 10, 64)
		sum += time.Duration(n)
	}
	return sum
}

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
	kd := findKernelThreads("kdamond")
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
		k0 := kd.cpu()
		t := time.Now()
		if err := be.Forward(bt, &out); err != nil {
			b.Fatal(err)
		}
		d := time.Since(t)
		pos++
		all = append(all, d)
		if kd.cpu()-k0 >= time.Millisecond {
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
	if kd.ok() && len(quiet) > 0 {
		b.ReportMetric(float64(len(all)-len(quiet)), "kdamond-forwards")
		b.ReportMetric(float64(slowNear), "slow-kdamond")
		b.ReportMetric(percentile(quiet, 0.99), "quiet-p99-ns")
	}
}
