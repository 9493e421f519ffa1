package route

import (
	"maps"
	"path/filepath"
	"slices"
	"testing"

	"github.com/meshnet/shardd/internal/race"
	"github.com/meshnet/shardd/verify"
)

// TestArchitectureRoutes: for every supported architecture, and for a
// q4_K_M llama, a 2-shard route of real `shardd serve` processes (f32
// boundary) generates the whole model's 32 greedy tokens.
func TestArchitectureRoutes(t *testing.T) {
	race.Numeric(t)
	dir := t.TempDir()
	models, err := verify.ArchModels(dir)
	if err != nil {
		t.Fatal(err)
	}
	prompt := []int32{1, 17, 42, 7, 99, 3}
	const n = 32
	for _, name := range slices.Sorted(maps.Keys(models)) {
		model := models[name]
		t.Run(name, func(t *testing.T) {
			ranges, shards := splitModel(t, model, 2, filepath.Join(dir, name))
			got := generateTokens(t, addrsOf(serveAll(t, shards, "--boundary", "f32")), prompt, n)
			want, err := verify.Greedy(model, prompt, n, 1)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s (%v): route %v, whole model %v", name, ranges, got, want)
			}
		})
	}
}
