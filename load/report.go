package load

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshnet/shardd/telemetry"
)

// Schema names the JSON report's layout. A field is never renamed or
// given another meaning under one schema name; new fields may be added.
const Schema = "shardd.bench/v1"

// Report is everything a harness invocation measured; it is the --json
// file. Times are milliseconds unless a field's name says otherwise.
type Report struct {
	Schema   string       `json:"schema"`
	Started  time.Time    `json:"started"`
	Command  string       `json:"command"`
	Workload WorkloadInfo `json:"workload"`
	Targets  []TargetInfo `json:"targets"`
	// Runs are in the order they ran: rounds interleave the targets.
	Runs []*Summary `json:"runs"`
	// Medians are per target and load level, over the rounds; Ratio is
	// the target's tokens/s over the first target's at that level.
	Medians []Median `json:"medians"`
	// Sweep is present when the load was swept.
	Sweep *Sweep `json:"sweep,omitempty"`
	// Ceiling is present when the bench measured it (--ceiling).
	Ceiling *Ceiling `json:"ceiling,omitempty"`
	// Budget is every limit checked against every run of the first
	// target; BudgetPass is false when any failed.
	Budget     []Check `json:"budget,omitempty"`
	BudgetPass bool    `json:"budget_pass"`
}

// WorkloadInfo records the load, for the report.
type WorkloadInfo struct {
	Mode        string  `json:"mode"` // "closed" or "open"
	Concurrency []int   `json:"concurrency,omitempty"`
	Rate        float64 `json:"rate,omitempty"`
	Requests    int     `json:"requests,omitempty"`
	DurationS   float64 `json:"duration_s,omitempty"`
	Warmup      int     `json:"warmup"`
	PromptLen   [2]int  `json:"prompt_len"`
	OutputLen   [2]int  `json:"output_len"`
	LengthPairs int     `json:"length_pairs,omitempty"`
	// Prompts is the number of text prompts (bench --prompts), whose
	// lengths PromptLen gives in the model's tokens, with their median.
	Prompts         int     `json:"prompts,omitempty"`
	PromptTokensP50 int     `json:"prompt_tokens_p50,omitempty"`
	Temperature     float64 `json:"temperature"`
	TopK            int     `json:"top_k"`
	TopP            float64 `json:"top_p"`
	Seed            uint64  `json:"seed"`
	Rounds          int     `json:"rounds"`
	SLO             string  `json:"slo,omitempty"`
	// Prefixes shared system prompts of PrefixLen tokens, Turns per
	// conversation, and the gamma shape of open-loop arrivals (Workload).
	Prefixes   int     `json:"shared_prefixes,omitempty"`
	PrefixLen  int     `json:"prefix_len,omitempty"`
	Turns      int     `json:"turns,omitempty"`
	Burstiness float64 `json:"burstiness,omitempty"`
}

// TargetInfo describes a target.
type TargetInfo struct {
	Name    string   `json:"name"`
	Workers []string `json:"workers"`
	Ranges  []string `json:"ranges,omitempty"`
	Threads []int    `json:"threads,omitempty"`
	CPUs    []string `json:"cpus,omitempty"`
	Links   []string `json:"links,omitempty"`
	// Standbys are each hop's standby workers.
	Standbys [][]string `json:"standbys,omitempty"`
}

// Median is one target at one load level over its rounds.
type Median struct {
	Target           string  `json:"target"`
	Concurrency      int     `json:"concurrency,omitempty"`
	Rate             float64 `json:"rate,omitempty"`
	Rounds           int     `json:"rounds"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	SteadyTokensPerS float64 `json:"steady_tokens_per_s,omitempty"`
	TTFTP99          float64 `json:"ttft_p99_ms"`
	ITLP99           float64 `json:"itl_p99_ms"`
	Goodput          float64 `json:"goodput"`
	// Spread is (max - min) / median of tokens/s over the rounds;
	// SteadySpread the same of the steady tokens/s.
	Spread       float64 `json:"spread"`
	SteadySpread float64 `json:"steady_spread,omitempty"`
	Ratio        float64 `json:"ratio"`
}

// Sweep is the throughput/latency curve of the first target.
type Sweep struct {
	Param  string   `json:"param"`
	Levels []Median `json:"levels"`
	// Knee is the smallest level whose tokens/s reaches 90% of the
	// curve's peak: past it, more load mostly adds latency.
	Knee float64 `json:"knee"`
}

// Finish computes the medians, the sweep's knee and the budget verdict.
func (r *Report) Finish(budget Budget, sweepParam string) {
	type key struct {
		target string
		c      int
		rate   float64
	}
	groups := map[key][]*Summary{}
	var order []key
	for _, s := range r.Runs {
		k := key{s.Target, s.Concurrency, s.Rate}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], s)
	}
	first := ""
	if len(r.Runs) > 0 {
		first = r.Runs[0].Target
	}
	base := map[[2]float64]float64{}
	r.Medians = nil
	for _, k := range order {
		g := groups[k]
		tps := collect(g, func(s *Summary) float64 { return s.OutputTokensPerS })
		m := Median{Target: k.target, Concurrency: k.c, Rate: k.rate, Rounds: len(g),
			OutputTokensPerS: median(tps),
			TTFTP99:          median(collect(g, func(s *Summary) float64 { return s.TTFT.P99 })),
			ITLP99:           median(collect(g, func(s *Summary) float64 { return s.ITL.P99 })),
			Goodput:          median(collect(g, func(s *Summary) float64 { return s.Goodput })),
		}
		m.Spread = spread(tps)
		steady := collect(g, func(s *Summary) float64 { return s.SteadyTokensPerS })
		m.SteadyTokensPerS, m.SteadySpread = median(steady), spread(steady)
		lvl := [2]float64{float64(k.c), k.rate}
		if k.target == first {
			base[lvl] = m.OutputTokensPerS
		}
		if b := base[lvl]; b > 0 {
			m.Ratio = m.OutputTokensPerS / b
		}
		r.Medians = append(r.Medians, m)
	}
	if sweepParam != "" {
		sw := &Sweep{Param: sweepParam}
		peak := 0.0
		for _, m := range r.Medians {
			if m.Target == first {
				sw.Levels = append(sw.Levels, m)
				peak = max(peak, m.OutputTokensPerS)
			}
		}
		sort.Slice(sw.Levels, func(a, b int) bool { return sw.Levels[a].level() < sw.Levels[b].level() })
		for _, m := range sw.Levels {
			if m.OutputTokensPerS >= 0.9*peak {
				sw.Knee = m.level()
				break
			}
		}
		r.Sweep = sw
	}
	if r.Ceiling != nil {
		r.Ceiling.finish(r.Runs)
	}
	r.Budget, r.BudgetPass = nil, true
	for _, s := range r.Runs {
		if s.Target != first {
			continue
		}
		for _, c := range budget.Evaluate(s) {
			r.Budget = append(r.Budget, c)
			r.BudgetPass = r.BudgetPass && c.Pass
		}
	}
}

func (m Median) level() float64 {
	if m.Rate > 0 {
		return m.Rate
	}
	return float64(m.Concurrency)
}

func collect(g []*Summary, f func(*Summary) float64) []float64 {
	out := make([]float64, len(g))
	for i, s := range g {
		out[i] = f(s)
	}
	return out
}

// spread is (max - min) / median of v (0 when the median is 0).
func spread(v []float64) float64 {
	m := median(v)
	if m <= 0 {
		return 0
	}
	return (slices.Max(v) - slices.Min(v)) / m
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// WriteJSON writes the report to path.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// writeTurns prints each run's TTFT p50 by turn of its conversations.
func (r *Report) writeTurns(w io.Writer) {
	for _, s := range r.Runs {
		if len(s.TurnTTFT) == 0 {
			continue
		}
		parts := make([]string, len(s.TurnTTFT))
		for i, v := range s.TurnTTFT {
			parts[i] = fmt.Sprintf("%d: %s", i+1, msf(v))
		}
		fmt.Fprintf(w, "TTFT p50 by turn, %s: %s\n", s.Label, strings.Join(parts, ", "))
	}
}

// writeWorkerMetrics prints each run's figures per hop from the workers'
// metrics: prefix cache hits, backend busy share, rows per forward and
// cost model, and the exact mode's KV stream work.
func (r *Report) writeWorkerMetrics(w io.Writer) {
	for _, s := range r.Runs {
		if len(s.PrefixHitRate) == 0 || slices.Max(s.PrefixHitRate) == 0 {
			continue
		}
		parts := make([]string, len(s.PrefixHitRate))
		for i, v := range s.PrefixHitRate {
			parts[i] = fmt.Sprintf("hop %d %.0f%%", i, 100*v)
			if i < len(s.PrefixMisfits) && s.PrefixMisfits[i] > 0 {
				parts[i] += fmt.Sprintf(" (%d loads found no room)", s.PrefixMisfits[i])
			}
		}
		fmt.Fprintf(w, "prefix cache, prompt tokens answered, %s: %s\n", s.Label, strings.Join(parts, ", "))
	}
	for _, s := range r.Runs {
		if len(s.HopBusy) == 0 {
			continue
		}
		parts := make([]string, len(s.HopBusy))
		for i, v := range s.HopBusy {
			parts[i] = fmt.Sprintf("hop %d %.0f%% / %.1f", i, 100*v, s.HopRowsPerForward[i])
			if c := s.HopCost[i]; c[1] > 0 {
				parts[i] += fmt.Sprintf(" / %.1f + %.2f ms", 1e3*c[0], 1e3*c[1])
			}
		}
		fmt.Fprintf(w, "backend busy / rows per forward / cost model (a forward + a row), %s: %s\n", s.Label, strings.Join(parts, ", "))
	}
	for _, s := range r.Runs {
		if len(s.StreamPlaceholders) == 0 || slices.Max(s.StreamPlaceholders)+slices.Max(s.StreamCopies) == 0 {
			continue
		}
		parts := make([]string, len(s.StreamPlaceholders))
		for i := range parts {
			parts[i] = fmt.Sprintf("hop %d %d / %d", i, s.StreamPlaceholders[i], s.StreamCopies[i])
		}
		fmt.Fprintf(w, "KV streams, placeholder rows / stream copies, %s: %s\n", s.Label, strings.Join(parts, ", "))
	}
}

// WriteText prints the summary tables.
func (r *Report) WriteText(w io.Writer) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "run\trequests\terrors\ttokens/s\tsteady\treq/s\tTTFT p50\tTTFT p99\tITL p50\tITL p99\tTPOT p50\tE2E p99\tgoodput\tharness CPU/token\t")
	for _, s := range r.Runs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%.1f\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\t%.3f\t%.0f us\t\n", s.Label, s.Requests, s.Errors,
			s.OutputTokensPerS, s.SteadyTokensPerS, s.RequestsPerS, msf(s.TTFT.P50), msf(s.TTFT.P99), msf(s.ITL.P50), msf(s.ITL.P99),
			msf(s.TPOT.P50), msf(s.E2E.P99), s.Goodput, s.HarnessCPUPerTokenMicros)
	}
	tw.Flush()
	r.writeTurns(w)
	r.writeWorkerMetrics(w)
	r.writeHost(w)
	r.writeHops(w)
	for _, s := range r.Runs {
		if len(s.Stages) == 0 {
			continue
		}
		fmt.Fprintf(w, "\nstages of %s (worker spans, p50 / p99)\n", s.Label)
		tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprint(tw, "hop\t")
		names := stageNames(s.Stages)
		for _, n := range names {
			fmt.Fprintf(tw, "%s\t", n)
		}
		fmt.Fprintln(tw)
		for i, st := range s.Stages {
			fmt.Fprintf(tw, "%d\t", i)
			for _, n := range names {
				fmt.Fprintf(tw, "%s / %s\t", msf(st[n].P50), msf(st[n].P99))
			}
			fmt.Fprintln(tw)
		}
		tw.Flush()
	}
	r.writeIdle(w)
	r.writeCrossings(w)
	var errs []string
	for _, s := range r.Runs {
		for code, n := range s.ErrorsByCode {
			line := fmt.Sprintf("%s: %s %d", s.Label, code, n)
			if e := s.ErrorSamples[code]; e != "" {
				line += " (first: " + e + ")"
			}
			errs = append(errs, line)
		}
		if s.KillAtS > 0 {
			errs = append(errs, fmt.Sprintf("%s: a worker killed at %.1f s; %d generations failed over, failover time p50 %s, p99 %s",
				s.Label, s.KillAtS, s.Failovers, msf(s.FailoverTime.P50), msf(s.FailoverTime.P99)))
			if s.TokensPerSBeforeKill > 0 && s.TokensPerSAfterKill > 0 {
				errs = append(errs, fmt.Sprintf("%s: %.1f tokens/s in the 3 s before the kill, %.1f in the 3 s after (%.2fx)",
					s.Label, s.TokensPerSBeforeKill, s.TokensPerSAfterKill, s.TokensPerSAfterKill/s.TokensPerSBeforeKill))
			}
		}
		if s.Retries+s.Recoveries+s.Busy > 0 {
			errs = append(errs, fmt.Sprintf("%s: %d retries, %d re-prefills after a cache miss, %d refusals of a full worker ridden out (%.1f s waited)",
				s.Label, s.Retries, s.Recoveries, s.Busy, s.BusyWaitS))
		}
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		fmt.Fprintf(w, "\nerrors and recoveries\n  %s\n", strings.Join(errs, "\n  "))
	}
	r.writeMedians(w)
	if r.Ceiling != nil {
		r.Ceiling.write(w)
	}
	if r.Sweep != nil {
		fmt.Fprintf(w, "\nsweep of %s: knee at %g (the first level with 90%% of the peak tokens/s)\n", r.Sweep.Param, r.Sweep.Knee)
	}
	if len(r.Budget) > 0 {
		fmt.Fprintln(w)
		failed := 0
		tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "budget\trun\tlimit\tvalue\tverdict\t")
		for _, c := range r.Budget {
			verdict := "ok"
			switch {
			case c.Missing:
				verdict, failed = "FAIL: not measured", failed+1
			case !c.Pass:
				verdict, failed = fmt.Sprintf("FAIL by %.1f%%", 100*c.Over), failed+1
			}
			fmt.Fprintf(tw, "\t%s\t%s\t%s\t%s\t\n", c.Run, c.Limit, formatFigure(c.Limit.Metric, c.Value), verdict)
		}
		tw.Flush()
		if failed > 0 {
			fmt.Fprintf(w, "budget: %d of %d limits FAILED\n", failed, len(r.Budget))
		} else {
			fmt.Fprintf(w, "budget: all %d limits hold\n", len(r.Budget))
		}
	}
}

// writeMedians writes the medians over rounds, with each target's ratio to
// the first.
func (r *Report) writeMedians(w io.Writer) {
	if len(r.Medians) < 2 {
		return
	}
	fmt.Fprintln(w, "\nmedians over rounds (ratio: tokens/s over the first target's; steady: tokens/s until the arrivals ended)")
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\tload\trounds\ttokens/s\tspread\tsteady\tspread\tratio\tTTFT p99\tITL p99\tgoodput\t")
	for _, m := range r.Medians {
		ratio := "-" // no run of the first target at this level (--ceiling's c/hops)
		if m.Ratio > 0 {
			ratio = fmt.Sprintf("%.2fx", m.Ratio)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f\t%.0f%%\t%.1f\t%.0f%%\t%s\t%s\t%s\t%.3f\t\n", m.Target, m.Load(), m.Rounds,
			m.OutputTokensPerS, 100*m.Spread, m.SteadyTokensPerS, 100*m.SteadySpread, ratio, msf(m.TTFTP99), msf(m.ITLP99), m.Goodput)
	}
	tw.Flush()
}

func (m Median) Load() string {
	if m.Rate > 0 {
		return fmt.Sprintf("rate %g/s", m.Rate)
	}
	return fmt.Sprintf("c=%d", m.Concurrency)
}

// writeHops writes each route run's hops (an OpenAI server has none).
func (r *Report) writeHops(w io.Writer) {
	if !slices.ContainsFunc(r.Runs, func(s *Summary) bool { return len(s.Hops) > 0 }) {
		return
	}
	fmt.Fprintln(w, "\nper hop, decode steps (exec: the worker's own execution; wire: the head's wait beyond it; out: payload bytes the hop returned per generated token)")
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "run\thop\tworker\tsteps\texec p50\texec p99\twire p50\twire p99\tprefill exec p50\tout B/token\t")
	for _, s := range r.Runs {
		for _, h := range s.Hops {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%.0f\t\n", s.Label, h.Hop, h.Worker, h.Exec.Count,
				msf(h.Exec.P50), msf(h.Exec.P99), msf(h.Wire.P50), msf(h.Wire.P99), msf(h.PrefillExec.P50), h.OutBytesPerToken)
		}
	}
	tw.Flush()
}

func msf(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f ms", v)
}

// stageNames are the stages present, in pipeline order.
func stageNames(stages []map[string]Dist) []string {
	order := []string{"decode", "reassemble", "decompress", "checksum", "queue", "forward", "frameout", "step"}
	var out []string
	for _, n := range order {
		for _, st := range stages {
			if _, ok := st[n]; ok {
				out = append(out, n)
				break
			}
		}
	}
	return out
}

// writeHost notes what the host's kdamond ran during each run, where it
// ran at all (the forwards it stalled are in the latency tails above), and
// the host's memory read speed around each run, where it was probed.
func (r *Report) writeHost(w io.Writer) {
	var parts []string
	for _, s := range r.Runs {
		if s.HostKdamondMillis > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f ms", s.Label, s.HostKdamondMillis))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "\nhost: kdamond (the kernel's memory monitor) used this much CPU during each run, and forwards stall while it runs: %s\n", strings.Join(parts, ", "))
	}
	parts = parts[:0]
	for _, s := range r.Runs {
		if len(s.HostReadGBps) == 2 {
			parts = append(parts, fmt.Sprintf("%s %.1f / %.1f", s.Label, s.HostReadGBps[0], s.HostReadGBps[1]))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "\nhost: memory read speed of one core on the workers' CPUs before / after each run, GB/s: %s\n", strings.Join(parts, ", "))
	}
	parts = parts[:0]
	for _, s := range r.Runs {
		if c := s.HostCores; c != nil {
			var cpus []string
			for i, cpu := range c.CPUs {
				cpus = append(cpus, fmt.Sprintf("cpu%d %.0f", cpu, c.GBps[i]))
			}
			parts = append(parts, fmt.Sprintf("%s %s", s.Label, strings.Join(cpus, " ")))
			if len(c.CPUs) > 1 {
				parts[len(parts)-1] += fmt.Sprintf(" (slowest %.0f)", c.Slowest)
			}
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "\nhost: each run's cores, an L1 copy in GB/s sampled every 100 ms on each pinned CPU (a forward's time moves with it; slowest: the slower CPU's mean in each second, the pace of a pipeline across them): %s\n", strings.Join(parts, ", "))
	}
	parts = parts[:0]
	for _, s := range r.Runs {
		if len(s.HostSteal) > 0 && s.HostCores != nil && len(s.HostCores.CPUs) == len(s.HostSteal) {
			var cpus []string
			for i, cpu := range s.HostCores.CPUs {
				cpus = append(cpus, fmt.Sprintf("cpu%d %.1f%%", cpu, 100*s.HostSteal[i]))
			}
			parts = append(parts, fmt.Sprintf("%s %s", s.Label, strings.Join(cpus, " ")))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "\nhost: steal, the share of each run each pinned CPU waited for the host while it had work (a vCPU halted between forwards may wait at its next wakeup; serve --idle-poll): %s\n", strings.Join(parts, ", "))
	}
}

// writeCrossings prints, per hop, the decode groups' crossings into it
// (worker spans, --stages).
func (r *Report) writeCrossings(w io.Writer) {
	for _, s := range r.Runs {
		groups := 0
		for _, c := range s.Crossings {
			groups += c.Groups
		}
		if groups == 0 {
			continue
		}
		fmt.Fprintf(w, "\ncrossings into each hop of %s, a decode group at a time (worker spans, p50 / p90: the sender's frame-out, the relay\nthrough the head and the wire to the group's last arrival, the wait for the hop's forward, in all)\n", s.Label)
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "hop\tfrom\tgroups\tout\trelay\twait\tin all\t")
		n := len(s.Crossings)
		for i, c := range s.Crossings {
			fmt.Fprintf(tw, "%d\t%d\t%d\t", i, (i+n-1)%n, c.Groups)
			for _, d := range []Dist{c.Out, c.Relay, c.Wait, c.Total} {
				fmt.Fprintf(tw, "%s / %s\t", msf(d.P50), msf(d.P90))
			}
			fmt.Fprintln(tw)
		}
		tw.Flush()
	}
}

// writeIdle prints each hop's busy share and the idle before its forwards
// by the kind of forward that ended it (worker spans, --stages).
func (r *Report) writeIdle(w io.Writer) {
	for _, s := range r.Runs {
		if len(s.Idle) == 0 {
			continue
		}
		fmt.Fprintf(w, "\nforwards of %s and the idle before them, by what came next (worker spans: share of the time, mean gap, forwards)\n", s.Label)
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprint(tw, "hop\tbusy\tforwards\tgroup rows\t")
		for _, k := range telemetry.BeforeKinds {
			fmt.Fprintf(tw, "%s\t", k)
		}
		fmt.Fprintln(tw)
		for i, h := range s.Idle {
			fmt.Fprintf(tw, "%d\t%.1f%%\t%d\t%d\t", i, 100*h.Busy, h.Forwards, h.GroupRows)
			for _, k := range telemetry.BeforeKinds {
				g := h.Before[k]
				fmt.Fprintf(tw, "%.1f%%, %.1f ms (%d)\t", 100*g.Share, g.MeanMs, g.Forwards)
			}
			fmt.Fprintln(tw)
		}
		tw.Flush()
	}
}
