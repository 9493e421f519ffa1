package route

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/meshnet/shardd/gguf"
)

// TestFullWorkerRoute: 32 concurrent generations (8 prompt + 24 new
// tokens each, 1,024 KV cells in all) through a 2-shard route of `shardd
// serve` processes whose workers hold 512 cells: every generation
// completes, each greedy token the whole model's given its prefix (the
// near-tie rule of checkGreedy, as for any batched route). The heads say
// each session's length, the workers admit as many as fit and refuse the
// rest retryably, and the heads ride the refusals out.
func TestFullWorkerRoute(t *testing.T) {
	model, shards := tinyShards(t, 2)
	addrs := addrsOf(serveAll(t, shards, "--max-sessions", "64", "--ctx-tokens", "512"))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := Dial(ctx, addrs, Options{StepTimeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	const n, tokens = 32, 24
	got := make([][]int32, n)
	stats := make([]Stats, n)
	errs := make([]error, n)
	prompts := make([][]int32, n)
	var wg sync.WaitGroup
	for g := range n {
		prompts[g] = []int32{1, int32(3 + g), 17, int32(40 + g), 7, 99, int32(200 + g), 11}
		wg.Go(func() {
			stats[g], errs[g] = r.Generate(ctx, Request{Prompt: prompts[g], MaxTokens: tokens}, func(tok int32) error {
				got[g] = append(got[g], tok)
				return nil
			})
		})
	}
	wg.Wait()
	busy := 0
	for g := range n {
		if errs[g] != nil || len(got[g]) != tokens {
			t.Fatalf("generation %d: %d tokens, %v", g, len(got[g]), errs[g])
		}
		busy += stats[g].Busy
	}
	if busy == 0 {
		t.Fatal("no head was refused: the workers' cells fit every session")
	}
	round := []int{gguf.EvenRanges(6, 2)[0].End - 1}
	for g := range n {
		checkGreedy(t, model, prompts[g], got[g], round...)
	}
	t.Logf("32 generations complete; the heads rode out %d refusals", busy)
}
