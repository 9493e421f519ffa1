package engine

import (
	"fmt"
	"testing"
	"time"
)

// The gathering rule as a script: 32 sessions move in two uneven groups,
// A (14) and B (18), each step coming back 27 ms after the last one
// completed, B one 26 ms forward behind A. Iterations with some decode
// rows ready ask whether to wait for more.
func TestGatherHolds(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// A forward of n rows is predicted at 10 ms + 1 ms per row: 16 rows,
	// 26 ms, so a hold for them lasts at most 13 ms.
	predict := func(rows int) (time.Duration, bool) { return time.Duration(10+rows) * time.Millisecond, true }
	none := func(int) (time.Duration, bool) { return 0, false }
	quiet := 250 * time.Millisecond
	ids := func(lo, hi int) []string {
		var v []string
		for i := lo; i < hi; i++ {
			v = append(v, fmt.Sprint("s", i))
		}
		return v
	}
	A, B := ids(0, 14), ids(14, 32)
	var g gatherer
	for _, id := range A {
		g.done(id, at(-27))
		g.arrived(id, at(0))
		g.done(id, at(0)) // next step expected at 27 ms
	}
	for _, id := range B {
		g.done(id, at(-1))
		g.arrived(id, at(26))
		g.done(id, at(26)) // next step expected at 53 ms
	}
	steps := []struct {
		now           int      // ms
		arrive        []string // steps arriving just before the ask
		done          []string // steps completed just before the ask
		ready, groups int
		window        time.Duration
		predict       func(int) (time.Duration, bool)
		want          time.Duration
	}{
		// 32 decoding, 2 groups: 16 wanted. A's first 10 are in; its other
		// 4 are due now: wait for them, dueSlack at a time.
		{now: 27, arrive: A[:10], ready: 10, groups: 2, predict: predict, want: 2 * time.Millisecond},
		// All of A is in. The 2 rows still wanted are B's, due at 53 ms,
		// past the hold's end at 40: run now rather than idle 12 ms.
		{now: 28, arrive: A[10:], ready: 14, groups: 2, predict: predict, want: 0},
		// B comes back with 3 of its rows late: wait for them while they
		// are expected, but no longer than the window.
		{now: 53, done: A, arrive: B[:15], ready: 15, groups: 2, predict: predict, want: 2 * time.Millisecond},
		{now: 55, ready: 15, groups: 2, predict: predict, want: 2 * time.Millisecond},
		{now: 66, ready: 15, groups: 2, predict: predict, want: 0},
		// Enough ready: run, whatever is still expected.
		{now: 67, arrive: B[15:17], ready: 17, groups: 2, predict: predict, want: 0},
		// A set window instead of the prediction (A, done at 53, is due at
		// 80); a new hold starts afresh and ends when its window is spent.
		{now: 80, done: B, arrive: A[:5], ready: 5, groups: 2, window: time.Millisecond, predict: predict, want: time.Millisecond},
		{now: 81, ready: 5, groups: 2, window: time.Millisecond, predict: predict, want: 0},
		// Gathering off, or nothing to predict with: run at once.
		{now: 82, ready: 5, groups: -1, predict: predict, want: 0},
		{now: 82, ready: 5, groups: 2, predict: none, want: 0},
		// Nothing ready: nothing to hold.
		{now: 82, ready: 0, groups: 2, predict: predict, want: 0},
	}
	for i, s := range steps {
		for _, id := range s.done {
			g.done(id, at(s.now))
		}
		for _, id := range s.arrive {
			g.arrived(id, at(s.now))
		}
		decoding := g.decoding(at(s.now), quiet)
		if decoding != 32 {
			t.Fatalf("step %d: %d decoding, want 32", i, decoding)
		}
		if got := g.hold(at(s.now), s.ready, decoding, s.groups, s.window, s.predict); got != s.want {
			t.Errorf("step %d (now %d ms, %d ready): hold %v, want %v", i, s.now, s.ready, got, s.want)
		}
	}
}

// Sessions stop counting as decoding when released or quiet for longer
// than the quiet time; one decoding session never waits.
func TestGatherDecodingSessions(t *testing.T) {
	t0 := time.Unix(1000, 0)
	predict := func(rows int) (time.Duration, bool) { return 50 * time.Millisecond, true }
	var g gatherer
	// decoded: a session's prompt done at, then a decode step arriving
	// and done at once.
	decoded := func(id string, at time.Time) {
		g.done(id, at)
		g.arrived(id, at)
		g.done(id, at)
	}
	g.done("a", t0)
	if n := g.decoding(t0, time.Second); n != 0 {
		t.Fatalf("%d decoding after a prompt alone, want 0", n)
	}
	decoded("a", t0)
	if n := g.decoding(t0, time.Second); n != 1 {
		t.Fatalf("%d decoding, want 1", n)
	}
	if w := g.hold(t0, 1, 1, 2, 0, predict); w != 0 {
		t.Fatalf("a lone session waited %v", w)
	}
	decoded("b", t0)
	decoded("c", t0.Add(900*time.Millisecond))
	g.forget("a")
	if n := g.decoding(t0.Add(500*time.Millisecond), time.Second); n != 2 {
		t.Fatalf("after releasing a: %d decoding, want 2", n)
	}
	if n := g.decoding(t0.Add(1500*time.Millisecond), time.Second); n != 1 {
		t.Fatalf("after b went quiet: %d decoding, want 1", n)
	}
	if _, ok := g.last["b"]; ok {
		t.Fatal("a quiet session is still remembered")
	}
}

// When the next decode step is due: each session's last completion plus
// its usual gap, skipping sessions whose step has arrived and steps
// overdue by more than their gap (at least dueSlack).
func TestGatherDue(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	var g gatherer
	if _, ok := g.due(at(0)); ok {
		t.Fatal("due with no session")
	}
	// a: completes at 0, its step comes back 3 ms later, twice.
	g.done("a", at(0))
	if _, ok := g.due(at(1)); ok {
		t.Fatal("due before any gap was seen")
	}
	g.arrived("a", at(3))
	if _, ok := g.due(at(3.5)); ok {
		t.Fatal("due while a's step is queued")
	}
	g.done("a", at(10))
	g.arrived("a", at(13))
	g.done("a", at(20))
	if d, ok := g.due(at(21)); !ok || !d.Equal(at(23)) {
		t.Fatalf("due %v %v, want 23 ms", d.Sub(t0), ok)
	}
	// b: a longer gap, 8 ms; a's step stays the first due.
	g.done("b", at(0))
	g.arrived("b", at(8))
	g.done("b", at(19))
	if d, _ := g.due(at(21)); !d.Equal(at(23)) {
		t.Fatalf("due %v, want a's 23 ms", d.Sub(t0))
	}
	// a overdue by more than max(gap, dueSlack) = 3 ms: b's 27 ms.
	if d, _ := g.due(at(26.5)); !d.Equal(at(27)) {
		t.Fatalf("due %v, want b's 27 ms", d.Sub(t0))
	}
	// A duplicate arrival does not count as a gap; a released session is
	// forgotten.
	g.arrived("b", at(30))
	g.arrived("b", at(90))
	g.done("b", at(31))
	if d, _ := g.due(at(32)); !d.Equal(at(31).Add(g.gap["b"].v)) || g.gap["b"].v != 8*time.Millisecond+(11*time.Millisecond-8*time.Millisecond)/8 {
		t.Fatalf("b's gap %v", g.gap["b"].v)
	}
	g.forget("b")
	if _, ok := g.due(at(32)); ok {
		t.Fatal("a released session is still due")
	}
}
