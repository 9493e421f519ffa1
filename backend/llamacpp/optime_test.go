package llamacpp

import (
	"path/filepath"
	"testing"

	"github.com/meshnet/shardd/gguf"
)

// TimeCost times every part of a model with its own weights: layers of
// the same matrices weigh the same, the head weighs what its matrix
// takes (the tied embedding where there is no output.weight, a 3-D
// expert tensor as all its experts), and a head of 28 times a layer's
// multiply-adds takes several times a layer's time.
func TestTimeCost(t *testing.T) {
	wide := gguf.Presets["tiny"]
	wide.Vocab *= 64 // head 4.2M multiply-adds a row, a layer 0.15M
	dir := t.TempDir()
	models := map[string]gguf.Spec{
		"tiny": gguf.Presets["tiny"], "wide": wide,
		"gemma3": gguf.Presets["tiny"].ForArch("gemma3"), "qwen3moe": gguf.Presets["tiny"].ForArch("qwen3moe"),
	}
	for name, spec := range models {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, name+".gguf")
			if err := gguf.Generate(path, spec); err != nil {
				t.Fatal(err)
			}
			c, err := gguf.ReadCost(path)
			if err != nil {
				t.Fatal(err)
			}
			for _, cells := range []int{0, 72} {
				tc, err := TimeCost(path, c, cells, 16, 1, 5)
				if err != nil {
					t.Fatal(err)
				}
				if len(tc.Layers) != spec.Layers || tc.Head <= 0 || tc.Align != c.Align || tc.PerCell != nil {
					t.Fatalf("cells %d: %d layers (want %d), head %d, align %d (want %d), per cell %v",
						cells, len(tc.Layers), spec.Layers, tc.Head, tc.Align, c.Align, tc.PerCell)
				}
				for i, l := range tc.Layers {
					if l <= 0 || l != tc.Layers[0] {
						t.Errorf("cells %d: layer %d weighs %d ps, layer 0 %d (the same matrices)", cells, i, l, tc.Layers[0])
					}
				}
				if name == "wide" && tc.Head < 4*tc.Layers[0] {
					t.Errorf("cells %d: the head of 28 layers' multiply-adds weighs %d ps, a layer %d", cells, tc.Head, tc.Layers[0])
				}
			}
		})
	}
	// A shard before the last weighs its layers and no head (its token
	// embedding is none); the last shard weighs its head.
	shards, err := gguf.Split(filepath.Join(dir, "wide.gguf"), gguf.EvenRanges(wide.Layers, 2), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, sh := range shards {
		c, err := gguf.ReadCost(sh)
		if err != nil {
			t.Fatal(err)
		}
		tc, err := TimeCost(sh, c, 0, 16, 1, 3)
		if err != nil {
			t.Fatal(err)
		}
		if first := i == 0; len(tc.Layers) != wide.Layers/2 || (tc.Head == 0) != first {
			t.Errorf("shard %d: %d layers, head %d ps", i, len(tc.Layers), tc.Head)
		}
	}
	if _, err := TimeCost(filepath.Join(dir, "missing.gguf"), gguf.Cost{Layers: make([]int64, 6)}, 0, 16, 1, 1); err == nil {
		t.Error("a missing file timed without error")
	}
}
