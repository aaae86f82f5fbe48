package telemetry

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// sample is one sample of a gauge: its labels and value.
type sample struct {
	labels map[string]string
	value  float64
}

// gauges is the samples of the gauge family name in m's registry, none when
// it is absent.
func gauges(t *testing.T, m *Metrics, name string) []sample {
	t.Helper()
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []sample
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, g := range f.GetMetric() {
			s := sample{labels: map[string]string{}, value: g.GetGauge().GetValue()}
			for _, l := range g.GetLabel() {
				s.labels[l.GetName()] = l.GetValue()
			}
			out = append(out, s)
		}
	}
	return out
}

func newTestMetrics(t *testing.T) *Metrics {
	t.Helper()
	m, err := NewMetrics()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// countersign_build_info is 1, labelled with the build's version and Go
// version.
func TestBuildInfo(t *testing.T) {
	got := gauges(t, newTestMetrics(t), MetricBuildInfo)
	if len(got) != 1 {
		t.Fatalf("%s: %v, want one sample", MetricBuildInfo, got)
	}
	if l := got[0].labels; l["go_version"] != runtime.Version() || l["version"] == "" || len(l) != 2 {
		t.Errorf("labels %v, want version and go_version %s", l, runtime.Version())
	}
	if got[0].value != 1 {
		t.Errorf("value %v, want 1", got[0].value)
	}
}

// The pending total is read at scrape time, at most once per
// PendingReadEvery; a failed read keeps the last value, and none is
// exported before the first success.
func TestWatchPending(t *testing.T) {
	m := newTestMetrics(t)
	var reads int
	var err error
	n := 7
	if e := m.WatchPending(func(context.Context) (int, error) { reads++; return n, err }); e != nil {
		t.Fatal(e)
	}
	value := func() (float64, bool) {
		got := gauges(t, m, MetricPendingTasks)
		if len(got) == 0 {
			return 0, false
		}
		return got[0].value, true
	}
	if v, ok := value(); !ok || v != 7 || reads != 1 {
		t.Fatalf("first scrape: %v %v after %d reads; want 7 after 1", v, ok, reads)
	}
	n = 9
	if v, _ := value(); v != 7 || reads != 1 {
		t.Errorf("a scrape within %v read again (%d reads) or changed the value (%v)", PendingReadEvery, reads, v)
	}
	c := pendingOf(t, m)
	c.at = c.at.Add(-PendingReadEvery) // as if a period had passed
	err = errors.New("nats: timeout")
	if v, _ := value(); v != 7 || reads != 2 {
		t.Errorf("after a failed read: %v after %d reads; want the last value, 7, after 2", v, reads)
	}
	c.at = c.at.Add(-PendingReadEvery)
	err = nil
	if v, _ := value(); v != 9 || reads != 3 {
		t.Errorf("after a period: %v after %d reads; want 9 after 3", v, reads)
	}

	failing := newTestMetrics(t)
	if e := failing.WatchPending(func(context.Context) (int, error) { return 0, errors.New("down") }); e != nil {
		t.Fatal(e)
	}
	if got := gauges(t, failing, MetricPendingTasks); len(got) != 0 {
		t.Errorf("exported %v before any read succeeded", got)
	}
}

// pendingOf is m's pending collector (tests move its clock).
func pendingOf(t *testing.T, m *Metrics) *pendingCollector {
	t.Helper()
	if m.pending == nil {
		t.Fatal("no pending collector")
	}
	return m.pending
}

// Each upstream's state, read at scrape time.
func TestWatchUpstreams(t *testing.T) {
	m := newTestMetrics(t)
	states := map[string]bool{"fs": true, "web": false}
	if err := m.WatchUpstreams(func() map[string]bool { return states }); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, s := range gauges(t, m, MetricUpstreamUp) {
		got[s.labels["upstream"]] = s.value
	}
	if diff := cmp.Diff(map[string]float64{"fs": 1, "web": 0}, got); diff != "" {
		t.Errorf("%s (-want +got):\n%s", MetricUpstreamUp, diff)
	}
}

// A nil *Metrics records nothing and registers nothing.
func TestNilMetrics(t *testing.T) {
	var m *Metrics
	m.StartFailed(StartNotStarted)
	m.Orphans(OrphanFailed, 1)
	if err := m.WatchPending(nil); err != nil {
		t.Error(err)
	}
	if err := m.WatchUpstreams(nil); err != nil {
		t.Error(err)
	}
}

// The Temporal SDK's timers are histograms in seconds, bucketed for
// seconds: a 20 ms workflow-task latency falls in a bucket of 50 ms or
// less, not in OpenTelemetry's default first bucket (5, meant for
// milliseconds), where every latency under 5 s would look the same.
func TestTemporalTimerBuckets(t *testing.T) {
	m := newTestMetrics(t)
	m.Temporal().Timer("temporal_workflow_task_execution_latency").Record(20 * time.Millisecond)
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	const name = "temporal_workflow_task_execution_latency_seconds"
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		var bounds []float64
		for _, b := range f.GetMetric()[0].GetHistogram().GetBucket() {
			bounds = append(bounds, b.GetUpperBound())
			if b.GetUpperBound() <= 0.05 && b.GetCumulativeCount() == 1 {
				return
			}
		}
		t.Fatalf("%s: no bucket of 50 ms or less holds the 20 ms sample; bounds %v", name, bounds)
	}
	t.Fatalf("%s not exported", name)
}
