package e2e

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/tasks"
)

// The benchmarks run against a real `countersign dev` (embedded Temporal on
// SQLite with the default synchronous=FULL, embedded NATS) over loopback
// HTTP, as an agent and an approver would. Run them with
//
//	go test ./internal/e2e -run '^$' -bench . -benchtime 200x
//
// Each reports p50/p99 latencies or a rate as custom metrics.

// benchStack runs countersign dev with its defaults (SQLite synchronous=FULL).
// With COUNTERSIGN_BENCH_TRACE=1, tracing is on and every span goes to an
// exporter that drops it, synchronously: the cost of tracing in process.
func benchStack(b *testing.B) *stack {
	cfg := app.Config{SQLiteSync: benchSync()}
	if os.Getenv("COUNTERSIGN_BENCH_TRACE") == "1" {
		cfg.TraceExporter = tracetest.NewNoopExporter()
	}
	return startStackConfig(b, cfg, 0)
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func reportLatency(b *testing.B, prefix string, d []time.Duration) {
	b.ReportMetric(float64(percentile(d, 0.50).Microseconds())/1000, prefix+"-p50-ms")
	b.ReportMetric(float64(percentile(d, 0.99).Microseconds())/1000, prefix+"-p99-ms")
}

// BenchmarkGatedCall measures a requestable tools/call to its
// CreateTaskResult: policy, action hash, dedup slot, read model write and a
// durable workflow start. Calls follow each other back to back, so each
// one competes with the previous task's first workflow steps for the
// embedded SQLite file.
func BenchmarkGatedCall(b *testing.B) {
	benchGatedCall(b, 0)
}

// BenchmarkGatedCallSpaced is BenchmarkGatedCall with 100 ms of quiet
// between calls (not timed): the latency one agent sees on an idle server.
func BenchmarkGatedCallSpaced(b *testing.B) {
	benchGatedCall(b, 100*time.Millisecond)
}

func benchGatedCall(b *testing.B, pause time.Duration) {
	s := benchStack(b)
	var lat []time.Duration
	i := 0
	for b.Loop() {
		i++
		if pause > 0 {
			b.StopTimer()
			time.Sleep(pause)
			b.StartTimer()
		}
		args := map[string]any{"to": fmt.Sprintf("acct-%d", i), "amount": 5000, "currency": "USD"}
		start := time.Now()
		task := s.CreateTask(s.AgentToken, "transfer_funds", args)
		lat = append(lat, time.Since(start))
		if task.Status != tasks.StatusWorking {
			b.Fatalf("status %s", task.Status)
		}
	}
	reportLatency(b, "gated-call", lat)
}

// BenchmarkTasksGet measures tasks/get throughput with 8 concurrent pollers
// over a set of pending tasks.
func BenchmarkTasksGet(b *testing.B) {
	s := benchStack(b)
	var ids []string
	for i := range 20 {
		ids = append(ids, s.CreateTask(s.AgentToken, "transfer_funds", map[string]any{"to": fmt.Sprintf("acct-g%d", i), "amount": 5000, "currency": "USD"}).TaskID)
	}
	var n atomic.Int64
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	per := max(1, b.N/8)
	for w := range 8 {
		wg.Go(func() {
			for j := range per {
				id := ids[(w*per+j)%len(ids)]
				if _, r := s.GetTask(s.AgentToken, id); r.Error != nil {
					b.Errorf("tasks/get: %+v", r.Error)
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(n.Load())/time.Since(start).Seconds(), "tasks-get/s")
}

// BenchmarkApprovalToExecuted measures from the accepted decision (the
// approver's POST returning accepted) to the task being observed completed
// with approved-executed by a poller.
func BenchmarkApprovalToExecuted(b *testing.B) {
	s := benchStack(b)
	alice := s.Enroll("alice", "approvers")
	var decide, toExec []time.Duration
	i := 0
	for b.Loop() {
		i++
		b.StopTimer()
		task := s.CreateTask(s.AgentToken, "transfer_funds", map[string]any{"to": fmt.Sprintf("acct-a%d", i), "amount": 5000, "currency": "USD"})
		ref := s.RefOf(task.TaskID)
		c := s.Challenge(ref, "approve")
		sig := alice.Sign(s.T, c)
		b.StartTimer()
		t0 := time.Now()
		if r := s.Decide(ref, c, "approve", sig); !r.Accepted {
			b.Fatalf("rejected: %+v", r)
		}
		t1 := time.Now()
		for {
			d, _ := s.GetTask(s.AgentToken, task.TaskID)
			if d.Status.Terminal() {
				if disposition(d) != tasks.ApprovedExecuted {
					b.Fatalf("disposition %s", disposition(d))
				}
				break
			}
			time.Sleep(200 * time.Microsecond)
		}
		decide = append(decide, t1.Sub(t0))
		toExec = append(toExec, time.Since(t1))
	}
	reportLatency(b, "decision", decide)
	reportLatency(b, "accepted-to-executed", toExec)
}

// benchSync is the SQLite synchronous mode of the benchmark stack: FULL (the
// default of countersign dev) unless COUNTERSIGN_BENCH_SQLITE_SYNC says
// NORMAL.
func benchSync() string {
	if v := os.Getenv("COUNTERSIGN_BENCH_SQLITE_SYNC"); v != "" {
		return v
	}
	return "FULL"
}
