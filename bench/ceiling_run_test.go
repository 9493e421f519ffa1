package bench

import (
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/gguf"
)

// The in-process loops the ceiling benchmarks compare against compute the
// model, not something faster: on the tiny model, the two shards give
// every session the whole model's greedy tokens, bitwise, in one group
// and in two (a split at an f32 boundary computes what the whole model
// does, and the whole model is run in the same groups, so the batches are
// the same), one token per step.
func TestCeilingLoopsCompute(t *testing.T) {
	const sessions, promptLen, outLen = 4, 5, 12
	dir := t.TempDir()
	model := filepath.Join(dir, "tiny.gguf")
	if err := gguf.Generate(model, gguf.Presets["tiny"]); err != nil {
		t.Fatal(err)
	}
	shards, err := gguf.CachedRanges(model, []gguf.Range{{Start: 0, End: 3}, {Start: 3, End: 6}}, dir)
	if err != nil {
		t.Fatal(err)
	}
	open := func(p string) *llamacpp.Backend {
		be, err := llamacpp.Open(llamacpp.Config{Path: p, Threads: 1, MaxSeqs: sessions, CtxTokens: sessions * (promptLen + outLen), MaxBatch: 64})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Close() })
		return be
	}
	whole, s0, s1 := open(model), open(shards[0]), open(shards[1])
	prompt := sessionPrompts(promptLen)
	collect := func() ([][]int32, func(int, int32)) {
		got := make([][]int32, sessions)
		return got, func(s int, tok int32) { got[s] = append(got[s], tok) }
	}
	cpus := [2]int{0, min(1, runtime.NumCPU()-1)}
	for _, groups := range []int{1, 2} {
		want, rec := collect()
		if _, _, err := ceilingRun(whole, sessions, outLen, groups, prompt, rec); err != nil {
			t.Fatal(err)
		}
		got, rec := collect()
		if _, _, err := pipeCeilingRun([2]backend.Backend{s0, s1}, sessions, outLen, groups, prompt, cpus, rec); err != nil {
			t.Fatal(err)
		}
		for s := range sessions {
			if len(want[s]) != outLen || len(got[s]) != outLen {
				t.Fatalf("%d groups, session %d: %d tokens from the pipeline, %d from the whole model, want %d", groups, s, len(got[s]), len(want[s]), outLen)
			}
			if !slices.Equal(got[s], want[s]) {
				t.Errorf("%d groups, session %d: the shards gave %v, the whole model %v", groups, s, got[s], want[s])
			}
		}
		t.Logf("%d groups: session 0 %v", groups, got[0])
	}
}
