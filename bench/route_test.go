package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
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

// serveShard runs one worker for path on loopback and returns its address.
func serveShard(b *testing.B, path string) string {
	meta, err := gguf.Read(path)
	if err != nil {
		b.Fatal(err)
	}
	be, err := llamacpp.OpenMeta(llamacpp.Config{Path: path, Threads: routeThreads, MaxSeqs: 3, CtxTokens: 1024, MaxBatch: 64, Poll: routePoll()}, meta)
	if err != nil {
		b.Fatal(err)
	}
	eng := engine.New(engine.Config{}, be, meta, slog.New(slog.NewTextHandler(io.Discard, nil)))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer(eng.ServerOptions()...)
	shardv1.RegisterShardRuntimeServer(srv, eng)
	go srv.Serve(lis)
	b.Cleanup(func() { srv.Stop(); eng.Close(); be.Close() })
	return lis.Addr().String()
}

// BenchmarkRouteDecode: decode tokens/s of a greedy generation through a
// 2-shard loopback route, against the unsplit bench model decoding in one
// process with the same threads, in the same run. Each op is one generation:
// an 8-token prompt, then 32 tokens. Target: route >= 0.95x unsplit.
func BenchmarkRouteDecode(b *testing.B) {
	model := benchModel(b)
	prompt := []int32{1, 17, 42, 7, 99, 3, 250, 11}
	const n = 32
	b.Run("route-2-shards", func(b *testing.B) {
		shards, err := gguf.CachedSplit(model, 2, filepath.Join(os.TempDir(), "shardd-bench-models"))
		if err != nil {
			b.Fatal(err)
		}
		addrs := []string{serveShard(b, shards[0]), serveShard(b, shards[1])}
		r, err := route.Dial(context.Background(), addrs, route.Options{})
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		var decode time.Duration
		tokens := 0
		hops := make([]route.HopStats, len(addrs))
		for b.Loop() {
			st, err := r.Generate(context.Background(), route.Request{Prompt: prompt, MaxTokens: n}, func(int32) error { return nil })
			if err != nil {
				b.Fatal(err)
			}
			decode += st.Decode
			tokens += st.Tokens - 1
			for i, h := range st.Hops {
				hops[i].Calls += h.Calls
				hops[i].Wall += h.Wall
				hops[i].Exec += h.Exec
			}
		}
		b.ReportMetric(float64(tokens)/decode.Seconds(), "decode-tok/s")
		// Per call, prompt included: the worker's own execution time and
		// what the head waited beyond it (wire, queues, goroutine hand-offs).
		for i, h := range hops {
			b.ReportMetric(float64(h.Exec.Microseconds())/float64(h.Calls), fmt.Sprintf("hop%d-exec-us", i))
			b.ReportMetric(float64((h.Wall-h.Exec).Microseconds())/float64(h.Calls), fmt.Sprintf("hop%d-extra-us", i))
		}
	})
	b.Run("chain-2-shards", func(b *testing.B) {
		// The same two shards called one after the other in this goroutine,
		// no wire: what splitting costs inside llama.cpp alone.
		shards, err := gguf.CachedSplit(model, 2, filepath.Join(os.TempDir(), "shardd-bench-models"))
		if err != nil {
			b.Fatal(err)
		}
		var bes []backend.Backend
		for _, s := range shards {
			be, err := llamacpp.Open(llamacpp.Config{Path: s, Threads: routeThreads, MaxSeqs: 1, CtxTokens: 1024, MaxBatch: 64, Poll: routePoll()})
			if err != nil {
				b.Fatal(err)
			}
			defer be.Close()
			bes = append(bes, be)
		}
		chainDecode(b, bes, prompt, n)
	})
	b.Run("unsplit", func(b *testing.B) {
		be, err := llamacpp.Open(llamacpp.Config{Path: model, Threads: routeThreads, MaxSeqs: 1, CtxTokens: 1024, MaxBatch: 64, Poll: routePoll()})
		if err != nil {
			b.Fatal(err)
		}
		defer be.Close()
		chainDecode(b, []backend.Backend{be}, prompt, n)
	})
}

// chainDecode runs greedy generations through bes in one goroutine and
// reports decode tokens/s.
func chainDecode(b *testing.B, bes []backend.Backend, prompt []int32, n int) {
	timedBes := make([]backend.Backend, len(bes))
	timers := make([]*timedBackend, len(bes))
	for i, be := range bes {
		timers[i] = &timedBackend{Backend: be}
		timedBes[i] = timers[i]
	}
	c, err := verify.NewChain(timedBes, verify.BF16)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var decode time.Duration
	tokens := 0
	for b.Loop() {
		for _, be := range bes {
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
		for range n - 1 {
			tok := argmaxF(logits)
			if logits, err = c.Forward([]verify.Row{{Pos: pos, Token: tok, Output: true}}); err != nil {
				b.Fatal(err)
			}
			pos++
		}
		decode += time.Since(t0)
		tokens += n - 1
	}
	b.ReportMetric(float64(tokens)/decode.Seconds(), "decode-tok/s")
	for i, t := range timers {
		b.ReportMetric(float64(t.spent.Microseconds())/float64(t.calls), fmt.Sprintf("hop%d-exec-us", i))
	}
}

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

func argmaxF(v []float32) int32 {
	best := 0
	for i := range v {
		if v[i] > v[best] {
			best = i
		}
	}
	return int32(best)
}
