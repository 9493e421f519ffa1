package telemetry

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// crossSpans returns one decode step's spans on inst for session sess: its
// arrival (decode span start), its forward from start to end and its
// frame-out end, in ms.
func crossSpans(inst, sess string, n *int, arrived, start, end, sent float64) []SpanRecord {
	*n++
	id := fmt.Sprintf("step%d", *n)
	ms := func(v float64) int64 { return int64(v * float64(time.Millisecond)) }
	return []SpanRecord{
		{SpanID: id, Name: "shardd.step", Instance: inst, Start: ms(arrived), End: ms(sent),
			Attrs: map[string]string{"shardd.mode": decodeMode, "shardd.tokens": "1", "shardd.route_session": sess}},
		{SpanID: id + "d", Parent: id, Name: "decode", Instance: inst, Start: ms(arrived), End: ms(arrived) + 1000},
		{SpanID: id + "f", Parent: id, Name: "forward", Instance: inst, Start: ms(start), End: ms(end)},
		{SpanID: id + "o", Parent: id, Name: "frameout", Instance: inst, Start: ms(end), End: ms(sent)},
	}
}

func TestCrossings(t *testing.T) {
	var spans []SpanRecord
	n := 0
	add := func(inst, sess string, arrived, start, end, sent float64) {
		spans = append(spans, crossSpans(inst, sess, &n, arrived, start, end, sent)...)
	}
	// A group of two sessions: hop0's forward 10-20 ms, out by 21 and 22;
	// at hop1 by 24 and 25, whose forward starts at 27 and ends at 40; out
	// by 41; back at hop0 (the next token) by 43 and 44, and hop0, busy
	// with another group until 50, starts it then.
	add("hop0", "a", 5, 10, 20, 21)
	add("hop0", "b", 5, 10, 20, 22)
	add("hop1", "a", 24, 27, 40, 41)
	add("hop1", "b", 25, 27.01, 40, 41)
	add("hop0", "c", 30, 35, 50, 51) // the other group: its own session
	add("hop0", "a", 43, 50, 60, 61)
	add("hop0", "b", 44, 50.01, 60, 61)
	// A group whose steps came from different workers is not a crossing:
	// session c's step before was on hop0, d's on hop2.
	add("hop2", "d", 52, 53, 54, 55)
	add("hop1", "c", 56, 58, 70, 71)
	add("hop1", "d", 57, 58, 70, 71)

	got := Crossings(spans, time.Time{}, time.Time{})
	if len(got) != 2 {
		t.Fatalf("crossings %v, want hop0->hop1 and hop1->hop0", got)
	}
	ms := time.Millisecond
	want := map[[2]string]Crossing{
		{"hop0", "hop1"}: {Out: []time.Duration{2 * ms}, Relay: []time.Duration{3 * ms},
			Wait: []time.Duration{2 * ms}, Total: []time.Duration{7 * ms}},
		{"hop1", "hop0"}: {Out: []time.Duration{ms}, Relay: []time.Duration{3 * ms},
			Wait: []time.Duration{6 * ms}, Total: []time.Duration{10 * ms}},
	}
	for k, w := range want {
		if c := got[k]; c == nil || fmt.Sprint(*c) != fmt.Sprint(w) {
			t.Errorf("%v:\n got %+v\nwant %+v", k, c, w)
		}
	}
	if g := got[[2]string{"hop0", "hop1"}].Groups(); g != 1 {
		t.Errorf("hop0->hop1: %d groups, want 1", g)
	}

	// trace-report prints each crossing's parts.
	var out strings.Builder
	Report(&out, spans)
	line := "  hop0 -> hop1, 1 groups: out 2ms / 2ms, relay 3ms / 3ms, wait 2ms / 2ms, in all 7ms / 7ms\n"
	if !strings.Contains(out.String(), line) {
		t.Errorf("trace report lacks\n%s in\n%s", line, out.String())
	}

	// The window leaves out the steps outside it, and with them the
	// crossing back to hop0 (its forward ends at 60 ms).
	base := time.Unix(0, 0)
	got = Crossings(spans, base, base.Add(55*ms))
	if len(got) != 1 || got[[2]string{"hop0", "hop1"}] == nil {
		t.Errorf("in [0, 55 ms]: %v, want hop0->hop1 alone", got)
	}
	// One worker alone has no crossing.
	var alone []SpanRecord
	for _, s := range spans {
		if s.Instance == "hop0" {
			alone = append(alone, s)
		}
	}
	if got := Crossings(alone, time.Time{}, time.Time{}); len(got) != 0 {
		t.Errorf("one worker: %v, want none", got)
	}
}
