package engine

import (
	"math"
	"time"
)

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
}

// done records that session id completed a decode step (or its prompt).
func (g *gatherer) done(id string, now time.Time) {
	if g.last == nil {
		g.last = map[string]time.Time{}
	}
	g.last[id] = now
}

// forget drops a released session.
func (g *gatherer) forget(id string) { delete(g.last, id) }

// decoding counts the sessions that completed a decode step within recent
// of now, forgetting older ones.
func (g *gatherer) decoding(now time.Time, recent time.Duration) int {
	n := 0
	for id, t := range g.last {
		if now.Sub(t) > recent {
			delete(g.last, id)
			continue
		}
		n++
	}
	return n
}

// hold returns how much longer an iteration with ready decode rows should
// wait for more (0: run now). groups <= 0 turns gathering off; window 0
// bounds a hold by half of predict(the rows it waits for), and with no
// prediction yet it does not hold.
func (g *gatherer) hold(now time.Time, ready, decoding, groups int, window time.Duration, predict func(rows int) (time.Duration, bool)) time.Duration {
	need := 0
	if groups > 0 {
		need = int(math.Ceil(float64(decoding) / float64(groups)))
	}
	if ready == 0 || ready >= need {
		g.since = time.Time{}
		return 0
	}
	if window == 0 {
		t, ok := predict(need)
		if !ok {
			g.since = time.Time{}
			return 0
		}
		window = t / 2
	}
	if g.since.IsZero() {
		g.since = now
	}
	left := g.since.Add(window).Sub(now)
	if left <= 0 {
		g.since = time.Time{}
		return 0
	}
	return left
}
