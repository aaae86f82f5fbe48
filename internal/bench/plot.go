package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
)

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#843c39", "#7b4173"}

// Plot draws the report as an SVG image: each series' latency distribution
// at each concurrency (whiskers p5–p99, box p25–p75, a bar at p50, on a log
// scale), and each scenario's throughput against concurrency.
func Plot(w io.Writer, r *Report) error {
	var rows []Result
	for _, x := range r.Results {
		if len(x.QuantilesMs) == 101 {
			rows = append(rows, x)
		}
	}
	if len(rows) == 0 {
		return fmt.Errorf("report %s has no latency distribution to plot", r.RunID)
	}
	concs := slices.Clone(r.Settings.Concurrency)
	for _, x := range rows {
		if !slices.Contains(concs, x.Concurrency) {
			concs = append(concs, x.Concurrency)
		}
	}
	slices.Sort(concs)
	concColor := func(c int) string { return palette[slices.Index(concs, c)%len(palette)] }

	const (
		width   = 980
		left    = 250
		right   = 30
		rowH    = 15
		top1    = 60
		plot2H  = 320
		legendW = 230
	)
	h1 := len(rows)*rowH + 40
	top2 := top1 + h1 + 70
	height := top2 + plot2H + 60
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="15" font-weight="bold">countersign bench %s — %s</text>`+"\n", 10, esc(r.RunID), esc(r.StartedAt.Format("2006-01-02 15:04 MST")))
	fmt.Fprintf(&b, `<text x="%d" y="38" fill="#555">%d cores, %s, load %s; %s</text>`+"\n", 10, r.Machine.Cores, esc(r.Machine.CPU), esc(r.Machine.LoadAvg), esc(r.Note))

	// Panel 1: latency distributions on a log scale.
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, x := range rows {
		lo = min(lo, x.QuantilesMs[5])
		hi = max(hi, x.QuantilesMs[99])
	}
	lo = math.Pow(10, math.Floor(math.Log10(max(lo, 0.01))))
	hi = math.Pow(10, math.Ceil(math.Log10(max(hi, lo*10))))
	xOf := func(v float64) float64 {
		v = min(max(v, lo), hi)
		return left + (math.Log10(v)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))*(width-left-right)
	}
	fmt.Fprintf(&b, `<text x="10" y="%d" font-size="13" font-weight="bold">Latency (ms, log scale): whiskers p5–p99, box p25–p75, bar p50</text>`+"\n", top1-8)
	for d := lo; d <= hi*1.0001; d *= 10 {
		x := xOf(d)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ccc"/>`+"\n", x, top1, x, top1+len(rows)*rowH)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, top1+len(rows)*rowH+14, fmtNum(d))
	}
	for i, x := range rows {
		y := float64(top1 + i*rowH + rowH/2)
		q := x.QuantilesMs
		col := concColor(x.Concurrency)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s c=%d</text>`+"\n", left-8, y, esc(x.Series), x.Concurrency)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", xOf(q[5]), y, xOf(q[99]), y, col)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%d" fill="%s" fill-opacity="0.35" stroke="%s"/>`+"\n",
			xOf(q[25]), y-5, max(xOf(q[75])-xOf(q[25]), 1), 10, col, col)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2.5"/>`+"\n", xOf(q[50]), y-6, xOf(q[50]), y+6, col)
	}
	for i, c := range concs {
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d">concurrency %d</text>`+"\n",
			left+i*120, top1+len(rows)*rowH+24, concColor(c), left+i*120+14, top1+len(rows)*rowH+33, c)
	}

	// Panel 2: throughput against concurrency, one line per scenario (its
	// first series: the others are timed inside the same operations and
	// share its rate).
	series := []string{}
	var seen []string
	for _, x := range rows {
		if !slices.Contains(seen, x.Scenario) && x.Throughput > 0 {
			seen = append(seen, x.Scenario)
			series = append(series, x.Series)
		}
	}
	tlo, thi := math.Inf(1), math.Inf(-1)
	for _, x := range rows {
		if x.Throughput > 0 {
			tlo, thi = min(tlo, x.Throughput), max(thi, x.Throughput)
		}
	}
	tlo = math.Pow(10, math.Floor(math.Log10(tlo)))
	thi = math.Pow(10, math.Ceil(math.Log10(max(thi, tlo*10))))
	p2left, p2right := 80.0, float64(width-legendW)
	cx := func(c int) float64 {
		if len(concs) == 1 {
			return (p2left + p2right) / 2
		}
		return p2left + float64(slices.Index(concs, c))/float64(len(concs)-1)*(p2right-p2left)
	}
	ty := func(v float64) float64 {
		return float64(top2+plot2H) - (math.Log10(v)-math.Log10(tlo))/(math.Log10(thi)-math.Log10(tlo))*plot2H
	}
	fmt.Fprintf(&b, `<text x="10" y="%d" font-size="13" font-weight="bold">Throughput (operations/s, log scale) against concurrency</text>`+"\n", top2-12)
	for d := tlo; d <= thi*1.0001; d *= 10 {
		y := ty(d)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ccc"/>`+"\n", p2left, y, p2right, y)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", p2left-6, y, fmtNum(d))
	}
	for _, c := range concs {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">c=%d</text>`+"\n", cx(c), top2+plot2H+16, c)
	}
	for i, s := range series {
		col := palette[i%len(palette)]
		var pts []string
		for _, x := range rows {
			if x.Series == s && x.Throughput > 0 {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", cx(x.Concurrency), ty(x.Throughput)))
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", cx(x.Concurrency), ty(x.Throughput), col)
			}
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5"/>`+"\n", strings.Join(pts, " "), col)
		ly := top2 + i*15
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="10" height="10" fill="%s"/><text x="%.1f" y="%d">%s</text>`+"\n",
			p2right+20, ly, col, p2right+34, ly+9, esc(s))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func esc(s string) string { return html.EscapeString(s) }

func fmtNum(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.0fk", v/1000)
	case v >= 1:
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%g", v)
}
