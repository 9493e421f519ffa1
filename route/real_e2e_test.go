package route

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/internal/race"
	"github.com/meshnet/shardd/verify"
)

// TestRealModelRoutes drives the real checkpoints `make models` fetches
// through routes of `shardd serve` processes and compares every token with
// the whole model run in this process: SmolLM2 on two workers, Gemma 3 on
// three (cut on its 6-layer pattern), each at an f32 boundary against the
// unrounded model and at the default bf16 boundary against the model
// rounded where the route rounds. Prompts are text, tokenized with the
// route's first shard's own tokenizer.
func TestRealModelRoutes(t *testing.T) {
	race.Numeric(t)
	const n = 32
	for _, tc := range []struct {
		name   string
		shards int
		prompt string
	}{
		{"smollm2", 2, "<|im_start|>user\nWrite a haiku about rivers.<|im_end|>\n<|im_start|>assistant\n"},
		{"gemma3", 3, "The history of the printing press begins"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			model, err := verify.RealModel(tc.name)
			if err != nil {
				t.Fatal(err)
			}
			ranges, shards := splitModel(t, model, tc.shards, filepath.Join(t.TempDir(), tc.name))
			prompt := encode(t, shards[0], tc.prompt)[0]
			for _, boundary := range []string{"f32", "bf16"} {
				procs := serveAll(t, shards, "--boundary", boundary)
				got := generateTokens(t, addrsOf(procs), prompt, n)
				var round []int
				if boundary == "bf16" {
					for _, r := range ranges[:len(ranges)-1] {
						round = append(round, r.End-1)
					}
				}
				want, err := verify.Greedy(model, prompt, n, 1, round...)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("%s, %v, %s boundary: route %v, whole model (rounded after %v) %v", tc.name, ranges, boundary, got, round, want)
				}
				for _, p := range procs {
					p.stop()
				}
			}
		})
	}
}

// splitModel splits model k ways on its layer pattern into dir.
func splitModel(t *testing.T, model string, k int, dir string) ([]gguf.Range, []string) {
	t.Helper()
	meta, err := gguf.Read(model)
	if err != nil {
		t.Fatal(err)
	}
	ranges, err := meta.EvenRanges(k)
	if err != nil {
		t.Fatal(err)
	}
	shards, err := gguf.Split(model, ranges, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ranges, shards
}

// encode tokenizes texts with shard's own tokenizer.
func encode(t *testing.T, shard string, texts ...string) [][]int32 {
	t.Helper()
	tok, err := llamacpp.OpenTokenizer(shard)
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	out := make([][]int32, len(texts))
	for i, text := range texts {
		if out[i], err = tok.Encode(text); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// serveAll starts a `shardd serve` on each shard, with args.
func serveAll(t *testing.T, shards []string, args ...string) []*proc {
	t.Helper()
	var ps []*proc
	for _, s := range shards {
		ps = append(ps, serve(t, s, "127.0.0.1:0", args...))
	}
	return ps
}

func addrsOf(ps []*proc) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.addr)
	}
	return out
}

// generateTokens runs one greedy generation of n tokens through addrs.
func generateTokens(t *testing.T, addrs []string, prompt []int32, n int) []int32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := Dial(ctx, addrs, Options{StepTimeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var got []int32
	if _, err := r.Generate(ctx, Request{Prompt: prompt, MaxTokens: n}, func(tok int32) error {
		got = append(got, tok)
		return nil
	}); err != nil {
		t.Fatal(fmt.Errorf("generate through %v: %w", addrs, err))
	}
	return got
}

// TestCompactLogitsRoute: on Gemma 3's 262,144-token vocabulary, a route
// whose head asks the last hop for compact output (Options.CompactLogits)
// generates exactly the tokens it generates from whole logits rows, greedy
// and with top-k 40 / top-p 0.9 at a fixed seed, while the last hop sends
// 8 x K bytes a step instead of 1 MiB.
func TestCompactLogitsRoute(t *testing.T) {
	race.Numeric(t)
	model, err := verify.RealModel("gemma3")
	if err != nil {
		t.Fatal(err)
	}
	_, shards := splitModel(t, model, 2, t.TempDir())
	addrs := addrsOf(serveAll(t, shards))
	prompt := []int32{2, 818, 5279, 529, 7001, 563} // "<bos>The capital of France is"
	const n = 24
	run := func(compact bool, s Sampling) ([]int32, Stats) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		r, err := Dial(ctx, addrs, Options{StepTimeout: 60 * time.Second, CompactLogits: compact})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		var got []int32
		st, err := r.Generate(ctx, Request{Prompt: prompt, MaxTokens: n, Sampling: s}, func(tok int32) error {
			got = append(got, tok)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return got, st
	}
	for _, s := range []Sampling{{}, {Temperature: 0.8, TopK: 40, TopP: 0.9, Seed: 42}} {
		whole, wst := run(false, s)
		top, tst := run(true, s)
		if !slices.Equal(whole, top) {
			t.Fatalf("%+v: whole rows %v, compact %v", s, whole, top)
		}
		last := len(addrs) - 1
		wb := wst.Hops[last].OutBytes / int64(wst.Hops[last].Calls)
		tb := tst.Hops[last].OutBytes / int64(tst.Hops[last].Calls)
		if wst.Compact != 0 || tst.Compact != s.Compact() || wb != 4*262144 || tb > 8*int64(s.Compact()) {
			t.Fatalf("%+v: compact %d/%d, last hop bytes per step %d (whole rows) and %d (compact)", s, wst.Compact, tst.Compact, wb, tb)
		}
		t.Logf("%+v: %d tokens equal; last hop %d bytes a step with whole rows, %d compact", s, n, wb, tb)
	}
	// A generation that watches the logits gets whole rows.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := Dial(ctx, addrs, Options{CompactLogits: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	seen := 0
	if _, err := r.Generate(ctx, Request{Prompt: prompt, MaxTokens: 2, Logits: func(_ int, l []float32) {
		if len(l) == 262144 {
			seen++
		}
	}}, func(int32) error { return nil }); err != nil || seen != 2 {
		t.Fatalf("Logits hook with CompactLogits: %d whole rows, %v", seen, err)
	}
}

// TestCompactLogitsWholeVocabulary: top-k sampling with k past the
// vocabulary (the tiny preset's 512) asks for more than the last hop has;
// it answers with its whole vocabulary, which the head rebuilds into the
// whole row and samples as one: the same tokens as without compact output.
// (Sampling the 512 entries as a top-k list instead would differ only where
// summing the weights in another order moves a draw by an ulp, which these
// 24 tokens do not show; the rebuilt row is what makes it exact.)
func TestCompactLogitsWholeVocabulary(t *testing.T) {
	_, shards := tinyShards(t, 2)
	addrs := addrsOf(serveAll(t, shards))
	s := Sampling{Temperature: 0.9, TopK: 1000, TopP: 0.95, Seed: 5}
	var runs [2][]int32
	for i, compact := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		r, err := Dial(ctx, addrs, Options{CompactLogits: compact})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Generate(ctx, Request{Prompt: []int32{1, 17, 42}, MaxTokens: 24, Sampling: s}, func(tok int32) error {
			runs[i] = append(runs[i], tok)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		r.Close()
		cancel()
	}
	if !slices.Equal(runs[0], runs[1]) {
		t.Fatalf("whole rows %v, compact %v", runs[0], runs[1])
	}
}

// TestRealModelExact: the exact mode on the real
// checkpoints, SmolLM2 on two workers and Gemma 3 on three (whose
// sliding-window layers keep a second KV cache, which moves with the
// first): six generations at once, two pairs of them with prompts of one
// token count (their chunks can share a prefill forward), each equal its
// own solo run token for token and logit for logit.
func TestRealModelExact(t *testing.T) {
	race.Numeric(t)
	const n = 16
	texts := []string{
		"The river runs", "The forest sleeps", // pairs: cut to one token count
		"Write a haiku about rivers.", "Write a haiku about forests.",
		"Explain in one sentence why the sky is blue.", "List three prime numbers:",
	}
	for _, tc := range []struct {
		name   string
		shards int
	}{{"smollm2", 2}, {"gemma3", 3}} {
		t.Run(tc.name, func(t *testing.T) {
			model, err := verify.RealModel(tc.name)
			if err != nil {
				t.Fatal(err)
			}
			_, shards := splitModel(t, model, tc.shards, filepath.Join(t.TempDir(), tc.name))
			prompts := encode(t, shards[0], texts...)
			for i := 0; i < 4; i += 2 { // the pairs cut to one token count
				k := min(len(prompts[i]), len(prompts[i+1]))
				prompts[i], prompts[i+1] = prompts[i][:k], prompts[i+1][:k]
			}
			// 9 KV streams of 128 tokens each.
			var procs []*proc
			ports := make([]int, len(shards))
			for i, s := range shards {
				ports[i] = freePort(t)
				procs = append(procs, serve(t, s, "127.0.0.1:0", "--exact", "--max-sessions", "8", "--ctx-tokens", "1152",
					"--metrics-listen", fmt.Sprint("127.0.0.1:", ports[i])))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			r, err := Dial(ctx, addrsOf(procs), Options{StepTimeout: 60 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			together := make([][]int32, len(prompts))
			togetherBits := make([][][]uint32, len(prompts))
			var wg sync.WaitGroup
			for i := range prompts {
				wg.Go(func() { together[i], togetherBits[i] = generateBits(ctx, t, r, prompts[i], n) })
			}
			wg.Wait()
			for i, port := range ports {
				t.Logf("worker %d: %v stream copies, %v placeholder rows", i,
					metric(t, port, "shardd_streams_copies_total"), metric(t, port, "shardd_streams_placeholder_rows_total"))
			}
			for i := range prompts {
				alone, bits := generateBits(ctx, t, r, prompts[i], n)
				if !slices.Equal(together[i], alone) {
					t.Fatalf("%q: with the others %v, alone %v", texts[i], together[i], alone)
				}
				for k := range bits {
					if !slices.Equal(togetherBits[i][k], bits[k]) {
						t.Fatalf("%q, token %d: logits with the others differ from alone", texts[i], k)
					}
				}
			}
		})
	}
}
