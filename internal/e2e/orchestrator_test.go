package e2e

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"go.temporal.io/server/temporaltest"

	"github.com/countersign/countersign/tasks"
)

// TestOrchestratorOneUpdateAtATime (tasks.Orchestrator on a real Temporal
// server; here rather than in tasks, whose tests run under -race and must
// not link the Temporal server) sends twenty rejections and a cancel to
// each of ten workflows at the same instant, on a real Temporal server, and
// counts the updates each workflow had in flight at once: never more than
// one. Updates to different workflows do not wait for each other, an
// update whose deadline passes while it waits is never sent, and no more
// rejections wait in a task's line than the task records.
func TestOrchestratorOneUpdateAtATime(t *testing.T) {
	inflight := &updateCounter{now: map[string]int{}, max: map[string]int{}}
	ts := temporaltest.NewServer(temporaltest.WithT(t))
	ts.NewWorker(tasks.TaskQueue, func(r worker.Registry) {
		r.RegisterWorkflowWithOptions(updateTarget, workflow.RegisterOptions{Name: tasks.WorkflowName})
	})
	c := ts.NewClientWithOptions(client.Options{Interceptors: []interceptor.ClientInterceptor{inflight}})
	o := tasks.NewOrchestrator(c)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := func(id string, rejections int) client.WorkflowRun {
		t.Helper()
		run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: tasks.TaskQueue}, tasks.WorkflowName, rejections)
		if err != nil {
			t.Fatal(err)
		}
		return run
	}

	const rounds, rejections = 10, 20
	for round := range rounds {
		id := fmt.Sprintf("one-at-a-time-%d", round)
		run := start(id, rejections)
		barrier := make(chan struct{})
		errs := make(chan error, rejections+1)
		var wg sync.WaitGroup
		for i := range rejections {
			wg.Go(func() {
				<-barrier
				errs <- o.RecordRejection(ctx, id, tasks.RejectedDecision{ChallengeID: fmt.Sprint(i), Decision: tasks.DecisionApprove, Reason: "forged"})
			})
		}
		wg.Go(func() {
			<-barrier
			res, err := o.Cancel(ctx, id)
			if err == nil && !res.Cancelled {
				err = errors.New("cancel answered not cancelled")
			}
			errs <- err
		})
		close(barrier)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("round %d: %v", round, err)
			}
		}
		var recorded int
		if err := run.Get(ctx, &recorded); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if recorded != rejections {
			t.Errorf("round %d: the workflow recorded %d rejections, want %d", round, recorded, rejections)
		}
		if m := inflight.maxOf(id); m != 1 {
			t.Errorf("round %d: %d updates in flight to one workflow at once, want 1", round, m)
		}
	}

	// An update held in its handler keeps the next one to its workflow
	// waiting, not one to another workflow.
	held, free := "held", "free"
	start(held, 1)
	start(free, 1)
	heldDone := make(chan error, 1)
	go func() {
		heldDone <- o.RecordRejection(ctx, held, tasks.RejectedDecision{ChallengeID: "hold", Reason: "forged"})
	}()
	waitFor(t, func() bool { return inflight.nowOf(held) == 1 })
	if err := o.RecordRejection(ctx, free, tasks.RejectedDecision{ChallengeID: "x", Reason: "forged"}); err != nil {
		t.Fatalf("an update to another workflow: %v", err)
	}
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	err := o.RecordRejection(short, held, tasks.RejectedDecision{ChallengeID: "late", Reason: "forged"})
	cancelShort()
	if !errors.Is(err, tasks.ErrUpdateInProgress) {
		t.Fatalf("an update whose deadline passed in line: %v, want tasks.ErrUpdateInProgress", err)
	}
	// A flood of rejections: the task's quota may wait in line, the rest
	// is not sent.
	flood := make(chan error, 30)
	for i := range cap(flood) {
		go func() {
			flood <- o.RecordRejection(ctx, held, tasks.RejectedDecision{ChallengeID: fmt.Sprint("flood-", i), Reason: "forged"})
		}()
	}
	for range cap(flood) - (tasks.MaxRecordedRejections - 1) {
		if err := <-flood; !errors.Is(err, tasks.ErrRejectionsQueued) {
			t.Fatalf("a rejection past the quota in line: %v, want tasks.ErrRejectionsQueued", err)
		}
	}
	if err := c.SignalWorkflow(ctx, held, "", releaseSignal, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-heldDone; err != nil {
		t.Fatalf("the held update: %v", err)
	}
	for range tasks.MaxRecordedRejections - 1 {
		if err := <-flood; err != nil {
			t.Fatalf("a rejection in line: %v", err)
		}
	}
	// The late one never reached the workflow.
	for id, want := range map[string]int{held: tasks.MaxRecordedRejections, free: 1} {
		if _, err := o.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
		var recorded int
		if err := c.GetWorkflow(ctx, id, "").Get(ctx, &recorded); err != nil {
			t.Fatal(err)
		}
		if recorded != want {
			t.Errorf("%s recorded %d rejections, want %d", id, recorded, want)
		}
	}
	// After the rounds: the held rejection and its line, one to the other
	// workflow, two cancels; the late one and the flood's rest unsent.
	if want := rounds*(rejections+1) + tasks.MaxRecordedRejections + 3; inflight.calls() != want {
		t.Errorf("%d updates sent, want %d", inflight.calls(), want)
	}
}

const releaseSignal = "release"

// updateTarget is a stand-in for the approval workflow with its rejection
// and cancel updates: it counts the rejections and ends once it has the
// cancel and the rejections it was told to expect, and no handler runs. A
// rejection named "hold" waits for the release signal.
func updateTarget(ctx workflow.Context, want int) (int, error) {
	recorded, cancelled, released := 0, false, false
	workflow.Go(ctx, func(ctx workflow.Context) {
		workflow.GetSignalChannel(ctx, releaseSignal).Receive(ctx, nil)
		released = true
	})
	if err := workflow.SetUpdateHandler(ctx, tasks.UpdateRecordRejection, func(ctx workflow.Context, r tasks.RejectedDecision) error {
		if r.ChallengeID == "hold" {
			if err := workflow.Await(ctx, func() bool { return released }); err != nil {
				return err
			}
		}
		recorded++
		return nil
	}); err != nil {
		return 0, err
	}
	if err := workflow.SetUpdateHandler(ctx, tasks.UpdateCancel, func(ctx workflow.Context, _ struct{}) (tasks.CancelResult, error) {
		cancelled = true
		return tasks.CancelResult{Cancelled: true, Status: tasks.StatusCancelled}, nil
	}); err != nil {
		return 0, err
	}
	if err := workflow.Await(ctx, func() bool { return cancelled && recorded >= want && workflow.AllHandlersFinished(ctx) }); err != nil {
		return 0, err
	}
	return recorded, nil
}

// updateCounter counts each workflow's updates in flight, and the most at once.
type updateCounter struct {
	interceptor.ClientInterceptorBase
	mu       sync.Mutex
	now, max map[string]int
	total    int
}

func (u *updateCounter) InterceptClient(next interceptor.ClientOutboundInterceptor) interceptor.ClientOutboundInterceptor {
	return &updateCounterOutbound{ClientOutboundInterceptorBase: interceptor.ClientOutboundInterceptorBase{Next: next}, u: u}
}

func (u *updateCounter) nowOf(id string) int { u.mu.Lock(); defer u.mu.Unlock(); return u.now[id] }
func (u *updateCounter) maxOf(id string) int { u.mu.Lock(); defer u.mu.Unlock(); return u.max[id] }
func (u *updateCounter) calls() int          { u.mu.Lock(); defer u.mu.Unlock(); return u.total }

type updateCounterOutbound struct {
	interceptor.ClientOutboundInterceptorBase
	u *updateCounter
}

func (o *updateCounterOutbound) UpdateWorkflow(ctx context.Context, in *interceptor.ClientUpdateWorkflowInput) (client.WorkflowUpdateHandle, error) {
	u, id := o.u, in.WorkflowID
	u.mu.Lock()
	u.total++
	u.now[id]++
	u.max[id] = max(u.max[id], u.now[id])
	u.mu.Unlock()
	defer func() { u.mu.Lock(); u.now[id]--; u.mu.Unlock() }()
	return o.Next.UpdateWorkflow(ctx, in)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30s")
		}
	}
}
