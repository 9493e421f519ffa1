package kvcache

import (
	"errors"
	"slices"
	"testing"
	"time"
)

type harness struct {
	s     *Store
	freed []int
	clock time.Time
}

func newHarness(cfg Config) *harness {
	h := &harness{clock: time.Unix(1000, 0)}
	h.s = New(cfg, func(seq int) { h.freed = append(h.freed, seq) }, func() time.Time { return h.clock })
	return h
}

func (h *harness) begin(t *testing.T, id string, epoch uint64, tokens int) *Session {
	t.Helper()
	sess, err := h.s.Begin(id, epoch, 0)
	if err != nil {
		t.Fatalf("begin %s: %v", id, err)
	}
	if err := h.s.Reserve(sess, tokens, false); err != nil {
		t.Fatalf("reserve %s: %v", id, err)
	}
	return sess
}

// Scenario: sessions fill the slots; the least recently used idle session is
// evicted for a new one, its sequence freed; a pinned one never is.
func TestEvictionBySessions(t *testing.T) {
	h := newHarness(Config{MaxSessions: 2, MaxTokens: 100})
	a := h.begin(t, "a", 1, 10)
	b := h.begin(t, "b", 1, 10)
	h.clock = h.clock.Add(time.Second)
	h.s.Lookup("a") // b is now least recently used
	c := h.begin(t, "c", 1, 10)
	if _, ok := h.s.Lookup("b"); ok {
		t.Fatal("b survived")
	}
	if c.Seq != b.Seq || !slices.Equal(h.freed, []int{b.Seq}) {
		t.Fatalf("c took seq %d, freed %v", c.Seq, h.freed)
	}
	if h.s.Tokens() != 20 || h.s.Evictions != 1 {
		t.Fatalf("tokens %d evictions %d", h.s.Tokens(), h.s.Evictions)
	}
	a.Pins, c.Pins = 1, 1
	if h.s.CanAdmit("d") {
		t.Fatal("admits with every session pinned")
	}
	if _, err := h.s.Begin("d", 1, 0); !errors.Is(err, ErrNoSlot) {
		t.Fatalf("got %v", err)
	}
	c.Pins = 0
	if !h.s.CanAdmit("d") {
		t.Fatal("refuses with an idle session to evict")
	}
}

// Scenario: with a grace, a session used within it is not evicted for a
// newcomer (which is refused, for a slot or for KV tokens); once the grace
// has passed it is.
func TestEvictGrace(t *testing.T) {
	h := newHarness(Config{MaxSessions: 1, MaxTokens: 100, EvictGrace: 2 * time.Second})
	h.begin(t, "a", 1, 10)
	h.clock = h.clock.Add(time.Second)
	if h.s.CanAdmit("b") {
		t.Fatal("admits by evicting a session used a second ago")
	}
	if _, err := h.s.Begin("b", 1, 0); !errors.Is(err, ErrNoSlot) {
		t.Fatalf("begin b within the grace: %v", err)
	}
	h.clock = h.clock.Add(time.Second)
	if !h.s.CanAdmit("b") {
		t.Fatal("refuses once the grace has passed")
	}
	h.begin(t, "b", 1, 10)
	if _, ok := h.s.Lookup("a"); ok || h.s.Evictions != 1 {
		t.Fatalf("a survived, evictions %d", h.s.Evictions)
	}

	// KV tokens: a newcomer's prompt (preempt false) cannot take b's
	// tokens while b is fresh; once the grace has passed it can.
	k := newHarness(Config{MaxSessions: 2, MaxTokens: 100, EvictGrace: 2 * time.Second})
	k.begin(t, "b", 1, 60)
	c := k.begin(t, "c", 1, 10)
	if err := k.s.Reserve(c, 50, false); !errors.Is(err, ErrKVBudget) {
		t.Fatalf("reserve within the grace: %v", err)
	}
	k.clock = k.clock.Add(3 * time.Second)
	k.s.Lookup("c")
	if err := k.s.Reserve(c, 50, false); err != nil {
		t.Fatalf("reserve after the grace: %v", err)
	}
}

// Scenario: an admitted session's step (preempt true) takes the tokens of
// an idle session however fresh, least recently used first, and fails
// only when every other session is pinned.
func TestPreemptForAdmittedSteps(t *testing.T) {
	h := newHarness(Config{MaxSessions: 3, MaxTokens: 100, EvictGrace: time.Hour})
	a := h.begin(t, "a", 1, 40)
	h.begin(t, "b", 1, 30)
	h.clock = h.clock.Add(time.Millisecond)
	c := h.begin(t, "c", 1, 30)
	if err := h.s.Reserve(c, 10, true); err != nil {
		t.Fatalf("c grows: %v", err)
	}
	if _, ok := h.s.Peek("a"); ok || h.s.Preemptions != 1 || h.s.Evictions != 0 {
		t.Fatalf("a (least recently used) kept; preemptions %d evictions %d", h.s.Preemptions, h.s.Evictions)
	}
	if h.s.Committed() != 70 || h.s.Tokens() != 70 || a.PastLen != 40 {
		t.Fatalf("committed %d tokens %d", h.s.Committed(), h.s.Tokens())
	}
	b, _ := h.s.Peek("b")
	b.Pins = 1
	if err := h.s.Reserve(c, 31, true); !errors.Is(err, ErrKVBudget) {
		t.Fatalf("growth with every other session pinned: %v", err)
	}
	// a's head finds it gone and prefills it again: a re-prefill, counted
	// once it is admitted.
	if _, err := h.s.Begin("a", 1, 40); !errors.Is(err, ErrKVBudget) || h.s.Reprefills != 0 {
		t.Fatalf("a again, beyond the budget: %v, re-prefills %d", err, h.s.Reprefills)
	}
	if _, err := h.s.Begin("a", 1, 0); err != nil || h.s.Reprefills != 1 {
		t.Fatalf("a again: %v, re-prefills %d", err, h.s.Reprefills)
	}
}

// Scenario: reservations. A session that states its length is admitted
// only when it fits beside every other promise, and then grows to it
// without taking anything; a newcomer that does not fit is refused and
// leaves no trace; a length over the whole budget is refused for good.
func TestReservations(t *testing.T) {
	h := newHarness(Config{MaxSessions: 4, MaxTokens: 100, EvictGrace: time.Hour})
	a, err := h.s.Begin("a", 1, 60)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.s.Reserve(a, 10, false); err != nil || h.s.Committed() != 60 {
		t.Fatalf("a's prompt: %v, committed %d", err, h.s.Committed())
	}
	if _, err := h.s.Begin("b", 1, 50); !errors.Is(err, ErrKVBudget) || h.s.Len() != 1 || h.s.Refused != 1 {
		t.Fatalf("b over the promises: %v, %d sessions, refused %d", err, h.s.Len(), h.s.Refused)
	}
	c, err := h.s.Begin("c", 1, 40)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.s.Reserve(c, 40, false); err != nil {
		t.Fatalf("c within its promise: %v", err)
	}
	for range 50 { // a decodes to its reservation: no one is touched
		if err := h.s.Reserve(a, 1, true); err != nil {
			t.Fatal(err)
		}
	}
	if h.s.Len() != 2 || h.s.Preemptions != 0 || h.s.Committed() != 100 || h.s.Tokens() != 100 {
		t.Fatalf("%d sessions, preemptions %d, committed %d, tokens %d", h.s.Len(), h.s.Preemptions, h.s.Committed(), h.s.Tokens())
	}
	if err := h.s.Reserve(a, 1, true); err != nil || h.s.Preemptions != 1 {
		t.Fatalf("a past its reservation: %v, preemptions %d", err, h.s.Preemptions)
	}
	h.s.Truncate(a, 30)
	if h.s.Committed() != 60 {
		t.Fatalf("committed %d after a rewind below the reservation", h.s.Committed())
	}
	if _, err := h.s.Begin("d", 1, 101); !errors.Is(err, ErrTooLong) {
		t.Fatalf("longer than the budget: %v", err)
	}
	if _, err := h.s.Release("a", 1); err != nil || h.s.Committed() != 0 || h.s.Tokens() != 0 {
		t.Fatalf("release: %v, committed %d", err, h.s.Committed())
	}
	if h.s.Admitted != 2 || h.s.Refused != 2 {
		t.Fatalf("admitted %d refused %d", h.s.Admitted, h.s.Refused)
	}
}

// Scenario: the KV token budget evicts other idle sessions, never the one
// growing, and refuses when nothing can go.
func TestEvictionByTokens(t *testing.T) {
	h := newHarness(Config{MaxSessions: 4, MaxTokens: 50})
	h.begin(t, "a", 1, 20)
	b := h.begin(t, "b", 1, 20)
	if err := h.s.Reserve(b, 20, false); err != nil { // a must go
		t.Fatal(err)
	}
	if _, ok := h.s.Lookup("a"); ok || h.s.Tokens() != 40 {
		t.Fatalf("a kept, tokens %d", h.s.Tokens())
	}
	if err := h.s.Reserve(b, 20, false); !errors.Is(err, ErrKVBudget) {
		t.Fatalf("over budget with nothing to evict: %v", err)
	}
	h.s.Truncate(b, 10)
	if h.s.Tokens() != 10 || b.PastLen != 10 {
		t.Fatalf("truncate: tokens %d past %d", h.s.Tokens(), b.PastLen)
	}
}

// Scenario: epochs. Older is stale; newer supersedes and drops state.
func TestEpochs(t *testing.T) {
	h := newHarness(Config{MaxSessions: 2, MaxTokens: 100})
	s := h.begin(t, "a", 5, 10)
	s.LastStep, s.HasStep = 7, true
	if _, err := h.s.Begin("a", 4, 0); !errors.Is(err, ErrEpochStale) {
		t.Fatalf("older epoch: %v", err)
	}
	if err := h.s.CheckEpoch("a", 4); !errors.Is(err, ErrEpochStale) {
		t.Fatal("CheckEpoch missed a stale epoch")
	}
	// Same epoch: a fresh prefill keeps the step history.
	s2 := h.begin(t, "a", 5, 3)
	if s2 != s || !s.HasStep || s.PastLen != 3 {
		t.Fatalf("re-prefill: %+v", s)
	}
	// Newer epoch: state and steps superseded.
	h.begin(t, "a", 6, 0)
	if s.Epoch != 6 || s.HasStep || s.PastLen != 0 || h.s.Tokens() != 0 {
		t.Fatalf("new epoch: %+v tokens %d", s, h.s.Tokens())
	}
	if released, err := h.s.Release("a", 5); released || !errors.Is(err, ErrEpochStale) {
		t.Fatalf("stale release: %v %v", released, err)
	}
	if released, err := h.s.Release("a", 6); !released || err != nil {
		t.Fatalf("release: %v %v", released, err)
	}
	if released, err := h.s.Release("a", 6); released || err != nil {
		t.Fatalf("release again must be a quiet success: %v %v", released, err)
	}
}

// Scenario: TTL evicts idle sessions only.
func TestTTL(t *testing.T) {
	h := newHarness(Config{MaxSessions: 3, MaxTokens: 100, TTL: time.Minute})
	h.begin(t, "old", 1, 5)
	pinned := h.begin(t, "pinned", 1, 5)
	pinned.Pins = 1
	h.clock = h.clock.Add(50 * time.Second)
	h.begin(t, "new", 1, 5)
	h.clock = h.clock.Add(20 * time.Second)
	h.s.Sweep()
	if _, ok := h.s.Lookup("old"); ok {
		t.Fatal("expired session kept")
	}
	for _, id := range []string{"pinned", "new"} {
		if _, ok := h.s.Lookup(id); !ok {
			t.Fatalf("%s evicted", id)
		}
	}
	if h.s.Len() != 2 || h.s.Tokens() != 10 {
		t.Fatalf("len %d tokens %d", h.s.Len(), h.s.Tokens())
	}
}

// Scenario: with a cap per session (a KV stream each), a length or a
// growth past it is refused for good, whatever is free elsewhere.
func TestSessionCap(t *testing.T) {
	h := newHarness(Config{MaxSessions: 4, MaxTokens: 400, SessionTokens: 100})
	if _, err := h.s.Begin("a", 1, 101); !errors.Is(err, ErrTooLong) {
		t.Fatalf("a length past the cap: %v", err)
	}
	b := h.begin(t, "b", 1, 90)
	if err := h.s.Reserve(b, 11, true); !errors.Is(err, ErrTooLong) {
		t.Fatalf("growth past the cap: %v", err)
	}
	if err := h.s.Reserve(b, 10, true); err != nil || b.PastLen != 100 {
		t.Fatalf("growth to the cap: %v, %d", err, b.PastLen)
	}
}
