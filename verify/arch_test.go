package verify

import (
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/gguf"
)

// archModels writes a small generated model of every supported
// architecture into dir, and a q4_K_M llama (hidden 256, since k-quant
// blocks are 256 weights wide) quantized by llama.cpp's own quantizer. It
// returns their paths by name.
func archModels(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, arch := range slices.Sorted(maps.Keys(gguf.SupportedArchs)) {
		p := filepath.Join(dir, arch+".gguf")
		if err := gguf.Generate(p, gguf.Presets["tiny"].ForArch(arch)); err != nil {
			t.Fatal(err)
		}
		out[arch] = p
	}
	spec := gguf.Presets["tiny"]
	spec.Hidden, spec.FFN = 256, 512
	f32 := filepath.Join(dir, "llama-256.f32.gguf")
	if err := gguf.Generate(f32, spec); err != nil {
		t.Fatal(err)
	}
	q := filepath.Join(dir, "llama-q4_K_M.gguf")
	if err := llamacpp.Quantize(f32, q, "q4_K_M"); err != nil {
		t.Fatal(err)
	}
	out["llama-q4_K_M"] = q
	return out
}

// TestArchitectures is the proof for every supported architecture and for
// k-quant weights: 2- and 3-way splits of each generated model (prefill,
// 16 decode steps, two interleaved sessions, a rewind) are bitwise equal
// to the whole model at an f32 boundary, and to the whole model rounded
// where the route rounds at a bf16 one.
func TestArchitectures(t *testing.T) {
	dir := t.TempDir()
	for name, model := range archModels(t, dir) {
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
			results, err := Run(Config{Model: model, Splits: []int{2, 3}, WorkDir: filepath.Join(dir, name), Threads: 2})
			if err != nil {
				t.Fatal(err)
			}
			if len(results) != 4 {
				t.Fatalf("%d results, want 4", len(results))
			}
			for _, r := range results {
				if !r.Identical || r.Rows != 2+2*16 {
					t.Errorf("%v", r)
				}
			}
		})
	}
}
