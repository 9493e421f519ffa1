// Package argmax picks a logits row's greedy token, one way for every
// consumer: the route's sampler, the split proof and the benchmarks.
package argmax

// Index returns the index of the largest value, the lowest index on ties
// (0 for an empty row).
func Index(v []float32) int32 {
	best := 0
	for i := range v {
		if v[i] > v[best] {
			best = i
		}
	}
	return int32(best)
}
