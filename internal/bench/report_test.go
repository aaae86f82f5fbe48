package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// msSamples are durations of the given milliseconds.
func msSamples(v ...float64) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x * float64(time.Millisecond))
	}
	return out
}

func TestSummarizeNearestRank(t *testing.T) {
	// 1..100 ms, shuffled: the nearest-rank p50 is the 50th value.
	var v []float64
	for i := 100; i >= 1; i-- {
		v = append(v, float64((i*37)%100+1))
	}
	r := summarize("s", "x", 8, msSamples(v...), 2*time.Second)
	want := Latency{P50: 50, P95: 95, P99: 99, Mean: 50.5, Min: 1, Max: 100}
	if r.LatencyMs != want {
		t.Errorf("latency %+v, want %+v", r.LatencyMs, want)
	}
	if r.Count != 100 || r.Throughput != 50 || r.Seconds != 2 || r.Concurrency != 8 {
		t.Errorf("count %d, throughput %v, seconds %v, concurrency %d; want 100, 50, 2, 8", r.Count, r.Throughput, r.Seconds, r.Concurrency)
	}
	if len(r.QuantilesMs) != 101 || r.QuantilesMs[0] != 1 || r.QuantilesMs[25] != 25 || r.QuantilesMs[100] != 100 {
		t.Errorf("quantiles %v", r.QuantilesMs)
	}
	for i := 1; i < len(r.QuantilesMs); i++ {
		if r.QuantilesMs[i] < r.QuantilesMs[i-1] {
			t.Fatalf("quantiles not monotonic at %d: %v", i, r.QuantilesMs)
		}
	}
}

func TestSummarizeSmallSeries(t *testing.T) {
	r := summarize("s", "x", 1, msSamples(3.25), time.Second/4)
	if r.LatencyMs.P50 != 3.25 || r.LatencyMs.P99 != 3.25 || r.LatencyMs.Min != 3.25 || r.Throughput != 4 {
		t.Errorf("one sample: %+v, throughput %v", r.LatencyMs, r.Throughput)
	}
	// Two samples: p50 is the lower one (rank ceil(0.5·2) = 1), p95 the higher.
	r = summarize("s", "x", 1, msSamples(7, 1), time.Second)
	if r.LatencyMs.P50 != 1 || r.LatencyMs.P95 != 7 || r.LatencyMs.Mean != 4 {
		t.Errorf("two samples: %+v", r.LatencyMs)
	}
	r = summarize("s", "x", 1, nil, time.Second)
	if r.Count != 0 || r.Throughput != 0 || r.QuantilesMs != nil {
		t.Errorf("no samples: %+v", r)
	}
}

func TestPhaseCountsErrorsByKind(t *testing.T) {
	p := newPhase("s", 1, "a", "b")
	p.observe("a", time.Millisecond)
	p.fail("a", &rpcError{HTTPStatus: 429})
	p.fail("a", &rpcError{HTTPStatus: 200, Code: codeTooManyRequests, Message: "slow down"})
	p.fail("a", &rpcError{HTTPStatus: 200, Code: -32602, Message: "bad"})
	p.fail("a", &rpcError{HTTPStatus: 502})
	p.fail("a", unexpectedError{"not-a-task", "{}"})
	p.fail("a", fmt.Errorf("wrapped: %w", context.Canceled))
	p.fail("c", errors.New("boom"))
	rs := p.results(time.Second)
	if len(rs) != 3 || rs[0].Series != "a" || rs[1].Series != "b" || rs[2].Series != "c" {
		t.Fatalf("series in order a, b, c: %+v", rs)
	}
	want := map[string]int{"rate-limited": 2, "rpc-32602": 1, "http-502": 1, "unexpected-not-a-task": 1, "canceled": 1}
	if fmt.Sprint(rs[0].ErrorKinds) != fmt.Sprint(want) || rs[0].Errors != 6 || rs[0].Count != 1 {
		t.Errorf("a: %d errors %v, count %d; want 6 %v, 1", rs[0].Errors, rs[0].ErrorKinds, rs[0].Count, want)
	}
	if rs[1].Count != 0 || rs[1].Errors != 0 {
		t.Errorf("b: %+v", rs[1])
	}
	if rs[2].ErrorKinds["other"] != 1 {
		t.Errorf("c: %v", rs[2].ErrorKinds)
	}
}

func TestOptionsRefuseBadInput(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{AgentToken: "t"}, "server URL"},
		{Options{Server: "http://x"}, "agent token"},
		{Options{Server: "http://x", AgentToken: "t", Scenarios: []string{"nope"}}, `unknown scenario "nope"`},
		{Options{Server: "http://x", AgentToken: "t", Scenarios: []string{ScenarioApproval}}, "needs the admin token"},
		{Options{Server: "http://x", AgentToken: "t", AdminToken: "a", Concurrency: []int{0}}, "concurrency 0"},
		{Options{Server: "http://x", AgentToken: "t", AdminToken: "a", Requests: -1}, "negative"},
	} {
		err := tc.o.defaults()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.o, err, tc.want)
		}
	}
	o := Options{Server: "http://x/", AgentToken: "t", AdminToken: "a"}
	if err := o.defaults(); err != nil || o.Server != "http://x" || o.Duration != 10*time.Second || len(o.Concurrency) != 2 {
		t.Errorf("defaults: %v, %+v", err, o)
	}
}

// fixedReport is a report with a baseline and the series Targets judges.
func fixedReport() *Report {
	res := func(series string, conc int, p50, tput float64) Result {
		r := Result{Scenario: series, Series: series, Concurrency: conc, Count: 100, Seconds: 1, Throughput: tput,
			LatencyMs: Latency{P50: p50, P95: p50 * 2, P99: p50 * 3, Mean: p50, Min: p50 / 2, Max: p50 * 4}}
		r.QuantilesMs = make([]float64, 101)
		for i := range r.QuantilesMs {
			r.QuantilesMs[i] = p50 * (0.5 + float64(i)/50)
		}
		return r
	}
	r := &Report{
		Schema: Schema, RunID: "abcd1234", StartedAt: time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC),
		Machine:  Machine{Cores: 2, CPU: "AMD EPYC", LoadAvg: "3.00 2.00 1.00"},
		Server:   "http://127.0.0.1:8080",
		Settings: Settings{Concurrency: []int{1, 8}, Baseline: true},
		Results: []Result{
			res("temporal-start", 1, 4, 250), res("temporal-start", 8, 10, 800),
			res("gated-call", 1, 5, 200), res("gated-call", 8, 20, 400),
			res("tasks-get-pending", 1, 0.8, 1250), res("tasks-get-pending", 8, 1.5, 5300),
			res("approval-accepted-to-executed", 1, 12, 50),
			res("gateway-direct", 1, 2, 500), res("gateway-through", 1, 2.75, 500),
		},
	}
	// The two gateway series are timed inside one operation.
	for i := range r.Results {
		if strings.HasPrefix(r.Results[i].Series, "gateway-") {
			r.Results[i].Scenario = "gateway"
		}
	}
	return r
}

func TestTargets(t *testing.T) {
	got := map[string]Target{}
	for _, x := range Targets(fixedReport()) {
		got[x.Name] = x
	}
	for name, want := range map[string]Target{
		"gated call p50 above raw start p50, c=1":      {Measured: "1.00 ms (5.00 vs 4.00)", Verdict: "met"},
		"gated call throughput vs raw start, c=8":      {Measured: "0.50× (400 vs 800/s)", Verdict: "missed"},
		"tasks-get-pending throughput, c=8":            {Measured: "5300/s", Verdict: "met"},
		"tasks-get-pending p50, c=1":                   {Measured: "0.80 ms", Verdict: "met"},
		"approval accepted → executed p50, c=1":        {Measured: "12.00 ms", Verdict: "missed"},
		"gateway overhead on an allowed call p50, c=1": {Measured: "0.75 ms (2.75 vs 2.00 direct)", Verdict: "met"},
	} {
		g, ok := got[name]
		if !ok {
			t.Errorf("no target %q in %v", name, got)
			continue
		}
		if g.Measured != want.Measured || g.Verdict != want.Verdict {
			t.Errorf("%s: %q %s, want %q %s", name, g.Measured, g.Verdict, want.Measured, want.Verdict)
		}
	}
	if len(got) != 6 {
		t.Errorf("%d targets, want 6 (no completed tasks/get series): %v", len(got), got)
	}
	// Without a baseline there is nothing to hold the gated call to.
	r := fixedReport()
	r.Results = r.Results[2:]
	for _, x := range Targets(r) {
		if strings.Contains(x.Name, "raw start") {
			t.Errorf("a baseline target without a baseline: %+v", x)
		}
	}
}

func TestWriteTextRatios(t *testing.T) {
	var b bytes.Buffer
	if err := WriteText(&b, fixedReport()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	// gated-call c=8: p50 20 / 10 = 2.00, throughput 400 / 800 = 0.50.
	if !regexp.MustCompile(`gated-call\s+8\s+100\s+0\s+20\.00\s+40\.00\s+60\.00\s+400\s+2\.00\s+0\.50`).MatchString(out) {
		t.Errorf("no gated-call c=8 row with its ratios:\n%s", out)
	}
	if !strings.Contains(out, "Issue 14 targets:") || !strings.Contains(out, "missed") {
		t.Errorf("no targets:\n%s", out)
	}
	// Without a baseline, no ratio columns.
	r := fixedReport()
	r.Settings.Baseline = false
	r.Results = r.Results[2:]
	b.Reset()
	if err := WriteText(&b, r); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "×raw") {
		t.Errorf("ratio columns without a baseline:\n%s", b.String())
	}
}

func TestCompare(t *testing.T) {
	a, b := fixedReport(), fixedReport()
	b.RunID = "ffff0000"
	for i := range b.Results {
		if b.Results[i].Series == "gated-call" && b.Results[i].Concurrency == 1 {
			b.Results[i].LatencyMs.P50 = 7.5 // 1.5× A's 5
			b.Results[i].Throughput = 100    // 0.5× A's 200
		}
	}
	b.Results = append(b.Results, Result{Series: "only-in-b", Concurrency: 1, Count: 1})
	var out bytes.Buffer
	if err := Compare(&out, a, b); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`gated-call\s+1\s+5\.00\s+7\.50\s+1\.50\s+\+2\.50\s+15\.00\s+15\.00\s+1\.00\s+200\s+100\s+0\.50`).MatchString(out.String()) {
		t.Errorf("no gated-call c=1 comparison:\n%s", out.String())
	}
	if strings.Contains(out.String(), "only-in-b") {
		t.Errorf("a series only B has is compared:\n%s", out.String())
	}
	c := fixedReport()
	c.Results = []Result{{Series: "other", Concurrency: 1, Count: 3}}
	if err := Compare(io.Discard, a, c); err == nil {
		t.Error("two reports with nothing in common compared without an error")
	}
}

func TestReadReport(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "a.json")
	b, _ := json.Marshal(fixedReport())
	if err := os.WriteFile(good, b, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := ReadReport(good)
	if err != nil || r.RunID != "abcd1234" || len(r.Results) != 9 {
		t.Fatalf("read back: %v %+v", err, r)
	}
	other := filepath.Join(dir, "b.json")
	_ = os.WriteFile(other, []byte(`{"schema":"something-else/2"}`), 0o600)
	if _, err := ReadReport(other); err == nil || !strings.Contains(err.Error(), "schema") {
		t.Errorf("another schema: %v", err)
	}
	bad := filepath.Join(dir, "c.json")
	_ = os.WriteFile(bad, []byte(`not json`), 0o600)
	if _, err := ReadReport(bad); err == nil || !strings.Contains(err.Error(), "not a bench report") {
		t.Errorf("not JSON: %v", err)
	}
}

func TestPlot(t *testing.T) {
	var b bytes.Buffer
	r := fixedReport()
	r.Note = `<script>"x"</script>`
	if err := Plot(&b, r); err != nil {
		t.Fatal(err)
	}
	// Well-formed XML, the note escaped, a box per row and a throughput
	// line per series.
	d := xml.NewDecoder(bytes.NewReader(b.Bytes()))
	counts := map[string]int{}
	p50x := map[string]float64{}
	var lastLabel string
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed SVG: %v\n%s", err, b.String())
		}
		switch e := tok.(type) {
		case xml.StartElement:
			counts[e.Name.Local]++
			if e.Name.Local == "line" && attr(e, "stroke-width") == "2.5" {
				x, _ := strconv.ParseFloat(attr(e, "x1"), 64)
				p50x[lastLabel] = x
			}
		case xml.CharData:
			if s := strings.TrimSpace(string(e)); strings.Contains(s, " c=") {
				lastLabel = s
			}
		}
	}
	if counts["script"] != 0 || !strings.Contains(b.String(), "&lt;script&gt;") {
		t.Error("the note is not escaped")
	}
	if counts["polyline"] != 5 { // temporal-start, gated-call, tasks-get-pending, approval…, gateway (one line for its two series)
		t.Errorf("%d throughput lines, want 5", counts["polyline"])
	}
	if len(p50x) != 9 {
		t.Fatalf("%d p50 bars, want 9: %v", len(p50x), p50x)
	}
	// Log scale: a larger p50 is further right.
	if !(p50x["gated-call c=8"] > p50x["gated-call c=1"] && p50x["gated-call c=1"] > p50x["tasks-get-pending c=1"]) {
		t.Errorf("p50 bars out of order: %v", p50x)
	}
	if err := Plot(io.Discard, &Report{RunID: "empty"}); err == nil {
		t.Error("an empty report plotted")
	}
}

func attr(e xml.StartElement, name string) string {
	for _, a := range e.Attr {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}
