package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
)

// BaselineWorkflow is the baseline's workflow type: it waits for the
// BaselineSignal, or at most BaselineWait, and ends.
const (
	BaselineWorkflow = "countersign-bench-wait"
	BaselineSignal   = "done"
	BaselineWait     = 10 * time.Minute
)

// WaitWorkflow is the baseline's trivial workflow: it only waits, as an
// approval workflow waits for its approvers.
func WaitWorkflow(ctx workflow.Context) error {
	workflow.GetSignalChannel(ctx, BaselineSignal).ReceiveWithTimeout(ctx, BaselineWait, nil)
	return nil
}

// startBaseline starts the baseline's worker on its own task queue (a
// fresh one per run unless Options.TaskQueue); stop stops it.
func (b *bencher) startBaseline() (stop func(), err error) {
	b.queue = b.o.TaskQueue
	if b.queue == "" {
		b.queue = "countersign-bench-" + b.runID
	}
	w := worker.New(b.o.Temporal, b.queue, worker.Options{})
	w.RegisterWorkflowWithOptions(WaitWorkflow, workflow.RegisterOptions{Name: BaselineWorkflow})
	if err := w.Start(); err != nil {
		return nil, fmt.Errorf("baseline: start the worker: %w", err)
	}
	return w.Stop, nil
}

// baseline measures raw StartWorkflow calls of WaitWorkflow against the same
// Temporal at concurrency conc, with what a gated call's start has: eager
// start with a worker in this process, a reject-duplicate ID policy, and an
// answer once the start is durable. The workflows wait until the end of the
// run, when they are terminated (not timed): terminating them between
// phases would load the next phase.
func (b *bencher) baseline(ctx context.Context, conc int) error {
	var mu sync.Mutex
	var started []string
	var n atomic.Int64
	err := b.measure(ctx, ScenarioBaseline, conc, func(ctx context.Context, p *phase, _ int) error {
		id := fmt.Sprintf("bench-%s-wait-c%d-%d", b.runID, conc, n.Add(1))
		if timed(p, "temporal-start", func() error {
			_, err := b.o.Temporal.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
				ID:                       id,
				TaskQueue:                b.queue,
				WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
				WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
				EnableEagerStart:         true,
			}, BaselineWorkflow)
			return err
		}) == nil {
			mu.Lock()
			started = append(started, id)
			mu.Unlock()
		}
		return nil
	}, "temporal-start")
	b.mu.Lock()
	b.waiting = append(b.waiting, started...)
	b.mu.Unlock()
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	b.settle()
	return nil
}

// terminate ends the baseline's workflows.
func (b *bencher) terminate(ctx context.Context, ids []string) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(8, len(ids)) {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(ids)); i = next.Add(1) - 1 {
				_ = b.o.Temporal.TerminateWorkflow(ctx, ids[i], "", "countersign bench: run over")
			}
		})
	}
	wg.Wait()
}
