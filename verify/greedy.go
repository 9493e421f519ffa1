package verify

import (
	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/internal/argmax"
)

// Greedy runs the whole model in this process and returns the n tokens it
// generates greedily after prompt: the reference a route's output is
// checked against. roundAfter lists the layers after which the model's
// residual stream is rounded to bf16, as a route with bf16 boundaries
// there computes (none: the unrounded model, what an f32 route computes).
func Greedy(model string, prompt []int32, n, threads int, roundAfter ...int) ([]int32, error) {
	be, err := llamacpp.Open(llamacpp.Config{Path: model, Threads: threads, MaxSeqs: 1,
		CtxTokens: len(prompt) + n + 1, MaxBatch: max(len(prompt), 1), RoundBF16: roundAfter})
	if err != nil {
		return nil, err
	}
	defer be.Close()
	c, err := NewChain([]backend.Backend{be}, F32)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	rows := make([]Row, len(prompt))
	for i, t := range prompt {
		rows[i] = Row{Pos: i, Token: t, Output: i == len(prompt)-1}
	}
	var out []int32
	for len(out) < n {
		logits, err := c.Forward(rows)
		if err != nil {
			return nil, err
		}
		tok := argmax.Index(logits)
		out = append(out, tok)
		rows = []Row{{Pos: rows[len(rows)-1].Pos + 1, Token: tok, Output: true}}
	}
	return out, nil
}
