package bench

import (
	"context"
	"fmt"
	"github.com/meshnet/shardd/internal/argmax"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/engine"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/route"
	"github.com/meshnet/shardd/verify"
)

const routeThreads = 2

// routePoll is the workers' threadpool polling level
// (SHARDD_BENCH_POLL, default 0).
func routePoll() int {
	p := 0
	if v := os.Getenv("SHARDD_BENCH_POLL"); v != "" {
		fmt.Sscan(v, &p)
	}
	return p
}

// routePin is shardd serve's default (--pin-threads auto), for every set-up
// of the route and decode-under-prefill benchmarks; SHARDD_BENCH_PIN=off
// turns it off.
func routePin() bool { return os.Getenv("SHARDD_BENCH_PIN") != "off" && llamacpp.PinAuto(routeThreads) }

// serveShard runs one worker for path on loopback and returns its address.
func serveShard(b *testing.B, path string) string {
	meta, err := gguf.Read(path)
	if err != nil {
		b.Fatal(err)
	}
	be, err := llamacpp.OpenMeta(llamacpp.Config{Path: path, Threads: routeThreads, MaxSeqs: 3, CtxTokens: 1024, MaxBatch: 64, Poll: routePoll(), PinThreads: routePin()}, meta)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() }) // after the engine's cleanup below
	addr, _ := serveEngine(b, be, meta, engine.Config{})
	return addr
}

// serveEngine serves be through an engine with cfg on loopback and returns
// its address; the server and the engine stop when the benchmark ends.
func serveEngine(b *testing.B, be backend.Backend, meta gguf.Meta, cfg engine.Config) (string, *engine.Engine) {
	eng := engine.New(cfg, be, meta, slog.New(slog.NewTextHandler(io.Discard, nil)))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer(eng.ServerOptions()...)
	shardv1.RegisterShardRuntimeServer(srv, eng)
	go srv.Serve(lis)
	b.Cleanup(func() { srv.Stop(); eng.Close() })
	return lis.Addr().String(), eng
}

// BenchmarkRouteDecode: decode tokens/s of a greedy generation through a
// 2-shard loopback route (two workers in this process on loopback TCP, 2
// threads each), through the same two shards chained in this goroutine with
// no wire (what splitting costs inside llama.cpp alone), and through the
// unsplit bench model in one process with the same threads. Each op runs one
// generation (an 8-token prompt, then 32 tokens) on each of the three in
// turn, so drift on this shared machine hits all three alike; the ratios are
// reported directly. Target: route >= 0.95x unsplit.
func BenchmarkRouteDecode(b *testing.B) {
	model := benchModel(b)
	prompt := []int32{1, 17, 42, 7, 99, 3, 250, 11}
	const n = 32
	shards, err := gguf.CachedSplit(model, 2, benchShardDir(b, model))
	if err != nil {
		b.Fatal(err)
	}
	addrs := []string{serveShard(b, shards[0]), serveShard(b, shards[1])}
	r, err := route.Dial(context.Background(), addrs, route.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	chain := newTimedChain(b, shards...)
	defer chain.Close()
	whole := newTimedChain(b, model)
	defer whole.Close()

	var routeDecode time.Duration
	routeTokens := 0
	hops := make([]route.HopStats, len(addrs))
	var routeCPU, routeFaults int64
	var routeGaps []time.Duration // between consecutive decoded tokens
	for b.Loop() {
		cpu0, faults0 := processCPU(), processFaults()
		var last time.Time
		st, err := r.Generate(context.Background(), route.Request{Prompt: prompt, MaxTokens: n}, func(int32) error {
			now := time.Now()
			if !last.IsZero() {
				routeGaps = append(routeGaps, now.Sub(last))
			}
			last = now
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		routeCPU += processCPU() - cpu0
		routeFaults += processFaults() - faults0
		routeDecode += st.Decode
		routeTokens += st.Tokens - 1
		for i, h := range st.Hops {
			hops[i].Calls += h.Calls
			hops[i].Wall += h.Wall
			hops[i].Exec += h.Exec
		}
		chain.generate(b, prompt, n)
		whole.generate(b, prompt, n)
	}
	routeRate := float64(routeTokens) / routeDecode.Seconds()
	b.ReportMetric(routeRate, "route-tok/s")
	b.ReportMetric(chain.rate(), "chain-tok/s")
	b.ReportMetric(whole.rate(), "unsplit-tok/s")
	b.ReportMetric(routeRate/whole.rate(), "route/unsplit")
	b.ReportMetric(chain.rate()/whole.rate(), "chain/unsplit")
	// The same ratios from the median time per token, which a hiccup of
	// the shared host during a few tokens does not move.
	rp50, cp50, up50 := median(routeGaps), median(chain.gaps), median(whole.gaps)
	b.ReportMetric(float64(up50)/float64(rp50), "route/unsplit-p50")
	b.ReportMetric(float64(up50)/float64(cp50), "chain/unsplit-p50")
	b.ReportMetric(float64(rp50.Microseconds()), "route-p50-us")
	b.ReportMetric(float64(up50.Microseconds()), "unsplit-p50-us")
	if os.Getenv("SHARDD_BENCH_DIST") != "" {
		for _, d := range []struct {
			name string
			g    []time.Duration
		}{{"route", routeGaps}, {"chain", chain.gaps}, {"unsplit", whole.gaps}} {
			n := len(d.g)
			b.Logf("%-8s p10 %v p50 %v p90 %v p99 %v max %v", d.name, d.g[n/10], d.g[n/2], d.g[n*9/10], d.g[n*99/100], d.g[n-1])
		}
	}
	// CPU time of the whole process per generated token (prompt included),
	// all threads: what the wire and the engine add to the forward's work.
	gens := float64(b.N * n)
	b.ReportMetric(float64(routeCPU)/gens/1e3, "route-cpu-us/tok")
	// Page faults per generated token: a fresh buffer costs one per 4 KiB
	// page, so steady decoding that reuses its buffers stays near zero.
	b.ReportMetric(float64(routeFaults)/gens, "route-faults/tok")
	b.ReportMetric(float64(chain.faults)/gens, "chain-faults/tok")
	b.ReportMetric(float64(whole.faults)/gens, "unsplit-faults/tok")
	b.ReportMetric(float64(chain.cpu)/gens/1e3, "chain-cpu-us/tok")
	b.ReportMetric(float64(whole.cpu)/gens/1e3, "unsplit-cpu-us/tok")
	// Per call, prompt included: each worker's own execution time and what
	// the head waited beyond it (wire, queues, goroutine hand-offs), and the
	// chained shards' forward times for comparison.
	for i, h := range hops {
		b.ReportMetric(float64(h.Exec.Microseconds())/float64(h.Calls), fmt.Sprintf("hop%d-exec-us", i))
		b.ReportMetric(float64((h.Wall-h.Exec).Microseconds())/float64(h.Calls), fmt.Sprintf("hop%d-extra-us", i))
		t := chain.timers[i]
		b.ReportMetric(float64(t.spent.Microseconds())/float64(t.calls), fmt.Sprintf("chain%d-exec-us", i))
	}
}

// timedChain runs greedy generations through backends chained in one
// goroutine (verify.Chain, bf16 boundaries like the wire) and times them.
type timedChain struct {
	*verify.Chain
	bes    []backend.Backend
	timers []*timedBackend
	decode time.Duration
	tokens int
	cpu    int64 // process CPU time spent in generate, ns
	faults int64 // process page faults during generate
	gaps   []time.Duration
}

// median returns the middle value of d (sorting d).
func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[len(d)/2]
}

func newTimedChain(b *testing.B, paths ...string) *timedChain {
	c := &timedChain{}
	var chained []backend.Backend
	for _, p := range paths {
		be, err := llamacpp.Open(llamacpp.Config{Path: p, Threads: routeThreads, MaxSeqs: 1, CtxTokens: 1024, MaxBatch: 64, Poll: routePoll(), PinThreads: routePin()})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { be.Close() })
		t := &timedBackend{Backend: be}
		c.bes, c.timers, chained = append(c.bes, be), append(c.timers, t), append(chained, t)
	}
	var err error
	if c.Chain, err = verify.NewChain(chained, verify.BF16); err != nil {
		b.Fatal(err)
	}
	return c
}

// generate runs one greedy generation of n tokens after prompt, timing the
// tokens after the first as the route client does.
func (c *timedChain) generate(b *testing.B, prompt []int32, n int) {
	cpu0, faults0 := processCPU(), processFaults()
	defer func() { c.cpu, c.faults = c.cpu+processCPU()-cpu0, c.faults+processFaults()-faults0 }()
	for _, be := range c.bes {
		be.SeqTrim(0, 0)
	}
	rows := make([]verify.Row, len(prompt))
	for i, t := range prompt {
		rows[i] = verify.Row{Pos: i, Token: t, Output: i == len(prompt)-1}
	}
	logits, err := c.Forward(rows)
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	pos := len(prompt)
	last := t0
	for range n - 1 {
		tok := argmax.Index(logits)
		if logits, err = c.Forward([]verify.Row{{Pos: pos, Token: tok, Output: true}}); err != nil {
			b.Fatal(err)
		}
		pos++
		now := time.Now()
		c.gaps = append(c.gaps, now.Sub(last))
		last = now
	}
	c.decode += time.Since(t0)
	c.tokens += n - 1
}

func (c *timedChain) rate() float64 { return float64(c.tokens) / c.decode.Seconds() }

// timedBackend measures the time spent in Forward.
type timedBackend struct {
	backend.Backend
	spent time.Duration
	calls int
}

func (t *timedBackend) Forward(bt backend.Batch, out *backend.Output) error {
	t0 := time.Now()
	err := t.Backend.Forward(bt, out)
	t.spent += time.Since(t0)
	t.calls++
	return err
}
