package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/engine"
	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/internal/argmax"
	"github.com/meshnet/shardd/route"
)

// BenchmarkRoutePipeline: issue 16's pipelining targets with no processes.
// N concurrent greedy generations (8-token prompts, 64 tokens) through:
//   - route: the bench model cut in two by time at 16 rows, attention
//     over a session's cells included (`split --by time --kv-cells 72`:
//     the bench preset at 0:8, SmolLM2 at 0:18; SHARDD_BENCH_RANGES sets
//     another cut), one worker per shard at 1 thread, behind the route
//     client;
//   - unsplit-1t, unsplit-2t: the whole model on one worker at 1 and at 2
//     threads, behind the route client;
//   - inproc-1t: the whole model at 1 thread in this process, no wire, no
//     scheduler, no head (BenchmarkDecodeCeiling's loop);
//   - inproc-pipe: the two shards in this process, each stage on a thread
//     pinned to its own CPU, the sessions in two groups so both stages
//     compute at once: the pipeline's ceiling on this machine;
//   - inproc-chain: the same in one group, so the stages take turns: what
//     the cut alone costs;
//   - inproc-groups: the whole model at 1 thread, the sessions in the same
//     two groups taking turns, a forward each per step: what the groups'
//     size alone costs. Two stages that overlap perfectly, split the work
//     evenly and do not slow each other make twice its tokens/s, so
//     inproc-pipe / inproc-groups (at most 2) is how near the pipeline
//     comes to that, and 2 x inproc-groups / inproc-1t is the most two
//     stages can give over one thread at this group size.
//
// SHARDD_BENCH_SESSIONS sets the session counts (default 16,32). Each
// worker target first serves one untimed round. Each op
// runs every target in turn, starting with a different one each
// op; reported are the medians of each target's tokens/s and of the
// per-op ratios (targets: route >= 1.6x unsplit-1t and >= 1.0x
// unsplit-2t). The workers and the head share this process on loopback
// gRPC; the workers' forwards are not pinned, and the Go side runs
// wherever the OS puts it, as it does on a machine with no CPU of its own
// for the head. Also reported: each stage's busy share (time in forwards
// over the wall time; 1.0 on both is two CPUs of forwards), for the route
// and for inproc-pipe; the route's rows per forward on each stage (near
// N/2 when the sessions move in two groups); and the CPU this process
// spent outside the route's forwards per token (head, gRPC, scheduling).
func BenchmarkRoutePipeline(b *testing.B) {
	sizes := []int{16, 32}
	if v := os.Getenv("SHARDD_BENCH_SESSIONS"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n < 2 {
				b.Fatalf("SHARDD_BENCH_SESSIONS=%q: want session counts of 2 or more, e.g. 16,32,64", v)
			}
			sizes = append(sizes, n)
		}
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) { routePipeline(b, n) })
	}
}

// busyBackend counts a served backend's forward calls, their rows and the
// time spent in them (timedBackend is the unserved one of the chains).
type busyBackend struct {
	*llamacpp.Backend
	busy        atomic.Int64 // ns
	calls, rows atomic.Int64
}

func (t *busyBackend) Forward(bt backend.Batch, out *backend.Output) error {
	defer t.count(bt, time.Now())
	return t.Backend.Forward(bt, out)
}

func (t *busyBackend) ForwardPreemptible(bt backend.Batch, out *backend.Output) error {
	defer t.count(bt, time.Now())
	return t.Backend.ForwardPreemptible(bt, out)
}

func (t *busyBackend) count(bt backend.Batch, start time.Time) {
	t.busy.Add(int64(time.Since(start)))
	t.calls.Add(1)
	t.rows.Add(int64(bt.Len()))
}

// pipelineTarget is one way to decode the sessions: through workers in this
// process (stages set), or in process with no wire (run set).
type pipelineTarget struct {
	name   string
	rt     *route.Route
	stages []*busyBackend
	run    func() (time.Duration, error)
	rates  []float64
}

// needTwoCPUs skips a benchmark that pins threads to CPUs 0 and 1 where
// this process may not run on both.
func needTwoCPUs(b *testing.B) {
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) != nil || !set.IsSet(0) || !set.IsSet(1) {
		b.Skip("pins threads to CPUs 0 and 1, and this process may not use both")
	}
}

// pinThread locks the calling goroutine to its thread and pins the thread
// to cpu. It is never unlocked: the thread ends with the goroutine.
func pinThread(cpu int) error {
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	return unix.SchedSetaffinity(0, &set)
}

// pipelineShards are model's two shards for the pipeline benchmarks: cut
// by time at a group of 16 rows on 1 thread, with attention over cells KV
// cells (`split --by time --kv-cells cells`), or at SHARDD_BENCH_RANGES
// (e.g. "0:8,8:12").
func pipelineShards(b *testing.B, model string, cells int) []string {
	var ranges []gguf.Range
	if v := os.Getenv("SHARDD_BENCH_RANGES"); v != "" {
		var err error
		if ranges, err = gguf.ParseRanges(v); err != nil {
			b.Fatal(err)
		}
	} else {
		cost, err := gguf.ReadCost(model)
		if err != nil {
			b.Fatal(err)
		}
		if cost, err = llamacpp.TimeCost(model, cost, cells, 16, 1, 9); err != nil {
			b.Fatal(err)
		}
		ranges = gguf.BalancedRanges(cost, 2)
		b.Logf("cut by time: %v", ranges)
	}
	if len(ranges) != 2 {
		b.Fatalf("the pipeline benchmarks take two ranges, not %d", len(ranges))
	}
	shards, err := gguf.CachedRanges(model, ranges, benchShardDir(b, model))
	if err != nil {
		b.Fatal(err)
	}
	return shards
}

// pipelineRatios are the per-op ratios routePipeline reports, by index in
// its targets.
var pipelineRatios = []struct {
	name     string
	num, den int
}{{"route/unsplit-1t", 0, 1}, {"route/unsplit-2t", 0, 2}, {"route/inproc-pipe", 0, 4}, {"inproc-pipe/inproc-1t", 4, 3},
	{"inproc-chain/inproc-1t", 5, 3}, {"inproc-groups/inproc-1t", 6, 3}, {"inproc-pipe/inproc-groups", 4, 6}, {"unsplit-2t/unsplit-1t", 2, 1}}

func routePipeline(b *testing.B, sessions int) {
	needTwoCPUs(b)
	const promptLen, outLen = 8, 64
	model := benchModel(b)
	shards := pipelineShards(b, model, promptLen+outLen)
	load := func(path string, threads int) (*llamacpp.Backend, gguf.Meta) {
		meta, err := gguf.Read(path)
		if err != nil {
			b.Fatal(err)
		}
		be, err := llamacpp.OpenMeta(llamacpp.Config{Path: path, Threads: threads, MaxSeqs: sessions + 1,
			CtxTokens: (sessions + 1) * (promptLen + outLen), MaxBatch: 512, PinThreads: llamacpp.PinAuto(threads)}, meta)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { be.Close() }) // after the engine's cleanup in serveEngine
		return be, meta
	}
	serve := func(name string, threads int, paths ...string) *pipelineTarget {
		t := &pipelineTarget{name: name}
		var addrs []string
		for _, p := range paths {
			be, meta := load(p, threads)
			tb := &busyBackend{Backend: be}
			addr, _ := serveEngine(b, tb, meta, benchEngineConfig(b, engine.Config{MaxSessions: sessions}))
			addrs, t.stages = append(addrs, addr), append(t.stages, tb)
		}
		var err error
		if t.rt, err = route.Dial(context.Background(), addrs, route.Options{}); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { t.rt.Close() })
		return t
	}
	prompt := sessionPrompts(promptLen)
	var busy, pipeBusy, rowsPer [2][]float64
	rt := serve("route", 1, shards...)
	one, _ := load(model, 1)
	s0, _ := load(shards[0], 1)
	s1, _ := load(shards[1], 1)
	targets := []*pipelineTarget{rt, serve("unsplit-1t", 1, model), serve("unsplit-2t", 2, model),
		{name: "inproc-1t", run: func() (time.Duration, error) {
			_, took, err := ceilingRun(one, sessions, outLen, 1, prompt, nil)
			return took, err
		}},
		{name: "inproc-pipe", run: func() (time.Duration, error) {
			took, busy, err := pipeCeilingRun([2]backend.Backend{s0, s1}, sessions, outLen, 2, prompt, [2]int{0, 1}, nil)
			for j := range busy {
				pipeBusy[j] = append(pipeBusy[j], float64(busy[j])/float64(took))
			}
			return took, err
		}},
		{name: "inproc-chain", run: func() (time.Duration, error) {
			took, _, err := pipeCeilingRun([2]backend.Backend{s0, s1}, sessions, outLen, 1, prompt, [2]int{0, 1}, nil)
			return took, err
		}},
		{name: "inproc-groups", run: func() (time.Duration, error) {
			_, took, err := ceilingRun(one, sessions, outLen, 2, prompt, nil)
			return took, err
		}},
	}
	// Workers that have served before: a fresh one has no cost model, so
	// its first burst neither gathers groups nor packs prefill beside
	// decode; one untimed round each.
	for _, t := range targets {
		if t.rt != nil {
			generateAll(b, t.rt, sessions, outLen, prompt)
		}
	}
	var otherCPU []float64
	ratios := map[string][]float64{}
	for op := 0; b.Loop(); op++ {
		for i := range targets {
			t := targets[(op+i)%len(targets)]
			var busy0, calls0, rows0 []int64
			for _, s := range t.stages {
				busy0, calls0, rows0 = append(busy0, s.busy.Load()), append(calls0, s.calls.Load()), append(rows0, s.rows.Load())
			}
			cpu0 := processCPU()
			var took time.Duration
			if t.run != nil {
				var err error
				if took, err = t.run(); err != nil {
					b.Fatal(err)
				}
			} else {
				_, took = generateAll(b, t.rt, sessions, outLen, prompt)
			}
			cpu := processCPU() - cpu0
			t.rates = append(t.rates, float64(sessions*outLen)/took.Seconds())
			if t != rt {
				continue
			}
			var fwd int64
			for j, s := range t.stages {
				d := s.busy.Load() - busy0[j]
				fwd += d
				busy[j] = append(busy[j], float64(d)/float64(took))
				rowsPer[j] = append(rowsPer[j], float64(s.rows.Load()-rows0[j])/float64(max(s.calls.Load()-calls0[j], 1)))
			}
			otherCPU = append(otherCPU, float64(cpu-fwd)/1e3/float64(sessions*outLen))
		}
		rate := func(i int) float64 { return targets[i].rates[len(targets[i].rates)-1] }
		for _, r := range pipelineRatios {
			ratios[r.name] = append(ratios[r.name], rate(r.num)/rate(r.den))
		}
	}
	for _, t := range targets {
		b.ReportMetric(medianF(t.rates), t.name+"-tok/s")
	}
	for name, r := range ratios {
		b.ReportMetric(medianF(r), name)
	}
	b.ReportMetric(medianF(busy[0]), "stage0-busy")
	b.ReportMetric(medianF(busy[1]), "stage1-busy")
	b.ReportMetric(medianF(rowsPer[0]), "stage0-rows/forward")
	b.ReportMetric(medianF(rowsPer[1]), "stage1-rows/forward")
	b.ReportMetric(medianF(pipeBusy[0]), "pipe-stage0-busy")
	b.ReportMetric(medianF(pipeBusy[1]), "pipe-stage1-busy")
	b.ReportMetric(medianF(otherCPU), "other-cpu-us/token")
}

// pipeCeilingRun decodes the sessions through two shards in this process
// with no wire, no scheduler and no head: the pipeline's ceiling. The
// sessions go round in groups (sessions/groups each); one goroutine per
// stage, its thread pinned to its CPU in cpus (as the harness pins each
// worker), runs that stage's forwards in the order the groups reach it,
// and the last stage picks each row's next token (greedy). Every prompt
// goes in its group's first forward. It returns the time taken and each
// stage's time in forwards; record, when set, is told each session's
// tokens in order (from the last stage's goroutine).
func pipeCeilingRun(stages [2]backend.Backend, sessions, outLen, groups int, prompt func(int) []int32, cpus [2]int, record func(s int, tok int32)) (took time.Duration, busy [2]time.Duration, err error) {
	for _, be := range stages {
		for s := range sessions {
			be.SeqTrim(s, 0)
		}
	}
	type handoff struct {
		g, step int
		hidden  []float32
	}
	size := (sessions + groups - 1) / groups
	members := func(g int) (int, int) { return g * size, min((g+1)*size, sessions) }
	promptLen := len(prompt(0))
	toks := make([]int32, sessions)
	next := make([]chan struct{}, groups) // group g's tokens are in toks
	for g := range next {
		next[g] = make(chan struct{}, 1)
	}
	hid := make(chan handoff, groups)
	quit := make(chan struct{})
	var once sync.Once
	var failed error
	fail := func(err error) { once.Do(func() { failed = err; close(quit) }) }
	// fill adds group g's rows at step: its prompts at step 0, then one row
	// per session; rowHidden, when set, gives each row's input.
	fill := func(bt backend.Batch, g, step int, rowHidden func(i int) []float32, lastOnly bool) error {
		lo, hi := members(g)
		i := 0
		for s := lo; s < hi; s++ {
			n, pos0 := 1, promptLen+step-1
			var p []int32
			if step == 0 {
				n, pos0, p = promptLen, 0, prompt(s)
			}
			for k := range n {
				out := !lastOnly || k == n-1
				var err error
				switch {
				case rowHidden != nil:
					err = bt.AddHiddenF32(s, pos0+k, rowHidden(i), out)
				case step == 0:
					err = bt.AddToken(s, k, p[k], out)
				default:
					err = bt.AddToken(s, pos0, toks[s], out)
				}
				if err != nil {
					return err
				}
				i++
			}
		}
		return nil
	}
	stage := func(i int, run func(bt backend.Batch, out *backend.Output) error) {
		if err := pinThread(cpus[i]); err != nil {
			fail(err)
			return
		}
		bt, err := stages[i].NewBatch()
		if err != nil {
			fail(err)
			return
		}
		defer stages[i].FreeBatch(bt)
		var out backend.Output
		if err := run(bt, &out); err != nil {
			fail(err)
		}
	}
	forward := func(i int, bt backend.Batch, out *backend.Output) error {
		t0 := time.Now()
		defer func() { busy[i] += time.Since(t0) }()
		return stages[i].Forward(bt, out)
	}
	bufs := make([][]float32, groups) // a group's hidden states, until stage 1 has read them
	start := time.Now()
	var wg sync.WaitGroup
	wg.Go(func() {
		stage(0, func(bt backend.Batch, out *backend.Output) error {
			for step := range outLen {
				for g := range groups {
					if step > 0 {
						select {
						case <-next[g]:
						case <-quit:
							return nil
						}
					}
					bt.Reset()
					if err := fill(bt, g, step, nil, false); err != nil {
						return err
					}
					if err := forward(0, bt, out); err != nil {
						return err
					}
					bufs[g] = append(bufs[g][:0], out.Hidden...)
					hid <- handoff{g, step, bufs[g]}
				}
			}
			return nil
		})
	})
	wg.Go(func() {
		stage(1, func(bt backend.Batch, out *backend.Output) error {
			hidden := stages[1].Info().Hidden
			for range outLen * groups {
				var h handoff
				select {
				case h = <-hid:
				case <-quit:
					return nil
				}
				bt.Reset()
				row := func(i int) []float32 { return h.hidden[i*hidden : (i+1)*hidden] }
				if err := fill(bt, h.g, h.step, row, true); err != nil {
					return err
				}
				if err := forward(1, bt, out); err != nil {
					return err
				}
				lo, hi := members(h.g)
				vocab := len(out.Logits) / (hi - lo)
				for s := lo; s < hi; s++ {
					toks[s] = int32(argmax.Index(out.Logits[(s-lo)*vocab : (s-lo+1)*vocab]))
					if record != nil {
						record(s, toks[s])
					}
				}
				if h.step < outLen-1 {
					next[h.g] <- struct{}{}
				}
			}
			return nil
		})
	})
	wg.Wait()
	return time.Since(start), busy, failed
}

// BenchmarkForwardBeside: what a forward costs while the other CPU works,
// the bound on what a second CPU adds to a pipeline. It times 16-row decode
// forwards of the first shard of BenchmarkRoutePipeline's split (KV held
// at 8 cells a row), on a thread pinned to CPU 0, while CPU 1 is idle
// ("alone"), spins in Go ("spin": CPU 1 busy, memory quiet), runs eight
// independent floating-point chains in Go ("fpu": CPU 1's FP units busy),
// copies a 256 MiB buffer ("stream": the memory bus busy), or loops the
// second shard's 16-row forward ("forward": a pipeline's other stage), or
// that forward with a 5 ms sleep after each ("forward-gap": the stage's
// CPU halts between forwards, as a pipeline's hops do). A case named
// "gap:X" is X with CPU 0 sleeping 5 ms after each timed forward too; its
// ratio is to "gap:alone" where that case runs. Each op times every case in
// turn (eight forwards each by default, the order rotating); reported are
// each case's median time and the median of its per-op ratio. On a machine
// whose two CPUs are two cores with bandwidth to spare, every ratio is near
// 1.
//
// SHARDD_BESIDE_CASES picks the cases (comma-separated, e.g.
// alone,forward,gap:alone,gap:forward-gap) and SHARDD_BESIDE_FORWARDS the
// forwards a case times: at 80 a case lasts some seconds, long enough for
// a host's scheduler to act on CPU 1's load, which eight forwards are not.
func BenchmarkForwardBeside(b *testing.B) {
	needTwoCPUs(b)
	const rows, past = 16, 8
	model := benchModel(b)
	shards := pipelineShards(b, model, 72)
	var bes [2]*llamacpp.Backend
	for i, p := range shards {
		var err error
		if bes[i], err = llamacpp.Open(llamacpp.Config{Path: p, Threads: 1, MaxSeqs: rows, CtxTokens: rows * (past + 8), MaxBatch: rows * past}); err != nil {
			b.Fatal(err)
		}
		defer bes[i].Close()
	}
	hidden := bes[1].Info().Hidden
	h := make([]float32, hidden)
	for i := range h {
		h[i] = float32(i%7) * 0.01
	}
	// step runs one forward of rows rows on be, each a session's next token
	// after past cells, and drops those cells again.
	step := func(be *llamacpp.Backend, bt backend.Batch, out *backend.Output, i int) error {
		bt.Reset()
		for s := range rows {
			var err error
			if be == bes[0] {
				err = bt.AddToken(s, past, int32(1+i%400), true)
			} else {
				err = bt.AddHiddenF32(s, past, h, true)
			}
			if err != nil {
				return err
			}
		}
		if err := be.Forward(bt, out); err != nil {
			return err
		}
		for s := range rows {
			be.SeqTrim(s, past)
		}
		return nil
	}
	// Fill each session's first past cells on both shards.
	for k, be := range bes {
		bt, err := be.NewBatch()
		if err != nil {
			b.Fatal(err)
		}
		for s := range rows {
			for p := range past {
				if k == 0 {
					err = bt.AddToken(s, p, int32(1+p), true)
				} else {
					err = bt.AddHiddenF32(s, p, h, true)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		}
		var out backend.Output
		if err := be.Forward(bt, &out); err != nil {
			b.Fatal(err)
		}
		be.FreeBatch(bt)
	}
	// beside runs other on CPU 1 until stop is closed, and closes finished
	// when it has stopped.
	beside := func(other string, stop <-chan struct{}, started chan<- error, finished chan<- struct{}) {
		defer close(finished)
		other = strings.TrimPrefix(other, "gap:")
		if err := pinThread(1); err != nil || other == "alone" {
			started <- err
			return
		}
		if other == "stream" {
			started <- nil
			for {
				select {
				case <-stop:
					return
				default:
				}
				copy(streamBuf[len(streamBuf)/2:], streamBuf[:len(streamBuf)/2])
			}
		}
		if other == "fpu" {
			started <- nil
			var acc [8]float64
			for {
				select {
				case <-stop:
					sink.Store(uint64(acc[0] + acc[7]))
					return
				default:
				}
				for range 1 << 14 {
					for j := range acc {
						acc[j] = acc[j]*0.999999 + 1e-9
					}
				}
			}
		}
		if other == "spin" {
			started <- nil
			x := uint64(1)
			for {
				select {
				case <-stop:
					sink.Store(x)
					return
				default:
				}
				for range 1 << 16 {
					x = x*6364136223846793005 + 1442695040888963407
				}
			}
		}
		bt, err := bes[1].NewBatch()
		started <- err
		if err != nil {
			return
		}
		defer bes[1].FreeBatch(bt)
		var out backend.Output
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if step(bes[1], bt, &out, i) != nil {
				return
			}
			if other == "forward-gap" {
				time.Sleep(besideGap)
			}
		}
	}
	streamBuf = make([]byte, 256<<20)
	known := []string{"alone", "spin", "fpu", "stream", "forward", "forward-gap"}
	cases := known[:5] // forward-gap only when asked for
	if c := os.Getenv("SHARDD_BESIDE_CASES"); c != "" {
		cases = strings.Split(c, ",")
	}
	base := map[string]string{}
	for _, c := range cases {
		if !slices.Contains(known, strings.TrimPrefix(c, "gap:")) {
			b.Fatalf("SHARDD_BESIDE_CASES: no case %q", c)
		}
		base[c] = "alone"
		if strings.HasPrefix(c, "gap:") && slices.Contains(cases, "gap:alone") {
			base[c] = "gap:alone"
		}
	}
	n := besideForwards(b) // forwards a case, after one to settle
	took, ratio := map[string][]float64{}, map[string][]float64{}
	done := make(chan error)
	go func() {
		done <- func() error {
			if err := pinThread(0); err != nil {
				return err
			}
			bt, err := bes[0].NewBatch()
			if err != nil {
				return err
			}
			defer bes[0].FreeBatch(bt)
			var out backend.Output
			for op := 0; b.Loop(); op++ {
				ms := map[string]float64{}
				for k := range cases {
					c := cases[(op+k)%len(cases)]
					stop, started, finished := make(chan struct{}), make(chan error), make(chan struct{})
					go beside(c, stop, started, finished)
					if err := <-started; err != nil {
						return err
					}
					var spent time.Duration
					for f := range n + 1 {
						t0 := time.Now()
						if err := step(bes[0], bt, &out, op+f); err != nil {
							return err
						}
						if f > 0 {
							spent += time.Since(t0)
						}
						if strings.HasPrefix(c, "gap:") {
							time.Sleep(besideGap)
						}
					}
					ms[c] = float64(spent.Microseconds()) / 1e3 / float64(n)
					close(stop)
					<-finished
				}
				for _, c := range cases {
					took[c] = append(took[c], ms[c])
					if c != base[c] && ms[base[c]] > 0 {
						ratio[c] = append(ratio[c], ms[c]/ms[base[c]])
					}
				}
			}
			return nil
		}()
	}()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	for _, c := range cases {
		b.ReportMetric(medianF(took[c]), c+"-ms")
		b.Logf("%s: %.1f ms a forward, op by op", c, took[c])
	}
	for c, r := range ratio {
		b.ReportMetric(medianF(r), c+"/"+base[c])
	}
}

// besideForwards is how many forwards BenchmarkForwardBeside times in
// each case: 8, or SHARDD_BESIDE_FORWARDS.
func besideForwards(b *testing.B) int {
	s := os.Getenv("SHARDD_BESIDE_FORWARDS")
	if s == "" {
		return 8
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		b.Fatalf("SHARDD_BESIDE_FORWARDS=%q: want a count", s)
	}
	return n
}

// besideGap is how long a "forward-gap" case's CPU 1, and a "gap:" case's
// CPU 0, sleeps after each forward: about a pipeline's idle share of a
// 16-row forward, so a vCPU halts between forwards as a pipeline's do.
const besideGap = 5 * time.Millisecond

// sink keeps the spin loop's result alive.
var sink atomic.Uint64

// streamBuf is what the stream case copies, half onto half, to load the
// memory bus from CPU 1.
var streamBuf []byte
