package route

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnet/shardd/internal/feature"
	"github.com/meshnet/shardd/verify"
)

// TestMixedReleases: heads and workers of different releases generate
// together. A worker started with --withhold-features behaves as one of a
// release without those behaviours: it advertises none of them and refuses
// their tensors. This head reads each hop's advertisement and sends
// session_tokens and logits_top_k only where they are understood, so with
// such workers it completes generations (no reservation, whole logits rows
// instead of compact output) with the whole model's tokens. The reverse, a
// head of the last release (which sent both tensors to every hop without
// reading any advertisement) with workers of this release, is this head
// made to assume every hop understands everything.
func TestMixedReleases(t *testing.T) {
	model, shards := tinyShards(t, 2)
	prompt := []int32{11, 42, 7, 300, 19, 5, 77, 121, 64, 3}
	const n = 12
	gen := func(addrs []string, assumeAll bool) ([]int32, Stats, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		r, err := Dial(ctx, addrs, Options{StepTimeout: 30 * time.Second, CompactLogits: true})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if assumeAll {
			for _, h := range r.Hops {
				h.current.Store(&hopState{cap: h.Capability, features: feature.All})
			}
		}
		var got []int32
		st, err := r.Generate(ctx, Request{Prompt: prompt, MaxTokens: n}, func(tok int32) error {
			got = append(got, tok)
			return nil
		})
		return got, st, err
	}
	want, err := verify.Greedy(model, prompt, n, 0, 2)
	if err != nil {
		t.Fatal(err)
	}

	older := addrsOf([]*proc{
		serve(t, shards[0], "127.0.0.1:0", "--withhold-features", "session_tokens"),
		serve(t, shards[1], "127.0.0.1:0", "--withhold-features", "session_tokens,logits_top_k"),
	})
	got, st, err := gen(older, false)
	if err != nil {
		t.Fatalf("this head, workers of the last release: %v", err)
	}
	if !slices.Equal(got, want) || st.Compact != 0 {
		t.Fatalf("this head, workers of the last release: %v (compact K %d), want %v in whole rows", got, st.Compact, want)
	}
	// Without the advertisement such a worker refuses what it does not
	// know, as the last release's worker did.
	if _, _, err := gen(older, true); err == nil {
		t.Fatal("a worker withholding session_tokens and logits_top_k accepted them")
	}

	newer := addrsOf(serveAll(t, shards))
	got, st, err = gen(newer, true)
	if err != nil {
		t.Fatalf("a head of the last release, workers of this one: %v", err)
	}
	if !slices.Equal(got, want) || st.Compact != 1 {
		t.Fatalf("a head of the last release, workers of this one: %v (compact K %d), want %v compact", got, st.Compact, want)
	}
	got, st, err = gen(newer, false)
	if err != nil || !slices.Equal(got, want) || st.Compact != 1 {
		t.Fatalf("this head and workers: %v (compact K %d, %v), want %v compact", got, st.Compact, err, want)
	}
}

// TestRecoveryOntoAnotherRecipe: the middle worker of a route is
// restarted on its address with another recipe (the exact mode stands in
// for another build: same model and range, another recipe digest). The
// head, refused its old fingerprint, reads the worker's report again,
// rebuilds the session there and declares the change in the generation's
// statistics; with ReplayRecovery, whose promise is bitwise continuation,
// the generation ends with ErrRecipeChanged instead.
func TestRecoveryOntoAnotherRecipe(t *testing.T) {
	model, shards := tinyShards(t, 3)
	for _, replay := range []bool{false, true} {
		procs := serveAll(t, shards)
		addrs := addrsOf(procs)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		r, err := Dial(ctx, addrs, Options{StepTimeout: 30 * time.Second, ReplayRecovery: replay})
		if err != nil {
			t.Fatal(err)
		}
		prompt := []int32{1, 17, 42, 7, 99}
		var got []int32
		st, err := r.Generate(ctx, Request{Prompt: prompt, MaxTokens: 16}, func(tok int32) error {
			got = append(got, tok)
			if len(got) == 4 {
				procs[1].stop()
				procs[1] = serve(t, shards[1], procs[1].addr, "--exact")
			}
			return nil
		})
		r.Close()
		cancel()
		switch {
		case replay && !errors.Is(err, ErrRecipeChanged):
			t.Fatalf("with ReplayRecovery: %v, want ErrRecipeChanged", err)
		case replay:
			t.Logf("with ReplayRecovery: %v", err)
		case err != nil:
			t.Fatalf("recovery onto another recipe: %v (worker log: %s)", err, procs[1].log)
		case len(st.RecipeChanges) != 1 || !strings.Contains(st.RecipeChanges[0], "batching"):
			t.Fatalf("recipe changes %q, want one naming the batching line", st.RecipeChanges)
		default:
			t.Logf("declared: %s", st.RecipeChanges[0])
			checkGreedy(t, model, prompt, got, 1, 3)
		}
		for _, p := range procs {
			p.stop()
		}
	}
}
