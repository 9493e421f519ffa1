package engine

import (
	"fmt"
	"testing"
	"time"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/tensorname"
)

// Scenario: admitted sessions outgrow the KV budget (256 cells, four
// sessions that state no length and decode in turn to 76 tokens each). No
// step of theirs is refused for lack of cells: each takes the cells of the
// idle session used longest ago, whose next step is a declared CACHE_MISS
// (actual_past_len 0); its head prefills it again and it goes on. The
// counters say so.
func TestAdmittedSessionsOutgrowKV(t *testing.T) {
	whole, _ := tinyFiles(t)
	w := startLlama(t, whole, Config{MaxSessions: 4, EvictGrace: time.Hour})
	type gen struct {
		s    *session
		past int
		step uint64
	}
	gens := make([]*gen, 4)
	prompt := make([]int32, 16)
	for i := range prompt {
		prompt[i] = int32(1 + i)
	}
	prefill := func(g *gen) {
		t.Helper()
		g.step++
		if o := g.s.prefillTokens(g.step, prompt...); o.ack == nil {
			t.Fatalf("%s prefill: %v", g.s.id, o.status)
		}
		g.past = len(prompt)
	}
	for i := range gens {
		gens[i] = &gen{s: w.open(t, fmt.Sprintf("grow-%d", i), 1)}
		prefill(gens[i])
	}
	misses := 0
	for round := range 60 {
		for _, g := range gens {
			g.step++
			o := g.s.decodeToken(g.step, g.past, int32(20+round))
			switch code(o) {
			case cUnspec:
				g.past++
			case cMiss:
				if o.status.Error.ActualPastLen != 0 {
					t.Fatalf("%s: a miss holding %d", g.s.id, o.status.Error.ActualPastLen)
				}
				misses++
				prefill(g)
			default:
				t.Fatalf("%s round %d: a step of an admitted session refused: %v", g.s.id, round, o.status)
			}
		}
	}
	var admitted, refused, preempted, reprefilled uint64
	waitFor(t, w.eng, func() bool {
		st := w.eng.sched.Store()
		admitted, refused, preempted, reprefilled = st.Admitted, st.Refused, st.Preemptions, st.Reprefills
		return true
	})
	if misses == 0 || preempted != uint64(misses) || reprefilled != uint64(misses) || refused != 0 || admitted != uint64(4+misses) {
		t.Fatalf("misses %d: admitted %d refused %d preempted %d re-prefilled %d", misses, admitted, refused, preempted, reprefilled)
	}
}

// Scenario: a session that states its length (session_tokens) is admitted
// only with that many cells free beside the others' promises; otherwise
// its first prefill is refused, retryably, and nothing of it stays. Once
// the others release, the same prefill is admitted and the session grows
// to its length without taking anyone's cells.
func TestReservedAdmission(t *testing.T) {
	whole, _ := tinyFiles(t)
	w := startLlama(t, whole, Config{MaxSessions: 4, EvictGrace: time.Hour})
	first := func(s *session, step uint64, length int32, ids ...int32) outcome {
		s.chunk(s.envelope(step, prefill, 0, len(ids), 0), s.tokensTensor(ids), s.scalar(tensorname.SessionTokens, length))
		return s.result()
	}
	a, b := w.open(t, "resv-a", 1), w.open(t, "resv-b", 1)
	if o := first(a, 1, 200, 1, 2, 3); o.ack == nil {
		t.Fatalf("a: %v", o.status)
	}
	o := first(b, 1, 100, 4, 5)
	if code(o) != cExhausted || !o.status.Error.Retryable {
		t.Fatalf("b beyond the promises: %v", o.status)
	}
	if o := b.decodeToken(2, 2, 6); code(o) != cMiss {
		t.Fatalf("b kept state after its refusal: %v", o.status)
	}
	for pos := 3; pos < 200; pos++ { // a grows to its length untouched
		if o := a.decodeToken(uint64(pos-1), pos, 7); o.ack == nil {
			t.Fatalf("a at %d: %v", pos, o.status)
		}
	}
	if o := first(b, 3, 300, 4, 5); code(o) != cExhausted || o.status.Error.Retryable {
		t.Fatalf("b longer than the whole budget: %v", o.status)
	}
	a.send(&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Release{Release: &shardv1.ReleaseSignal{RouteSessionId: a.id, RouteEpoch: 1}}})
	waitFor(t, w.eng, func() bool { return w.eng.sched.Store().Len() == 0 })
	if o := first(b, 4, 100, 4, 5); o.ack == nil {
		t.Fatalf("b after a's release: %v", o.status)
	}
}
