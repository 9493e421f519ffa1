package route

import (
	"math"
	"math/rand/v2"
	"slices"

	"github.com/meshnet/shardd/internal/argmax"
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
	heap []int32   // the k best so far, worst on top (top-k)
	idx  []int32   // candidates, best first
	prob []float64 // their unnormalized probabilities
	// weights holds every token's unnormalized probability when the draw
	// is over the whole vocabulary.
	weights []float64
}

func newSampler(s Sampling) *sampler {
	return &sampler{s: s, rng: rand.New(rand.NewPCG(s.Seed, 0x5a4dd))}
}

// next returns the chosen token id.
//
// Candidates are ranked by logit, ties to the lower id. Top-k keeps the k
// best; top-p then keeps the shortest best-first prefix whose probability
// reaches p; the draw walks the candidates best first. Only as much of the
// ranking as the draw needs is computed (top-k by a heap of k, the rest by
// sorting only the tokens heavy enough to matter): sorting all 32,000
// logits took about 4 ms per token, half a forward pass.
func (sm *sampler) next(logits []float32) int32 {
	if sm.s.Temperature <= 0 || len(logits) == 0 {
		return argmax.Index(logits)
	}
	t := sm.s.Temperature
	maxL := float64(logits[argmax.Index(logits)])
	weight := func(id int32) float64 { return math.Exp((float64(logits[id]) - maxL) / t) }
	topP := sm.s.TopP > 0 && sm.s.TopP < 1

	if k := sm.s.TopK; k > 0 && k < len(logits) {
		sm.idx, sm.heap = argmax.TopK(sm.idx, sm.heap, logits, k)
		return sm.drawRanked(func(j int) float32 { return logits[sm.idx[j]] }, maxL)
	}

	// The whole vocabulary: every token's weight and their total, then a
	// ranking of only the best tokens, as many as the nucleus (top-p) or the
	// draw can reach.
	sm.weights = slices.Grow(sm.weights[:0], len(logits))[:len(logits)]
	var total float64
	for i := range logits {
		w := weight(int32(i))
		sm.weights[i] = w
		total += w
	}
	var r, target float64
	if topP {
		target = sm.s.TopP * total
	} else {
		r = sm.rng.Float64() * total
		target = r
	}
	for limit := sm.bucketLimit(target); ; limit = lastBucket {
		sm.rankBuckets(logits, limit)
		if topP {
			sm.prob = sm.prob[:0]
			var acc, sum float64
			for _, id := range sm.idx {
				w := sm.weights[id]
				sm.prob = append(sm.prob, w)
				sum += w
				if acc += w / total; acc >= sm.s.TopP {
					sm.idx = sm.idx[:len(sm.prob)]
					return sm.draw(sum)
				}
			}
			if limit == lastBucket { // rounding: the nucleus is everything
				return sm.draw(sum)
			}
			continue
		}
		left := r
		for _, id := range sm.idx {
			w := sm.weights[id]
			if left < w {
				return id
			}
			left -= w
		}
		if limit == lastBucket { // rounding left r past the last token
			return sm.idx[len(sm.idx)-1]
		}
	}
}

// nextTop returns the chosen token from a last shard's compact output: the
// ids and logits of its best tokens, best first (argmax.TopK's ranking).
// Only greedy sampling and top-k sampling with k <= len(ids) need no more
// of the row (Compact says when), and for those it chooses exactly what
// next would from the whole row: the same candidates, in the same order,
// with the same weights and draws.
func (sm *sampler) nextTop(ids []int32, vals []float32) int32 {
	if sm.s.Temperature <= 0 {
		return ids[0]
	}
	sm.idx = append(sm.idx[:0], ids[:min(sm.s.TopK, len(ids))]...)
	return sm.drawRanked(func(j int) float32 { return vals[j] }, float64(vals[0]))
}

// Compact reports how many of the row's best logits sampling needs (0:
// the whole row): 1 for greedy, k for top-k sampling.
func (s Sampling) Compact() int {
	switch {
	case s.Temperature <= 0:
		return 1
	case s.TopK > 0:
		return s.TopK
	}
	return 0
}

// drawRanked draws among the candidates in sm.idx, best first, whose j-th
// has logit logit(j): top-p, when set, keeps the shortest best-first prefix
// whose probability reaches it.
func (sm *sampler) drawRanked(logit func(j int) float32, maxL float64) int32 {
	t := sm.s.Temperature
	sm.prob = sm.prob[:0]
	var sum float64
	for j := range sm.idx {
		w := math.Exp((float64(logit(j)) - maxL) / t)
		sm.prob = append(sm.prob, w)
		sum += w
	}
	if sm.s.TopP > 0 && sm.s.TopP < 1 {
		var acc float64
		for j, w := range sm.prob {
			acc += w / sum
			if acc >= sm.s.TopP {
				sm.idx, sm.prob = sm.idx[:j+1], sm.prob[:j+1]
				break
			}
		}
		sum = 0
		for _, w := range sm.prob {
			sum += w
		}
	}
	return sm.draw(sum)
}

// Tokens are bucketed by the binary exponent of their weight (at most 1, the
// best token's): bucket b holds weights in (2^-(b+1), 2^-b], the last one
// everything smaller. A better-ranked token never sits in a later bucket.
const lastBucket = 63

func bucketOf(w float64) int {
	return min(1023-int(math.Float64bits(w)>>52&0x7ff), lastBucket)
}

// bucketLimit returns the last bucket that must be ranked for the best
// tokens' weights to exceed target, plus one to spare for rounding.
func (sm *sampler) bucketLimit(target float64) int {
	var mass [lastBucket + 1]float64
	for _, w := range sm.weights {
		mass[bucketOf(w)] += w
	}
	var cum float64
	for b, m := range mass {
		if cum += m; cum > target {
			return min(b+1, lastBucket)
		}
	}
	return lastBucket
}

// rankBuckets leaves in sm.idx, best first, every token whose weight falls
// in buckets 0..limit.
func (sm *sampler) rankBuckets(logits []float32, limit int) {
	sm.idx = sm.idx[:0]
	for i, w := range sm.weights {
		if bucketOf(w) <= limit {
			sm.idx = append(sm.idx, int32(i))
		}
	}
	slices.SortFunc(sm.idx, func(a, b int32) int {
		if argmax.Better(logits, a, b) {
			return -1
		}
		return 1
	})
}

// draw picks from the candidates (best first) with probability in
// proportion to their weights, which sum to sum.
func (sm *sampler) draw(sum float64) int32 {
	r := sm.rng.Float64() * sum
	for j, w := range sm.prob {
		if r < w {
			return sm.idx[j]
		}
		r -= w
	}
	return sm.idx[len(sm.idx)-1]
}
