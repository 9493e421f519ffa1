package verify

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/internal/race"
)

// TestArchitectures is the proof for every supported architecture and for
// k-quant weights: 2- and 3-way splits of each generated model (prefill,
// 16 decode steps, two interleaved sessions, a rewind) are bitwise equal
// to the whole model at an f32 boundary, and to the whole model rounded
// where the route rounds at a bf16 one.
func TestArchitectures(t *testing.T) {
	race.Numeric(t)
	dir := t.TempDir()
	models, err := ArchModels(dir)
	if err != nil {
		t.Fatal(err)
	}
	for name, model := range models {
		t.Run(name, func(t *testing.T) {
			meta, err := gguf.Read(model)
			if err != nil {
				t.Fatal(err)
			}
			if want := strings.TrimSuffix(name, "-q4_K_M"); meta.Arch != want {
				t.Fatalf("architecture %q, want %q", meta.Arch, want)
			}
			if strings.HasSuffix(name, "q4_K_M") && !strings.Contains(meta.FileType, "q4_k") {
				t.Fatalf("weights %q: no q4_K tensors", meta.FileType)
			}
			splits := []int{2, 3}
			if name == "gemma3" {
				// Its local/global pattern comes from each layer's index
				// in the whole model (gemma3-shard-pattern.patch): the 2-way
				// cut falls at 9, off the pattern of 6, and 18 one-layer
				// shards hold one global layer or one local one each.
				splits = append(splits, 18)
			}
			results, err := Run(Config{Model: model, Splits: splits, WorkDir: filepath.Join(dir, name), Threads: 1})
			if err != nil {
				t.Fatal(err)
			}
			if len(results) != 2*len(splits) {
				t.Fatalf("%d results, want %d", len(results), 2*len(splits))
			}
			for _, r := range results {
				if !r.Identical || r.Rows != 2+2*16 {
					t.Errorf("%v", r)
				}
			}
		})
	}
}
