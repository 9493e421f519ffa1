package llamacpp

import (
	"fmt"

	"github.com/ollama/ollama/llama"

	"github.com/meshnet/shardd/gguf"
)

// Tokenizer is a GGUF's vocabulary, loaded without weights.
type Tokenizer struct{ m *llama.Model }

// OpenTokenizer loads the vocabulary of a real GGUF (any llama.cpp
// architecture with a tokenizer).
func OpenTokenizer(path string) (*Tokenizer, error) {
	meta, err := gguf.Read(path)
	if err != nil && meta.Arch == "" {
		return nil, err
	}
	if meta.Tokenizer == "" || meta.Tokenizer == "none" {
		return nil, fmt.Errorf("llamacpp: %s carries no tokenizer; pass token ids instead", shortName(path))
	}
	initOnce.Do(func() { backendInit(false) })
	m, err := llama.LoadModelFromFile(path, llama.ModelParams{VocabOnly: true})
	if err != nil {
		return nil, fmt.Errorf("llamacpp: could not load the vocabulary of %s", shortName(path))
	}
	return &Tokenizer{m: m}, nil
}

// Encode tokenizes text, adding the model's special tokens (BOS).
func (t *Tokenizer) Encode(text string) ([]int32, error) {
	ids, err := t.m.Tokenize(text, true, true)
	if err != nil {
		return nil, err
	}
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out, nil
}

// Piece is the text of one token.
func (t *Tokenizer) Piece(id int32) string { return t.m.TokenToPiece(int(id)) }

// EndOfGeneration reports whether id ends a generation.
func (t *Tokenizer) EndOfGeneration(id int32) bool { return t.m.TokenIsEog(int(id)) }

// Close frees the vocabulary.
func (t *Tokenizer) Close() { llama.FreeModel(t.m) }
