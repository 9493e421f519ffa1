// Package bench is shardd's benchmark harness. Every figure in PERF.md comes
// from a benchmark here or beside the code it measures, and every target is a
// ratio between our path and a baseline measured in the same run (these
// machines are shared and noisy; absolute numbers drift, ratios hold).
//
//	make bench            runs them all, -count 6, and prints medians
package bench
