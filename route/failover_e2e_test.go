package route

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshnet/shardd/internal/race"
	"github.com/meshnet/shardd/verify"
)

// failoverPrompts are the real prompts of TestFailoverRealModel, in
// SmolLM2's chat format; generation g asks prompt g mod len.
var failoverPrompts = []string{
	"What is the capital of France?", "Name three primary colors.", "Write a haiku about rivers.",
	"Explain photosynthesis in one sentence.", "How many legs does a spider have?",
	"Give me a tip for learning a new language.", "What is 12 times 12?", "Describe the moon to a child.",
}

// 32 concurrent generations of 64 tokens through a 2-hop route of SmolLM2
// with one standby per hop; hop 1's worker is killed (SIGKILL) 3 s in.
// Every generation completes. At an f32 boundary each token is the whole
// model's best given its prefix, near ties aside (checkGreedyTies); with
// --exact workers and ReplayRecovery each generation is bitwise
// its uninterrupted run.
func TestFailoverRealModel(t *testing.T) {
	race.Numeric(t)
	model, err := verify.RealModel("smollm2")
	if err != nil {
		t.Fatal(err)
	}
	_, shards := splitModel(t, model, 2, filepath.Join(t.TempDir(), "smollm2"))
	var texts []string
	for _, p := range failoverPrompts {
		texts = append(texts, "<|im_start|>user\n"+p+"<|im_end|>\n<|im_start|>assistant\n")
	}
	prompts := encode(t, shards[0], texts...)
	const gens, n = 32, 64
	for _, exact := range []bool{false, true} {
		t.Run(fmt.Sprintf("exact=%v", exact), func(t *testing.T) {
			args := []string{"--max-sessions", "40", "--ctx-tokens", "8192", "--boundary", "f32"}
			if exact {
				args = []string{"--exact", "--max-sessions", "33", "--ctx-tokens", "8704", "--boundary", "f32"}
			}
			var procs [2][2]*proc // [hop][worker, standby]
			for h := range 2 {
				for k := range 2 {
					procs[h][k] = serve(t, shards[h], "127.0.0.1:0", args...)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
			defer cancel()
			r, err := Dial(ctx, []string{procs[0][0].addr, procs[1][0].addr}, Options{StepTimeout: 30 * time.Second,
				ReplayRecovery: exact, Alternates: [][]string{{procs[0][1].addr}, {procs[1][1].addr}}})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			run := func(kill func()) ([][]int32, []Stats) {
				got, stats := make([][]int32, gens), make([]Stats, gens)
				var wg sync.WaitGroup
				for g := range gens {
					wg.Go(func() {
						var err error
						stats[g], err = r.Generate(ctx, Request{Prompt: prompts[g%len(prompts)], MaxTokens: n}, func(tok int32) error {
							got[g] = append(got[g], tok)
							return nil
						})
						if err != nil || len(got[g]) != n {
							t.Errorf("generation %d: %d of %d tokens: %v", g, len(got[g]), n, err)
						}
					})
				}
				if kill != nil {
					time.AfterFunc(3*time.Second, kill)
				}
				wg.Wait()
				return got, stats
			}
			var want [][]int32
			if exact {
				want, _ = run(nil)
			}
			got, stats := run(func() { procs[1][0].cmd.Process.Kill() })
			moved := 0
			for g := range gens {
				if len(stats[g].Failovers) > 0 {
					moved++
				}
				switch {
				case exact && !slices.Equal(got[g], want[g]):
					t.Errorf("generation %d (failovers %q): %v, uninterrupted %v", g, stats[g].Failovers, got[g], want[g])
				case !exact && len(got[g]) == n:
					// After the failover the generation computes on KV the
					// standby built in prefill batches rather than step by
					// step (other kernels for Q4_1 rows in a batch): its
					// logits moved by up to 0.705 of a 43.1 span (1.6%) in the
					// runs measured, and SmolLM2's distributions are flatter
					// than the tiny preset's (near ties come more often than
					// the 2 a tiny generation is allowed). Hence 4 times the
					// near-tie bound (3.3% of a row's span) and n/4 ties. A
					// wrong state (KV of another session, a wrong position)
					// puts tokens far below the best; the exact run below is
					// the bitwise claim.
					checkGreedyTies(t, model, prompts[g%len(prompts)], got[g], n/4, 4)
				}
			}
			if moved == 0 {
				t.Errorf("no generation failed over: the kill came after them all")
			}
			t.Logf("%d of %d generations failed over onto the standby", moved, gens)
		})
	}
}
