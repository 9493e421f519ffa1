package load

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"gopkg.in/yaml.v3"
)

// Limit is one line of a budget: a reported figure and its bound.
type Limit struct {
	Metric string  `json:"metric"`
	Bound  float64 `json:"bound"` // milliseconds for latencies
	// AtLeast: the figure must be >= Bound (throughput, goodput);
	// otherwise <= Bound.
	AtLeast bool `json:"at_least"`
}

func (l Limit) String() string {
	op := "<="
	if l.AtLeast {
		op = ">="
	}
	return fmt.Sprintf("%s %s %s", l.Metric, op, formatFigure(l.Metric, l.Bound))
}

// Budget is the limits a run must keep.
type Budget []Limit

// metricPattern is every figure a budget may name:
//
//	ttft|itl|tpot|e2e.STAT              request latencies
//	hop[I].exec|wire|prefill_exec.STAT  per hop, decode steps (ms)
//	stage.NAME.STAT                     worst hop's stage (span files)
//	hop[I].stage.NAME.STAT              one hop's stage
//	hop[I].busy                         its share of the time in forwards (span files; at least)
//	goodput, tokens_per_s, requests_per_s (at least)
//	error_rate, harness_cpu_per_token_us (at most)
//
// STAT is p50, p90, p99, max or mean.
var metricPattern = regexp.MustCompile(`^(?:(ttft|itl|tpot|e2e)\.(p50|p90|p99|max|mean)|hop\[(\d+)\]\.(exec|wire|prefill_exec)\.(p50|p90|p99|max|mean)|(?:hop\[(\d+)\]\.)?stage\.([a-z_]+)\.(p50|p90|p99|max|mean)|(goodput|tokens_per_s|requests_per_s|error_rate|harness_cpu_per_token_us)|hop\[(\d+)\]\.busy)$`)

// atLeast: the metric is a lower bound (more is better).
func atLeast(metric string) bool {
	switch metric {
	case "goodput", "tokens_per_s", "requests_per_s":
		return true
	}
	return strings.HasSuffix(metric, ".busy")
}

// isLatency: the metric is a time and its bound is written as a duration.
func isLatency(metric string) bool {
	return !atLeast(metric) && metric != "error_rate" && metric != "harness_cpu_per_token_us"
}

// ReadBudget reads a YAML (.yaml, .yml) or TOML (.toml) file of limits:
// "metric: bound", nested tables flattened with dots. Latency bounds are
// durations ("25ms"); goodput, error_rate are fractions; tokens_per_s,
// requests_per_s rates; harness_cpu_per_token_us microseconds.
func ReadBudget(path string) (Budget, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: budget: %v", ErrInput, err)
	}
	raw := map[string]any{}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".yaml", ".yml":
		err = yaml.Unmarshal(b, &raw)
	case ".toml":
		err = toml.Unmarshal(b, &raw)
	default:
		return nil, fmt.Errorf("%w: budget %s: want a .yaml, .yml or .toml file", ErrInput, filepath.Base(path))
	}
	if err != nil {
		return nil, fmt.Errorf("%w: budget %s: %v", ErrInput, filepath.Base(path), err)
	}
	flat := map[string]any{}
	flatten("", raw, flat)
	if len(flat) == 0 {
		return nil, fmt.Errorf("%w: budget %s has no limits", ErrInput, filepath.Base(path))
	}
	var out Budget
	for k, v := range flat {
		l, err := parseLimit(k, v)
		if err != nil {
			return nil, fmt.Errorf("%w: budget %s: %v", ErrInput, filepath.Base(path), err)
		}
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b Limit) int { return strings.Compare(a.Metric, b.Metric) })
	return out, nil
}

func flatten(prefix string, m map[string]any, out map[string]any) {
	for k, v := range m {
		key := k
		if prefix != "" {
			key = prefix + "." + k
		}
		if sub, ok := v.(map[string]any); ok {
			flatten(key, sub, out)
			continue
		}
		out[key] = v
	}
}

func parseLimit(metric string, v any) (Limit, error) {
	if !metricPattern.MatchString(metric) {
		return Limit{}, fmt.Errorf("unknown metric %q (see shardd bench -h)", metric)
	}
	l := Limit{Metric: metric, AtLeast: atLeast(metric)}
	s := strings.TrimSpace(fmt.Sprint(v))
	if isLatency(metric) {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return l, fmt.Errorf("%s: want a positive duration such as 25ms, not %q", metric, s)
		}
		l.Bound = float64(d) / float64(time.Millisecond)
		return l, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		return l, fmt.Errorf("%s: want a number, not %q", metric, s)
	}
	if (metric == "goodput" || metric == "error_rate" || strings.HasSuffix(metric, ".busy")) && f > 1 {
		return l, fmt.Errorf("%s is a fraction from 0 to 1, not %v", metric, f)
	}
	l.Bound = f
	return l, nil
}

// Check is one limit against one run.
type Check struct {
	Run   string  `json:"run"`
	Limit Limit   `json:"limit"`
	Value float64 `json:"value"`
	Pass  bool    `json:"pass"`
	// Missing: the run has no such figure (a hop it lacks, stages without
	// span files); it counts as a failure.
	Missing bool `json:"missing,omitempty"`
	// Over is how far the value is past the bound, as a fraction of the
	// bound (0 when it holds).
	Over float64 `json:"over"`
}

// Evaluate checks every limit against s.
func (b Budget) Evaluate(s *Summary) []Check {
	var out []Check
	for _, l := range b {
		v, ok := Figure(s, l.Metric)
		c := Check{Run: s.Label, Limit: l, Value: v, Missing: !ok}
		c.Pass = ok && ((l.AtLeast && v >= l.Bound) || (!l.AtLeast && v <= l.Bound))
		if !c.Pass && ok && l.Bound > 0 {
			c.Over = math.Abs(v-l.Bound) / l.Bound
		}
		out = append(out, c)
	}
	return out
}

// Figure returns the named figure of s (see metricPattern).
func Figure(s *Summary, metric string) (float64, bool) {
	m := metricPattern.FindStringSubmatch(metric)
	switch {
	case m == nil:
		return 0, false
	case m[1] != "":
		d := map[string]Dist{"ttft": s.TTFT, "itl": s.ITL, "tpot": s.TPOT, "e2e": s.E2E}[m[1]]
		if d.Count == 0 {
			return 0, false
		}
		return d.Stat(m[2])
	case m[3] != "":
		i, _ := strconv.Atoi(m[3])
		if i >= len(s.Hops) {
			return 0, false
		}
		h := s.Hops[i]
		d := map[string]Dist{"exec": h.Exec, "wire": h.Wire, "prefill_exec": h.PrefillExec}[m[4]]
		if d.Count == 0 {
			return 0, false
		}
		return d.Stat(m[5])
	case m[7] != "":
		hops := s.Stages
		if m[6] != "" {
			i, _ := strconv.Atoi(m[6])
			if i >= len(hops) {
				return 0, false
			}
			hops = hops[i : i+1]
		}
		v, found := 0.0, false
		for _, st := range hops {
			if d, ok := st[m[7]]; ok && d.Count > 0 {
				x, _ := d.Stat(m[8])
				v, found = max(v, x), true
			}
		}
		return v, found
	case m[10] != "":
		i, _ := strconv.Atoi(m[10])
		if i >= len(s.Idle) || s.Idle[i].Forwards == 0 {
			return 0, false
		}
		return s.Idle[i].Busy, true
	}
	switch m[9] {
	case "goodput":
		return s.Goodput, s.Requests > 0
	case "tokens_per_s":
		return s.OutputTokensPerS, true
	case "requests_per_s":
		return s.RequestsPerS, true
	case "error_rate":
		return s.ErrorRate, s.Requests > 0
	case "harness_cpu_per_token_us":
		return s.HarnessCPUPerTokenMicros, s.OutputTokens > 0
	}
	return 0, false
}

// formatFigure prints a figure in its unit.
func formatFigure(metric string, v float64) string {
	switch {
	case isLatency(metric):
		return fmt.Sprintf("%.3g ms", v)
	case metric == "harness_cpu_per_token_us":
		return fmt.Sprintf("%.1f us", v)
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}
