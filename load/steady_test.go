package load

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/meshnet/shardd/route"
)

// The steady tokens/s counts the tokens emitted until the arrivals ended,
// over that time; tokens/s counts every token to the last, over the time
// to the last.
func TestSteadyWindow(t *testing.T) {
	r := newRecorder(1)
	t0 := time.Unix(1000, 0)
	r.on, r.start = true, t0
	at := func(ms ...int) *reqTrace {
		tr := &reqTrace{arrival: t0}
		for _, m := range ms {
			tr.times = append(tr.times, t0.Add(time.Duration(m)*time.Millisecond))
		}
		return tr
	}
	r.finish(at(100, 200, 300, 400, 500), route.Stats{}, nil, SLO{})
	r.arrivalsOver(t0.Add(1100 * time.Millisecond))
	r.arrivalsOver(t0.Add(1300 * time.Millisecond)) // the first end stands
	r.finish(at(800, 1000, 1200, 1400), route.Stats{}, nil, SLO{})
	s := r.summary(Target{Name: "t"}, Workload{Concurrency: 2}, "t")
	near := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	near("tokens/s", s.OutputTokensPerS, 9/1.4)
	near("steady window", s.SteadySeconds, 1.1)
	near("steady tokens/s", s.SteadyTokensPerS, 7/1.1)

	rep := &Report{Runs: []*Summary{
		{Target: "t", Concurrency: 2, OutputTokensPerS: 100, SteadyTokensPerS: 120},
		{Target: "t", Concurrency: 2, OutputTokensPerS: 80, SteadyTokensPerS: 118},
		{Target: "t", Concurrency: 2, OutputTokensPerS: 90, SteadyTokensPerS: 121},
	}}
	rep.Finish(Budget{}, "")
	m := rep.Medians[0]
	near("median steady", m.SteadyTokensPerS, 120)
	near("steady spread", m.SteadySpread, 3.0/120)
	near("spread", m.Spread, 20.0/90)
}

// The text report notes the host's kdamond CPU per run where it ran, and
// says nothing where it did not.
func TestReportHostKdamond(t *testing.T) {
	r := &Report{Runs: []*Summary{{Label: "a c=16 r1", HostKdamondMillis: 412.4}, {Label: "b c=16 r1"}}}
	var out strings.Builder
	r.writeHost(&out)
	if got := out.String(); !strings.Contains(got, "kdamond") || !strings.Contains(got, "a c=16 r1 412 ms") || strings.Contains(got, "b c=16") {
		t.Fatalf("host note %q", got)
	}
	out.Reset()
	(&Report{Runs: []*Summary{{Label: "b"}}}).writeHost(&out)
	if out.Len() != 0 {
		t.Fatalf("host note %q on a host without kdamond", out.String())
	}
}
