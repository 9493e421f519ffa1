package load

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
)

// Ceiling judges a route's tokens/s over its unsplit baseline's against the
// most that ratio can be. A route of N hops, one thread each, keeps N
// decode groups of c/N sessions in flight; with balanced hops, no idle and
// free crossings its N forwards of a group take the whole model's step at
// c/N rows, so route / whole at c is at most the whole model's step at c
// rows over its step at c/N: N x whole(c/N) / whole(c) in tokens/s. The
// bench measures whole(c/N) in each round beside the others (--ceiling),
// so the ceiling is read on the same machine at the same time as the ratio
// it bounds. It is a bound on decoding: runs too short for several
// turnovers, or of long prompts, read it poorly (the bench preset: 2.8x
// from 3 s runs of 128-token prompts at 16 sessions; 1.74-1.81x from 12 s
// runs of 8-token prompts at 32).
type Ceiling struct {
	// Route and Baseline name the targets compared; Hops is the route's.
	Route    string `json:"route"`
	Baseline string `json:"baseline"`
	Hops     int    `json:"hops"`
	// Rows are each round's figures at each load level, then per level the
	// medians of the rounds' figures (Round 0).
	Rows []CeilingRow `json:"rows,omitempty"`
}

// CeilingRow is one round's (or the medians') ratio, ceiling and share.
type CeilingRow struct {
	Concurrency int `json:"concurrency"`
	Round       int `json:"round"`
	// Ratio is route / baseline tokens/s at Concurrency; Ceiling is Hops x
	// baseline at Concurrency/Hops over baseline at Concurrency; Share is
	// Ratio / Ceiling.
	Ratio   float64 `json:"ratio"`
	Ceiling float64 `json:"ceiling"`
	Share   float64 `json:"share"`
	// HostSpread is how far the host's memory read speed, probed before
	// and after each of the round's three runs (Summary.HostReadGBps),
	// moved: (fastest - slowest) / median, 0 without probes, as the
	// medians' spread is. On these hosts it moves by up to about 30%
	// within seconds with nothing running (12 probes a second apart on an
	// idle machine: 9.5-12.8 GB/s); a round well above that compared runs
	// made at different host speeds, and its ceiling can read even above
	// Hops.
	HostSpread float64 `json:"host_spread,omitempty"`
	// CorePace is how fast the route's CPUs ran over how fast the
	// baseline's did, at c (the mean of Summary.HostCores' per-CPU
	// means, sampled through each run): below 1, the route ran on slower
	// cores than the whole model it is compared with, and its share reads
	// low. (Not the route's Slowest: the slower of two noisy samples reads
	// 3-10% under either CPU's mean even on an idle host.) CoreSpread is
	// (fastest - slowest) / median of the three runs' figures. 0 where
	// the runs were not sampled.
	CorePace   float64 `json:"core_pace,omitempty"`
	CoreSpread float64 `json:"core_spread,omitempty"`
	// SlowPace is the pace the route's cores allowed a pipeline across
	// them (their Slowest: the slower CPU's mean in each second) over the
	// baseline's at c (its one CPU's, by the same seconds).
	SlowPace float64 `json:"slow_pace,omitempty"`
}

// finish computes the rows from the runs: a round counts where the route
// and the baseline at c and the baseline at c/Hops all ran in it.
func (c *Ceiling) finish(runs []*Summary) {
	c.Rows = nil
	if c.Hops < 2 {
		return
	}
	type key struct {
		target      string
		concurrency int
		round       int
	}
	tps := map[key]float64{}
	reads := map[key][]float64{}
	pace := map[key]float64{}
	slow := map[key]float64{}
	for _, s := range runs {
		if s.Rate == 0 {
			k := key{s.Target, s.Concurrency, s.Round}
			tps[k], reads[k] = s.OutputTokensPerS, s.HostReadGBps
			if c := s.HostCores; c != nil && len(c.GBps) > 0 {
				pace[k], slow[k] = meanOf(c.GBps), c.Slowest
			}
		}
	}
	byLevel := map[int][]CeilingRow{}
	var levels []int
	for _, s := range runs {
		conc := s.Concurrency
		if s.Target != c.Route || s.Rate != 0 || conc%c.Hops != 0 {
			continue
		}
		whole := tps[key{c.Baseline, conc, s.Round}]
		half := tps[key{c.Baseline, conc / c.Hops, s.Round}]
		if whole <= 0 || half <= 0 {
			continue
		}
		row := CeilingRow{Concurrency: conc, Round: s.Round, Ratio: s.OutputTokensPerS / whole,
			Ceiling: float64(c.Hops) * half / whole}
		row.Share = row.Ratio / row.Ceiling
		row.HostSpread = spread(slices.Concat(s.HostReadGBps, reads[key{c.Baseline, conc, s.Round}],
			reads[key{c.Baseline, conc / c.Hops, s.Round}]))
		paces := []float64{pace[key{s.Target, conc, s.Round}], pace[key{c.Baseline, conc, s.Round}],
			pace[key{c.Baseline, conc / c.Hops, s.Round}]}
		if !slices.Contains(paces, 0) {
			row.CorePace, row.CoreSpread = paces[0]/paces[1], spread(paces)
		}
		if r, b := slow[key{s.Target, conc, s.Round}], slow[key{c.Baseline, conc, s.Round}]; r > 0 && b > 0 {
			row.SlowPace = r / b
		}
		if _, ok := byLevel[conc]; !ok {
			levels = append(levels, conc)
		}
		byLevel[conc] = append(byLevel[conc], row)
		c.Rows = append(c.Rows, row)
	}
	for _, conc := range levels {
		g := byLevel[conc]
		pick := func(f func(CeilingRow) float64) float64 { // over the rounds that have it
			var v []float64
			for _, r := range g {
				if x := f(r); x != 0 {
					v = append(v, x)
				}
			}
			return median(v)
		}
		c.Rows = append(c.Rows, CeilingRow{Concurrency: conc,
			Ratio:      pick(func(r CeilingRow) float64 { return r.Ratio }),
			Ceiling:    pick(func(r CeilingRow) float64 { return r.Ceiling }),
			Share:      pick(func(r CeilingRow) float64 { return r.Share }),
			HostSpread: pick(func(r CeilingRow) float64 { return r.HostSpread }),
			CorePace:   pick(func(r CeilingRow) float64 { return r.CorePace }),
			CoreSpread: pick(func(r CeilingRow) float64 { return r.CoreSpread }),
			SlowPace:   pick(func(r CeilingRow) float64 { return r.SlowPace })})
	}
}

// write prints the rows, or says why there are none.
func (c *Ceiling) write(w io.Writer) {
	fmt.Fprintf(w, "\npipeline ceiling (%s / %s at c against %d x %s at c/%d over %s at c: the ratio with balanced hops, no idle and free crossings)\n",
		c.Route, c.Baseline, c.Hops, c.Baseline, c.Hops, c.Baseline)
	if len(c.Rows) == 0 {
		fmt.Fprintln(w, "  none: no round ran the route and the baseline at c and c/hops")
		return
	}
	probed := slices.ContainsFunc(c.Rows, func(r CeilingRow) bool { return r.HostSpread > 0 })
	sampled := slices.ContainsFunc(c.Rows, func(r CeilingRow) bool { return r.CorePace > 0 })
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "load\tround\tratio\tceiling\tshare\t")
	if probed {
		fmt.Fprint(tw, "host moved\t")
	}
	if sampled {
		fmt.Fprint(tw, "core pace\tslow pace\tcores moved\t")
	}
	fmt.Fprintln(tw)
	for _, r := range c.Rows {
		round := fmt.Sprint(r.Round)
		if r.Round == 0 {
			round = "median"
		}
		fmt.Fprintf(tw, "c=%d\t%s\t%.2fx\t%.2fx\t%.0f%%\t", r.Concurrency, round, r.Ratio, r.Ceiling, 100*r.Share)
		if probed {
			fmt.Fprintf(tw, "%.0f%%\t", 100*r.HostSpread)
		}
		if sampled {
			fmt.Fprintf(tw, "%.2f\t%.2f\t%.0f%%\t", r.CorePace, r.SlowPace, 100*r.CoreSpread)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	if probed {
		fmt.Fprintln(w, "host moved: how far one core's memory read speed, probed before and after each of the round's runs, moved (fastest - slowest over the median; on an idle host it moves up to about 30% within seconds); a round well above that compared runs made at different host speeds")
	}
	if sampled {
		fmt.Fprintln(w, "core pace: how fast the route's CPUs ran (an L1 copy sampled every 100 ms through the run, the mean over its CPUs) over how fast the whole model's CPU did at c; below 1 the route ran on slower cores, and its share reads low. slow pace: the same with the route's slower CPU in each second. cores moved: how far the three runs' figures differ (fastest - slowest over the median)")
	}
}

func meanOf(v []float64) float64 {
	var sum float64
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}
