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
		for b.Loop() {
			st, err := r.Generate(context.Background(), route.Request{Prompt: prompt, MaxTokens: n}, func(int32) error { return nil })
			if err != nil {
				b.Fatal(err)
			}
			decode += st.Decode
			tokens += st.Tokens - 1
		}
		b.ReportMetric(float64(tokens)/decode.Seconds(), "decode-tok/s")
	})
	b.Run("unsplit", func(b *testing.B) {
		be, err := llamacpp.Open(llamacpp.Config{Path: model, Threads: routeThreads, MaxSeqs: 1, CtxTokens: 1024, MaxBatch: 64, Poll: routePoll()})
		if err != nil {
			b.Fatal(err)
		}
		defer be.Close()
		c, err := verify.NewChain([]backend.Backend{be}, verify.F32)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		var decode time.Duration
		tokens := 0
		for b.Loop() {
			be.SeqTrim(0, 0)
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
	})
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
