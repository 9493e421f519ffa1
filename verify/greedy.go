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
	var out []int32
	err := run(model, prompt, n, threads, roundAfter, func(i int, logits []float32) int32 {
		tok := argmax.Index(logits)
		out = append(out, tok)
		return tok
	})
	return out, err
}

// Forced runs the whole model as Greedy does, but feeds it tokens (a
// route's output) instead of its own choices, and returns the logits each
// of them was chosen from: what the model predicts at every position given
// the route's own prefix. A route whose tokens differ from Greedy's can be
// checked with it token by token: each must be the model's best, or within
// a rounding margin of it.
func Forced(model string, prompt, tokens []int32, threads int, roundAfter ...int) ([][]float32, error) {
	var out [][]float32
	err := run(model, prompt, len(tokens), threads, roundAfter, func(i int, logits []float32) int32 {
		out = append(out, append([]float32(nil), logits...))
		return tokens[i]
	})
	return out, err
}

// run prefills prompt, then n times hands next the logits of the last
// position and feeds the token it returns.
func run(model string, prompt []int32, n, threads int, roundAfter []int, next func(i int, logits []float32) int32) error {
	be, err := llamacpp.Open(llamacpp.Config{Path: model, Threads: threads, MaxSeqs: 1,
		CtxTokens: len(prompt) + n + 1, MaxBatch: max(len(prompt), 1), RoundBF16: roundAfter})
	if err != nil {
		return err
	}
	defer be.Close()
	c, err := NewChain([]backend.Backend{be}, F32)
	if err != nil {
		return err
	}
	defer c.Close()
	rows := make([]Row, len(prompt))
	for i, t := range prompt {
		rows[i] = Row{Pos: i, Token: t, Output: i == len(prompt)-1}
	}
	for i := range n {
		logits, err := c.Forward(rows)
		if err != nil {
			return err
		}
		tok := next(i, logits)
		rows = []Row{{Pos: rows[len(rows)-1].Pos + 1, Token: tok, Output: true}}
	}
	return nil
}
