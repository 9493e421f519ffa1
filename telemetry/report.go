package telemetry

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"time"
)

// StageOrder is the order stages are printed in.
var StageOrder = []string{"decode", "reassemble", "decompress", "checksum", "queue", "forward", "frameout", "shardd.step"}

// ReadSpans reads JSON-lines span files.
func ReadSpans(paths ...string) ([]SpanRecord, error) {
	var out []SpanRecord
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for n := 1; sc.Scan(); n++ {
			var r SpanRecord
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				f.Close()
				return nil, fmt.Errorf("telemetry: %s line %d: %v", p, n, err)
			}
			out = append(out, r)
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

type dist []time.Duration

func (d dist) pct(p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// StageDurations groups the durations of the workers' stage spans (and
// their whole steps, "shardd.step") by instance and stage. Spans that start
// before from or end after to are left out; zero times mean no bound.
func StageDurations(spans []SpanRecord, from, to time.Time) map[string]map[string][]time.Duration {
	byHop := map[string]map[string][]time.Duration{}
	for _, s := range spans {
		if !slices.Contains(StageOrder, s.Name) ||
			(!from.IsZero() && s.Start < from.UnixNano()) || (!to.IsZero() && s.End > to.UnixNano()) {
			continue
		}
		hop := s.Instance
		if hop == "" {
			hop = "(unnamed)"
		}
		if byHop[hop] == nil {
			byHop[hop] = map[string][]time.Duration{}
		}
		byHop[hop][s.Name] = append(byHop[hop][s.Name], time.Duration(s.End-s.Start))
	}
	return byHop
}

// Report prints per-hop, per-stage p50/p99 and ranks the hops: which hop is
// slow, and in which stage.
func Report(w io.Writer, spans []SpanRecord) {
	byHop := map[string]map[string]dist{}
	for hop, stages := range StageDurations(spans, time.Time{}, time.Time{}) {
		byHop[hop] = map[string]dist{}
		for st, d := range stages {
			byHop[hop][st] = d
		}
	}
	traces := map[string]bool{}
	var gens dist
	for _, s := range spans {
		traces[s.TraceID] = true
		if s.Name == "shardd.generate" {
			gens = append(gens, time.Duration(s.End-s.Start))
		}
	}
	fmt.Fprintf(w, "%d spans in %d traces", len(spans), len(traces))
	if len(gens) > 0 {
		fmt.Fprintf(w, "; %d generations, p50 %s p99 %s", len(gens), gens.pct(0.5).Round(time.Microsecond), gens.pct(0.99).Round(time.Microsecond))
	}
	fmt.Fprintln(w)
	hops := make([]string, 0, len(byHop))
	for h := range byHop {
		hops = append(hops, h)
	}
	slices.Sort(hops)
	for _, h := range hops {
		fmt.Fprintf(w, "\nhop %s\n  %-12s %7s %12s %12s\n", h, "stage", "count", "p50", "p99")
		for _, st := range StageOrder {
			d := byHop[h][st]
			if len(d) == 0 {
				continue
			}
			name := st
			if st == "shardd.step" {
				name = "step (all)"
			}
			fmt.Fprintf(w, "  %-12s %7d %12s %12s\n", name, len(d), d.pct(0.5).Round(time.Microsecond), d.pct(0.99).Round(time.Microsecond))
		}
	}
	// Slowest hops by step p99, with the stage that costs most at p50.
	slices.SortFunc(hops, func(a, b string) int {
		return int(byHop[b]["shardd.step"].pct(0.99) - byHop[a]["shardd.step"].pct(0.99))
	})
	cores := coreSpeeds(spans)
	fmt.Fprintf(w, "\nslowest hops (by step p99):\n")
	for i, h := range hops {
		worst, worstD := "", time.Duration(-1)
		for _, st := range StageOrder[:len(StageOrder)-1] {
			if d := byHop[h][st].pct(0.5); d > worstD {
				worst, worstD = st, d
			}
		}
		fmt.Fprintf(w, "  %d. %-24s step p99 %-12s most time in %s (p50 %s)", i+1, h,
			byHop[h]["shardd.step"].pct(0.99).Round(time.Microsecond), worst, worstD.Round(time.Microsecond))
		if c := cores[h]; len(c) > 0 {
			slices.Sort(c)
			fmt.Fprintf(w, "; its core %.0f GB/s p50, %.0f p10", c[len(c)/2], c[len(c)/10])
		}
		fmt.Fprintln(w)
	}
	if len(hops) == 0 {
		fmt.Fprintln(w, "  (no shardd step spans: were the workers run with --traces?)")
	}
	reportIdle(w, ForwardIdle(spans, time.Time{}, time.Time{}))
	reportCrossings(w, Crossings(spans, time.Time{}, time.Time{}))
}

// coreSpeeds gathers per instance the core speed its forward spans carry
// (shardd.host.core_gbps: the forward thread's core, probed before the
// forward). On a shared host a forward's time follows it, so a hop whose
// core ran slow is slow for the host's reasons.
func coreSpeeds(spans []SpanRecord) map[string][]float64 {
	out := map[string][]float64{}
	for _, s := range spans {
		if s.Name != "forward" {
			continue
		}
		if g, err := strconv.ParseFloat(s.Attrs["shardd.host.core_gbps"], 64); err == nil && g > 0 {
			out[s.Instance] = append(out[s.Instance], g)
		}
	}
	return out
}

// reportIdle prints each hop's busy share and the idle before its
// forwards, by the kind of forward that ended it (ForwardIdle).
func reportIdle(w io.Writer, byHop map[string]Idle) {
	hops := slices.Sorted(maps.Keys(byHop))
	if len(hops) > 0 {
		fmt.Fprintf(w, "\nforwards, and the idle before them by what came next (share of the time, mean gap, forwards):\n")
	}
	for _, h := range hops {
		id := byHop[h]
		fmt.Fprintf(w, "  %-24s busy %.1f%%, %d forwards, a decode group %d rows", h, 100*id.BusyShare(), id.Forwards, id.Group)
		for _, k := range BeforeKinds {
			if g := id.Before[k]; g.Forwards > 0 {
				fmt.Fprintf(w, "; before %s %.1f%%, %s (%d)", k, 100*id.IdleShare(k), g.Mean().Round(10*time.Microsecond), g.Forwards)
			}
		}
		fmt.Fprintln(w)
	}
}

// reportCrossings prints each crossing's parts, p50 / p90 (Crossing).
func reportCrossings(w io.Writer, cs map[[2]string]*Crossing) {
	keys := slices.SortedFunc(maps.Keys(cs), func(a, b [2]string) int {
		return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1]))
	})
	if len(keys) > 0 {
		fmt.Fprintf(w, "\ncrossings, a decode group from one worker to the next (p50 / p90: the sender's frame-out, the relay through\nthe head and the wire to the group's last arrival, the wait for the receiver's forward, in all):\n")
	}
	pp := func(d dist) string {
		return fmt.Sprintf("%s / %s", d.pct(0.5).Round(10*time.Microsecond), d.pct(0.9).Round(10*time.Microsecond))
	}
	for _, k := range keys {
		c := cs[k]
		fmt.Fprintf(w, "  %s -> %s, %d groups: out %s, relay %s, wait %s, in all %s\n", k[0], k[1], c.Groups(),
			pp(c.Out), pp(c.Relay), pp(c.Wait), pp(c.Total))
	}
}
