package route

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/meshnet/shardd/internal/argmax"
)

// randomLogits returns n logits spread like a language model's: most near
// zero, a few standing out; some repeat, to exercise ties.
func randomLogits(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(math.Round(r.NormFloat64()*3*64) / 64)
	}
	return v
}

// referenceNext is the sampler's specification written the obvious way:
// sort every token best first (larger logit, ties to the lower id), keep
// the top k, keep the shortest prefix whose probability reaches p, draw.
func referenceNext(s Sampling, rng *rand.Rand, logits []float32) int32 {
	if s.Temperature <= 0 {
		return argmax.Index(logits)
	}
	idx := make([]int32, len(logits))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortFunc(idx, func(a, b int32) int {
		if argmax.Better(logits, a, b) {
			return -1
		}
		return 1
	})
	if s.TopK > 0 && s.TopK < len(idx) {
		idx = idx[:s.TopK]
	}
	maxL := float64(logits[idx[0]])
	var prob []float64
	var sum float64
	for _, id := range idx {
		p := math.Exp((float64(logits[id]) - maxL) / s.Temperature)
		prob = append(prob, p)
		sum += p
	}
	if s.TopP > 0 && s.TopP < 1 {
		var acc float64
		for j, q := range prob {
			acc += q / sum
			if acc >= s.TopP {
				idx, prob = idx[:j+1], prob[:j+1]
				break
			}
		}
		sum = 0
		for _, q := range prob {
			sum += q
		}
	}
	r := rng.Float64() * sum
	for j, q := range prob {
		if r < q {
			return idx[j]
		}
		r -= q
	}
	return idx[len(idx)-1]
}

var samplings = []Sampling{
	{},
	{Temperature: 0.8, Seed: 1},
	{Temperature: 1.5, Seed: 2},
	{Temperature: 0.8, TopK: 40, Seed: 3},
	{Temperature: 0.8, TopK: 1, Seed: 4},
	{Temperature: 0.8, TopP: 0.9, Seed: 5},
	{Temperature: 0.3, TopP: 0.5, Seed: 6},
	{Temperature: 0.8, TopK: 40, TopP: 0.9, Seed: 7},
	{Temperature: 50, Seed: 8},                       // nearly flat: most tokens ranked
	{Temperature: 0.05, Seed: 9},                     // nearly greedy
	{Temperature: 5, TopP: 0.999999999999, Seed: 10}, // a nucleus rounding may never close
	{Temperature: 1, TopK: 3000, TopP: 0.95, Seed: 11},
	{Temperature: 1, TopP: math.Nextafter(1, 0), Seed: 12}, // may stay short of p by rounding
}

// TestSamplerMatchesReference: for every mode, the sampler draws the same
// tokens as the sort-everything specification from the same seed, step
// after step, on vocabularies with ties.
func TestSamplerMatchesReference(t *testing.T) {
	for _, s := range samplings {
		sm := newSampler(s)
		ref := rand.New(rand.NewPCG(s.Seed, 0x5a4dd))
		for step := range 200 {
			logits := randomLogits(3000-step*14, uint64(step)) // down to 214 tokens
			got, want := sm.next(logits), referenceNext(s, ref, logits)
			if got != want {
				t.Fatalf("%+v step %d: token %d, the specification draws %d", s, step, got, want)
			}
		}
	}
}

// TestSamplerDistribution: with temperature 1 the frequencies follow the
// softmax; top-k and top-p never draw outside their sets.
func TestSamplerDistribution(t *testing.T) {
	logits := []float32{2, 1, 0, -1, 1}
	var z float64
	for _, l := range logits {
		z += math.Exp(float64(l))
	}
	sm := newSampler(Sampling{Temperature: 1, Seed: 9})
	const n = 100000
	counts := make([]int, len(logits))
	for range n {
		counts[sm.next(logits)]++
	}
	for i, l := range logits {
		want := math.Exp(float64(l)) / z
		if got := float64(counts[i]) / n; math.Abs(got-want) > 0.01 {
			t.Errorf("token %d drawn %.4f of the time, softmax %.4f", i, got, want)
		}
	}
	// Top-2 keeps tokens 0 and 1 (1 ties with 4, the lower id wins). Token
	// 0's softmax is 0.52: top-p 0.5 keeps it alone, top-p 0.6 needs token
	// 1 too.
	for _, c := range []struct {
		s       Sampling
		allowed []int32
	}{
		{Sampling{Temperature: 1, TopK: 2, Seed: 1}, []int32{0, 1}},
		{Sampling{Temperature: 1, TopP: 0.6, Seed: 2}, []int32{0, 1}},
		{Sampling{Temperature: 1, TopP: 0.5, Seed: 3}, []int32{0}},
	} {
		sm := newSampler(c.s)
		seen := map[int32]bool{}
		for range 2000 {
			tok := sm.next(logits)
			if !slices.Contains(c.allowed, tok) {
				t.Fatalf("%+v drew %d, outside %v", c.s, tok, c.allowed)
			}
			seen[tok] = true
		}
		if len(seen) != len(c.allowed) {
			t.Fatalf("%+v drew only %v of %v", c.s, seen, c.allowed)
		}
	}
}

// BenchmarkSampler: one draw from 32,000 logits in each mode.
func BenchmarkSampler(b *testing.B) {
	logits := randomLogits(32000, 7)
	for _, c := range []struct {
		name string
		s    Sampling
	}{
		{"greedy", Sampling{}},
		{"temperature", Sampling{Temperature: 0.8, Seed: 1}},
		{"top-k-40", Sampling{Temperature: 0.8, TopK: 40, Seed: 1}},
		{"top-p-0.9", Sampling{Temperature: 0.8, TopP: 0.9, Seed: 1}},
		{"top-k-40-top-p-0.9", Sampling{Temperature: 0.8, TopK: 40, TopP: 0.9, Seed: 1}},
	} {
		b.Run(c.name, func(b *testing.B) {
			sm := newSampler(c.s)
			b.ReportAllocs()
			for b.Loop() {
				sm.next(logits)
			}
		})
		b.Run(c.name+"/sort-everything", func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			for b.Loop() {
				referenceNext(c.s, rng, logits)
			}
		})
	}
}

// A last shard's compact output (the K best logits, argmax.TopK) gives the
// sampler exactly the token the whole row gives, for greedy and for top-k
// (with top-p) sampling with k <= K, draw after draw: same candidates,
// same order, same weights, same random numbers. Rows have ties and
// repeated values, where the ranking's tie rule decides.
func TestCompactSamplingExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	for _, s := range []Sampling{
		{},
		{Temperature: 0.8, TopK: 40, TopP: 0.9, Seed: 3},
		{Temperature: 1.3, TopK: 40, Seed: 11},
		{Temperature: 0.5, TopK: 1, Seed: 5},
	} {
		k := s.Compact()
		if k == 0 {
			t.Fatalf("%+v: no compact form", s)
		}
		whole, top := newSampler(s), newSampler(s)
		var ids, heap []int32
		vals := make([]float32, 0, 64)
		for step := range 300 {
			row := make([]float32, 5000)
			for i := range row {
				row[i] = float32(rng.IntN(400)) / 40 // many ties
			}
			ids, heap = argmax.TopK(ids, heap, row, k+step%3) // K may exceed k
			vals = vals[:0]
			for _, id := range ids {
				vals = append(vals, row[id])
			}
			if a, b := whole.next(row), top.nextTop(ids, vals); a != b {
				t.Fatalf("%+v step %d: whole row %d, compact %d", s, step, a, b)
			}
		}
	}
	if (Sampling{Temperature: 1, TopP: 0.9}).Compact() != 0 {
		t.Fatal("top-p alone needs the whole row")
	}
}
