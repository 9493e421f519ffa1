package load

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshnet/shardd/internal/hoststat"
)

// The ceiling pairs each round's route run with the baseline's runs at c
// and c/hops of the same round, skips a round that lacks one, ignores open
// loops and other targets, and gives per level the medians of the rounds.
func TestCeilingRounds(t *testing.T) {
	run := func(target string, c, round int, tps float64) *Summary {
		return &Summary{Target: target, Concurrency: c, Round: round, OutputTokensPerS: tps}
	}
	probed := func(s *Summary, reads ...float64) *Summary { s.HostReadGBps = reads; return s }
	sampled := func(s *Summary, slowest float64) *Summary {
		s.HostCores = &hoststat.Cores{CPUs: []int{0}, GBps: []float64{slowest}, Slowest: slowest, Windows: 2}
		return s
	}
	routeCores := func(s *Summary) *Summary {
		s.HostCores = &hoststat.Cores{CPUs: []int{0, 1}, GBps: []float64{70, 50}, Slowest: 45, Windows: 2}
		s.HostSteal = []float64{0.05, 0.125}
		return s
	}
	runs := []*Summary{
		run("route", 32, 1, 300), run("unsplit", 32, 1, 200), run("unsplit", 16, 1, 180), // 1.5 of 1.8
		// 1.65 of 2.0, the host moving from 10 to 4 GB/s: (10 - 4) / 8; the
		// route's two cores at 70 and 50 (the slower at each tick 45: not
		// the core pace; its slow pace, 45 / 100) against the baseline's 100
		// and 80
		routeCores(probed(run("route", 32, 2, 330), 10, 9)), sampled(probed(run("unsplit", 32, 2, 200), 8, 8), 100),
		sampled(probed(run("unsplit", 16, 2, 200), 6, 4), 80),
		// 2.5 of 2.0; a core pace only where all three runs were sampled, a
		// slow pace where the route and the baseline at c were
		sampled(run("route", 32, 3, 250), 50), sampled(run("unsplit", 32, 3, 100), 50), run("unsplit", 16, 3, 100),
		run("route", 32, 4, 999), run("unsplit", 32, 4, 100), // no c/2 run: skipped
		run("route+compact", 32, 1, 500),
		{Target: "route", Rate: 4, Round: 1, OutputTokensPerS: 50},
	}
	c := &Ceiling{Route: "route", Baseline: "unsplit", Hops: 2}
	r := &Report{Runs: runs, Ceiling: c}
	r.Finish(Budget{}, "")
	want := []CeilingRow{
		{Concurrency: 32, Round: 1, Ratio: 1.5, Ceiling: 1.8, Share: 1.5 / 1.8},
		{Concurrency: 32, Round: 2, Ratio: 1.65, Ceiling: 2, Share: 0.825, HostSpread: 6.0 / 8, CorePace: 0.6, CoreSpread: 40.0 / 80, SlowPace: 0.45},
		{Concurrency: 32, Round: 3, Ratio: 2.5, Ceiling: 2, Share: 1.25, SlowPace: 1},
		// each column's own median, over the rounds that have it
		{Concurrency: 32, Round: 0, Ratio: 1.65, Ceiling: 2, Share: 1.5 / 1.8, HostSpread: 6.0 / 8, CorePace: 0.6,
			CoreSpread: 40.0 / 80, SlowPace: (0.45 + 1) / 2},
	}
	if len(c.Rows) != len(want) {
		t.Fatalf("rows %+v, want %+v", c.Rows, want)
	}
	for i, w := range want {
		g := c.Rows[i]
		if g.Concurrency != w.Concurrency || g.Round != w.Round || math.Abs(g.Ratio-w.Ratio) > 1e-9 ||
			math.Abs(g.Ceiling-w.Ceiling) > 1e-9 || math.Abs(g.Share-w.Share) > 1e-9 || math.Abs(g.HostSpread-w.HostSpread) > 1e-9 ||
			math.Abs(g.CorePace-w.CorePace) > 1e-9 || math.Abs(g.CoreSpread-w.CoreSpread) > 1e-9 ||
			math.Abs(g.SlowPace-w.SlowPace) > 1e-9 {
			t.Errorf("row %d: %+v, want %+v", i, g, w)
		}
	}
	var b strings.Builder
	r.WriteText(&b)
	if !strings.Contains(b.String(), "pipeline ceiling") || !strings.Contains(b.String(), "median") ||
		!strings.Contains(b.String(), "host moved") || !strings.Contains(b.String(), "75%") ||
		!strings.Contains(b.String(), "core pace") || !strings.Contains(b.String(), "cpu0 5.0% cpu1 12.5%") || !strings.Contains(b.String(), "1.65x    2.00x    82%         75%       0.60       0.45          50%") {
		t.Errorf("the text report has no ceiling:\n%s", b.String())
	}
	page := filepath.Join(t.TempDir(), "r.html")
	if err := r.WriteHTML(page); err != nil {
		t.Fatal(err)
	}
	html, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"<h2>Pipeline ceiling</h2>", "<td>c=32</td><td>2</td><td>1.65x</td><td>2.00x</td><td>82%</td><td>75%</td><td>0.60</td><td>0.45</td><td>50%</td>", "<td>median</td><td>1.65x</td><td>2.00x</td><td>83%</td><td>75%</td><td>0.60</td><td>0.72</td>"} {
		if !strings.Contains(string(html), w) {
			t.Errorf("the HTML report lacks %q", w)
		}
	}

	// One hop has no ceiling; nor does a report without its runs.
	for _, c := range []*Ceiling{{Route: "route", Baseline: "unsplit", Hops: 1}, {Route: "other", Baseline: "unsplit", Hops: 2}} {
		(&Report{Runs: runs, Ceiling: c}).Finish(Budget{}, "")
		if len(c.Rows) != 0 {
			t.Errorf("%+v: rows %+v", c, c.Rows)
		}
	}
}
