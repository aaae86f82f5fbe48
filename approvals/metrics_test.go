package approvals_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/internal/telemetry"
	"github.com/countersign/countersign/tasks"
)

// counters reads the counter family name from m, by its one label's value.
func counters(t *testing.T, m *telemetry.Metrics, name string) map[string]float64 {
	t.Helper()
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, c := range f.GetMetric() {
			out[c.GetLabel()[0].GetValue()] = c.GetCounter().GetValue()
		}
	}
	return out
}

func newMetrics(t *testing.T) *telemetry.Metrics {
	t.Helper()
	m, err := telemetry.NewMetrics()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A workflow start that fails and never took effect is counted, with what
// became of it.
func TestStartFailureCounted(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	m := newMetrics(t)
	gate := make(chan struct{})
	close(gate)
	svc := f.service(t, func(o *approvals.Options) {
		o.Engine = failedStart{Engine: f.engine, gate: gate, err: errors.New("temporal unavailable")}
		o.Telemetry = &telemetry.Telemetry{Metrics: m}
	})
	o, err := svc.Open(ctx, f.call(t, "agent-start-fails", "transfer_funds", transfer(5000, "start fails"), 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.WaitStart(ctx, o.Task.TaskID); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]float64{telemetry.StartNotStarted: 1}, counters(t, m, telemetry.MetricStartFailures)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", telemetry.MetricStartFailures, diff)
	}
}

// The reconciler counts the orphans it resumes and those it fails.
func TestOrphansCounted(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	m := newMetrics(t)
	svc := f.service(t, func(o *approvals.Options) { o.Telemetry = &telemetry.Telemetry{Metrics: m} })
	running := f.open(t, f.call(t, "agent-orphans", "transfer_funds", transfer(5000, "orphans"), 0))
	// Two orphans that can be resumed (their records hold their start)
	// and one that cannot (written before tasks.Record.Start existed).
	for i := range 3 {
		orphan := running
		orphan.TaskID, orphan.ApprovalRef, orphan.DedupKey = tasks.NewID("tsk_"), tasks.NewID("apr_"), ""
		orphan.CreatedAt = time.Now().Add(-time.Hour)
		orphan.Timeline = nil
		if i == 2 {
			orphan.Start = nil
		}
		if err := f.store.Create(ctx, orphan); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := svc.Reconcile(ctx, time.Minute); err != nil || n != 1 {
		t.Fatalf("Reconcile = %d, %v; want 1 failed", n, err)
	}
	want := map[string]float64{telemetry.OrphanResumed: 2, telemetry.OrphanFailed: 1}
	if diff := cmp.Diff(want, counters(t, m, telemetry.MetricOrphanedTasks)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", telemetry.MetricOrphanedTasks, diff)
	}
	// A second round finds nothing to do, and counts nothing more.
	if _, err := svc.Reconcile(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, counters(t, m, telemetry.MetricOrphanedTasks)); diff != "" {
		t.Errorf("after a second round, %s (-want +got):\n%s", telemetry.MetricOrphanedTasks, diff)
	}
}
