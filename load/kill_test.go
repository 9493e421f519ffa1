package load

import (
	"math"
	"testing"
	"time"
)

// aroundKill counts the tokens of the 3 s on each side of the kill, and
// gives nothing for a side the run did not cover.
func TestAroundKill(t *testing.T) {
	r := newRecorder(0)
	r.start = time.Unix(100, 0)
	r.killAt = r.start.Add(5 * time.Second)
	r.cutoff = r.start.Add(10 * time.Second)
	r.perTick = make([]int, 100)
	for i := range r.perTick {
		r.perTick[i] = 4 // 40 tokens/s
		if i >= 50 && i < 60 {
			r.perTick[i] = 1 // the first second after the kill: 10 tokens/s
		}
	}
	before, after := r.aroundKill()
	if before != 40 || math.Abs(after-30) > 1e-9 {
		t.Fatalf("before %v, after %v; want 40 and 30", before, after)
	}
	r.cutoff = r.start.Add(7 * time.Second) // arrivals ended 2 s after the kill
	if _, after := r.aroundKill(); after != 0 {
		t.Fatalf("after %v for a window past the arrivals", after)
	}
	r.killAt = r.start.Add(time.Second)
	if before, _ := r.aroundKill(); before != 0 {
		t.Fatalf("before %v for a kill 1 s in", before)
	}
}
