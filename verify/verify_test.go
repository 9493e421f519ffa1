package verify

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/meshnet/shardd/gguf"
)

func tinyModel(t *testing.T, dir string, seed uint64) string {
	t.Helper()
	spec := gguf.Presets["tiny"]
	spec.Seed = seed
	model := filepath.Join(dir, fmt.Sprintf("tiny-%d.gguf", seed))
	if err := gguf.Generate(model, spec); err != nil {
		t.Fatal(err)
	}
	return model
}

// TestSplitMatchesWholeModel is the proof on the tiny preset: 2- and 3-way
// splits against the unsplit model, prefill then 16 decode steps, two
// interleaved sessions, one mid-sequence rewind; bitwise at an f32
// boundary against the whole model, and at a bf16 boundary against the
// whole model rounded to bf16 after the same layers. Seeds 3 and 7 are ones
// where the bf16 rounding flips a greedy token against the unrounded model,
// which a comparison with that model called a mismatch.
func TestSplitMatchesWholeModel(t *testing.T) {
	for _, seed := range []uint64{1, 3, 7} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			dir := t.TempDir()
			results, err := Run(Config{Model: tinyModel(t, dir, seed), Splits: []int{2, 3}, WorkDir: dir, Threads: 1, Log: t.Logf})
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
				if !r.Identical || r.FirstDiff != -1 {
					t.Errorf("not bitwise equal to its reference: %v", r)
				}
				if r.Boundary == BF16 {
					// The rounding happened (the reference is not the
					// unrounded model) and moved logits a little.
					if u := r.Unrounded; u.MaxDiff == 0 || u.MaxDiff > 0.05 || u.Flips+u.ArgmaxAgree != r.Rows {
						t.Errorf("bf16 against the unrounded model: %+v", u)
					}
					if len(r.RoundedAfter) != r.Shards-1 {
						t.Errorf("rounded after %v for %d shards", r.RoundedAfter, r.Shards)
					}
				}
			}
		})
	}
}

// One boundary value one bf16 ulp off is seen, and the row named.
func TestOneULPIsSeen(t *testing.T) {
	dir := t.TempDir()
	model := tinyModel(t, dir, 1)
	crossed := 0
	Corrupt = func(hidden []byte) {
		crossed++
		if crossed == 5 { // the fifth row to cross a boundary
			hidden[0] ^= 1 // the lowest mantissa bit of its first value
		}
	}
	defer func() { Corrupt = nil }()
	results, err := Run(Config{Model: model, Splits: []int{2}, WorkDir: dir, Threads: 1, Boundaries: []Boundary{BF16}})
	if err != nil {
		t.Fatal(err)
	}
	r := results[0]
	if r.Identical || r.FirstDiff < 0 || r.MaxDiff == 0 {
		t.Fatalf("a one-ulp change was not seen: %v", r)
	}
	t.Log(r)
}
