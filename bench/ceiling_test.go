package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/engine"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/internal/argmax"
	"github.com/meshnet/shardd/route"
)

// ceilingThreads is the forward threads of BenchmarkDecodeCeiling
// (SHARDD_BENCH_THREADS, default 1).
func ceilingThreads() int {
	n := 1
	if v := os.Getenv("SHARDD_BENCH_THREADS"); v != "" {
		fmt.Sscan(v, &n)
	}
	return n
}

// BenchmarkDecodeCeiling: N sessions (8-token prompts, 64 tokens each,
// greedy) through one shardd worker holding the whole bench model, and the
// same sessions computed in this process with no wire and no scheduler:
// every prompt in one forward, then one forward of N rows per step (what
// llama.cpp's batched bench does). Each op runs both in turn; the ratio of
// their tokens/s (prompt tokens not counted) is reported. The worker runs
// in this process on loopback behind the route client, so the head's
// sampling and both sides' gRPC share the machine with the forward.
// Target (issue 16): worker >= 0.85x the ceiling at 32 sessions.
func BenchmarkDecodeCeiling(b *testing.B) {
	for _, n := range []int{1, 16, 32} {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) { decodeCeiling(b, n) })
	}
}

func decodeCeiling(b *testing.B, sessions int) {
	const promptLen, outLen = 8, 64
	model := benchModel(b)
	meta, err := gguf.Read(model)
	if err != nil {
		b.Fatal(err)
	}
	cfg := llamacpp.Config{Path: model, Threads: ceilingThreads(), MaxSeqs: sessions + 1, CtxTokens: (sessions + 1) * (promptLen + outLen), MaxBatch: 512}
	direct, err := llamacpp.OpenMeta(cfg, meta)
	if err != nil {
		b.Fatal(err)
	}
	defer direct.Close()
	served, err := llamacpp.OpenMeta(cfg, meta)
	if err != nil {
		b.Fatal(err)
	}
	eng := engine.New(benchEngineConfig(b, engine.Config{MaxSessions: sessions}), served, meta, slog.New(slog.NewTextHandler(io.Discard, nil)))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer(eng.ServerOptions()...)
	shardv1.RegisterShardRuntimeServer(srv, eng)
	go srv.Serve(lis)
	defer func() { srv.Stop(); eng.Close(); served.Close() }()
	// The worker returns each row's greedy token (compact logits), as the
	// front door asks for greedy requests: the in-process side takes the
	// same argmax in its own process, and a whole row back (1 MiB a row
	// for Gemma 3's vocabulary) would measure the wire and the head's
	// argmax on the worker's CPU instead.
	rt, err := route.Dial(context.Background(), []string{lis.Addr().String()}, route.Options{CompactLogits: true})
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close()

	prompt := sessionPrompts(promptLen)
	// Both sides warm up first, as llama-batched-bench does and as a
	// long-running worker is: a generation of the same shape, 8 tokens
	// long, on prompts of its own (none of it is a prefix of the measured
	// prompts). Without it the worker's first op ran with its scheduler's
	// cost model untrusted (8 forwards), so 16 sessions decoded with no
	// prompt rows beside them while 15 prompts waited.
	warm := func(s int) []int32 { return prompt(s + 1000) }
	if _, _, err := ceilingRun(direct, sessions, 8, 1, warm, nil); err != nil {
		b.Fatal(err)
	}
	generateAll(b, rt, sessions, 8, warm)
	var inProc, worker, inProcFirst, workerFirst, inProcDecode, workerDecode []float64
	b.ReportAllocs()
	for b.Loop() {
		first, t, err := ceilingRun(direct, sessions, outLen, 1, prompt, nil)
		if err != nil {
			b.Fatal(err)
		}
		inProc = append(inProc, float64(sessions*outLen)/t.Seconds())
		inProcFirst = append(inProcFirst, float64(first.Milliseconds()))
		inProcDecode = append(inProcDecode, float64(sessions*(outLen-1))/(t-first).Seconds())

		first, took := generateAll(b, rt, sessions, outLen, prompt)
		worker = append(worker, float64(sessions*outLen)/took.Seconds())
		workerFirst = append(workerFirst, float64(first.Milliseconds()))
		workerDecode = append(workerDecode, float64(sessions*(outLen-1))/(took-first).Seconds())
	}
	mi, mw := medianF(inProc), medianF(worker)
	b.ReportMetric(mi, "inproc-tok/s")
	b.ReportMetric(mw, "worker-tok/s")
	b.ReportMetric(mw/mi, "worker/ceiling")
	// Where the gap lies: the time until every session had its first
	// token, and the rate once all of them decode, each against the same
	// in the process.
	b.ReportMetric(medianF(inProcFirst), "inproc-first-ms")
	b.ReportMetric(medianF(workerFirst), "worker-first-ms")
	b.ReportMetric(medianF(inProcDecode), "inproc-decode-tok/s")
	b.ReportMetric(medianF(workerDecode), "worker-decode-tok/s")
	b.ReportMetric(medianF(workerDecode)/medianF(inProcDecode), "decode-phase/ceiling")
}

// sessionPrompts gives each session s a prompt of n tokens of its own.
func sessionPrompts(n int) func(s int) []int32 {
	return func(s int) []int32 {
		p := make([]int32, n)
		for i := range p {
			p[i] = int32((s*31 + i*7 + 1) % 500)
		}
		return p
	}
}

// generateAll runs one greedy generation of outLen tokens per session
// through rt, all at once; it returns the time until every session had its
// first token, and the time until all ended.
func generateAll(b *testing.B, rt *route.Route, sessions, outLen int, prompt func(int) []int32) (first, took time.Duration) {
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, sessions)
	firsts := make([]time.Time, sessions)
	for s := range sessions {
		wg.Go(func() {
			_, err := rt.Generate(context.Background(), route.Request{Prompt: prompt(s), MaxTokens: outLen}, func(int32) error {
				if firsts[s].IsZero() {
					firsts[s] = time.Now()
				}
				return nil
			})
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	last := slices.MaxFunc(firsts, time.Time.Compare)
	return last.Sub(start), time.Since(start)
}

// ceilingRun prefills every session's prompt, then decodes outLen-1
// steps of one row per session, greedy, the sessions in groups of
// ceil(sessions/groups) taking turns: each step is one forward per group
// (groups 1: one forward of every session). It returns the time until
// every session had its first token, and the time taken. record, when
// set, is told each session's tokens in order.
func ceilingRun(be backend.Backend, sessions, outLen, groups int, prompt func(int) []int32, record func(s int, tok int32)) (first, took time.Duration, err error) {
	bt, err := be.NewBatch()
	if err != nil {
		return 0, 0, err
	}
	defer be.FreeBatch(bt)
	for s := range sessions {
		be.SeqTrim(s, 0)
	}
	var out backend.Output
	start := time.Now()
	toks := make([]int32, sessions)
	size := (sessions + groups - 1) / groups
	promptLen := len(prompt(0))
	for step := range outLen {
		for lo := 0; lo < sessions; lo += size {
			hi := min(lo+size, sessions)
			bt.Reset()
			for s := lo; s < hi; s++ {
				if step == 0 {
					p := prompt(s)
					for i, t := range p {
						if err := bt.AddToken(s, i, t, i == len(p)-1); err != nil {
							return 0, 0, err
						}
					}
					continue
				}
				if err := bt.AddToken(s, promptLen+step-1, toks[s], true); err != nil {
					return 0, 0, err
				}
			}
			if err := be.Forward(bt, &out); err != nil {
				return 0, 0, err
			}
			vocab := len(out.Logits) / (hi - lo)
			for s := lo; s < hi; s++ {
				toks[s] = int32(argmax.Index(out.Logits[(s-lo)*vocab : (s-lo+1)*vocab]))
				if record != nil {
					record(s, toks[s])
				}
			}
		}
		if step == 0 {
			first = time.Since(start)
		}
	}
	return first, time.Since(start), nil
}

// benchEngineConfig applies the scheduler settings a benchmark run may
// set to a worker's cfg; unset, the engine's defaults hold.
// SHARDD_BENCH_ITERATION_TOKENS, SHARDD_BENCH_DECODE_BUDGET (a duration;
// -1ms runs without the decode budget, the scheduler before issue 16),
// SHARDD_BENCH_DECODE_GROUPS and SHARDD_BENCH_PREFILL_ITERATION_TOKENS.
func benchEngineConfig(b *testing.B, cfg engine.Config) engine.Config {
	if v := os.Getenv("SHARDD_BENCH_ITERATION_TOKENS"); v != "" {
		fmt.Sscan(v, &cfg.IterationTokens)
	}
	if v := os.Getenv("SHARDD_BENCH_DECODE_BUDGET"); v != "" {
		var err error
		if cfg.DecodeBudget, err = time.ParseDuration(v); err != nil {
			b.Fatal(err)
		}
	}
	if v := os.Getenv("SHARDD_BENCH_DECODE_GROUPS"); v != "" {
		fmt.Sscan(v, &cfg.DecodeGroups)
	}
	if v := os.Getenv("SHARDD_BENCH_PREFILL_ITERATION_TOKENS"); v != "" {
		fmt.Sscan(v, &cfg.PrefillIterationTokens)
	}
	return cfg
}

func medianF(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	c := slices.Clone(v)
	slices.Sort(c)
	return c[len(c)/2]
}
