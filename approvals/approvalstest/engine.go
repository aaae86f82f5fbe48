// Package approvalstest is an in-memory approvals.Engine for the adapters'
// tests: the MCP endpoint, the approver API and the notifiers run over the
// real approvals.Service and task store without Temporal, so their tests
// build quickly and run under -race.
//
// # What the engine models
//
// The contract of the approval workflow (package workflows), as its callers
// see it through tasks.Orchestrator, and nothing of its mechanics. Each task
// is one small state machine (task.go) with the workflow's phases, and every
// side effect goes through the real [activities.Activities] methods:
//
//   - The read model and the audit chain are written the way the workflow's
//     outbox writes them: the same entries (activities.Projection), in the
//     same order, through activities.Publish. An entry is written before the
//     step that decided it answers, so an update's answer never runs ahead
//     of tasks/get; nothing is written after the terminal entry.
//   - Updates answer as the workflow's do: a validator refuses without
//     recording (*tasks.UpdateRejected with the workflow's reasons), a
//     decision is verified through Activities.VerifyDecision under its
//     update ID (tasks.DecisionUpdateID), and the same decision request sent
//     again is the same update, answered with the same verdict, while it
//     runs and after the workflow has returned. A caller whose context ends
//     first gets an error wrapping tasks.ErrUpdateInProgress; the update
//     goes on, as it does in Temporal. Once the workflow has returned, any
//     other update is tasks.ErrWorkflowGone, as Temporal answers updates to
//     a closed workflow.
//   - Approvals (quorum of distinct approvers, a verified deny, expiry at
//     ExpiresAt, cancel before the claim, cancel-refused once after it) and
//     unattended tasks (input requests, the wait until StartAt and then for
//     Requirement.TTL again after the answers); then policy re-evaluation
//     (Activities.Reevaluate; without a PDP it allows), the execution claim
//     and a single Activities.ExecuteTool call, classified exactly as the
//     workflow classifies it.
//   - Notifications: Notify once the request is written, then NotifyUpdate
//     for accepted approvals and the end, one at a time and in order, and
//     the notified or notify-failed step.
//
// # What it does not model
//
// Temporal itself: histories, replay, workflow tasks that are discarded and
// retried, durability across a restart, workflow cancellation or
// termination (no caller reaches them), the retry timings of activities
// (the engine retries sooner), and the exact text of errors that only
// Temporal produces. ProvideInput on a task that asks no input answers
// tasks.ErrTypeNotWaitingForInput where Temporal rejects an unknown update
// with a reason of its own making; approvals.Service never sends one.
package approvalstest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/tasks"
)

var _ approvals.Engine = (*Engine)(nil)

// ErrClosed is the answer to every request made of a closed engine.
var ErrClosed = errors.New("approvalstest: engine closed")

// ErrAlreadyStarted is wrapped by Start's error for a task ID that already
// has a workflow, running or ended (Temporal's reject-duplicate policy).
var ErrAlreadyStarted = errors.New("approvalstest: workflow already started")

// Options configures an [Engine].
type Options struct {
	// Activities are the side effects the engine runs as the workflow
	// would: verification, policy re-evaluation, tool execution and the
	// read-model writes. Tasks (the store) is required; Passkeys is needed
	// for decisions, Tools for calls that run, PDP for re-evaluation (nil:
	// re-evaluation allows).
	Activities *activities.Activities
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Engine is an in-memory stand-in for the approval workflow. It is safe for
// concurrent use.
type Engine struct {
	act *activities.Activities
	now func() time.Time
	log *slog.Logger

	// ctx is the workflows' context: Close cancels it, and every goroutine
	// of the engine (wg) stops.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex // guards the fields below; never held while taking a task's lock
	tasks    map[string]*task
	failNext *startFailure
	closed   bool
}

// startFailure is the outcome FailNextStart arranged for the next Start.
type startFailure struct {
	err     error
	started bool
}

// New returns an engine. Close stops its timers. It panics without
// Activities or their task store, which no test can do without.
func New(opts Options) *Engine {
	if opts.Activities == nil || opts.Activities.Tasks == nil {
		panic("approvalstest: Options.Activities with a task store is required")
	}
	e := &Engine{act: opts.Activities, now: opts.Now, log: opts.Activities.Logger, tasks: map[string]*task{}}
	if e.now == nil {
		e.now = time.Now
	}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	return e
}

// Close stops every task's timers; tasks still waiting stay as they are.
// It returns once the engine's goroutines have stopped, after which nothing
// is written. Close is idempotent.
func (e *Engine) Close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	e.mu.Unlock()
	e.cancel()
	e.wg.Wait()
}

// FailNextStart makes the next Start return err; started says whether the
// workflow exists all the same (Running answers it).
func (e *Engine) FailNextStart(err error, started bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.failNext = &startFailure{err: err, started: started}
}

// Start implements approvals.Engine: it starts the task's workflow, whose
// ID is the envelope's task ID, and returns once the workflow has written
// its first steps. A second start for the same ID fails (ErrAlreadyStarted).
func (e *Engine) Start(ctx context.Context, in tasks.ApprovalInput) error {
	id := in.Envelope.TaskID
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("approvalstest: start workflow %s: %w", id, err)
	}
	t := newTask(e, id, in.Normalized())
	// The task's lock is taken before it is visible: an update sent as soon
	// as Start has registered it waits for the first steps, as Temporal
	// runs a workflow's first task before its updates.
	t.mu.Lock()
	defer t.mu.Unlock()
	e.mu.Lock()
	fail := e.failNext
	e.failNext = nil
	switch {
	case e.closed:
		e.mu.Unlock()
		return fmt.Errorf("approvalstest: start workflow %s: %w", id, ErrClosed)
	case fail != nil && !fail.started:
		e.mu.Unlock()
		return fail.err
	case e.tasks[id] != nil:
		e.mu.Unlock()
		return fmt.Errorf("approvalstest: start workflow %s: %w", id, ErrAlreadyStarted)
	}
	e.tasks[id] = t
	e.wg.Add(1) // the first steps, below: Close waits for them too
	e.mu.Unlock()
	t.beginLocked()
	e.wg.Done()
	if fail != nil {
		return fail.err // started all the same: the answer was lost
	}
	return nil
}

// Running implements approvals.Engine: whether the task's workflow exists,
// running or ended.
func (e *Engine) Running(ctx context.Context, taskID string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("approvalstest: describe %s: %w", taskID, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.tasks[taskID] != nil, nil
}

// Decide implements approvals.Engine. The update's ID is
// tasks.DecisionUpdateID(d): the same request again is the same update.
func (e *Engine) Decide(ctx context.Context, taskID string, d tasks.DecisionUpdate) (tasks.DecisionResult, error) {
	id := tasks.DecisionUpdateID(d)
	return update(ctx, e, taskID, tasks.UpdateDecide, id,
		func(t *task) error { return t.validateDecision(d) },
		func(t *task) (tasks.DecisionResult, error) { return t.decide(id, d) })
}

// RecordRejection implements approvals.Engine.
func (e *Engine) RecordRejection(ctx context.Context, taskID string, r tasks.RejectedDecision) error {
	id := tasks.NewID("upd_")
	_, err := update(ctx, e, taskID, tasks.UpdateRecordRejection, id,
		func(t *task) error { return t.validateRejection(r) },
		func(t *task) (struct{}, error) { return struct{}{}, t.recordRejection(id, r) })
	return err
}

// DenyUnsigned implements approvals.Engine.
func (e *Engine) DenyUnsigned(ctx context.Context, taskID string, d tasks.UnsignedDenial) (tasks.DecisionResult, error) {
	id := tasks.NewID("upd_")
	return update(ctx, e, taskID, tasks.UpdateDenyUnsigned, id,
		func(t *task) error { return t.validateUnsignedDeny(d) },
		func(t *task) (tasks.DecisionResult, error) { return t.denyUnsigned(id, d) })
}

// Cancel implements approvals.Engine.
func (e *Engine) Cancel(ctx context.Context, taskID string) (tasks.CancelResult, error) {
	return update(ctx, e, taskID, tasks.UpdateCancel, tasks.NewID("upd_"), nil,
		func(t *task) (tasks.CancelResult, error) { return t.cancelTask() })
}

// ProvideInput implements approvals.Engine.
func (e *Engine) ProvideInput(ctx context.Context, taskID string, in tasks.InputUpdate) (tasks.InputResult, error) {
	return update(ctx, e, taskID, tasks.UpdateInput, tasks.NewID("upd_"),
		func(t *task) error { return t.validateInputUpdate() },
		func(t *task) (tasks.InputResult, error) { return t.provideInput(in) })
}

// call is one admitted update; res and err are its answer once done is
// closed.
type call struct {
	done chan struct{}
	res  any
	err  error
}

// update delivers one update to a task's workflow the way Temporal does.
// An update whose ID the workflow has admitted before is that update: the
// caller waits for (or gets) its answer. Otherwise, once the workflow has
// returned, the answer is tasks.ErrWorkflowGone. Else validate (nil: none)
// runs under the task's lock and may refuse, recording nothing; then the
// handler runs on its own goroutine, whatever happens to the caller, and
// the caller waits for its answer until ctx ends (tasks.ErrUpdateInProgress).
func update[R any](ctx context.Context, e *Engine, taskID, name, id string,
	validate func(*task) error, handle func(*task) (R, error)) (R, error) {
	var zero R
	e.mu.Lock()
	closed, t := e.closed, e.tasks[taskID]
	e.mu.Unlock()
	switch {
	case closed:
		return zero, ErrClosed
	case t == nil:
		return zero, tasks.ErrWorkflowGone
	}
	inProgress := func(err error) error {
		return fmt.Errorf("%w: %s %s: %w", tasks.ErrUpdateInProgress, name, taskID, err)
	}
	t.mu.Lock()
	c := t.updates[id]
	if c == nil {
		if t.returned {
			t.mu.Unlock()
			return zero, tasks.ErrWorkflowGone
		}
		if validate != nil {
			if err := validate(t); err != nil {
				t.mu.Unlock()
				if ctx.Err() != nil {
					return zero, inProgress(ctx.Err()) // the caller never heard the refusal
				}
				return zero, err
			}
		}
		c = &call{done: make(chan struct{})}
		t.inflight++
		ok := e.spawn(func() {
			res, err := handle(t)
			t.mu.Lock()
			defer t.mu.Unlock()
			c.res, c.err = res, err
			close(c.done)
			t.inflight--
			t.signal()
		})
		if !ok {
			t.inflight--
			t.mu.Unlock()
			return zero, ErrClosed
		}
		t.updates[id] = c
	}
	t.mu.Unlock()
	if ctx.Err() != nil {
		return zero, inProgress(ctx.Err())
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		return zero, inProgress(ctx.Err())
	case <-e.ctx.Done():
		return zero, ErrClosed
	}
	if c.err != nil {
		return zero, c.err
	}
	return c.res.(R), nil
}

// spawn runs fn on a goroutine that Close waits for; false when the engine
// is closed and fn does not run.
func (e *Engine) spawn(fn func()) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		fn()
	}()
	return true
}

// Retry policies of the activities, as attempts (0: until the engine
// closes). The workflow's attempts, with shorter waits between them: the
// delays are not part of the contract.
const (
	verifyAttempts     = 3
	reevaluateAttempts = 5
	notifyAttempts     = 5
	publishAttempts    = 0
)

// retry runs op until it succeeds, fails with a non-retryable application
// error (the activities' classification), runs out of attempts or the
// engine closes, waiting 20 ms and then twice as long each time, at most a
// second.
func (e *Engine) retry(attempts int, op func(context.Context) error) error {
	delay := 20 * time.Millisecond
	for i := 1; ; i++ {
		err := op(e.ctx)
		if err == nil || nonRetryable(err) || (attempts > 0 && i >= attempts) || e.ctx.Err() != nil {
			return err
		}
		timer := time.NewTimer(delay)
		select {
		case <-timer.C:
		case <-e.ctx.Done():
			timer.Stop()
			return err
		}
		delay = min(2*delay, time.Second)
	}
}

func nonRetryable(err error) bool {
	var appErr *temporal.ApplicationError
	return errors.As(err, &appErr) && appErr.NonRetryable()
}

// publish writes one outbox entry of the task through the Publish
// activity, retrying until it lands or the engine closes (nothing is
// written after Close).
func (e *Engine) publish(taskID string, p activities.Projection) {
	in := activities.PublishInput{Version: activities.Version, TaskID: taskID, Entries: []activities.Projection{p}}
	err := e.retry(publishAttempts, func(ctx context.Context) error { return e.act.Publish(ctx, in) })
	if err != nil && e.ctx.Err() == nil {
		e.log.Error("approvalstest: outbox entry not written", "task_id", taskID, "seq", p.Seq, "error", err)
	}
}
