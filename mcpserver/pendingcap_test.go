package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/tasks"
)

// The load in small: concurrent gated calls from one principal never
// create more tasks than the pending cap, and a task that ends gives its
// place back.
func TestPendingCapIsExactUnderConcurrency(t *testing.T) {
	const limit, calls, workers = 5, 40, 8
	h := newHarness(t, nil, func(o *approvals.Options) {
		o.MaxPendingPerPrincipal = limit
		o.RatePerMinute, o.Burst = 1_000_000, 1_000_000
	})
	p := principal(t, "a")
	var created, capped atomic.Int64
	var mu sync.Mutex
	var ids []string
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				r := h.do(t, call{token: tok(p), era: tasks.Era2026, tasks: true, method: "tools/call", params: gatedArgs(acct(t, fmt.Sprint(i)), 5000)})
				var task taskResult2026
				var res toolCallResult
				if r.Status != http.StatusOK || r.Error != nil || json.Unmarshal(r.Result, &task) != nil || json.Unmarshal(r.Result, &res) != nil {
					t.Errorf("call %d: HTTP %d: %s", i, r.Status, r.Body)
					continue
				}
				switch {
				case task.ResultType == "task":
					created.Add(1)
					mu.Lock()
					ids = append(ids, task.TaskID)
					mu.Unlock()
				case strings.Contains(res.text(), "too many approval requests waiting"):
					capped.Add(1)
				default:
					t.Errorf("call %d: %s", i, r.Result)
				}
			}
		})
	}
	for i := range calls {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if created.Load() != limit || capped.Load() != calls-limit {
		t.Fatalf("%d tasks created and %d refused at the cap, want %d and %d", created.Load(), capped.Load(), limit, calls-limit)
	}
	ctx := context.Background()
	if n, err := h.env.store.PendingReserved(ctx, p); err != nil || n != limit {
		t.Fatalf("reserved %d, %v; want %d", n, err, limit)
	}
	// Cancelling one task (through its workflow) frees one place.
	h.do(t, call{token: tok(p), era: tasks.Era2026, tasks: true, method: "tasks/cancel", params: map[string]any{"taskId": ids[0]}}).ok(t, nil)
	h.waitStatus(t, ids[0], tasks.StatusCancelled)
	if n, err := h.env.store.PendingReserved(ctx, p); err != nil || n != limit-1 {
		t.Fatalf("after a cancel: reserved %d, %v; want %d", n, err, limit-1)
	}
	h.createTask(t, p, tasks.Era2026, acct(t, "after-cancel"))
	if n, _ := h.env.store.CountPending(ctx, p); n != limit {
		t.Fatalf("%d pending tasks, want %d", n, limit)
	}
}
