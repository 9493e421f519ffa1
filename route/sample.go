package route

import (
	"github.com/meshnet/shardd/internal/argmax"
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
		sm.topK(logits, k)
		sm.prob = sm.prob[:0]
		var sum float64
		for _, id := range sm.idx {
			w := weight(id)
			sm.prob = append(sm.prob, w)
			sum += w
		}
		if topP {
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
		if better(logits, a, b) {
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

// better ranks token a above b: a larger logit, ties to the lower id.
func better(logits []float32, a, b int32) bool {
	return logits[a] > logits[b] || (logits[a] == logits[b] && a < b)
}

// topK leaves the k best tokens in sm.idx, best first: a heap of the k best
// so far with the worst on top, then a sort of those k.
func (sm *sampler) topK(logits []float32, k int) {
	h := sm.heap[:0]
	worse := func(a, b int32) bool { return better(logits, b, a) }
	for i := range logits {
		id := int32(i)
		if len(h) < k {
			h = append(h, id)
			siftUp(h, len(h)-1, worse)
		} else if better(logits, id, h[0]) {
			h[0] = id
			siftDown(h, 0, worse)
		}
	}
	sm.heap = h
	sm.idx = append(sm.idx[:0], h...)
	slices.SortFunc(sm.idx, func(a, b int32) int {
		if better(logits, a, b) {
			return -1
		}
		return 1
	})
}

// siftUp and siftDown keep h a binary heap in which above(parent, child)
// holds.
func siftUp(h []int32, i int, above func(a, b int32) bool) {
	for i > 0 {
		p := (i - 1) / 2
		if !above(h[i], h[p]) {
			return
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

func siftDown(h []int32, i int, above func(a, b int32) bool) {
	for {
		c := 2*i + 1
		if c >= len(h) {
			return
		}
		if c+1 < len(h) && above(h[c+1], h[c]) {
			c++
		}
		if !above(h[c], h[i]) {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}
