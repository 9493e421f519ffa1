package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/backend/backendtest"
	"github.com/meshnet/shardd/engine/sched"
)

// prefixScript is a script over a whole-model shard (token ids in, logits
// out: the shard that keeps no output rows in its entries) whose fake
// backend saves and loads sequences, so the scheduler keeps a prefix cache
// of blocks of 4 positions. Every script token is 0, so every prompt of a
// length is the same prompt.
func prefixScript(t *testing.T, cfg Config) (*script, *backendtest.Stater) {
	sc := newScript(t, cfg, func(i *backend.Info) { i.LogitsOut = true })
	st := backendtest.NewStater(sc.fb)
	sc.e.be, sc.d.be = st, st
	sc.s.EnablePrefix(sched.PrefixConfig{Bytes: 1 << 20, Block: 4, Seed: [32]byte{7}})
	return sc, st
}

// settled runs the driver's iterations (plan, effects, forward, outcome)
// until nothing is pending, checking after each that every session's
// position is where its cells end.
func (sc *script) settled() {
	sc.t.Helper()
	sc.agree("before")
	for i := range 64 {
		if sc.s.Pending() == 0 {
			return
		}
		sc.s.ClearWake()
		sc.d.step()
		sc.agree(fmt.Sprintf("after iteration %d", i))
		sc.now = sc.now.Add(time.Millisecond)
	}
	sc.t.Fatal("work still pending after 64 iterations")
}

// stats are the scheduler's figures now.
func (sc *script) stats() Stats {
	var st Stats
	sc.s.Stats(&st)
	return st
}

// agree fails the test when a session's position and its cells disagree.
func (sc *script) agree(when string) {
	sc.t.Helper()
	if err := sc.d.positionsAgree(); err != nil {
		sc.t.Fatalf("%s: %v", when, err)
	}
}

// preemptPlanned plans the queued work and has its forward preempted
// before it runs: the items stay admitted, their rows not run.
func (sc *script) preemptPlanned() {
	sc.t.Helper()
	sc.plan()
	sc.s.Advance(sc.now, sched.Outcome{Preempted: true})
	sc.d.apply()
	sc.agree("after a preempted forward")
}

// Scripted interleavings of the prefix cache with the ways a session's
// state changes under churn. Each ends with a session "z" whose prompt
// matches what the cache may hold: it must run to its end (its rows
// continue its cells), answered from the cache only as far as cells that
// were computed, and every step keeps positions and cells in agreement.
// A chain is fed when a chunk is admitted, before its rows run; an entry
// made from it must not claim blocks whose cells never ran.
func TestPrefixCacheChurn(t *testing.T) {
	// Each scenario leaves session "a" with an entry of one block of 4
	// (its first chunk) and a second chunk [4, 8) that was admitted (fed
	// to the chain) but never ran; then its state goes away.
	unrun := func(sc *script) {
		sc.submit("a", 4)
		sc.settled()
		sc.expect("a's first chunk", sc.replies("a"), "ack 1")
		sc.submit("a", 4)
		sc.preemptPlanned()
		sc.s.Cancel(sc.now, "a", 1, "")
		sc.d.apply()
		sc.expect("a's second chunk", sc.replies("a"), "CANCELLED 2")
		sc.agree("after the cancel")
	}
	cases := []struct {
		name string
		cfg  Config
		run  func(sc *script, st *backendtest.Stater)
		// z is the last session's prompt; hit the rows it must find in
		// the cache.
		z, hit int
	}{
		{name: "cancelled then released", z: 8, hit: 4, run: func(sc *script, _ *backendtest.Stater) {
			unrun(sc)
			sc.s.Release(sc.now, "a", 1)
			sc.d.apply()
		}},
		{name: "cancelled then expired", cfg: Config{SessionTTL: time.Second}, z: 8, hit: 4, run: func(sc *script, _ *backendtest.Stater) {
			unrun(sc)
			sc.now = sc.now.Add(2 * time.Second)
			sc.s.Sweep(sc.now)
			sc.d.apply()
		}},
		{name: "cancelled then evicted by a newcomer", cfg: Config{MaxSessions: 1}, z: 8, hit: 4, run: func(sc *script, _ *backendtest.Stater) {
			unrun(sc)
			sc.submit("b", 2)
			sc.settled()
			sc.expect("b", sc.replies("b"), "ack 1")
		}},
		{name: "preempted, then run and released", z: 8, hit: 7, run: func(sc *script, _ *backendtest.Stater) {
			sc.submit("a", 4)
			sc.settled()
			sc.submit("a", 4)
			sc.preemptPlanned()
			sc.settled()
			sc.expect("a", sc.replies("a"), "ack 1, ack 2")
			sc.s.Release(sc.now, "a", 1)
			sc.d.apply()
		}},
		{name: "cells out of order from position 4", z: 8, hit: 4, run: func(sc *script, st *backendtest.Stater) {
			sc.submit("a", 4)
			sc.settled()
			sess, _ := sc.s.Store().Peek("a")
			st.OrderFrom[sess.Seq] = 4 // a's later cells land before its earlier ones
			sc.submit("a", 4)
			sc.settled()
			sc.expect("a", sc.replies("a"), "ack 1, ack 2")
			sc.s.Release(sc.now, "a", 1)
			sc.d.apply()
		}},
		{name: "a load finds no room, then the next chunk", z: 4, hit: 0, run: func(sc *script, st *backendtest.Stater) {
			sc.submit("a", 8)
			sc.settled()
			sc.expect("a", sc.replies("a"), "ack 1")
			st.LoadFull = true
			sc.submit("b", 4) // 3 rows from the cache, but the load fails: all run
			sc.settled()
			sc.expect("b", sc.replies("b"), "ack 1")
			if st := sc.stats(); st.PrefixMisfits != 1 {
				sc.t.Fatalf("%d misfits, want 1", st.PrefixMisfits)
			}
			sc.submit("b", 4)
			sc.settled()
			sc.expect("b's next chunk", sc.replies("b"), "ack 2")
			st.LoadFull = false
			sc.s.Release(sc.now, "a", 1)
			sc.s.Release(sc.now, "b", 1)
			sc.d.apply()
			sc.s.FlushPrefix()
		}},
		{name: "a duplicate of a step answered from the cache", z: 8, hit: 7, run: func(sc *script, _ *backendtest.Stater) {
			sc.submit("a", 8)
			sc.settled()
			sc.submit("b", 8)
			sc.settled()
			sc.expect("b", sc.replies("b"), "ack 1")
			p := sc.next["b"]
			p.step, p.pos = 0, 0
			sc.submit("b", 8)
			sc.settled()
			sc.expect("b again", sc.replies("b"), "dup 1")
			sc.s.Release(sc.now, "b", 1)
			sc.d.apply()
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sc, st := prefixScript(t, c.cfg)
			c.run(sc, st)
			sc.agree("after the scenario")
			tokens := sc.stats().PrefixTokens
			sc.submit("z", c.z)
			sc.settled()
			if got := sc.replies("z"); got != "ack 1" {
				t.Fatalf("the last session got %q", got)
			}
			if got := sc.stats().PrefixTokens - tokens; got != int64(c.hit) {
				t.Fatalf("the last session's prompt of %d had %d rows from the cache, want %d", c.z, got, c.hit)
			}
		})
	}
}
