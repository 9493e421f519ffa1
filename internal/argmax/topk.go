package argmax

import "slices"

// Better ranks token a above token b of a logits row: a larger logit, ties
// to the lower id. The route's sampler and a last shard's compact output
// (TopK) rank by it, so both see the same candidates in the same order.
func Better(logits []float32, a, b int32) bool {
	return logits[a] > logits[b] || (logits[a] == logits[b] && a < b)
}

// TopK appends to dst[:0] the ids of the k best tokens of logits, best
// first (by Better), and returns it; heap is scratch (returned for reuse).
// k = 1 is Index. Otherwise a heap of the k best so far with the worst on
// top, then a sort of those k: one pass over the row, in which a value
// below the heap's worst is passed over with one comparison.
func TopK(dst, heap []int32, logits []float32, k int) (ids, scratch []int32) {
	k = min(k, len(logits))
	if k <= 0 {
		return dst[:0], heap
	}
	if k == 1 {
		return append(dst[:0], Index(logits)), heap
	}
	h := heap[:0]
	worse := func(a, b int32) bool { return Better(logits, b, a) }
	var floor float32 // the heap's worst value, once it holds k
	for i, v := range logits {
		id := int32(i)
		switch {
		case len(h) < k:
			h = append(h, id)
			siftUp(h, len(h)-1, worse)
			floor = logits[h[0]]
		case !(v >= floor): // below the worst, or NaN: Better would say no
		case Better(logits, id, h[0]):
			h[0] = id
			siftDown(h, 0, worse)
			floor = logits[h[0]]
		}
	}
	dst = append(dst[:0], h...)
	slices.SortFunc(dst, func(a, b int32) int {
		if Better(logits, a, b) {
			return -1
		}
		return 1
	})
	return dst, h
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
