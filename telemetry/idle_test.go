package telemetry

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// forwardSpans returns the step and forward spans of one forward on inst:
// decode decode steps and prompt prefill steps from start to end (ms),
// each forward span starting a little later than the one before, as the
// steps of one forward do.
func forwardSpans(inst string, n *int, start, end float64, decode, prompt int) []SpanRecord {
	var out []SpanRecord
	for i := range decode + prompt {
		*n++
		id := fmt.Sprintf("step%d", *n)
		m := decodeMode
		if i >= decode {
			m = "CACHE_MODE_PREFILL"
		}
		ms := func(v float64) int64 { return int64(v * float64(time.Millisecond)) }
		out = append(out,
			SpanRecord{SpanID: id, Name: "shardd.step", Instance: inst, Start: ms(start) - 1000, End: ms(end) + 1000,
				Attrs: map[string]string{"shardd.mode": m}},
			SpanRecord{SpanID: id + "f", Parent: id, Name: "forward", Instance: inst, Start: ms(start) + int64(i)*100, End: ms(end)})
	}
	return out
}

func TestForwardIdle(t *testing.T) {
	var spans []SpanRecord
	n := 0
	add := func(inst string, start, end float64, decode, prompt int) {
		spans = append(spans, forwardSpans(inst, &n, start, end, decode, prompt)...)
	}
	add("hop0", 1, 2, 4, 0) // before the window: left out
	add("hop0", 10, 20, 4, 0)
	add("hop0", 22, 32, 4, 0)   // 2 ms before a whole group
	add("hop0", 40, 43, 1, 0)   // 8 ms before part of one
	add("hop0", 44, 60, 2, 1)   // 1 ms before decode and prompt rows
	add("hop0", 110, 130, 0, 1) // 50 ms before prompt rows alone
	add("hop0", 135, 145, 3, 0) // 5 ms before a whole group (3 of 4)
	add("hop1", 20, 25, 2, 0)
	add("hop1", 30, 60, 2, 0)
	add("hop1", 61, 70, 2, 0) // after the window: left out

	ms := time.Millisecond
	base := time.Unix(0, 0)
	got := ForwardIdle(spans, base.Add(5*ms), base.Add(65*ms+ms/2))
	if _, ok := got["hop0"]; !ok || len(got) != 2 {
		t.Fatalf("instances %v, want hop0 and hop1", got)
	}
	// The window cuts hop0 after the forward that ends at 60 ms.
	h0 := got["hop0"]
	want := Idle{Span: 50 * ms, Busy: 39 * ms, Forwards: 4, Group: 4, Before: map[string]Gap{
		BeforeGroup: {1, 2 * ms}, BeforePart: {1, 8 * ms}, BeforeMixed: {1, ms}}}
	if fmt.Sprint(h0) != fmt.Sprint(want) {
		t.Errorf("hop0 in the window:\n got %+v\nwant %+v", h0, want)
	}
	h1 := got["hop1"]
	if h1.Forwards != 2 || h1.Busy != 35*ms || h1.Before[BeforeGroup] != (Gap{1, 5 * ms}) {
		t.Errorf("hop1: %+v, want 2 forwards, 35 ms busy, 5 ms before a group", h1)
	}

	all := ForwardIdle(spans, time.Time{}, time.Time{})["hop0"]
	want = Idle{Span: 144 * ms, Busy: 70 * ms, Forwards: 7, Group: 4, Before: map[string]Gap{
		BeforeGroup: {3, 8*ms + 2*ms + 5*ms}, BeforePart: {1, 8 * ms}, BeforeMixed: {1, ms}, BeforePrompt: {1, 50 * ms}}}
	if fmt.Sprint(all) != fmt.Sprint(want) {
		t.Errorf("hop0, no window:\n got %+v\nwant %+v", all, want)
	}

	var out strings.Builder
	Report(&out, spans)
	line := "hop0                     busy 48.6%, 7 forwards, a decode group 4 rows; before decode group 10.4%, 5ms (3); " +
		"before part of a group 5.6%, 8ms (1); before decode and prompt 0.7%, 1ms (1); before prompt only 34.7%, 50ms (1)\n"
	if !strings.Contains(out.String(), line) {
		t.Errorf("trace report lacks\n%s in\n%s", line, out.String())
	}
}

// The report gives each hop's core speed from its forward spans, where
// they carry it: a slow hop on a slow core is the host's.
func TestReportCoreSpeed(t *testing.T) {
	var spans []SpanRecord
	n := 0
	for i, core := range []string{"100", "40", "90", "95", "", "junk"} {
		for _, s := range forwardSpans("hop1", &n, float64(10*i), float64(10*i+5), 1, 0) {
			if s.Name == "forward" && core != "" {
				s.Attrs = map[string]string{"shardd.host.core_gbps": core}
			}
			spans = append(spans, s)
		}
	}
	spans = append(spans, forwardSpans("hop0", &n, 0, 5, 1, 0)...)
	var out strings.Builder
	Report(&out, spans)
	// hop1's four readings sorted: 40 90 95 100; p50 the third, p10 the first.
	if !strings.Contains(out.String(), "; its core 95 GB/s p50, 40 p10\n") {
		t.Errorf("no core speed for hop1 in\n%s", out.String())
	}
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.Contains(l, "hop0") && strings.Contains(l, "its core") {
			t.Errorf("hop0 has no core readings, but: %s", l)
		}
	}
}
