package route

import (
	"math"
	"math/rand/v2"
	"slices"
)

// Sampling picks the next token from logits at the head. The zero value is
// greedy.
type Sampling struct {
	// Temperature 0 is greedy (argmax); otherwise logits are divided by it
	// before the softmax.
	Temperature float64
	// TopK keeps the K most likely tokens (0: all).
	TopK int
	// TopP keeps the smallest set of tokens whose probability reaches P
	// (0 or 1: all).
	TopP float64
	// Seed makes sampling reproducible.
	Seed uint64
}

// sampler draws tokens; one per generation.
type sampler struct {
	s    Sampling
	rng  *rand.Rand
	idx  []int
	prob []float64
}

func newSampler(s Sampling) *sampler {
	return &sampler{s: s, rng: rand.New(rand.NewPCG(s.Seed, 0x5a4dd))}
}

// next returns the chosen token id.
func (sm *sampler) next(logits []float32) int32 {
	if sm.s.Temperature <= 0 {
		return argmax(logits)
	}
	sm.idx = sm.idx[:0]
	for i := range logits {
		sm.idx = append(sm.idx, i)
	}
	slices.SortFunc(sm.idx, func(a, b int) int {
		switch {
		case logits[a] > logits[b]:
			return -1
		case logits[a] < logits[b]:
			return 1
		}
		return a - b
	})
	if k := sm.s.TopK; k > 0 && k < len(sm.idx) {
		sm.idx = sm.idx[:k]
	}
	maxL := float64(logits[sm.idx[0]])
	sm.prob = sm.prob[:0]
	var sum float64
	for _, i := range sm.idx {
		p := math.Exp((float64(logits[i]) - maxL) / sm.s.Temperature)
		sm.prob = append(sm.prob, p)
		sum += p
	}
	if p := sm.s.TopP; p > 0 && p < 1 {
		var acc float64
		for j, q := range sm.prob {
			acc += q / sum
			if acc >= p {
				sm.idx, sm.prob = sm.idx[:j+1], sm.prob[:j+1]
				break
			}
		}
		sum = 0
		for _, q := range sm.prob {
			sum += q
		}
	}
	r := sm.rng.Float64() * sum
	for j, q := range sm.prob {
		if r < q {
			return int32(sm.idx[j])
		}
		r -= q
	}
	return int32(sm.idx[len(sm.idx)-1])
}

func argmax(v []float32) int32 {
	best := 0
	for i := range v {
		if v[i] > v[best] {
			best = i
		}
	}
	return int32(best)
}
