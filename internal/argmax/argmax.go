// Package argmax picks a logits row's greedy token and ranks its best
// candidates, one way for every consumer: the route's sampler, a last
// shard's compact output, the split proof and the benchmarks.
package argmax

import "math"

// Index returns the index of the largest value, the lowest index on ties
// (0 for an empty row). NaN is never the largest; a row with nothing larger
// than -Inf gives its first -Inf, or 0. It sits on every token's critical
// path at the head, over up to 262,144 logits a row.
//
// Two passes: the maximum, then the first index that holds it. On amd64
// with AVX2 both passes run 32 values at a time (index_amd64.s); elsewhere,
// and for rows under 64 values, indexGo.
func Index(v []float32) int32 { return index(v) }

// indexGo is Index in Go: the maximum kept by four independent running
// maxima (no dependency from one element to the next, and branches that
// soon stop being taken), then the first index that holds it. For a
// 32,000-token vocabulary that is between two and three times faster than
// one loop comparing each element with the best so far.
func indexGo(v []float32) int32 {
	m0 := float32(math.Inf(-1))
	m1, m2, m3 := m0, m0, m0
	i := 0
	for ; i+4 <= len(v); i += 4 {
		w := v[i : i+4 : i+4]
		if w[0] > m0 {
			m0 = w[0]
		}
		if w[1] > m1 {
			m1 = w[1]
		}
		if w[2] > m2 {
			m2 = w[2]
		}
		if w[3] > m3 {
			m3 = w[3]
		}
	}
	for ; i < len(v); i++ {
		if v[i] > m0 {
			m0 = v[i]
		}
	}
	m := max(m0, m1, m2, m3) // none is NaN
	for i, x := range v {
		if x == m {
			return int32(i)
		}
	}
	return 0
}
