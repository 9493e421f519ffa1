package sched

import "time"

// gatherer decides when a decode iteration waits for more decode steps.
//
// Each decoding session's next step comes back one trip around the route
// after its last one. A worker that starts an iteration with whatever has
// arrived settles into many small batches, each paying a forward's fixed
// cost (on a CPU, streaming every weight once: for the bench preset's
// first 8 layers about 7 ms, against about 1 ms per row). Holding the
// iteration until a share of the decoding sessions has arrived forms
// batches of that share instead: with DecodeGroups set to the route's
// stage count, the sessions move round the route in that many groups, one
// per stage, so every stage computes at once (pipelining) and each batch
// is as large as the pipeline allows. The hold is bounded by GatherWindow
// (or half the predicted time of the batch it waits for), so a session
// that stopped decoding costs at most that once.
type gatherer struct {
	// last: when each session's latest decode step (or final prefill
	// chunk) completed; sessions within DecodeQuiet of it are decoding.
	last map[string]time.Time
	// since: when the current hold began (zero: not holding).
	since time.Time
	// gap: per decoding session, the smoothed time from completing a step
	// to its next decode step arriving (one trip round the rest of the
	// route and the head); queued: sessions whose next step has arrived
	// and not completed. Together they say when the next decode step is
	// due, which a prefill-only iteration must not delay (due).
	gap    map[string]ewma
	queued map[string]bool
	// unexpected: sessions with a completed prompt and no decode step
	// yet that are no longer counted as decoding until one arrives: their
	// next work was another prompt (a prompt streamed in whole chunks), or
	// a hold that counted them ran out its window.
	unexpected map[string]bool
	// holds counts the holds that ended, expired those that ended because
	// their window ran out before the group formed, held their total time.
	holds, expired int64
	held           time.Duration
}

// end closes the current hold, if any, at now.
func (g *gatherer) end(now time.Time, expired bool) {
	if g.since.IsZero() {
		return
	}
	g.holds++
	g.held += now.Sub(g.since)
	if expired {
		g.expired++
	}
	g.since = time.Time{}
}

// done records that session id completed a decode step (or its prompt).
func (g *gatherer) done(id string, now time.Time) {
	if g.last == nil {
		g.last, g.gap, g.queued, g.unexpected = map[string]time.Time{}, map[string]ewma{}, map[string]bool{}, map[string]bool{}
	}
	g.last[id] = now
	delete(g.queued, id)
}

// arrived records that session id's decode step arrived.
func (g *gatherer) arrived(id string, now time.Time) {
	t, ok := g.last[id]
	if !ok {
		return
	}
	if !g.queued[id] {
		a := g.gap[id]
		a.add(now.Sub(t))
		g.gap[id] = a
	}
	g.queued[id] = true
}

// prompted records that a prompt (a prefill chunk) of session id arrived.
func (g *gatherer) prompted(id string) {
	if _, ok := g.last[id]; ok {
		g.unexpected[id] = true
	}
}

// forget drops a released session.
func (g *gatherer) forget(id string) {
	delete(g.last, id)
	delete(g.gap, id)
	delete(g.queued, id)
	delete(g.unexpected, id)
}

// due returns when the next decode step is expected: the earliest, over the
// decoding sessions whose next step has not arrived, of their last
// completion plus their usual gap. A step overdue by more than its gap (at
// least dueSlack) is not counted: its session is thinking, or has ended.
func (g *gatherer) due(now time.Time) (time.Time, bool) {
	var first time.Time
	for id, t := range g.last {
		a, ok := g.gap[id]
		if !ok || !a.ok || g.queued[id] {
			continue
		}
		at := t.Add(a.v)
		if now.Sub(at) > max(a.v, dueSlack) {
			continue
		}
		if first.IsZero() || at.Before(first) {
			first = at
		}
	}
	return first, !first.IsZero()
}

// dueSlack is the least time a due decode step is waited for past its
// expected arrival.
const dueSlack = 2 * time.Millisecond

// decoding counts the sessions that completed a decode step, or with
// fresh their prompt, within recent of now, forgetting older ones. With
// fresh (a shard of a pipeline: groups move round the route), a session
// whose prompt just completed is counted before its first decode step
// arrives: a burst of prompts (a closed loop's cohort starting again)
// completes together, and their first steps should form one group, not be
// taken in whatever fragments arrived first. One that sent another prompt
// instead (a prompt streamed in whole chunks, each a whole prefill), or
// that a hold waited for in vain (a prompt with no decode step after it),
// is not counted until it decodes: it would make every decode iteration
// beside it wait out its window, with the CPU idle. Without fresh (one
// group: the whole model) a prompt is never waited for.
func (g *gatherer) decoding(now time.Time, recent time.Duration, fresh bool) int {
	n := 0
	for id, t := range g.last {
		if now.Sub(t) > recent {
			g.forget(id)
			continue
		}
		if _, ok := g.gap[id]; ok || fresh && !g.unexpected[id] {
			n++
		}
	}
	return n
}

// active counts the sessions that completed a step (or their prompt)
// within window of now, forgetting nothing.
func (g *gatherer) active(now time.Time, window time.Duration) int {
	n := 0
	for _, t := range g.last {
		if now.Sub(t) <= window {
			n++
		}
	}
	return n
}

// hold returns how much longer an iteration with ready decode rows should
// wait for more (0: run now). groups <= 0 turns gathering off; window 0
// bounds a hold by half of predict(the rows it waits for), and with no
// prediction yet it does not hold.
func (g *gatherer) hold(now time.Time, ready, decoding, groups int, window time.Duration, predict func(rows int) (time.Duration, bool)) time.Duration {
	// The smaller group's size: with an odd count (31 of 2 groups: 15
	// and 16) a share rounded up is one more than the smaller group can
	// ever gather, and it held its window every trip round each hop.
	need := 0
	if groups > 0 {
		need = decoding / groups
	}
	if ready == 0 || ready >= need {
		g.end(now, false)
		return 0
	}
	if window == 0 {
		t, ok := predict(need)
		if !ok {
			g.end(now, false)
			return 0
		}
		window = t / 2
	}
	if g.since.IsZero() {
		g.since = now
	}
	left := g.since.Add(window).Sub(now)
	if left <= 0 {
		g.end(now, true)
		// A session with a prompt done and no decode step yet costs one
		// window at most, as one that stopped decoding does.
		for id := range g.last {
			if _, ok := g.gap[id]; !ok {
				g.unexpected[id] = true
			}
		}
		return 0
	}
	return left
}
