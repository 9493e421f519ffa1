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
	sess, err := h.s.Begin(id, epoch)
	if err != nil {
		t.Fatalf("begin %s: %v", id, err)
	}
	if err := h.s.Reserve(sess, tokens); err != nil {
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
	if _, err := h.s.Begin("d", 1); !errors.Is(err, ErrNoSlot) {
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
	if _, err := h.s.Begin("b", 1); !errors.Is(err, ErrNoSlot) {
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

	// KV tokens: c cannot grow into b's tokens while b is fresh.
	k := newHarness(Config{MaxSessions: 2, MaxTokens: 100, EvictGrace: 2 * time.Second})
	k.begin(t, "b", 1, 60)
	c := k.begin(t, "c", 1, 10)
	if err := k.s.Reserve(c, 50); !errors.Is(err, ErrKVBudget) {
		t.Fatalf("reserve within the grace: %v", err)
	}
	k.clock = k.clock.Add(3 * time.Second)
	k.s.Lookup("c")
	if err := k.s.Reserve(c, 50); err != nil {
		t.Fatalf("reserve after the grace: %v", err)
	}
}

// Scenario: the KV token budget evicts other idle sessions, never the one
// growing, and refuses when nothing can go.
func TestEvictionByTokens(t *testing.T) {
	h := newHarness(Config{MaxSessions: 4, MaxTokens: 50})
	h.begin(t, "a", 1, 20)
	b := h.begin(t, "b", 1, 20)
	if err := h.s.Reserve(b, 20); err != nil { // a must go
		t.Fatal(err)
	}
	if _, ok := h.s.Lookup("a"); ok || h.s.Tokens() != 40 {
		t.Fatalf("a kept, tokens %d", h.s.Tokens())
	}
	if err := h.s.Reserve(b, 20); !errors.Is(err, ErrKVBudget) {
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
	if _, err := h.s.Begin("a", 4); !errors.Is(err, ErrEpochStale) {
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
