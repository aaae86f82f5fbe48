package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/countersign/countersign/internal/proccpu"
	"github.com/countersign/countersign/tasks"
)

// The baseline of a gated call is the bare durable start it cannot do
// without: a Temporal workflow that is started eagerly, runs one workflow
// task and waits on a timer, as a pending approval does. The benchmarks
// below run both against the same `countersign dev`, in the same run, so
// their ratio means something on a shared machine:
//
//	go test ./internal/e2e -run '^$' -bench 'GatedVsRawStart' -benchtime 300x -count 3
//
// CPU is the test process's (it holds the server, the embedded Temporal and
// NATS, and the client), per operation, including the work each operation
// leaves behind (its workflow's later steps), measured over a phase and a
// quiet second after it.

// rawTaskQueue is the baseline workflow's task queue, served by a worker of
// its own on the app's Temporal client.
const rawTaskQueue = "bench-raw-start"

// rawPending is the baseline workflow: one workflow task, then a timer.
func rawPending(ctx workflow.Context) error {
	_, err := workflow.AwaitWithTimeout(ctx, time.Hour, func() bool { return false })
	return err
}

// baseline is a stack with the raw-start worker and a keep-alive HTTP client.
type baseline struct {
	s      *stack
	tc     client.Client
	http   *http.Client
	prefix string
	n      atomic.Int64
}

func newBaseline(b *testing.B) *baseline {
	s := benchStack(b)
	tc := s.App.Temporal()
	w := worker.New(tc, rawTaskQueue, worker.Options{})
	w.RegisterWorkflowWithOptions(rawPending, workflow.RegisterOptions{Name: "RawPending"})
	if err := w.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(w.Stop)
	return &baseline{
		s: s, tc: tc, prefix: tasks.NewID("raw_"),
		http: newBenchHTTP(),
	}
}

// newBenchHTTP is an HTTP client that keeps a connection per concurrent
// caller.
func newBenchHTTP() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
}

// raw starts one bare pending workflow, as Orchestrator.Start starts an
// approval (eager start).
func (bl *baseline) raw(ctx context.Context) error {
	_, err := bl.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:               fmt.Sprintf("%s-%d", bl.prefix, bl.n.Add(1)),
		TaskQueue:        rawTaskQueue,
		EnableEagerStart: true,
	}, "RawPending")
	return err
}

// gated sends one requestable tools/call (transfer_funds, unique
// arguments) as a tasks-declaring 2026-07-28 client and checks it became a
// task.
func (bl *baseline) gated() error {
	i := bl.n.Add(1)
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": map[string]any{
		"name":      "transfer_funds",
		"arguments": map[string]any{"to": fmt.Sprintf("acct-b%d", i), "amount": 5000, "currency": "USD"},
		"_meta": map[string]any{
			"io.modelcontextprotocol/protocolVersion":    "2026-07-28",
			"io.modelcontextprotocol/clientCapabilities": map[string]any{"extensions": map[string]any{tasks.ExtTasks: map[string]any{}}},
			"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "bench", "version": "1"},
		},
	}})
	req, _ := http.NewRequest("POST", bl.s.Base+"/mcp", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "tools/call")
	req.Header.Set("Mcp-Name", "transfer_funds")
	req.Header.Set("Authorization", "Bearer "+bl.s.AgentToken)
	resp, err := bl.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if !bytes.Contains(raw, []byte(`"resultType":"task"`)) {
		return fmt.Errorf("tools/call: HTTP %d, not a task: %.300s", resp.StatusCode, raw)
	}
	return nil
}

// BenchmarkGatedVsRawStart alternates, call by call, a raw start and a gated
// tools/call, one at a time (c=1), and reports each one's median and the
// gated call's overhead over the raw start.
func BenchmarkGatedVsRawStart(b *testing.B) {
	bl := newBaseline(b)
	ctx := context.Background()
	for range 20 { // warm both paths
		if err := bl.raw(ctx); err != nil {
			b.Fatal(err)
		}
		if err := bl.gated(); err != nil {
			b.Fatal(err)
		}
	}
	var raw, gated []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := bl.raw(ctx); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := bl.gated(); err != nil {
			b.Fatal(err)
		}
		raw, gated = append(raw, t1.Sub(t0)), append(gated, time.Since(t1))
	}
	pr, pg := percentile(raw, 0.5), percentile(gated, 0.5)
	b.ReportMetric(float64(pr.Microseconds())/1000, "raw-p50-ms")
	b.ReportMetric(float64(pg.Microseconds())/1000, "gated-p50-ms")
	b.ReportMetric(float64((pg-pr).Microseconds())/1000, "overhead-p50-ms")
}

// BenchmarkGatedVsRawStartParallel runs b.N raw starts and b.N gated
// calls, each over 8 concurrent callers (c=8), in 10 alternating rounds of
// b.N/10 (so that the shared machine's load drifts over both alike), and
// reports each one's throughput, their ratio and the CPU per operation.
func BenchmarkGatedVsRawStartParallel(b *testing.B) {
	bl := newBaseline(b)
	ctx := context.Background()
	const conc = 8
	phase := func(n int, op func() error) (time.Duration, time.Duration, error) {
		c0, t0 := proccpu.Used(), time.Now()
		var next atomic.Int64
		var wg sync.WaitGroup
		var failed atomic.Value
		for range conc {
			wg.Go(func() {
				for next.Add(1) <= int64(n) {
					if err := op(); err != nil {
						failed.CompareAndSwap(nil, err)
						return
					}
				}
			})
		}
		wg.Wait()
		wall := time.Since(t0)
		time.Sleep(300 * time.Millisecond) // the operations' trailing work
		if err, _ := failed.Load().(error); err != nil {
			return 0, 0, err
		}
		return wall, proccpu.Used() - c0, nil
	}
	rawOp := func() error { return bl.raw(ctx) }
	if _, _, err := phase(40, rawOp); err != nil { // warm up
		b.Fatal(err)
	}
	if _, _, err := phase(40, bl.gated); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var rawWall, rawCPU, gatedWall, gatedCPU time.Duration
	const rounds = 10
	n := max(b.N/rounds, conc)
	for range rounds {
		w, c, err := phase(n, rawOp)
		if err != nil {
			b.Fatal(err)
		}
		rawWall, rawCPU = rawWall+w, rawCPU+c
		if w, c, err = phase(n, bl.gated); err != nil {
			b.Fatal(err)
		}
		gatedWall, gatedCPU = gatedWall+w, gatedCPU+c
	}
	b.StopTimer()
	ops := float64(rounds * n)
	rawRate, gatedRate := ops/rawWall.Seconds(), ops/gatedWall.Seconds()
	b.ReportMetric(rawRate, "raw/s")
	b.ReportMetric(gatedRate, "gated/s")
	b.ReportMetric(gatedRate/rawRate, "gated/raw")
	b.ReportMetric(float64(rawCPU.Microseconds())/1000/ops, "raw-cpu-ms/op")
	b.ReportMetric(float64(gatedCPU.Microseconds())/1000/ops, "gated-cpu-ms/op")
}
