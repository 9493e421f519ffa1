package load

import (
	"fmt"
	"html/template"
	"os"
	"strings"

	"github.com/meshnet/shardd/telemetry"
)

// plot is one figure of the page.
type plot struct {
	ID, Caption string
	SVG         template.HTML
}

// plots builds the report's figures: TTFT and ITL CDFs per run, ITL over
// time, per-hop stacked bars, per-stage bars when spans were read, and the
// sweep's curve.
func (r *Report) plots() []plot {
	// With several rounds, the first round stands for the rest (the
	// tables have every run and the medians).
	var runs []*Summary
	for _, s := range r.Runs {
		if s.Round <= 1 && len(runs) < len(palette) {
			runs = append(runs, s)
		}
	}
	var out []plot
	cdf := func(id, name string, get func(*Summary) Dist) {
		var ss []plotSeries
		for _, s := range runs {
			if d := get(s); len(d.CDF) > 0 {
				ss = append(ss, plotSeries{Name: s.Label, Points: d.CDF})
			}
		}
		if len(ss) > 0 {
			out = append(out, plot{id, name + ": share of requests (TTFT) or tokens (ITL) at or below a latency",
				template.HTML(linePlot(name+" CDF", axis{label: name + " (ms, log)", log: true}, axis{label: "quantile"}, ss))})
		}
	}
	cdf("ttft-cdf", "TTFT", func(s *Summary) Dist { return s.TTFT })
	cdf("itl-cdf", "ITL", func(s *Summary) Dist { return s.ITL })

	out = append(out, timePlots(runs)...)
	out = append(out, hopPlots(runs)...)
	out = append(out, r.sweepPlots()...)
	return out
}

// timePlots: ITL over time (with any kill), TTFT by turn, and the prefix
// cache's hit rate over time.
func timePlots(runs []*Summary) []plot {
	var out []plot
	var ts []plotSeries
	for _, s := range runs {
		if len(s.ITLSeries) > 0 {
			ts = append(ts, plotSeries{Name: s.Label, Points: s.ITLSeries, Dots: true})
		}
	}
	for _, s := range runs {
		if s.KillAtS > 0 && len(s.ITLSeries) > 0 {
			// The kill, as a vertical line across the gaps around it.
			top := 0.0
			for _, p := range s.ITLSeries {
				top = max(top, p[1])
			}
			ts = append(ts, plotSeries{Name: s.Label + ": worker killed", Points: [][2]float64{{s.KillAtS, 0}, {s.KillAtS, top}}})
		}
	}
	if len(ts) > 0 {
		out = append(out, plot{"itl-time", "every inter-token gap (a sample of at most 20,000 per run) by when it ended",
			template.HTML(linePlot("ITL over time", axis{label: "seconds into the run"}, axis{label: "ITL (ms)"}, ts))})
	}

	var turns []plotSeries
	for _, s := range runs {
		var pts [][2]float64
		for i, v := range s.TurnTTFT {
			pts = append(pts, [2]float64{float64(i + 1), v})
		}
		if len(pts) > 0 {
			turns = append(turns, plotSeries{Name: s.Label, Points: pts})
		}
	}
	if len(turns) > 0 {
		out = append(out, plot{"turn-ttft", "TTFT p50 by turn of the conversations: each turn resends the whole history",
			template.HTML(linePlot("TTFT by turn", axis{label: "turn"}, axis{label: "TTFT p50 (ms)"}, turns))})
	}

	var hits []plotSeries
	for _, s := range runs {
		for h, pts := range s.PrefixHitSeries {
			if len(pts) > 0 {
				hits = append(hits, plotSeries{Name: fmt.Sprintf("%s h%d", shortLabel(s.Label), h), Points: pts})
			}
		}
	}
	if len(hits) > 0 {
		out = append(out, plot{"prefix-hits", "share of the prompt tokens sent so far that each hop's prefix cache answered",
			template.HTML(linePlot("Prefix cache hit rate", axis{label: "seconds into the run"}, axis{label: "tokens from the cache / prompt tokens"}, hits))})
	}

	return out
}

// hopPlots: the per-hop decode step, and the per-stage bars when spans
// were read.
func hopPlots(runs []*Summary) []plot {
	var out []plot
	var cats []string
	var vals [][]float64
	for _, s := range runs {
		for _, h := range s.Hops {
			cats = append(cats, fmt.Sprintf("%s h%d", shortLabel(s.Label), h.Hop))
			vals = append(vals, []float64{h.Exec.P50, h.Wire.P50})
		}
	}
	if len(cats) > 0 {
		out = append(out, plot{"hops", "median decode step per hop: the worker's execution and the head's wait beyond it (wire)",
			template.HTML(stackedBars("Per hop, decode step p50", "ms", cats, []string{"exec", "wire"}, vals))})
	}

	for _, s := range runs {
		if len(s.Stages) == 0 {
			continue
		}
		names := stageNames(s.Stages)
		var parts []string
		for _, n := range names {
			if n != "step" {
				parts = append(parts, n)
			}
		}
		var cats []string
		var vals [][]float64
		for i, st := range s.Stages {
			cats = append(cats, fmt.Sprintf("hop %d", i))
			var v []float64
			for _, n := range parts {
				v = append(v, st[n].P50)
			}
			vals = append(vals, v)
		}
		out = append(out, plot{"stages-" + s.Label, "median time per stage on each worker, from its spans (" + s.Label + ")",
			template.HTML(stackedBars("Per stage p50, "+s.Label, "ms", cats, parts, vals))})
		break
	}

	for _, s := range runs {
		if len(s.Idle) == 0 {
			continue
		}
		parts := append([]string{"busy"}, telemetry.BeforeKinds...)
		var cats []string
		var vals [][]float64
		for i, h := range s.Idle {
			cats = append(cats, fmt.Sprintf("hop %d", i))
			v := []float64{100 * h.Busy}
			for _, k := range telemetry.BeforeKinds {
				v = append(v, 100*h.Before[k].Share)
			}
			vals = append(vals, v)
		}
		out = append(out, plot{"idle-" + s.Label, "each worker's time in forwards, and its idle by the forward that ended it (" + s.Label + ")",
			template.HTML(stackedBars("Forwards and idle, "+s.Label, "%", cats, parts, vals))})
		break
	}

	return out
}

// sweepPlots: the sweep's throughput and ITL curves.
func (r *Report) sweepPlots() []plot {
	var out []plot
	if sw := r.Sweep; sw != nil && len(sw.Levels) > 1 {
		var tput, itl [][2]float64
		for _, m := range sw.Levels {
			tput = append(tput, [2]float64{m.level(), m.OutputTokensPerS})
			itl = append(itl, [2]float64{m.level(), m.ITLP99})
		}
		out = append(out,
			plot{"sweep-throughput", fmt.Sprintf("output tokens/s against %s (median over rounds); knee at %g", sw.Param, sw.Knee),
				template.HTML(linePlot("Throughput against "+sw.Param, axis{label: sw.Param, log: true}, axis{label: "tokens/s"},
					[]plotSeries{{Name: "tokens/s", Points: tput}}))},
			plot{"sweep-itl", "ITL p99 against " + sw.Param,
				template.HTML(linePlot("ITL p99 against "+sw.Param, axis{label: sw.Param, log: true}, axis{label: "ms"},
					[]plotSeries{{Name: "ITL p99", Points: itl}}))})
	}
	return out
}

func shortLabel(s string) string {
	if len(s) > 18 {
		return s[:18]
	}
	return s
}

var page = template.Must(template.New("page").Funcs(template.FuncMap{"ms": msf, "pct": func(f float64) float64 { return 100 * f }}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>shardd bench report</title>
<style>
body{font-family:system-ui,sans-serif;margin:24px;color:#222}
table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;font-size:13px}
th{background:#f4f4f4}figure{display:inline-block;margin:8px 16px 16px 0;vertical-align:top}
figcaption{font-size:12px;color:#555;max-width:640px}.fail{color:#b00;font-weight:bold}.ok{color:#070}
</style></head>
<body data-plots="{{len .Plots}}">
<h1>shardd bench</h1>
<p>{{.R.Started.Format "2006-01-02 15:04:05 MST"}} &middot; <code>{{.R.Command}}</code></p>
<p>{{.R.Workload.Mode}} loop{{if .R.Workload.Concurrency}}, concurrency {{.R.Workload.Concurrency}}{{end}}{{if .R.Workload.Rate}}, {{.R.Workload.Rate}} requests/s{{end}};
{{if .R.Workload.Prompts}}{{.R.Workload.Prompts}} real prompts of {{end}}prompts {{index .R.Workload.PromptLen 0}}-{{index .R.Workload.PromptLen 1}} tokens{{if .R.Workload.Prompts}} (median {{.R.Workload.PromptTokensP50}}){{end}}, outputs {{index .R.Workload.OutputLen 0}}-{{index .R.Workload.OutputLen 1}};
seed {{.R.Workload.Seed}}; {{.R.Workload.Rounds}} round(s){{if .R.Workload.SLO}}; SLO {{.R.Workload.SLO}}{{end}}.</p>
<h2>Targets</h2>
<table><tr><th>target</th><th>workers</th><th>ranges</th><th>threads</th><th>CPUs</th><th>links</th></tr>
{{range .R.Targets}}<tr><td>{{.Name}}</td><td>{{range .Workers}}{{.}} {{end}}</td><td>{{range .Ranges}}{{.}} {{end}}</td><td>{{range .Threads}}{{.}} {{end}}</td><td>{{range .CPUs}}{{.}} {{end}}</td><td>{{range .Links}}{{.}} {{end}}</td></tr>
{{end}}</table>
<h2>Runs</h2>
<table><tr><th>run</th><th>requests</th><th>errors</th><th>tokens/s</th><th>steady tokens/s</th><th>TTFT p50</th><th>TTFT p99</th><th>ITL p50</th><th>ITL p99</th><th>TPOT p50</th><th>E2E p99</th><th>goodput</th><th>harness CPU/token</th><th>host kdamond CPU</th></tr>
{{range .R.Runs}}<tr><td>{{.Label}}</td><td>{{.Requests}}</td><td>{{.Errors}}</td><td>{{printf "%.1f" .OutputTokensPerS}}</td><td>{{printf "%.1f" .SteadyTokensPerS}}</td><td>{{ms .TTFT.P50}}</td><td>{{ms .TTFT.P99}}</td><td>{{ms .ITL.P50}}</td><td>{{ms .ITL.P99}}</td><td>{{ms .TPOT.P50}}</td><td>{{ms .E2E.P99}}</td><td>{{printf "%.3f" .Goodput}}</td><td>{{printf "%.0f" .HarnessCPUPerTokenMicros}} us</td><td>{{ms .HostKdamondMillis}}</td></tr>
{{end}}</table>
{{if gt (len .R.Medians) 1}}<h2>Medians over rounds</h2>
<table><tr><th>target</th><th>load</th><th>rounds</th><th>tokens/s</th><th>spread</th><th>steady tokens/s</th><th>spread</th><th>ratio</th><th>TTFT p99</th><th>ITL p99</th></tr>
{{range .R.Medians}}<tr><td>{{.Target}}</td><td>{{.Load}}</td><td>{{.Rounds}}</td><td>{{printf "%.1f" .OutputTokensPerS}}</td><td>{{printf "%.0f%%" (pct .Spread)}}</td><td>{{printf "%.1f" .SteadyTokensPerS}}</td><td>{{printf "%.0f%%" (pct .SteadySpread)}}</td><td>{{printf "%.2fx" .Ratio}}</td><td>{{ms .TTFTP99}}</td><td>{{ms .ITLP99}}</td></tr>
{{end}}</table>{{end}}
{{with .R.Ceiling}}{{if .Rows}}<h2>Pipeline ceiling</h2>
<p>{{.Route}} / {{.Baseline}} against {{.Hops}} x {{.Baseline}} at c/{{.Hops}} over {{.Baseline}} at c: the ratio with balanced hops, no idle and free crossings, read in the same rounds. Host moved: how far one core's memory read speed, probed before and after each of the round's runs, moved (fastest - slowest over the median; 0 without probes). Core pace: how fast the route's CPUs ran (an L1 copy sampled every 100 ms through the run, the mean over its CPUs) over how fast the whole model's CPU did at c; below 1 the route ran on slower cores, and its share reads low. Slow pace: the same with the route's slower CPU in each second, the pace a pipeline across them allows. Cores moved: how far the round's three figures differ (0 where the runs were not sampled).</p>
<table><tr><th>load</th><th>round</th><th>ratio</th><th>ceiling</th><th>share</th><th>host moved</th><th>core pace</th><th>slow pace</th><th>cores moved</th></tr>
{{range .Rows}}<tr><td>c={{.Concurrency}}</td><td>{{if .Round}}{{.Round}}{{else}}median{{end}}</td><td>{{printf "%.2fx" .Ratio}}</td><td>{{printf "%.2fx" .Ceiling}}</td><td>{{printf "%.0f%%" (pct .Share)}}</td><td>{{printf "%.0f%%" (pct .HostSpread)}}</td><td>{{printf "%.2f" .CorePace}}</td><td>{{printf "%.2f" .SlowPace}}</td><td>{{printf "%.0f%%" (pct .CoreSpread)}}</td></tr>
{{end}}</table>{{end}}{{end}}
{{if .R.Budget}}<h2>Budget: {{if .R.BudgetPass}}<span class="ok">every limit holds</span>{{else}}<span class="fail">FAILED</span>{{end}}</h2>
<table><tr><th>run</th><th>limit</th><th>value</th><th>verdict</th></tr>
{{range .R.Budget}}<tr><td>{{.Run}}</td><td>{{.Limit}}</td><td>{{printf "%.4g" .Value}}</td><td>{{if .Pass}}<span class="ok">ok</span>{{else}}<span class="fail">FAIL</span>{{end}}</td></tr>
{{end}}</table>{{end}}
<h2>Plots</h2>
{{range .Plots}}<figure class="plot" id="{{.ID}}">{{.SVG}}<figcaption>{{.Caption}}</figcaption></figure>
{{end}}
<script>
// Marks each figure whose plot the browser laid out with visible marks;
// a test reads data-plots-rendered in a headless browser.
window.addEventListener("load", function () {
  var n = 0;
  document.querySelectorAll("figure.plot").forEach(function (f) {
    var svg = f.querySelector("svg");
    if (!svg) return;
    var box = svg.getBoundingClientRect();
    var marks = Array.prototype.filter.call(svg.querySelectorAll(".mark"), function (m) {
      var b = m.getBBox(); return b.width > 0 || b.height > 0;
    });
    if (box.width > 0 && box.height > 0 && marks.length > 0) { f.dataset.rendered = "yes"; n++; }
  });
  document.body.dataset.plotsRendered = String(n);
});
</script>
</body></html>
`))

// WriteHTML writes the report as one self-contained page.
func (r *Report) WriteHTML(path string) error {
	var b strings.Builder
	if err := page.Execute(&b, struct {
		R     *Report
		Plots []plot
	}{r, r.plots()}); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
