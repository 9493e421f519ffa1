package telemetry

import (
	"cmp"
	"slices"
	"time"
)

// A worker's backend runs one forward at a time, and every step the
// forward carries records a "forward" span of its own: the forward is the
// union of one instance's overlapping forward spans, and the time between
// two forwards is the time the worker's forward thread had nothing to
// run. What a gap waited for shows in the forward that ends it: a whole
// decode group (the hand-off round the other stages and the head), part
// of one (a hold that ran out, a straggler, a group split by sessions
// that came and went), decode rows with prompt rows, or prompt rows
// alone (a pipeline filling after a burst of prompts).

// The kinds of forward a gap is charged to (Idle.Before).
const (
	// BeforeGroup: decode rows only, at least three quarters of a whole
	// group (Idle.Group).
	BeforeGroup = "decode group"
	// BeforePart: decode rows only, fewer.
	BeforePart = "part of a group"
	// BeforeMixed: decode rows and prompt rows.
	BeforeMixed = "decode and prompt"
	// BeforePrompt: prompt rows only.
	BeforePrompt = "prompt only"
)

// BeforeKinds is the order the kinds are reported in.
var BeforeKinds = []string{BeforeGroup, BeforePart, BeforeMixed, BeforePrompt}

// Idle is one worker's forwards within a window, from its spans.
type Idle struct {
	// Span is from the first forward's start to the last one's end; Busy
	// the time inside forwards.
	Span, Busy time.Duration
	// Forwards counts them; Group is the rows of a whole decode group:
	// the 90th percentile of the decode-only forwards' rows.
	Forwards, Group int
	// Before is the idle before each forward (the first excepted), by the
	// forward's kind (BeforeKinds).
	Before map[string]Gap
}

// Gap is the idle before the forwards of one kind.
type Gap struct {
	Forwards int
	Idle     time.Duration
}

// BusyShare is the share of the span inside forwards (0 with no span).
func (id Idle) BusyShare() float64 { return id.share(id.Busy) }

// IdleShare is the share of the span idle before forwards of kind.
func (id Idle) IdleShare(kind string) float64 { return id.share(id.Before[kind].Idle) }

func (id Idle) share(d time.Duration) float64 {
	if id.Span <= 0 {
		return 0
	}
	return float64(d) / float64(id.Span)
}

// Mean is the mean gap (0 with none).
func (g Gap) Mean() time.Duration {
	if g.Forwards == 0 {
		return 0
	}
	return g.Idle / time.Duration(g.Forwards)
}

// decodeMode is the step attribute shardd.mode of a decode step.
const decodeMode = "CACHE_MODE_DECODE"

// ForwardIdle groups each instance's forward spans within [from, to] into
// forwards and charges the idle between them to the forward that follows
// (Idle). Zero times mean no bound. An instance with no forward span in
// the window has no entry.
func ForwardIdle(spans []SpanRecord, from, to time.Time) map[string]Idle {
	mode := map[string]string{} // step span id -> shardd.mode
	for _, s := range spans {
		if s.Name == "shardd.step" {
			mode[s.SpanID] = s.Attrs["shardd.mode"]
		}
	}
	byInst := map[string][]SpanRecord{}
	for _, s := range spans {
		if s.Name != "forward" || (!from.IsZero() && s.Start < from.UnixNano()) || (!to.IsZero() && s.End > to.UnixNano()) {
			continue
		}
		byInst[s.Instance] = append(byInst[s.Instance], s)
	}
	out := make(map[string]Idle, len(byInst))
	for inst, fs := range byInst {
		out[inst] = idleOf(fs, mode)
	}
	return out
}

// forward is a run of overlapping forward spans: one backend forward.
type forward struct {
	start, end      int64
	decode, prompts int
}

// idleOf is ForwardIdle for one instance's forward spans.
func idleOf(spans []SpanRecord, mode map[string]string) Idle {
	slices.SortFunc(spans, func(a, b SpanRecord) int { return cmp.Compare(a.Start, b.Start) })
	var fws []forward
	for _, s := range spans {
		if n := len(fws); n == 0 || s.Start >= fws[n-1].end {
			fws = append(fws, forward{start: s.Start, end: s.End})
		} else {
			fws[n-1].end = max(fws[n-1].end, s.End)
		}
		f := &fws[len(fws)-1]
		if mode[s.Parent] == decodeMode {
			f.decode++
		} else {
			f.prompts++
		}
	}
	var groups []int
	for _, f := range fws {
		if f.prompts == 0 {
			groups = append(groups, f.decode)
		}
	}
	id := Idle{Forwards: len(fws), Before: map[string]Gap{}}
	if len(groups) > 0 {
		slices.Sort(groups)
		id.Group = groups[len(groups)*9/10]
	}
	for i, f := range fws {
		id.Busy += time.Duration(f.end - f.start)
		if i == 0 {
			continue
		}
		kind := BeforePrompt
		switch {
		case f.prompts == 0 && 4*f.decode >= 3*id.Group:
			kind = BeforeGroup
		case f.prompts == 0:
			kind = BeforePart
		case f.decode > 0:
			kind = BeforeMixed
		}
		g := id.Before[kind]
		g.Forwards++
		g.Idle += time.Duration(f.start - fws[i-1].end)
		id.Before[kind] = g
	}
	if n := len(fws); n > 0 {
		id.Span = time.Duration(fws[n-1].end - fws[0].start)
	}
	return id
}
