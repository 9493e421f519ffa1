// Package chat renders chat messages into a prompt with a model's own
// template (or a plain transcript for a model without one) and says where
// a plain transcript's answer ends. generate and the API share it, so the
// same conversation is the same prompt through either.
package chat

import (
	"strings"

	"github.com/meshnet/shardd/backend/llamacpp"
)

// Vocab is what rendering needs of a tokenizer (llamacpp.Tokenizer).
type Vocab interface {
	Chat(msgs []llamacpp.Message, template string) (string, error)
	HasChatTemplate() bool
	Piece(id int32) string
	EndOfGeneration(id int32) bool
}

// Render renders a chat with template (empty: the model's own) and opens
// the assistant's turn. A model with no template of its own and none
// named gets a plain transcript (plain is true): the system message, then
// "Q: "/"A: " turns, ending in "A:".
func Render(tok Vocab, msgs []llamacpp.Message, template string) (text string, plain bool, err error) {
	if template != "" || tok.HasChatTemplate() {
		text, err = tok.Chat(msgs, template)
		return text, false, err
	}
	var b strings.Builder
	for _, m := range msgs {
		switch m.Role {
		case "system":
			b.WriteString(m.Content + "\n\n")
		case "user":
			b.WriteString("Q: " + m.Content + "\n")
		default:
			b.WriteString("A: " + m.Content + "\n")
		}
	}
	b.WriteString("A:")
	return b.String(), true, nil
}

// Stopper ends a generation at the model's end-of-generation tokens and,
// for a plain transcript, at the end of the answer's first line (a base
// model goes on to ask itself the next question). Each call returns a new
// stopper, for one generation.
func Stopper(tok Vocab, plain bool) func(int32) bool {
	answered := false
	return func(t int32) bool {
		if tok.EndOfGeneration(t) {
			return true
		}
		if !plain {
			return false
		}
		piece := tok.Piece(t)
		if answered && strings.Contains(piece, "\n") {
			return true
		}
		answered = answered || strings.TrimSpace(piece) != ""
		return false
	}
}
