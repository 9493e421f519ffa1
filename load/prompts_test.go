package load

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// The project's prompts file parses, and has what it promises: short
// questions, chat messages, and a long document.
func TestDefaultPrompts(t *testing.T) {
	ps, err := ReadPromptFile(filepath.Join("..", DefaultPrompts))
	if err != nil {
		t.Fatal(err)
	}
	var text, chat, long int
	for _, p := range ps {
		if p.Text != "" {
			text++
		} else {
			chat++
		}
		n := len(p.Text)
		for _, m := range p.Messages {
			n += len(m.Content)
		}
		if n > 1500 {
			long++
		}
	}
	if len(ps) < 20 || text == 0 || chat == 0 || long < 3 {
		t.Fatalf("%d prompts: %d text, %d chat, %d long", len(ps), text, chat, long)
	}
}

func TestReadPromptFileRefuses(t *testing.T) {
	for _, bad := range []string{
		``,
		`{"prompt": ""}`,
		`{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}`,
		`{"messages": [{"role": "robot", "content": "b"}]}`,
		`{"messages": [{"role": "user", "content": ""}]}`,
		`{"promt": "typo"}`,
		`not json`,
	} {
		p := filepath.Join(t.TempDir(), "p.jsonl")
		if err := os.WriteFile(p, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadPromptFile(p); !errors.Is(err, ErrInput) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// A workload with real prompts sends them in turn, whole, with output
// lengths from its range, and reports their lengths.
func TestWorkloadPrompts(t *testing.T) {
	w := Workload{Concurrency: 1, Requests: 4, Vocab: 100, Lengths: Lengths{Output: [2]int{3, 5}},
		Prompts: [][]int32{{1, 2, 3}, {4}, {5, 6, 7, 8, 9}}}
	if err := w.Check(); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		r := w.request(i)
		if !slices.Equal(r.Prompt, w.Prompts[i%3]) || r.MaxTokens < 3 || r.MaxTokens > 5 {
			t.Fatalf("request %d: prompt %v, %d tokens", i, r.Prompt, r.MaxTokens)
		}
	}
	if got := w.PromptLens(); got != [2]int{1, 5} {
		t.Fatalf("prompt lengths %v", got)
	}
	w.Prompts = append(w.Prompts, nil)
	if err := w.Check(); err == nil {
		t.Fatal("an empty prompt passed")
	}
}
