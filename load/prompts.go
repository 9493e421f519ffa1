package load

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
)

// Prompt is one line of a prompts file: text sent as it is, or chat
// messages that the model's chat template renders (the caller's
// tokenizer does both; this package sees only token ids).
type Prompt struct {
	Text     string    `json:"prompt,omitempty"`
	Messages []Message `json:"messages,omitempty"`
}

// Message is one chat turn.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// DefaultPrompts is the project's own prompts file (relative to the
// repository root): short questions, long instructions, and a long
// document to summarise or answer from, as text and as chat messages.
const DefaultPrompts = "load/prompts.jsonl"

// ReadPromptFile reads a JSONL file of prompts, one JSON object a line:
// {"prompt": "text"} or {"messages": [{"role": "user", "content": "..."}]}
// (roles system, user, assistant). Blank lines are skipped; anything else
// that does not parse is refused with its line number.
func ReadPromptFile(path string) ([]Prompt, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInput, err)
	}
	defer f.Close()
	var out []Prompt
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var p Prompt
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			return nil, fmt.Errorf("%w: %s line %d: %v", ErrInput, path, n, err)
		}
		if err := p.check(); err != nil {
			return nil, fmt.Errorf("%w: %s line %d: %v", ErrInput, path, n, err)
		}
		out = append(out, p)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInput, path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s has no prompts", ErrInput, path)
	}
	return out, nil
}

func (p Prompt) check() error {
	switch {
	case (p.Text == "") == (len(p.Messages) == 0):
		return fmt.Errorf("want exactly one of \"prompt\" (text) or \"messages\"")
	}
	for _, m := range p.Messages {
		if !slices.Contains([]string{"system", "user", "assistant"}, m.Role) {
			return fmt.Errorf("message role %q (want system, user or assistant)", m.Role)
		}
		if m.Content == "" {
			return fmt.Errorf("a %s message with no content", m.Role)
		}
	}
	return nil
}
