package argmax

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// reference is the obvious loop, the specification.
func reference(v []float32) int32 {
	best := -1
	for i, x := range v {
		if !math.IsNaN(float64(x)) && (best < 0 || x > v[best]) {
			best = i
		}
	}
	return int32(max(best, 0))
}

func TestIndex(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, c := range []struct {
		v    []float32
		want int32
	}{
		{nil, 0},
		{[]float32{-3}, 0},
		{[]float32{1, 5, 2}, 1},
		{[]float32{7, 2, 7}, 0}, // ties go to the lower index
		{[]float32{-2, -1, -9}, 1},
		{[]float32{nan, 1, 2, nan, 3, nan}, 4}, // NaN is never the largest
		{[]float32{nan, nan}, 0},
		{[]float32{nan, -inf, -inf}, 1},
		{[]float32{1, 2, 3, 4, 5, 6, 7, 9, 9}, 7}, // tie across the unrolled lanes and the tail
		{[]float32{0, 0, 0, 0, 0, inf, 0, inf}, 5},
	} {
		if got := Index(c.v); got != c.want {
			t.Errorf("Index(%v) = %d, want %d", c.v, got, c.want)
		}
	}
}

// TestIndexMatchesReference checks random rows of every length up to 67,
// with many ties (values drawn from a few levels) and some NaN.
func TestIndexMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := range 68 {
		for range 200 {
			v := make([]float32, n)
			for i := range v {
				v[i] = float32(rng.IntN(5)) - 2
				if rng.IntN(20) == 0 {
					v[i] = float32(math.NaN())
				}
			}
			if got, want := Index(v), reference(v); got != want {
				t.Fatalf("Index(%v) = %d, want %d", v, got, want)
			}
		}
	}
}

// TestIndexLongRows checks rows long enough for the vector kernels (every
// length to 300, so every tail past a block of 32, and a few large ones)
// against the reference, through Index and indexGo alike: values from a few
// levels (ties within and across blocks), NaN, both zeros and both
// infinities, and rows where only the tail or nothing but NaN and -Inf
// holds the answer.
func TestIndexLongRows(t *testing.T) {
	t.Logf("AVX2 kernels: %v", haveAVX2)
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	levels := []float32{-inf, -2, float32(math.Copysign(0, -1)), 0, 1, 3, inf}
	rng := rand.New(rand.NewPCG(5, 6))
	lengths := []int{1000, 4099, 32000, 49152, 262144}
	for n := 1; n <= 300; n++ {
		lengths = append(lengths, n)
	}
	check := func(v []float32) {
		t.Helper()
		want := reference(v)
		if got := Index(v); got != want {
			t.Fatalf("Index over %d values = %d, want %d", len(v), got, want)
		}
		if got := indexGo(v); got != want {
			t.Fatalf("indexGo over %d values = %d, want %d", len(v), got, want)
		}
	}
	for _, n := range lengths {
		trials := 40
		if n > 5000 {
			trials = 4
		}
		for range trials {
			v := make([]float32, n)
			top := 1 + rng.IntN(len(levels)) // values from levels[:top]
			for i := range v {
				v[i] = levels[rng.IntN(top)]
				if rng.IntN(10) == 0 {
					v[i] = nan
				}
			}
			check(v)
			// One larger value anywhere, the tail included.
			v[rng.IntN(n)] = 1e30
			check(v)
			// Nothing but NaN, then a -Inf somewhere.
			for i := range v {
				v[i] = nan
			}
			check(v)
			v[rng.IntN(n)] = -inf
			check(v)
		}
	}
}

// BenchmarkIndex: rows of SmolLM2's and Gemma 3's vocabularies through
// Index (AVX2 where the CPU has it), Go's four-lane loop and the one-loop
// reference, in the same run.
func BenchmarkIndex(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{32000, 262144} {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * 3)
		}
		for _, f := range []struct {
			name  string
			index func([]float32) int32
		}{{"shardd", Index}, {"go", indexGo}, {"one-loop", reference}} {
			b.Run(fmt.Sprintf("%s/n=%d", f.name, n), func(b *testing.B) {
				b.SetBytes(int64(4 * n))
				for b.Loop() {
					f.index(v)
				}
			})
		}
	}
}

// TopK is the first k of the whole row sorted by Better, with ties.
func TestTopK(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var ids, heap []int32
	for range 200 {
		n := 1 + rng.IntN(300)
		row := make([]float32, n)
		for i := range row {
			row[i] = float32(rng.IntN(20))
		}
		all := make([]int32, n)
		for i := range all {
			all[i] = int32(i)
		}
		slices.SortFunc(all, func(a, b int32) int {
			if Better(row, a, b) {
				return -1
			}
			return 1
		})
		k := 1 + rng.IntN(n+3)
		ids, heap = TopK(ids, heap, row, k)
		if !slices.Equal(ids, all[:min(k, n)]) {
			t.Fatalf("k=%d of %v: %v, want %v", k, row, ids, all[:min(k, n)])
		}
		if ids[0] != Index(row) {
			t.Fatalf("best %d, argmax %d", ids[0], Index(row))
		}
	}
}

// A last shard's compact output over Gemma 3's 262,144-token vocabulary.
func BenchmarkTopK(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	row := make([]float32, 262144)
	for i := range row {
		row[i] = float32(rng.NormFloat64() * 3)
	}
	for _, k := range []int{1, 40} {
		b.Run(fmt.Sprintf("k=%d", k), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(4 * len(row)))
			var ids, heap []int32
			for b.Loop() {
				ids, heap = TopK(ids, heap, row, k)
			}
		})
	}
}
