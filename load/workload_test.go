package load

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/meshnet/shardd/engine"
	"github.com/meshnet/shardd/engine/enginetest"
)

// TestSharedPrefixes: every request starts with one of the N shared
// prompts, each of them is used, the rest is the request's own, and the
// same index gives the same request.
func TestSharedPrefixes(t *testing.T) {
	w := Workload{Prefixes: 3, PrefixLen: 5, Vocab: 1000, Seed: 9, Lengths: Lengths{Prompt: [2]int{4, 4}, Output: [2]int{2, 2}}}
	seen := map[int]bool{}
	var suffixes [][]int32
	for i := range 30 {
		p := w.request(i).Prompt
		if len(p) != 9 {
			t.Fatalf("request %d: %d tokens, want 5 + 4", i, len(p))
		}
		k := slices.IndexFunc([]int{0, 1, 2}, func(k int) bool { return slices.Equal(p[:5], w.prefix(k)) })
		if k < 0 {
			t.Fatalf("request %d starts with no shared prefix: %v", i, p[:5])
		}
		seen[k] = true
		suffixes = append(suffixes, p[5:])
		if !slices.Equal(p, w.request(i).Prompt) {
			t.Fatalf("request %d differs between draws", i)
		}
	}
	if len(seen) != 3 || slices.Equal(suffixes[0], suffixes[1]) {
		t.Fatalf("prefixes used %v; suffixes %v %v", seen, suffixes[0], suffixes[1])
	}
	if got := w.PromptLens(); got != [2]int{9, 9} {
		t.Fatalf("prompt lengths %v", got)
	}
	w.Turns = 4 // the last turn: prefix, 4 messages, 3 answers
	if got := w.PromptLens(); got != [2]int{9, 5 + 4*4 + 3*2} {
		t.Fatalf("prompt lengths with turns %v", got)
	}
}

// TestGammaArrivals: the gaps' mean is 1/rate whatever the shape, and
// their coefficient of variation is 1/sqrt(shape): 1 for Poisson.
func TestGammaArrivals(t *testing.T) {
	for _, k := range []float64{0.25, 1, 4} {
		w := Workload{Rate: 10, Burstiness: k, Seed: 3}
		gap := w.arrivals()
		const n = 40000
		var sum, sq float64
		for range n {
			g := gap().Seconds()
			sum += g
			sq += g * g
		}
		mean := sum / n
		cv := math.Sqrt(sq/n-mean*mean) / mean
		if math.Abs(mean-0.1) > 0.004 || math.Abs(cv-1/math.Sqrt(k)) > 0.06/math.Sqrt(k) {
			t.Errorf("shape %g: mean gap %.4f s (want 0.1), CV %.3f (want %.3f)", k, mean, cv, 1/math.Sqrt(k))
		}
	}
}

// TestConversations: with turns, every turn is a measured request, the
// report gives a TTFT per turn, and the later turns, which resend the
// history, still complete on a route that checks every position.
func TestConversations(t *testing.T) {
	workers := enginetest.ServeRoute(t, 2, time.Millisecond, engine.Config{})
	w := smallWorkload(2, 9)
	w.Turns = 3
	s, err := Run(context.Background(), Target{Name: "route", Addrs: workers, Workers: workers}, w, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Requests != 9 || s.Errors != 0 || s.OutputTokens != 72 || len(s.TurnTTFT) != 3 {
		t.Fatalf("requests %d errors %d tokens %d turns %v", s.Requests, s.Errors, s.OutputTokens, s.TurnTTFT)
	}
	for i, v := range s.TurnTTFT {
		if v <= 0 {
			t.Fatalf("turn %d: TTFT p50 %v", i+1, v)
		}
	}
}
