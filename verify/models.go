package verify

import (
	"maps"
	"path/filepath"
	"slices"

	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/gguf"
)

// ArchModels writes into dir the models the proof runs on besides the
// tiny llama: a small generated model of every supported architecture,
// and a q4_K_M llama (hidden 256, since k-quant blocks are 256 weights
// wide) quantized by llama.cpp's own quantizer. It returns their paths
// by name (the architecture, or "llama-q4_K_M").
func ArchModels(dir string) (map[string]string, error) {
	out := map[string]string{}
	for _, arch := range slices.Sorted(maps.Keys(gguf.SupportedArchs)) {
		p := filepath.Join(dir, arch+".gguf")
		if err := gguf.Generate(p, gguf.Presets["tiny"].ForArch(arch)); err != nil {
			return nil, err
		}
		out[arch] = p
	}
	spec := gguf.Presets["tiny"]
	spec.Hidden, spec.FFN = 256, 512
	f32 := filepath.Join(dir, "llama-256.f32.gguf")
	if err := gguf.Generate(f32, spec); err != nil {
		return nil, err
	}
	q := filepath.Join(dir, "llama-q4_K_M.gguf")
	if err := llamacpp.Quantize(f32, q, "q4_K_M"); err != nil {
		return nil, err
	}
	out["llama-q4_K_M"] = q
	return out, nil
}
