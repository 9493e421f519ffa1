package telemetry

import (
	"cmp"
	"slices"
	"time"
)

// A decode group crosses from one worker to the next as one message per
// session: the sender frames each session's output out, the route client
// (the head) relays each to the next worker, and that worker's forward
// starts once the group has arrived (or when its forward thread is free).
// With two groups on two hops, a group's crossings are its loop's only
// slack, and each millisecond in them is a millisecond the bottleneck hop
// idles (PERF.md, "Pipeline"). The spans say where a crossing's time goes:
// a session's steps run through the route one at a time, so the step
// before a worker's decode step, in time, is the session's step on the
// worker before it (the previous hop for the same token, the last hop for
// the token before at the first hop).

// Crossing is the decode groups that crossed from one worker to another
// within a window, each group's hand-off in four parts (one entry per
// group, in the order the groups' forwards started):
//   - Out: from the sender's forward end to its last session's frame-out
//     end (the sender writing the group out);
//   - Relay: from that frame-out end to the receiver's last decode-span
//     start (the head, the wire and both transports: the group arrived);
//   - Wait: from that arrival to the receiver's forward start (its first
//     row's: a forward already running, or the scheduler's own time);
//   - Total: from the sender's forward end to the receiver's forward
//     start.
type Crossing struct {
	Out, Relay, Wait, Total []time.Duration
}

// Groups is how many decode groups crossed.
func (c Crossing) Groups() int { return len(c.Total) }

// crossStep is a decode step's timing on one worker, from its spans.
type crossStep struct {
	inst                          string
	session                       string
	arrived, started, ended, sent int64 // decode start, forward start and end, frame-out end
	forward                       int   // index of its forward on inst
}

// Crossings finds, within [from, to] (zero: no bound), the decode groups
// that crossed between each pair of workers, keyed by sender then
// receiver. A group counts when every one of its steps has a timed step
// of the same session on one other worker just before it; a worker alone
// (no route) has none.
func Crossings(spans []SpanRecord, from, to time.Time) map[[2]string]*Crossing {
	steps := decodeSteps(spans, from, to)
	bySession := map[string][]*crossStep{}
	for _, s := range steps {
		bySession[s.session] = append(bySession[s.session], s)
	}
	prev := map[*crossStep]*crossStep{}
	for _, ss := range bySession {
		slices.SortFunc(ss, func(a, b *crossStep) int { return cmp.Compare(a.started, b.started) })
		for i := 1; i < len(ss); i++ {
			if p := ss[i-1]; p.inst != ss[i].inst && p.sent <= ss[i].arrived {
				prev[ss[i]] = p
			}
		}
	}
	type fwKey struct {
		inst string
		i    int
	}
	groups := map[fwKey][]*crossStep{}
	for _, s := range steps {
		k := fwKey{s.inst, s.forward}
		groups[k] = append(groups[k], s)
	}
	keys := make([]fwKey, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b fwKey) int { return cmp.Compare(groups[a][0].started, groups[b][0].started) })
	out := map[[2]string]*Crossing{}
	for _, k := range keys {
		g := groups[k]
		var sender string
		var senderEnd, sent, arrived int64
		started := g[0].started // the forward's: its first row's
		whole := true
		for _, s := range g {
			p := prev[s]
			if p == nil || (sender != "" && p.inst != sender) {
				whole = false
				break
			}
			sender = p.inst
			senderEnd, sent = max(senderEnd, p.ended), max(sent, p.sent)
			arrived, started = max(arrived, s.arrived), min(started, s.started)
		}
		if !whole {
			continue
		}
		key := [2]string{sender, k.inst}
		c := out[key]
		if c == nil {
			c = &Crossing{}
			out[key] = c
		}
		c.Out = append(c.Out, time.Duration(sent-senderEnd))
		c.Relay = append(c.Relay, time.Duration(arrived-sent))
		c.Wait = append(c.Wait, time.Duration(started-arrived))
		c.Total = append(c.Total, time.Duration(started-senderEnd))
	}
	return out
}

// decodeSteps gathers the decode steps of one token whose forward lies in
// [from, to] and that have decode, forward and frame-out spans, each with
// the index of its forward on its worker (overlapping forward spans are
// one forward, as in ForwardIdle).
func decodeSteps(spans []SpanRecord, from, to time.Time) []*crossStep {
	byID := map[string]*crossStep{}
	for _, s := range spans {
		if s.Name == "shardd.step" && s.Attrs["shardd.mode"] == decodeMode && s.Attrs["shardd.tokens"] == "1" {
			byID[s.SpanID] = &crossStep{inst: s.Instance, session: s.Attrs["shardd.route_session"], forward: -1}
		}
	}
	have := map[*crossStep]int{}
	for _, s := range spans {
		st := byID[s.Parent]
		if st == nil {
			continue
		}
		switch s.Name {
		case "decode":
			st.arrived = s.Start
		case "forward":
			st.started, st.ended = s.Start, s.End
		case "frameout":
			st.sent = s.End
		default:
			continue
		}
		have[st]++
	}
	byInst := map[string][]*crossStep{}
	for _, st := range byID {
		if have[st] != 3 || st.session == "" || (!from.IsZero() && st.started < from.UnixNano()) || (!to.IsZero() && st.ended > to.UnixNano()) {
			continue
		}
		byInst[st.inst] = append(byInst[st.inst], st)
	}
	var out []*crossStep
	for _, ss := range byInst {
		slices.SortFunc(ss, func(a, b *crossStep) int { return cmp.Compare(a.started, b.started) })
		end := int64(0)
		n := -1
		for _, s := range ss {
			if n < 0 || s.started >= end {
				n++
			}
			end = max(end, s.ended)
			s.forward = n
		}
		out = append(out, ss...)
	}
	return out
}
