package load

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meshnet/shardd/engine"
	"github.com/meshnet/shardd/engine/enginetest"
	"github.com/meshnet/shardd/route"
	"github.com/meshnet/shardd/telemetry"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// toxiproxy's links and gRPC's connections wind down after a
		// proxy or client closes.
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/stream.(*ChanReader).Read"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).pipe"),
	)
}

func smallWorkload(c, requests int) Workload {
	return Workload{Concurrency: c, Requests: requests, Warmup: 1, Seed: 7,
		Lengths: Lengths{Prompt: [2]int{4, 4}, Output: [2]int{8, 8}}}
}

// The report recovers what the route is known to cost: every forward of
// the fake backend takes 8 ms, and a proxy adds 6 ms each way on hop 1
// only. With one request in flight, the head must see hop exec 8 ms
// (+2.5) on both hops, hop 0's wire under 4 ms, hop 1's wire 12 ms more
// than hop 0's (+4 ms for the proxy's own copies), and each inter-token
// gap the sum of the hops (-0.5, +5 ms for the head's own sampling and
// framing). The costs are large enough that every bound still tells a
// misattributed cost (8 ms of exec counted as wire, a hop counted twice)
// from the scheduling noise of a -race run of every package on two CPUs,
// where with 4 and 3 ms and bounds half as wide the test failed 2 runs in
// 4 (ITL 2.5 ms over the hops, a wire difference 2.02 ms over).
func TestReportRecoversKnownCosts(t *testing.T) {
	const fwd, oneWay = 8 * time.Millisecond, 6 * time.Millisecond
	workers := enginetest.ServeRoute(t, 2, fwd, engine.Config{})
	addrs, px, err := StartLinks(workers, map[int]Link{1: {Latency: oneWay}})
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	s, err := Run(context.Background(), Target{Name: "route", Addrs: addrs, Workers: workers}, smallWorkload(1, 8), RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Requests != 8 || s.Errors != 0 || s.OutputTokens != 64 {
		t.Fatalf("requests %d errors %d tokens %d, want 8, 0, 64", s.Requests, s.Errors, s.OutputTokens)
	}
	within := func(name string, got, lo, hi float64) {
		t.Helper()
		if got < lo || got > hi {
			t.Errorf("%s = %.2f ms, want %.1f..%.1f ms", name, got, lo, hi)
		}
	}
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	for i, h := range s.Hops {
		within("hop exec p50 "+string(rune('0'+i)), h.Exec.P50, ms(fwd), ms(fwd)+2.5)
		if h.Exec.Count != 7*8 {
			t.Errorf("hop %d: %d decode steps measured, want 56", i, h.Exec.Count)
		}
	}
	within("hop 0 wire p50", s.Hops[0].Wire.P50, 0, 4)
	within("hop 1 wire p50 - hop 0 wire p50", s.Hops[1].Wire.P50-s.Hops[0].Wire.P50, ms(2*oneWay), ms(2*oneWay)+4)
	// A token is the two hops one after the other, plus the head's own
	// sampling and framing.
	hops := s.Hops[0].Exec.P50 + s.Hops[0].Wire.P50 + s.Hops[1].Exec.P50 + s.Hops[1].Wire.P50
	within("ITL p50", s.ITL.P50, max(ms(2*fwd+2*oneWay), hops-0.5), hops+5)
	if s.Goodput != 1 {
		t.Errorf("goodput %v with no SLO and no errors, want 1", s.Goodput)
	}
}

// The same route loaded twice with the same seed gets the same tokens:
// requests are a function of the seed and their index.
func TestRequestsRepeat(t *testing.T) {
	w := smallWorkload(1, 4)
	w.Vocab = 64
	w.Lengths = Lengths{Prompt: [2]int{3, 9}, Output: [2]int{1, 5}}
	seen := map[int]bool{}
	for i := range 20 {
		a, b := w.request(i), w.request(i)
		if len(a.Prompt) != len(b.Prompt) || a.MaxTokens != b.MaxTokens || a.Sampling != b.Sampling {
			t.Fatal("request differs between calls")
		}
		for j := range a.Prompt {
			if a.Prompt[j] != b.Prompt[j] || a.Prompt[j] < 1 || a.Prompt[j] >= 64 {
				t.Fatalf("prompt token %d", a.Prompt[j])
			}
		}
		if len(a.Prompt) < 3 || len(a.Prompt) > 9 || a.MaxTokens < 1 || a.MaxTokens > 5 {
			t.Fatalf("lengths %d, %d outside the ranges", len(a.Prompt), a.MaxTokens)
		}
		seen[len(a.Prompt)] = true
	}
	if len(seen) < 3 {
		t.Errorf("prompt lengths drawn from 3..9 took only %d values in 20 requests", len(seen))
	}
}

// An open loop issues about rate x duration requests.
func TestOpenLoop(t *testing.T) {
	// Poisson bursts (and a slow -race build) can have more than the
	// default 16 sessions in flight.
	workers := enginetest.ServeRoute(t, 2, time.Millisecond, engine.Config{MaxSessions: 60})
	w := smallWorkload(0, 0)
	w.Rate, w.Duration, w.Warmup = 50, time.Second, 0
	s, err := Run(context.Background(), Target{Name: "route", Addrs: workers, Workers: workers}, w, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Poisson: 50 expected, standard deviation about 7.
	if s.Requests < 25 || s.Requests > 80 || s.Errors != 0 {
		t.Errorf("open loop at 50/s for 1 s: %d requests, %d errors %v", s.Requests, s.Errors, s.ErrorsByCode)
	}
}

// A closed loop with a duration stops issuing requests when it is over:
// every one of its goroutines sees the end, not only the first to look.
func TestClosedLoopDuration(t *testing.T) {
	workers := enginetest.ServeRoute(t, 1, time.Millisecond, engine.Config{})
	w := smallWorkload(0, 0)
	w.Concurrency, w.Duration, w.Warmup = 4, 300*time.Millisecond, 0
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Run(ctx, Target{Name: "route", Addrs: workers, Workers: workers}, w, RunOptions{})
	if err != nil {
		t.Fatalf("closed loop of 4 for 300 ms did not end: %v", err)
	}
	if s.Requests == 0 || s.Errors != 0 {
		t.Errorf("%d requests, %d errors %v", s.Requests, s.Errors, s.ErrorsByCode)
	}
	// The steady window ends with the arrivals, when the duration is up.
	if s.SteadySeconds < 0.3 || s.SteadySeconds > 0.5 || s.SteadyTokensPerS <= 0 {
		t.Errorf("steady window %.3f s, %.1f tokens/s; want 0.3 s and some tokens", s.SteadySeconds, s.SteadyTokensPerS)
	}
}

func budgetFile(t *testing.T, name, text string) string {
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// A budget passes when every limit holds and names each one that fails,
// and by how much; YAML and TOML read alike.
func TestBudgetGate(t *testing.T) {
	workers := enginetest.ServeRoute(t, 2, 2*time.Millisecond, engine.Config{})
	s, err := Run(context.Background(), Target{Name: "route", Addrs: workers, Workers: workers}, smallWorkload(2, 6), RunOptions{Label: "r"})
	if err != nil {
		t.Fatal(err)
	}
	holds := budgetFile(t, "ok.yaml", "itl.p99: 1s\nttft:\n  p99: 2s\ngoodput: 0.5\nhop[1].exec.p50: 100ms\ntokens_per_s: 1\n")
	broken := budgetFile(t, "bad.toml", "\"itl.p50\" = \"1ms\"\n\"hop[0].exec.p50\" = \"100ms\"\ntokens_per_s = 1e9\n")
	for _, c := range []struct {
		file string
		pass bool
		fail []string
	}{
		{holds, true, nil},
		{broken, false, []string{"itl.p50", "tokens_per_s"}},
	} {
		b, err := ReadBudget(c.file)
		if err != nil {
			t.Fatal(err)
		}
		r := &Report{Runs: []*Summary{s}}
		r.Finish(b, "")
		if r.BudgetPass != c.pass {
			t.Errorf("%s: pass = %v, want %v: %+v", filepath.Base(c.file), r.BudgetPass, c.pass, r.Budget)
		}
		var failed []string
		for _, ch := range r.Budget {
			if !ch.Pass {
				failed = append(failed, ch.Limit.Metric)
				if ch.Over <= 0 {
					t.Errorf("%s failed with no margin", ch.Limit.Metric)
				}
			}
		}
		if strings.Join(failed, ",") != strings.Join(c.fail, ",") {
			t.Errorf("%s: failed %v, want %v", filepath.Base(c.file), failed, c.fail)
		}
		var out strings.Builder
		r.WriteText(&out)
		if !c.pass && !strings.Contains(out.String(), "FAIL by") {
			t.Errorf("the text report does not name the failures:\n%s", out.String())
		}
	}
}

// Bad input gets a clear error before any load is put on anything.
func TestBadInput(t *testing.T) {
	workers := enginetest.ServeRoute(t, 2, time.Millisecond, engine.Config{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	w := smallWorkload(1, 1)
	for _, c := range []struct {
		name  string
		addrs []string
		want  string
	}{
		{"unreachable worker", []string{workers[0], dead}, "unreachable"},
		{"wrong layer order", []string{workers[1], workers[0]}, "starts at layer 1, the route is at 0"},
	} {
		_, err := Run(context.Background(), Target{Name: "route", Addrs: c.addrs}, w, RunOptions{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to say %q", c.name, err, c.want)
		}
	}
	if _, err := Run(context.Background(), Target{Name: "route", Addrs: []string{workers[1], workers[0]}}, w, RunOptions{}); !errors.Is(err, route.ErrRoute) {
		t.Errorf("wrong layer order: %v is not route.ErrRoute", err)
	}

	for _, c := range []struct{ name, text, want string }{
		{"b.yaml", "itl.p99: 25ms\nlatency.p99: 3ms\n", `unknown metric "latency.p99"`},
		{"b.yaml", "itl.p99: fast\n", "want a positive duration"},
		{"b.yaml", "goodput: 95\n", "fraction"},
		{"b.yaml", "itl.p99: [\n", "budget b.yaml"},
		{"b.json", "{}", "want a .yaml, .yml or .toml"},
		{"b.toml", "", "no limits"},
	} {
		_, err := ReadBudget(budgetFile(t, c.name, c.text))
		if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("budget %q: err = %v, want ErrInput saying %q", c.text, err, c.want)
		}
	}
	for _, c := range []struct{ text, want string }{
		{"128 64\n12\n", "line 2: want two lengths"},
		{"128 x\n", "line 1: lengths must be positive"},
		{"0 4\n", "positive"},
		{"# only a comment\n", "has no lengths"},
	} {
		_, err := ReadLengthFile(budgetFile(t, "lengths.txt", c.text))
		if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("length file %q: err = %v, want %q", c.text, err, c.want)
		}
	}
	pairs, err := ReadLengthFile(budgetFile(t, "lengths.txt", "# prompt output\n128 64\n\n32,8\n"))
	if err != nil || len(pairs) != 2 || pairs[1] != [2]int{32, 8} {
		t.Errorf("good length file: %v, %v", pairs, err)
	}
	for _, bad := range []string{"1=latency", "5=latency:1ms", "x=latency:1ms", "0=latency:-1ms", "0=bandwidth:10", "0=stall:5ms/1s", "0=reset:1s", "0=latency:500us", "0=warp:9"} {
		if _, err := ParseLinks([]string{bad}, 2); !errors.Is(err, ErrInput) {
			t.Errorf("--link %q: err = %v, want ErrInput", bad, err)
		}
	}
	links, err := ParseLinks([]string{"all=latency:5ms,jitter:1ms", "1=bandwidth:1gbit"}, 2)
	if err != nil || links[0].Latency != 5*time.Millisecond || links[0].Jitter != time.Millisecond || links[1].BandwidthKBps != 125000 || links[1].Latency != 0 {
		t.Errorf("links: %+v, %v", links, err)
	}
	for _, bad := range []string{"0", "5-3", "x", "-4"} {
		if _, err := ParseRange(bad); !errors.Is(err, ErrInput) {
			t.Errorf("length %q accepted", bad)
		}
	}
	if _, err := ParseSLO("ttft=300ms,latency=3ms"); !errors.Is(err, ErrInput) {
		t.Error("an SLO with an unknown name was accepted")
	}
}

// The HTML report, opened in a real headless browser, has every plot laid
// out with visible marks (the page's own check, read back from the DOM).
func TestHTMLRendersInChromium(t *testing.T) {
	browser, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("chromium is missing: make deps installs it")
		}
		t.Skip("chromium not installed (make deps installs it)")
	}
	workers := enginetest.ServeRoute(t, 2, time.Millisecond, engine.Config{})
	rep := &Report{Schema: Schema, Started: time.Now(), Command: "test"}
	for _, c := range []int{1, 3} {
		s, err := Run(context.Background(), Target{Name: "route", Addrs: workers, Workers: workers}, smallWorkload(c, 6), RunOptions{Label: "c"})
		if err != nil {
			t.Fatal(err)
		}
		s.Stages = []map[string]Dist{{"queue": {Count: 1, P50: 0.1}, "forward": {Count: 1, P50: 1}}, {"forward": {Count: 1, P50: 2}}}
		s.Idle = []HopIdle{{Busy: 0.9, Before: map[string]IdleGap{telemetry.BeforeGroup: {Share: 0.08}, telemetry.BeforePart: {Share: 0.02}}},
			{Busy: 0.8, Before: map[string]IdleGap{telemetry.BeforeMixed: {Share: 0.2}}}}
		rep.Runs = append(rep.Runs, s)
	}
	rep.Runs[0].TurnTTFT = []float64{12, 20, 31} // as a run of conversations reports
	rep.Finish(nil, "concurrency")
	page := filepath.Join(t.TempDir(), "r.html")
	if err := rep.WriteHTML(page); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", "file://"+page).Output()
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	dom := string(out)
	total := regexp.MustCompile(`data-plots="(\d+)"`).FindStringSubmatch(dom)
	rendered := regexp.MustCompile(`data-plots-rendered="(\d+)"`).FindStringSubmatch(dom)
	// TTFT CDF, ITL CDF, ITL over time, TTFT by turn, hops, stages, idle,
	// sweep throughput, sweep ITL.
	if total == nil || total[1] != "9" {
		t.Fatalf("page has %v plots, want 9", total)
	}
	if rendered == nil || rendered[1] != total[1] {
		t.Fatalf("browser rendered %v of %s plots", rendered, total[1])
	}
	for _, id := range []string{"ttft-cdf", "itl-cdf", "itl-time", "turn-ttft", "hops", "idle-c", "sweep-throughput", "sweep-itl"} {
		if !regexp.MustCompile(`id="` + id + `"[^>]*data-rendered="yes"|data-rendered="yes"[^>]*id="` + id + `"`).MatchString(dom) {
			t.Errorf("plot %s not rendered", id)
		}
	}
}

// The text report prints each hop's prefix cache share and loads without
// room, and its KV stream placeholders and copies, only for runs that had
// any.
func TestReportHopCounters(t *testing.T) {
	r := &Report{Runs: []*Summary{
		{Label: "cached", PrefixHitRate: []float64{0.5, 0.25}, PrefixMisfits: []int64{0, 3}},
		{Label: "exact", StreamPlaceholders: []int64{12, 0}, StreamCopies: []int64{4, 2}},
		{Label: "plain", PrefixHitRate: []float64{0, 0}, StreamPlaceholders: []int64{0, 0}, StreamCopies: []int64{0, 0}},
	}}
	var out strings.Builder
	r.WriteText(&out)
	for _, want := range []string{
		"prefix cache, prompt tokens answered, cached: hop 0 50%, hop 1 25% (3 loads found no room)\n",
		"KV streams, placeholder rows / stream copies, exact: hop 0 12 / 4, hop 1 0 / 2\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), ", plain:") {
		t.Errorf("a run with nothing to report has a line:\n%s", out.String())
	}
}

// A run's span files give each hop's stages and its forwards: the text
// report prints the busy share and the idle by what came next.
func TestFromSpansIdle(t *testing.T) {
	ms := int64(time.Millisecond)
	var lines []string
	span := func(inst, id, parent, name string, start, end int64, mode string) {
		attrs := ""
		if mode != "" {
			attrs = fmt.Sprintf(`,"attributes":{"shardd.mode":%q}`, mode)
		}
		lines = append(lines, fmt.Sprintf(`{"trace_id":"t","span_id":%q,"parent_span_id":%q,"name":%q,"instance":%q,"start_unix_nano":%d,"end_unix_nano":%d%s}`,
			id, parent, name, inst, start, end, attrs))
	}
	n := 0
	fwd := func(inst string, start, end int64, decode, prompt int) {
		for i := range decode + prompt {
			n++
			id, mode := fmt.Sprint("s", n), "CACHE_MODE_DECODE"
			if i >= decode {
				mode = "CACHE_MODE_PREFILL"
			}
			span(inst, id, "", "shardd.step", start*ms, end*ms, mode)
			span(inst, id+"f", id, "forward", start*ms, end*ms, "")
		}
	}
	fwd("w0", 100, 140, 16, 0)
	fwd("w0", 150, 190, 16, 0) // 10 ms before a group
	fwd("w0", 230, 240, 2, 0)  // 40 ms before part of one
	fwd("w0", 250, 300, 0, 8)  // 10 ms before prompt rows
	fwd("w1", 120, 180, 16, 0)
	stages, idle, crossings, err := fromSpans([]string{spanFile(t, lines)}, []string{"w0", "w1"}, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(crossings) != 2 || crossings[0].Groups+crossings[1].Groups != 0 {
		t.Errorf("crossings %+v, want none: the steps have no sessions", crossings)
	}
	if len(stages) != 2 || stages[0]["forward"].Count != 42 {
		t.Fatalf("stages %v, want w0's 42 forward spans", stages)
	}
	want := HopIdle{Busy: 0.7, Forwards: 4, GroupRows: 16, Before: map[string]IdleGap{
		telemetry.BeforeGroup: {Share: 0.05, MeanMs: 10, Forwards: 1}, telemetry.BeforePart: {Share: 0.2, MeanMs: 40, Forwards: 1},
		telemetry.BeforePrompt: {Share: 0.05, MeanMs: 10, Forwards: 1}}}
	if fmt.Sprintf("%.4v", idle[0]) != fmt.Sprintf("%.4v", want) {
		t.Errorf("w0:\n got %+v\nwant %+v", idle[0], want)
	}
	if idle[1].Busy != 1 || idle[1].Forwards != 1 {
		t.Errorf("w1: %+v, want one forward, all busy", idle[1])
	}
	r := &Report{Runs: []*Summary{{Label: "route", Idle: idle}}}
	var out strings.Builder
	r.WriteText(&out)
	if !regexp.MustCompile(`(?m)^ +0 +70\.0% +4 +16 +5\.0%, 10\.0 ms \(1\) +20\.0%, 40\.0 ms \(1\) +0\.0%, 0\.0 ms \(0\) +5\.0%, 10\.0 ms \(1\)$`).MatchString(out.String()) {
		t.Errorf("report lacks w0's idle row:\n%s", out.String())
	}

	// A budget holds each hop to a busy share.
	b, err := ReadBudget(budgetFile(t, "busy.yaml", "hop[0].busy: 0.8\nhop[1].busy: 0.9\nhop[2].busy: 0.1\n"))
	if err != nil {
		t.Fatal(err)
	}
	r.Finish(b, "")
	var verdict []string
	for _, ch := range r.Budget {
		verdict = append(verdict, fmt.Sprintf("%s %v %v %.3f", ch.Limit, ch.Pass, ch.Missing, ch.Over))
	}
	if got, want := strings.Join(verdict, "; "), "hop[0].busy >= 0.8 false false 0.125; hop[1].busy >= 0.9 true false 0.000; "+
		"hop[2].busy >= 0.1 false true 0.000"; got != want {
		t.Errorf("busy budget:\n got %s\nwant %s", got, want)
	}
	if _, err := ReadBudget(budgetFile(t, "over.yaml", "hop[0].busy: 1.5\n")); !errors.Is(err, ErrInput) {
		t.Errorf("a busy share over 1: err = %v, want ErrInput", err)
	}
}

// TestFromSpansCrossings reads a route's crossings from its workers' span
// files: per hop the decode groups that crossed into it, in parts.
func TestFromSpansCrossings(t *testing.T) {
	var lines []string
	n := 0
	// step writes one decode step of session sess on inst: its arrival,
	// its forward and its frame-out end, in ms.
	step := func(inst, sess string, arrived, start, end, sent float64) {
		n++
		id := fmt.Sprint("s", n)
		ns := func(v float64) int64 { return int64(v * float64(time.Millisecond)) }
		lines = append(lines,
			fmt.Sprintf(`{"trace_id":"t","span_id":%q,"name":"shardd.step","instance":%q,"start_unix_nano":%d,"end_unix_nano":%d,"attributes":{"shardd.mode":"CACHE_MODE_DECODE","shardd.tokens":"1","shardd.route_session":%q}}`,
				id, inst, ns(arrived), ns(sent), sess))
		for _, sp := range []struct {
			name       string
			start, end float64
		}{{"decode", arrived, arrived + 0.01}, {"forward", start, end}, {"frameout", end, sent}} {
			lines = append(lines, fmt.Sprintf(`{"trace_id":"t","span_id":"%s%s","parent_span_id":%q,"name":%q,"instance":%q,"start_unix_nano":%d,"end_unix_nano":%d}`,
				id, sp.name, id, sp.name, inst, ns(sp.start), ns(sp.end)))
		}
	}
	// Two tokens of a group of two round a 2-hop route: w0 -> w1 takes
	// 0.75 + 2.25 + 1 ms, and w1 -> w0 (through the head) between the two
	// tokens 0.5 + 2 + 0.5 ms.
	for tok := range 2 {
		at := float64(tok) * 82
		for i, sess := range []string{"a", "b"} {
			off := float64(i) / 2
			step("w0", sess, at+off, at+1, at+40, at+40.5+off/2)
			step("w1", sess, at+42.5+off, at+44, at+80, at+80.5)
		}
	}
	_, _, crossings, err := fromSpans([]string{spanFile(t, lines)}, []string{"w0", "w1"}, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(crossings) != 2 || crossings[1].Groups != 2 || crossings[0].Groups != 1 {
		t.Fatalf("crossings %+v, want 2 groups into w1 and 1 into w0", crossings)
	}
	got := fmt.Sprintf("%.2f %.2f %.2f %.2f / %.2f %.2f %.2f %.2f",
		crossings[1].Out.P50, crossings[1].Relay.P50, crossings[1].Wait.P50, crossings[1].Total.P50,
		crossings[0].Out.P50, crossings[0].Relay.P50, crossings[0].Wait.P50, crossings[0].Total.P50)
	if want := "0.75 2.25 1.00 4.00 / 0.50 2.00 0.50 3.00"; got != want {
		t.Errorf("crossings into w1 / w0 (out, relay, wait, in all; p50 ms):\n got %s\nwant %s", got, want)
	}
	r := &Report{Runs: []*Summary{{Label: "route", Crossings: crossings}}}
	var out strings.Builder
	r.WriteText(&out)
	if !regexp.MustCompile(`(?m)^ +1 +0 +2 +0\.75 ms / 0\.75 ms +2\.25 ms / 2\.25 ms +1\.00 ms / 1\.00 ms +4\.00 ms / 4\.00 ms$`).MatchString(out.String()) {
		t.Errorf("report lacks the crossing into hop 1:\n%s", out.String())
	}
}

// spanFile writes span JSON lines to a file of the test's and returns its
// path.
func spanFile(t *testing.T, lines []string) string {
	file := filepath.Join(t.TempDir(), "spans.jsonl")
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}
