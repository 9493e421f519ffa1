package verify

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/internal/race"
)

// TestRealModels is the proof on checkpoints people run (fetched by `make
// models`): SmolLM2 (a llama with a tied head, Q4_1) and Gemma 3 (Q4_K_M,
// a 262,144-token vocabulary, cut on its 6-layer pattern), each split 2
// and 3 ways, bitwise equal to the whole model at an f32 boundary and to
// the rounded reference at bf16.
func TestRealModels(t *testing.T) {
	race.Numeric(t)
	for _, tc := range []struct {
		name  string
		arch  string
		vocab int
	}{{"smollm2", "llama", 49152}, {"gemma3", "gemma3", 262144}} {
		t.Run(tc.name, func(t *testing.T) {
			model, err := RealModel(tc.name)
			if err != nil {
				t.Fatal(err)
			}
			meta, err := gguf.Read(model)
			if err != nil {
				t.Fatal(err)
			}
			if meta.Arch != tc.arch || meta.VocabSize != tc.vocab {
				t.Fatalf("%s: arch %q vocab %d, want %q %d", tc.name, meta.Arch, meta.VocabSize, tc.arch, tc.vocab)
			}
			results, err := Run(Config{Model: model, Splits: []int{2, 3}, WorkDir: filepath.Join(t.TempDir(), tc.name), Threads: 1})
			if err != nil {
				t.Fatal(err)
			}
			if len(results) != 4 {
				t.Fatalf("%d results, want 4", len(results))
			}
			for _, r := range results {
				t.Log(r)
				if !r.Identical || r.Rows != 2+2*16 {
					t.Errorf("%v", r)
				}
			}
		})
	}
}

// TestRealTokenizers: the shards keep the tokenizer where a head needs it
// (first and last shard), text survives a round trip, the end-of-turn
// token ends a generation, and SmolLM2's own chat template renders.
func TestRealTokenizers(t *testing.T) {
	race.Numeric(t)
	for _, name := range []string{"smollm2", "gemma3"} {
		t.Run(name, func(t *testing.T) {
			model, err := RealModel(name)
			if err != nil {
				t.Fatal(err)
			}
			meta, err := gguf.Read(model)
			if err != nil {
				t.Fatal(err)
			}
			ranges, err := meta.EvenRanges(3)
			if err != nil {
				t.Fatal(err)
			}
			shards, err := gguf.Split(model, ranges, t.TempDir(), nil)
			if err != nil {
				t.Fatal(err)
			}
			const text = "The quick brown fox jumps over the lazy dog. Ünïcödé, 東京, 🙂."
			var first []int32
			for i, path := range []string{model, shards[0], shards[2]} {
				tok, err := llamacpp.OpenTokenizer(path)
				if err != nil {
					t.Fatalf("%s: %v", filepath.Base(path), err)
				}
				ids, err := tok.Encode(text)
				if err != nil {
					t.Fatal(err)
				}
				var b strings.Builder
				for _, id := range ids {
					b.WriteString(tok.Piece(id))
				}
				if got := strings.TrimSpace(b.String()); got != text {
					t.Errorf("%s: round trip %q", filepath.Base(path), got)
				}
				if i == 0 {
					first = ids
				} else if !slices.Equal(ids, first) {
					t.Errorf("%s tokenizes differently from the whole model", filepath.Base(path))
				}
				tok.Close()
			}
			if _, err := llamacpp.OpenTokenizer(shards[1]); err == nil {
				t.Errorf("a middle shard loaded a tokenizer it does not carry")
			}
		})
	}
	model, err := RealModel("smollm2")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := llamacpp.OpenTokenizer(model)
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	chat, err := tok.Chat([]llamacpp.Message{{Role: "user", Content: "Hi"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"; chat != want {
		t.Errorf("chat %q, want %q", chat, want)
	}
	ids, err := tok.Encode("<|im_end|>")
	if err != nil || len(ids) != 1 || !tok.EndOfGeneration(ids[0]) {
		t.Errorf("<|im_end|> is %v (%v), not one end-of-generation token", ids, err)
	}
}
