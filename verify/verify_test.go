package verify

import (
	"path/filepath"
	"testing"

	"github.com/meshnet/shardd/gguf"
)

// TestSplitMatchesWholeModel is the proof on the tiny preset: 2- and 3-way
// splits against the unsplit model, prefill then 16 decode steps, two
// interleaved sessions, one mid-sequence rewind.
func TestSplitMatchesWholeModel(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "tiny.gguf")
	if err := gguf.Generate(model, gguf.Presets["tiny"]); err != nil {
		t.Fatal(err)
	}
	results, err := Run(Config{Model: model, Splits: []int{2, 3}, WorkDir: dir, Threads: 2, Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 4 {
		t.Fatalf("%d results, want 4", len(results))
	}
	for _, r := range results {
		if r.Rows != 2+2*16 {
			t.Errorf("%v: compared %d rows", r, r.Rows)
		}
		switch r.Boundary {
		case F32:
			// The layer-range execution itself must be exact.
			if !r.Identical {
				t.Errorf("f32 boundary must be bitwise identical: %v", r)
			}
		case BF16:
			// bf16 rounds the residual stream at each hop (8 mantissa bits):
			// small differences, the same greedy tokens.
			if r.MaxDiff > 0.05 || r.ArgmaxAgree != r.Rows {
				t.Errorf("bf16 boundary drifted: %v", r)
			}
		}
	}
}
