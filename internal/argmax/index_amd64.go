package argmax

import "golang.org/x/sys/cpu"

// haveAVX2 selects index_amd64.s's kernels.
var haveAVX2 = cpu.X86.HasAVX && cpu.X86.HasAVX2

// maxAVX2 and firstEqAVX2 are implemented in index_amd64.s.
//
//go:noescape
func maxAVX2(v []float32) float32

//go:noescape
func firstEqAVX2(v []float32, m float32) int

// index is Index with AVX2 over whole blocks of 32 values, and indexGo for
// short rows and where the CPU lacks AVX2.
func index(v []float32) int32 {
	n := len(v) &^ 31
	if !haveAVX2 || n < 64 {
		return indexGo(v)
	}
	m := maxAVX2(v[:n])
	for _, x := range v[n:] {
		if x > m {
			m = x
		}
	}
	if i := firstEqAVX2(v[:n], m); i < n {
		return int32(i)
	}
	for i, x := range v[n:] {
		if x == m {
			return int32(n + i)
		}
	}
	return 0 // every value NaN
}
