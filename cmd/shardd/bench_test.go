package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshnet/shardd/bufpool"
	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/internal/hoststat"
	"github.com/meshnet/shardd/internal/race"
	"github.com/meshnet/shardd/load"
)

// buildShardd builds the shardd binary into dir the way this test binary
// was built (-race and the invariants tag or not), so the packages
// compiled for the test are reused.
func buildShardd(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "shardd")
	build := []string{"build", "-o", bin}
	switch {
	case race.Enabled:
		build = append(build, "-race", "-tags", "invariants")
	case bufpool.Invariants: // the soak: the workers check what the test does
		build = append(build, "-tags", "invariants")
	}
	if out, err := exec.Command("go", append(build, ".")...).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// tinyModel writes the tiny preset into dir.
func tinyModel(t *testing.T, dir string) string {
	t.Helper()
	model := filepath.Join(dir, "tiny.gguf")
	if err := gguf.Generate(model, gguf.Presets["tiny"]); err != nil {
		t.Fatal(err)
	}
	return model
}

// The harness as an operator runs it: it splits the tiny model, starts a
// worker per shard and the unsplit baseline as real `shardd serve`
// processes, loads them, writes the JSON and HTML reports, exits 0 when the
// budget holds and 1 when it does not, and leaves no worker behind.
func TestBenchCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("builds shardd and runs real workers")
	}
	dir := t.TempDir()
	bin, model := buildShardd(t, dir), tinyModel(t, dir)
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	holds := write("ok.yaml", "ttft.p99: 60s\nitl.p99: 10s\ngoodput: 0.5\nhop[1].exec.p50: 10s\n")
	broken := write("bad.yaml", "itl.p50: 1us\n")
	run := func(budget string, extra ...string) (string, int) {
		args := append([]string{"bench", "--model", model, "--shards", "2", "--concurrency", "2", "--requests", "6",
			"--prompt-len", "8-16", "--output-len", "8", "--budget", budget, "--quiet"}, extra...)
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+filepath.Join(dir, "cache"))
		out, err := cmd.CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	jsonPath, htmlPath := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.html")
	out, code := run(holds, "--unsplit", "--json", jsonPath, "--html", htmlPath)
	if code != 0 || !strings.Contains(out, "budget: all 4 limits hold") {
		t.Fatalf("exit %d with a budget that holds:\n%s", code, out)
	}
	var rep load.Report
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Schema != load.Schema || len(rep.Runs) != 2 || rep.Runs[0].Target != "route" || rep.Runs[1].Target != "unsplit" {
		t.Fatalf("report: schema %q, %d runs", rep.Schema, len(rep.Runs))
	}
	for _, s := range rep.Runs {
		if s.Requests != 6 || s.Errors != 0 || s.OutputTokens != 48 || s.ITL.Count != 42 {
			t.Errorf("%s: %d requests, %d errors, %d tokens, %d gaps", s.Label, s.Requests, s.Errors, s.OutputTokens, s.ITL.Count)
		}
	}
	if len(rep.Runs[0].Hops) != 2 || len(rep.Runs[1].Hops) != 1 || rep.Medians[1].Ratio <= 0 {
		t.Errorf("hops %d and %d, unsplit ratio %v", len(rep.Runs[0].Hops), len(rep.Runs[1].Hops), rep.Medians[1].Ratio)
	}
	if fi, err := os.Stat(htmlPath); err != nil || fi.Size() < 10_000 {
		t.Errorf("HTML report: %v", err)
	}

	checkCeiling(t, bin, model, dir)

	out, code = run(broken)
	if code != 1 || !strings.Contains(out, "itl.p50 <= 0.001 ms") || !strings.Contains(out, "FAIL by") {
		t.Fatalf("exit %d with a broken budget:\n%s", code, out)
	}
	if ps, _ := exec.Command("pgrep", "-f", bin+" serve").Output(); len(ps) > 0 {
		t.Errorf("workers left running: %s", ps)
	}
}

// checkCeiling runs bench --ceiling on a timed closed loop: each round
// also runs the baseline at 2 sessions / 2 hops, and the report bounds
// route / whole by 2 x whole(2) / whole(4), round by round and in medians.
// The workers are pinned (to one CPU this process may use), so every run
// probes the host's read speed before and after and samples its CPU's
// speed throughout, and each round says how far they moved.
func checkCeiling(t *testing.T, bin, model, dir string) {
	t.Helper()
	cpu, err := hoststat.FirstCPU()
	if err != nil {
		t.Fatal(err)
	}
	jsonPath := filepath.Join(dir, "ceiling.json")
	cmd := exec.Command(bin, "bench", "--model", model, "--shards", "2", "--unsplit", "--ceiling", "--concurrency", "4",
		"--duration", "1s", "--prompt-len", "8", "--output-len", "8", "--rounds", "2", "--quiet", "--json", jsonPath,
		"--worker-cpus", fmt.Sprintf("%d;%d", cpu, cpu), "--unsplit-cpus", fmt.Sprint(cpu))
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+filepath.Join(dir, "cache"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bench --ceiling: %v\n%s", err, out)
	}
	var rep load.Report
	if b, err := os.ReadFile(jsonPath); err != nil {
		t.Fatal(err)
	} else if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	tps := map[string]float64{}
	pace := map[string]float64{}
	slow := map[string]float64{}
	reads := map[int][]float64{}
	for _, s := range rep.Runs {
		tps[fmt.Sprintf("%s c=%d r%d", s.Target, s.Concurrency, s.Round)] = s.OutputTokensPerS
		if len(s.HostReadGBps) != 2 || slices.Min(s.HostReadGBps) <= 0 {
			t.Errorf("%s: host read speed %v, want before and after", s.Label, s.HostReadGBps)
		}
		// A second's run sampled every 100 ms: about 10 samples in one or
		// two windows, fewer samples on a loaded machine.
		if c := s.HostCores; c == nil || !slices.Equal(c.CPUs, []int{cpu}) || len(c.Samples) != 1 || c.Samples[0] < 3 ||
			c.Windows < 1 || c.Slowest <= 0 {
			t.Errorf("%s: cores %+v, want CPU %d sampled", s.Label, c, cpu)
		} else {
			k := fmt.Sprintf("%s c=%d r%d", s.Target, s.Concurrency, s.Round)
			pace[k], slow[k] = c.GBps[0], c.Slowest
		}
		// The pinned CPU's steal over the run: a share, 0 on a host that
		// steals nothing.
		if len(s.HostSteal) != 1 || s.HostSteal[0] < 0 || s.HostSteal[0] > 1 {
			t.Errorf("%s: steal %v, want CPU %d's share", s.Label, s.HostSteal, cpu)
		}
		reads[s.Round] = append(reads[s.Round], s.HostReadGBps...)
	}
	cl := rep.Ceiling
	if len(rep.Runs) != 6 || cl == nil || cl.Hops != 2 || len(cl.Rows) != 3 || !strings.Contains(string(out), "pipeline ceiling") {
		t.Fatalf("runs %v, ceiling %+v\n%s", tps, cl, out)
	}
	for _, r := range cl.Rows[:2] {
		whole, half := tps[fmt.Sprintf("unsplit c=4 r%d", r.Round)], tps[fmt.Sprintf("unsplit c=2 r%d", r.Round)]
		ratio := tps[fmt.Sprintf("route c=4 r%d", r.Round)] / whole
		if whole <= 0 || half <= 0 || math.Abs(r.Ceiling-2*half/whole) > 1e-9 || math.Abs(r.Ratio-ratio) > 1e-9 ||
			math.Abs(r.Share-ratio/r.Ceiling) > 1e-9 {
			t.Errorf("round %d: %+v from %v", r.Round, r, tps)
		}
		v := reads[r.Round]
		if want := (slices.Max(v) - slices.Min(v)) / median(v); len(v) != 6 || math.Abs(r.HostSpread-want) > 1e-9 {
			t.Errorf("round %d: host spread %v from %v, want %v", r.Round, r.HostSpread, v, want)
		}
		p := pace[fmt.Sprintf("route c=4 r%d", r.Round)] / pace[fmt.Sprintf("unsplit c=4 r%d", r.Round)]
		if math.IsNaN(p) || math.Abs(r.CorePace-p) > 1e-9 || r.CoreSpread < 0 {
			t.Errorf("round %d: core pace %v (spread %v), want %v from %v", r.Round, r.CorePace, r.CoreSpread, p, pace)
		}
		if p := slow[fmt.Sprintf("route c=4 r%d", r.Round)] / slow[fmt.Sprintf("unsplit c=4 r%d", r.Round)]; math.IsNaN(p) ||
			math.Abs(r.SlowPace-p) > 1e-9 {
			t.Errorf("round %d: slow pace %v, want %v from %v", r.Round, r.SlowPace, p, slow)
		}
	}
	if m := cl.Rows[2]; m.Round != 0 || m.Concurrency != 4 || m.Ceiling <= 0 {
		t.Errorf("medians row %+v", m)
	}
}

// --kill with --standbys: hop 1's worker dies half a second into each
// run; generations move to its standby and none is lost; the worker is
// started again for the next round; the report says when and how long the
// failovers took.
func TestBenchKill(t *testing.T) {
	if testing.Short() {
		t.Skip("builds shardd and runs real workers")
	}
	dir := t.TempDir()
	bin, model := buildShardd(t, dir), tinyModel(t, dir)
	jsonPath := filepath.Join(dir, "r.json")
	cmd := exec.Command(bin, "bench", "--model", model, "--shards", "2", "--standbys", "1", "--kill", "1@500ms",
		"--concurrency", "4", "--duration", "2s", "--rounds", "2", "--prompt-len", "8", "--output-len", "32",
		"--quiet", "--json", jsonPath, "--html", filepath.Join(dir, "r.html"))
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+filepath.Join(dir, "cache"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bench --kill: %v\n%s", err, out)
	}
	var rep load.Report
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 2 {
		t.Fatalf("%d runs", len(rep.Runs))
	}
	for _, s := range rep.Runs {
		if s.Errors != 0 || s.Failovers == 0 || s.KillAtS < 0.4 || s.FailoverTime.Count != int64(s.Failovers) {
			t.Errorf("%s: %d errors %v, %d failovers (%d timed), killed at %.2f s", s.Label, s.Errors, s.ErrorSamples, s.Failovers, s.FailoverTime.Count, s.KillAtS)
		}
	}
	if !strings.Contains(string(out), "generations failed over") {
		t.Errorf("the report does not tell the failovers:\n%s", out)
	}
	if ps, _ := exec.Command("pgrep", "-f", bin+" serve").Output(); len(ps) > 0 {
		t.Errorf("workers left running: %s", ps)
	}
}

// median is the middle of v, or the mean of its two middle values.
func median(v []float64) float64 {
	v = slices.Sorted(slices.Values(v))
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}
