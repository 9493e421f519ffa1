package engine

import "time"

// gatherer decides how long an iteration that has decode steps ready waits
// for the decode steps it expects to arrive within a short window, so that
// sessions decoding together share one forward instead of falling into
// small groups that take turns (each group's results go out while the next
// group's steps arrive, and an iteration starts with whatever has arrived).
//
// It predicts a session's next decode step from when its last step
// completed plus the measured turnaround (the time from a step's completion
// to the session's next decode step arriving: the head's and the other
// hops' share of a token). It waits only for sessions predicted before the
// window ends, so on a pipelined route the sessions whose steps are at
// another stage (turnaround about that stage's forward) are not waited
// for, and the groups that pipelining needs stay apart. The window is at
// most Max and half a decode forward, so a step never waits longer than
// half the time its own forward takes.
//
// All of it belongs to the scheduler goroutine.
type gatherer struct {
	max time.Duration // 0: never wait
	// expect holds, per route session, when its last decode step (or its
	// prefill's final chunk) completed: its next decode step is due.
	expect map[string]time.Time
	turn   ewma // completion to the next decode step's arrival
	fwd    ewma // a forward with decode rows
	// Counters published for metrics.
	waits  int64         // iterations that waited
	waited time.Duration // their total wait
}

// ewma is an exponentially weighted moving average of durations (weight
// 1/8 for a new sample).
type ewma struct {
	v  time.Duration
	ok bool
}

func (a *ewma) add(d time.Duration) {
	if !a.ok {
		a.v, a.ok = d, true
		return
	}
	a.v += (d - a.v) / 8
}

func newGatherer(max time.Duration) gatherer {
	return gatherer{max: max, expect: map[string]time.Time{}}
}

// completed records that session's step finished at now; its next decode
// step is expected.
func (g *gatherer) completed(session string, now time.Time) {
	if g.max > 0 {
		g.expect[session] = now
	}
}

// arrived records a decode step of session arriving at now.
func (g *gatherer) arrived(session string, now time.Time) {
	if t, ok := g.expect[session]; ok {
		g.turn.add(now.Sub(t))
		delete(g.expect, session)
	}
}

// forget drops a session that ended.
func (g *gatherer) forget(session string) { delete(g.expect, session) }

// window is how long after the oldest ready decode step an iteration may
// wait for more.
func (g *gatherer) window() time.Duration {
	if !g.fwd.ok {
		return 0
	}
	return min(g.max, g.fwd.v/2)
}

// deadline returns until when an iteration whose oldest ready decode step
// arrived at oldest should wait, and whether any expected step is due by
// then. Expectations long past their prediction (a session that finished
// without a release, or was evicted) are dropped on the way.
func (g *gatherer) deadline(oldest, now time.Time) (time.Time, bool) {
	w := g.window()
	if w <= 0 {
		return time.Time{}, false
	}
	end := oldest.Add(w)
	if !now.Before(end) {
		return end, false
	}
	return end, g.due(end, now)
}

// due reports whether a session is expected to send a decode step by end.
func (g *gatherer) due(end, now time.Time) bool {
	found := false
	for id, t := range g.expect {
		at := t.Add(g.turn.v)
		if now.Sub(at) > 4*g.max+g.turn.v {
			delete(g.expect, id)
			continue
		}
		if !at.After(end) {
			found = true
		}
	}
	return found
}
