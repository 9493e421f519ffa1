package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/internal/chat"
	"github.com/meshnet/shardd/verify"
)

// generate's prompt handling on the real tokenizers: SmolLM2's own chat
// template, Gemma 3's base model asked in a plain transcript that ends at
// the answer's line, and the flag combinations it refuses.
func TestGeneratePrompt(t *testing.T) {
	open := func(name string) *llamacpp.Tokenizer {
		model, err := verify.RealModel(name)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := llamacpp.OpenTokenizer(model)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(tok.Close)
		return tok
	}
	smol, gemma := open("smollm2"), open("gemma3")

	ids, plain, err := promptIDs("", "Hi", chatSpec{on: true, system: "Be brief."}, smol)
	if err != nil || plain {
		t.Fatalf("smollm2 chat: plain %v, %v", plain, err)
	}
	want, _ := smol.Encode("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
	if !slices.Equal(ids, want) {
		t.Errorf("smollm2 chat ids %v, want %v", ids, want)
	}

	ids, plain, err = promptIDs("", "What is 2+2?", chatSpec{on: true}, gemma)
	if err != nil || !plain {
		t.Fatalf("gemma3 (no template) chat: plain %v, %v", plain, err)
	}
	want, _ = gemma.Encode("Q: What is 2+2?\nA:")
	if !slices.Equal(ids, want) {
		t.Errorf("gemma3 plain chat ids %v, want %v", ids, want)
	}
	stop := chat.Stopper(gemma, true)
	answer, _ := gemma.Encode(" Four.\nQ: next")
	stoppedAt := -1
	for i, id := range answer[1:] { // [0] is BOS
		if stop(id) {
			stoppedAt = i
			break
		}
	}
	var text strings.Builder
	for _, id := range answer[1 : stoppedAt+2] {
		text.WriteString(gemma.Piece(id))
	}
	if stoppedAt < 0 || text.String() != " Four.\n" {
		t.Errorf("plain transcript stopped after %q (token %d)", text.String(), stoppedAt)
	}
	if _, _, err := promptIDs("", "x", chatSpec{on: true, template: "gemma"}, gemma); err != nil {
		t.Errorf("a named template: %v", err)
	}

	for _, bad := range []struct {
		ids, text string
		chat      chatSpec
		tok       *llamacpp.Tokenizer
	}{
		{"1,2", "x", chatSpec{}, smol},
		{"1,2", "", chatSpec{on: true}, smol},
		{"", "x", chatSpec{}, nil},
		{"", "x", chatSpec{system: "s"}, smol},
		{"1,x", "", chatSpec{}, nil},
		{"", "", chatSpec{}, smol},
	} {
		if _, _, err := promptIDs(bad.ids, bad.text, bad.chat, bad.tok); err == nil {
			t.Errorf("promptIDs(%q, %q, %+v) accepted", bad.ids, bad.text, bad.chat)
		}
	}
}
