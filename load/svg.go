package load

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// A tiny SVG plotter for the HTML report: the page must be self-contained
// (no script or font from elsewhere), and a plot is a handful of lines.

const (
	plotW, plotH           = 640, 320
	padL, padR, padT, padB = 64, 150, 28, 64
)

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"}

type plotSeries struct {
	Name   string
	Points [][2]float64
	Dots   bool // scatter instead of a line
}

type axis struct {
	label  string
	lo, hi float64
	log    bool
}

func (a *axis) fit(vals []float64) {
	a.lo, a.hi = math.Inf(1), math.Inf(-1)
	for _, v := range vals {
		if a.log && v <= 0 {
			continue
		}
		a.lo, a.hi = min(a.lo, v), max(a.hi, v)
	}
	if math.IsInf(a.lo, 0) {
		a.lo, a.hi = 0, 1
	}
	if !a.log {
		a.lo = min(a.lo, 0)
	}
	if a.hi <= a.lo {
		a.hi = a.lo + 1
		if a.log {
			a.hi = a.lo * 10
		}
	}
}

// pos maps v into [0, 1] along the axis.
func (a *axis) pos(v float64) float64 {
	if a.log {
		return (math.Log10(max(v, a.lo)) - math.Log10(a.lo)) / (math.Log10(a.hi) - math.Log10(a.lo))
	}
	return (v - a.lo) / (a.hi - a.lo)
}

func (a *axis) ticks() []float64 {
	var out []float64
	for i := 0; i <= 4; i++ {
		f := float64(i) / 4
		if a.log {
			out = append(out, math.Pow(10, math.Log10(a.lo)+f*(math.Log10(a.hi)-math.Log10(a.lo))))
		} else {
			out = append(out, a.lo+f*(a.hi-a.lo))
		}
	}
	return out
}

func tickLabel(v float64) string {
	switch {
	case v == 0:
		return "0"
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

// frame draws the axes, ticks, labels and title; an x axis without a
// label has no ticks (a bar chart's categories stand there).
func frame(b *strings.Builder, title string, x, y *axis) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d" role="img">`, plotW, plotH, plotW, plotH)
	fmt.Fprintf(b, `<title>%s</title><text x="%d" y="18" font-size="14" font-weight="bold">%s</text>`, html.EscapeString(title), padL, html.EscapeString(title))
	iw, ih := plotW-padL-padR, plotH-padT-padB
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`, padL, padT, iw, ih)
	for _, t := range x.ticks() {
		if x.label == "" {
			break // categories label the x axis
		}
		px := float64(padL) + x.pos(t)*float64(iw)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/><text x="%.1f" y="%d" font-size="11" text-anchor="middle">%s</text>`,
			px, padT, px, padT+ih, px, padT+ih+14, tickLabel(t))
	}
	for _, t := range y.ticks() {
		py := float64(padT+ih) - y.pos(t)*float64(ih)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/><text x="%d" y="%.1f" font-size="11" text-anchor="end">%s</text>`,
			padL, py, padL+iw, py, padL-4, py+4, tickLabel(t))
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="12" text-anchor="middle">%s</text>`, padL+iw/2, plotH-8, html.EscapeString(x.label))
	fmt.Fprintf(b, `<text x="14" y="%d" font-size="12" text-anchor="middle" transform="rotate(-90 14 %d)">%s</text>`, padT+ih/2, padT+ih/2, html.EscapeString(y.label))
}

func legend(b *strings.Builder, names []string) {
	for i, n := range names {
		y := padT + 6 + 16*i
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d" font-size="11">%s</text>`,
			plotW-padR+10, y, palette[i%len(palette)], plotW-padR+24, y+9, html.EscapeString(n))
	}
}

// linePlot draws series on shared axes. Each series' marks carry the class
// "mark" that the page's render check looks for.
func linePlot(title string, x, y axis, series []plotSeries) string {
	var xs, ys []float64
	for _, s := range series {
		for _, p := range s.Points {
			xs, ys = append(xs, p[0]), append(ys, p[1])
		}
	}
	x.fit(xs)
	y.fit(ys)
	var b strings.Builder
	frame(&b, title, &x, &y)
	iw, ih := float64(plotW-padL-padR), float64(plotH-padT-padB)
	var names []string
	for i, s := range series {
		color := palette[i%len(palette)]
		names = append(names, s.Name)
		if s.Dots {
			fmt.Fprintf(&b, `<g class="mark" fill="%s" fill-opacity="0.5">`, color)
			for _, p := range s.Points {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="1.6"/>`, float64(padL)+x.pos(p[0])*iw, float64(padT)+ih-y.pos(p[1])*ih)
			}
			b.WriteString(`</g>`)
			continue
		}
		fmt.Fprintf(&b, `<polyline class="mark" fill="none" stroke="%s" stroke-width="1.8" points="`, color)
		for _, p := range s.Points {
			fmt.Fprintf(&b, "%.1f,%.1f ", float64(padL)+x.pos(p[0])*iw, float64(padT)+ih-y.pos(p[1])*ih)
		}
		b.WriteString(`"/>`)
		if len(s.Points) <= 12 {
			for _, p := range s.Points {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`, float64(padL)+x.pos(p[0])*iw, float64(padT)+ih-y.pos(p[1])*ih, color)
			}
		}
	}
	legend(&b, names)
	b.WriteString(`</svg>`)
	return b.String()
}

// stackedBars draws one bar per category, made of stacked parts.
func stackedBars(title, ylabel string, cats []string, parts []string, values [][]float64) string {
	var totals []float64
	for _, v := range values {
		t := 0.0
		for _, x := range v {
			t += x
		}
		totals = append(totals, t)
	}
	x := axis{label: ""}
	y := axis{label: ylabel}
	y.fit(totals)
	var b strings.Builder
	x.lo, x.hi = 0, 1
	frame(&b, title, &x, &y)
	iw, ih := float64(plotW-padL-padR), float64(plotH-padT-padB)
	slot := iw / float64(max(1, len(cats)))
	bw := slot * 0.6
	for i, cat := range cats {
		x0 := float64(padL) + slot*float64(i) + (slot-bw)/2
		base := 0.0
		for j, v := range values[i] {
			if v <= 0 {
				continue
			}
			y0 := float64(padT) + ih - y.pos(base+v)*ih
			h := (y.pos(base+v) - y.pos(base)) * ih
			fmt.Fprintf(&b, `<rect class="mark" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %.3f</title></rect>`,
				x0, y0, bw, max(h, 0.5), palette[j%len(palette)], html.EscapeString(cat), html.EscapeString(parts[j]), v)
			base += v
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="10" text-anchor="end" transform="rotate(-30 %.1f %d)">%s</text>`,
			x0+bw/2, plotH-padB+12, x0+bw/2, plotH-padB+12, html.EscapeString(cat))
	}
	legend(&b, parts)
	b.WriteString(`</svg>`)
	return b.String()
}
