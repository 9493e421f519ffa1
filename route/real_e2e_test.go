package route

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/verify"
)

// TestRealModelRoutes drives the real checkpoints `make models` fetches
// through routes of `shardd serve` processes and compares every token with
// the whole model run in this process: SmolLM2 on two workers, Gemma 3 on
// three (cut on its 6-layer pattern), each at an f32 boundary against the
// unrounded model and at the default bf16 boundary against the model
// rounded where the route rounds. Prompts are text, tokenized with the
// route's first shard's own tokenizer.
func TestRealModelRoutes(t *testing.T) {
	const n = 32
	for _, tc := range []struct {
		name   string
		shards int
		prompt string
	}{
		{"smollm2", 2, "<|im_start|>user\nWrite a haiku about rivers.<|im_end|>\n<|im_start|>assistant\n"},
		{"gemma3", 3, "The history of the printing press begins"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			model, err := verify.RealModel(tc.name)
			if err != nil {
				t.Fatal(err)
			}
			meta, err := gguf.Read(model)
			if err != nil {
				t.Fatal(err)
			}
			ranges, err := meta.EvenRanges(tc.shards)
			if err != nil {
				t.Fatal(err)
			}
			shards, err := gguf.Split(model, ranges, filepath.Join(t.TempDir(), tc.name), nil)
			if err != nil {
				t.Fatal(err)
			}
			tok, err := llamacpp.OpenTokenizer(shards[0])
			if err != nil {
				t.Fatal(err)
			}
			prompt, err := tok.Encode(tc.prompt)
			tok.Close()
			if err != nil {
				t.Fatal(err)
			}
			for _, boundary := range []string{"f32", "bf16"} {
				var addrs []string
				var procs []*proc
				for _, s := range shards {
					p := serve(t, s, "127.0.0.1:0", "--boundary", boundary)
					procs = append(procs, p)
					addrs = append(addrs, p.addr)
				}
				got := generateTokens(t, addrs, prompt, n)
				var round []int
				if boundary == "bf16" {
					for _, r := range ranges[:len(ranges)-1] {
						round = append(round, r.End-1)
					}
				}
				want, err := verify.Greedy(model, prompt, n, 2, round...)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("%s, %v, %s boundary: route %v, whole model (rounded after %v) %v", tc.name, ranges, boundary, got, round, want)
				}
				for _, p := range procs {
					p.stop()
				}
			}
		})
	}
}

// generateTokens runs one greedy generation of n tokens through addrs.
func generateTokens(t *testing.T, addrs []string, prompt []int32, n int) []int32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := Dial(ctx, addrs, Options{StepTimeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var got []int32
	if _, err := r.Generate(ctx, Request{Prompt: prompt, MaxTokens: n}, func(tok int32) error {
		got = append(got, tok)
		return nil
	}); err != nil {
		t.Fatal(fmt.Errorf("generate through %v: %w", addrs, err))
	}
	return got
}
