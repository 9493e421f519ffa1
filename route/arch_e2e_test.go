package route

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/verify"
)

// TestArchitectureRoutes: for every supported architecture, and for a
// q4_K_M llama, a 2-shard route of real `shardd serve` processes (f32
// boundary) generates the whole model's 32 greedy tokens.
func TestArchitectureRoutes(t *testing.T) {
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
			meta, err := gguf.Read(model)
			if err != nil {
				t.Fatal(err)
			}
			ranges, err := meta.EvenRanges(2)
			if err != nil {
				t.Fatal(err)
			}
			shards, err := gguf.Split(model, ranges, filepath.Join(dir, name), nil)
			if err != nil {
				t.Fatal(err)
			}
			var addrs []string
			for _, s := range shards {
				addrs = append(addrs, serve(t, s, "127.0.0.1:0", "--boundary", "f32").addr)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			r, err := Dial(ctx, addrs, Options{StepTimeout: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			var got []int32
			if _, err := r.Generate(ctx, Request{Prompt: prompt, MaxTokens: n}, func(tok int32) error {
				got = append(got, tok)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			want, err := verify.Greedy(model, prompt, n, 2)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s (%v): route %v, whole model %v", name, ranges, got, want)
			}
		})
	}
}
