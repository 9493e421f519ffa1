package sched

import (
	"fmt"
	"testing"
	"time"
)

// The gathering rule as a script: sessions complete steps, then iterations
// with some decode rows ready ask whether to wait.
func TestGatherHolds(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// A forward of n rows is predicted at 10 ms + 1 ms per row.
	predict := func(rows int) (time.Duration, bool) { return time.Duration(10+rows) * time.Millisecond, true }
	none := func(int) (time.Duration, bool) { return 0, false }
	quiet := 250 * time.Millisecond

	var g gatherer
	for i := range 32 {
		id := fmt.Sprint("s", i)
		g.done(id, at(0)) // its prompt
		g.arrived(id, at(0))
		g.done(id, at(0)) // its first decode step
	}
	steps := []struct {
		now           int // ms
		ready, groups int
		window        time.Duration
		predict       func(int) (time.Duration, bool)
		want          time.Duration
	}{
		// 32 decoding, 2 groups: 16 wanted. 10 ready waits half of the
		// predicted 26 ms, counted from the first ask.
		{now: 1, ready: 10, groups: 2, predict: predict, want: 13 * time.Millisecond},
		{now: 5, ready: 12, groups: 2, predict: predict, want: 9 * time.Millisecond},
		// Enough ready: run, and the hold is over.
		{now: 6, ready: 16, groups: 2, predict: predict, want: 0},
		// A new hold starts afresh; it ends when its window is spent.
		{now: 20, ready: 3, groups: 2, predict: predict, want: 13 * time.Millisecond},
		{now: 33, ready: 3, groups: 2, predict: predict, want: 0},
		// A set window instead of the prediction.
		{now: 40, ready: 3, groups: 2, window: 2 * time.Millisecond, predict: predict, want: 2 * time.Millisecond},
		{now: 42, ready: 3, groups: 2, window: 2 * time.Millisecond, predict: predict, want: 0},
		// Gathering off, or nothing to predict with: run at once.
		{now: 50, ready: 3, groups: -1, predict: predict, want: 0},
		{now: 60, ready: 3, groups: 2, predict: none, want: 0},
		// Nothing ready: nothing to hold.
		{now: 70, ready: 0, groups: 2, predict: predict, want: 0},
	}
	for i, s := range steps {
		decoding := g.decoding(at(s.now), quiet, true)
		if decoding != 32 {
			t.Fatalf("step %d: %d decoding, want 32", i, decoding)
		}
		if got := g.hold(at(s.now), s.ready, decoding, s.groups, s.window, s.predict); got != s.want {
			t.Errorf("step %d (%+v): hold %v, want %v", i, s, got, s.want)
		}
	}
	// Three holds ended: 1-6 ms (the group formed), 20-33 ms and 40-42 ms
	// (their windows ran out).
	if g.holds != 3 || g.expired != 2 || g.held != 20*time.Millisecond {
		t.Errorf("holds %d, expired %d, held %v; want 3, 2, 20ms", g.holds, g.expired, g.held)
	}
}

// With an odd count of decoding sessions the groups differ by one (31 in
// 2 groups: 15 and 16): the smaller one runs as soon as it is all there,
// rather than waiting its window every trip for a 16th that is in the
// other group. Three sessions in 2 groups: the lone one runs at once.
func TestGatherOddGroups(t *testing.T) {
	t0 := time.Unix(1000, 0)
	predict := func(rows int) (time.Duration, bool) { return time.Duration(10+rows) * time.Millisecond, true }
	var g gatherer
	for _, c := range []struct {
		decoding, ready, groups int
		hold                    bool
	}{
		{31, 15, 2, false},
		{31, 14, 2, true},
		{32, 15, 2, true},
		{3, 1, 2, false},
		{33, 11, 3, false},
		{33, 10, 2, true},
	} {
		g.end(t0, false)
		if got := g.hold(t0, c.ready, c.decoding, c.groups, 0, predict) > 0; got != c.hold {
			t.Errorf("%d decoding in %d groups, %d ready: held %v, want %v", c.decoding, c.groups, c.ready, got, c.hold)
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
	// On a shard a prompt alone counts (its first step is on its way),
	// until the session sends another prompt instead; on the whole model
	// it does not.
	g.done("a", t0)
	if n := g.decoding(t0, time.Second, true); n != 1 {
		t.Fatalf("%d decoding after a prompt alone, want 1", n)
	}
	if n := g.decoding(t0, time.Second, false); n != 0 {
		t.Fatalf("one group: %d decoding after a prompt alone, want 0", n)
	}
	g.prompted("a")
	if n := g.decoding(t0, time.Second, true); n != 0 {
		t.Fatalf("%d decoding after a second prompt, want 0", n)
	}
	decoded("a", t0)
	if n := g.decoding(t0, time.Second, true); n != 1 {
		t.Fatalf("%d decoding, want 1", n)
	}
	if w := g.hold(t0, 1, 1, 2, 0, predict); w != 0 {
		t.Fatalf("a lone session waited %v", w)
	}
	decoded("b", t0)
	decoded("c", t0.Add(900*time.Millisecond))
	g.forget("a")
	if n := g.decoding(t0.Add(500*time.Millisecond), time.Second, true); n != 2 {
		t.Fatalf("after releasing a: %d decoding, want 2", n)
	}
	if n := g.decoding(t0.Add(1500*time.Millisecond), time.Second, true); n != 1 {
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

// A burst of prompts completing together (a closed loop's cohort starting
// again, two groups of 16): their first steps form one group of 16, not
// fragments of what arrived first; a hold that waited in vain stops
// counting the prompts that sent no step.
func TestGatherFreshCohort(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	predict := func(rows int) (time.Duration, bool) { return time.Duration(10+rows) * time.Millisecond, true }
	var g gatherer
	for i := range 32 {
		g.done(fmt.Sprint("s", i), at(0)) // every prompt done
	}
	// The first group's steps arrive one by one, 0.5 ms apart: each
	// waits for 16 (within the 13 ms window).
	half := func(k int) time.Time { return t0.Add(time.Duration(k) * 500 * time.Microsecond) }
	for k := 1; k < 16; k++ {
		g.arrived(fmt.Sprint("s", k-1), half(k))
		d := g.decoding(half(k), time.Second, true)
		if d != 32 {
			t.Fatalf("%d arrived: %d decoding, want 32", k, d)
		}
		if w := g.hold(half(k), k, d, 2, 0, predict); w == 0 {
			t.Fatalf("%d of 16 arrived: ran", k)
		}
	}
	g.arrived("s15", half(16))
	if w := g.hold(half(16), 16, g.decoding(half(16), time.Second, true), 2, 0, predict); w != 0 {
		t.Fatalf("16 arrived: held %v", w)
	}
	for k := range 16 {
		g.done(fmt.Sprint("s", k), at(40))
	}
	// s16-s31 sent no step: one window (half of 26 ms) is waited, once.
	g.arrived("s0", at(100))
	if w := g.hold(at(100), 1, g.decoding(at(100), time.Second, true), 2, 0, predict); w != 13*time.Millisecond {
		t.Fatalf("held %v, want 13ms", w)
	}
	if w := g.hold(at(113), 1, g.decoding(at(113), time.Second, true), 2, 0, predict); w != 0 {
		t.Fatalf("after the window: held %v", w)
	}
	if d := g.decoding(at(114), time.Second, true); d != 16 {
		t.Fatalf("after a hold in vain: %d decoding, want the 16 that decoded", d)
	}
}
