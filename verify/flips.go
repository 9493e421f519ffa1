package verify

import (
	"fmt"

	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/internal/argmax"
)

// Flips measures what a bf16 route changes in real generations: for each
// prompt, the tokens a route of `shards` near-equal shards generates
// greedily at a bf16 boundary (the whole model rounded where the route
// rounds, which Run proves bitwise equal to the route), checked one by one
// against the unrounded whole model given the same prefix.
type Flips struct {
	Shards       int
	RoundedAfter []int
	Prompts      int
	Tokens       int // generated tokens checked
	// Flipped counts the tokens the unrounded model would not have chosen
	// given the route's own prefix; PerPrompt has the count of each prompt.
	Flipped   int
	PerPrompt []int
	// Margins are the unrounded model's logit lead of its own choice over
	// the route's, at each flipped token, in order.
	Margins []float32
}

func (f Flips) String() string {
	out := fmt.Sprintf("%d shards, bf16 boundary (rounded after layers %v): %d of %d greedy tokens over %d prompts differ from the unrounded model's choice",
		f.Shards, f.RoundedAfter, f.Flipped, f.Tokens, f.Prompts)
	if f.Flipped > 0 {
		var hi float32
		for _, m := range f.Margins {
			hi = max(hi, m)
		}
		out += fmt.Sprintf(" (margins %.3g, largest %.3g); prompts with a flip: %d", f.Margins, hi, countNonZero(f.PerPrompt))
	}
	return out
}

func countNonZero(xs []int) int {
	n := 0
	for _, x := range xs {
		if x != 0 {
			n++
		}
	}
	return n
}

// MeasureFlips runs the measurement for model split `shards` ways on its
// layer pattern, n greedy tokens after each prompt.
func MeasureFlips(model string, shards int, prompts [][]int32, n, threads int) (Flips, error) {
	meta, err := gguf.Read(model)
	if err != nil {
		return Flips{}, err
	}
	ranges, err := meta.EvenRanges(shards)
	if err != nil {
		return Flips{}, err
	}
	f := Flips{Shards: shards, Prompts: len(prompts)}
	for _, r := range ranges[:len(ranges)-1] {
		f.RoundedAfter = append(f.RoundedAfter, r.End-1)
	}
	for _, p := range prompts {
		route, err := Greedy(model, p, n, threads, f.RoundedAfter...)
		if err != nil {
			return f, err
		}
		whole, err := Forced(model, p, route, threads)
		if err != nil {
			return f, err
		}
		flipped := 0
		for i, logits := range whole {
			best := argmax.Index(logits)
			if best != route[i] {
				flipped++
				f.Margins = append(f.Margins, logits[best]-logits[route[i]])
			}
		}
		f.Tokens += len(route)
		f.Flipped += flipped
		f.PerPrompt = append(f.PerPrompt, flipped)
	}
	return f, nil
}
