package e2e

import (
	"bytes"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/devtest"
	"github.com/countersign/countersign/internal/proccpu"
)

// BenchmarkPending holds b.N pending approvals in one `countersign dev` and
// reports the process's resident memory, then restarts it on the same data
// dir and reports how long until it serves a tasks/get again, and the CPU
// it spends in the 15 s after that (startup work such as reconciliation):
//
//	go test ./internal/e2e -run '^$' -bench 'Pending$' -benchtime 10000x -timeout 2h
//
// The test process holds the server, so RSS includes the embedded Temporal
// and NATS and the test's own client.
func BenchmarkPending(b *testing.B) {
	dir, port := b.TempDir(), devtest.FreePort(b)
	cfg := app.Config{DataDir: dir, SQLiteSync: benchSync()}
	s := startStackConfig(b, cfg, port)
	bl := &baseline{s: s, prefix: "pending"}
	bl.http = newBenchHTTP()
	rss0 := rssMiB()
	b.ResetTimer()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	t0 := time.Now()
	for range 8 {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := bl.gated(); err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
			}
		})
	}
	wg.Wait()
	created := time.Since(t0)
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	time.Sleep(5 * time.Second) // the tasks' first workflow steps
	runtime.GC()
	debug.FreeOSMemory()
	rss := rssMiB()
	b.ReportMetric(float64(b.N)/created.Seconds(), "created/s")
	b.ReportMetric(rss, "rss-MiB")
	b.ReportMetric((rss-rss0)*1024/float64(b.N), "KiB/task")

	task := s.CreateTask(s.AgentToken, "transfer_funds", map[string]any{"to": "acct-restart", "amount": 5000, "currency": "USD"})
	s.Stop()
	t1 := time.Now()
	s = startStackConfig(b, cfg, port)
	if _, r := s.GetTask(s.AgentToken, task.TaskID); r.Error != nil {
		b.Fatalf("tasks/get after restart: %+v", r.Error)
	}
	b.ReportMetric(time.Since(t1).Seconds(), "restart-to-serving-s")
	c0 := proccpu.Used()
	time.Sleep(15 * time.Second)
	b.ReportMetric((proccpu.Used() - c0).Seconds(), "cpu-s-in-15s-after-restart")
	runtime.GC()
	debug.FreeOSMemory()
	b.ReportMetric(rssMiB(), "rss-after-restart-MiB")
}

// rssMiB is the process's resident set size, in MiB (Linux).
func rssMiB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			kb, _ := strconv.Atoi(string(bytes.TrimSpace(bytes.TrimSuffix(bytes.TrimSpace(v), []byte("kB")))))
			return float64(kb) / 1024
		}
	}
	return 0
}
