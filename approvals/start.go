package approvals

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/countersign/countersign/tasks"
)

// Starting a task's workflow after the answer.
//
// Open answers an approval or unattended call once its record (and the
// indexes, the dedup slot and the pending reservation that go with it) is
// durable in NATS KV, and starts the workflow right after, in the
// background. The agent holds a task whose tasks/get resolves at once
// either way; what it no longer waits for is Temporal. Where Temporal is
// remote (a managed cluster a region away) a start is a network round trip
// of tens of milliseconds, and a Temporal that is briefly unreachable (a
// failover, an upgrade) delays tasks instead of failing calls: the start is
// retried until startTimeout.
//
// What keeps this honest:
//
//   - Nothing runs before its workflow: the workflow is the only thing that
//     claims and runs a call, so a record without one is a request nobody
//     has acted on.
//   - A start that fails, and that Temporal has never heard of
//     (startOutcome), fails the task: "the tool did not run", its
//     reservation and dedup slot given back. The agent, which holds the
//     task, reads that from tasks/get instead of an error from tools/call.
//   - A start whose fate is unknown leaves the record to resume and the
//     reconciler, as before.
//   - Every update door (decide, reject, deny, cancel, input) first waits
//     for a start this process has in flight for the task; another
//     process's door that finds no workflow while the record says its start
//     may still be under way waits for the workflow to appear
//     (afterStart); one that finds an orphan resumes it first, as the
//     reconciler would, then sends the update to its workflow.
//   - Starts in flight are bounded (maxStartsInFlight): past it, Open waits
//     for a slot before writing anything, so a burst cannot outrun Temporal
//     without bound. Shutdown waits for them (Drain).
//   - A process that dies with a start in flight leaves an orphan: a task
//     whose agent holds its ID and whose workflow never started. Its record
//     holds what the start needs (tasks.Record.Start), so the reconciler
//     resumes it (at startup, 5 s later, then every 5 minutes; once per
//     record), as an identical call does; one it cannot resume it fails.
//
// A verified call (SEP-2672) still starts its workflow before Open returns:
// its caller waits for the tool's result anyway.

// maxStartsInFlight bounds the background workflow starts of one process.
const maxStartsInFlight = 32

// starts tracks the workflow starts a Service has in flight.
type starts struct {
	slots    chan struct{}
	mu       sync.Mutex
	inflight map[string]chan struct{} // task ID → closed when its start has ended
	wg       sync.WaitGroup
}

func newStarts(n int) *starts {
	return &starts{slots: make(chan struct{}, n), inflight: make(map[string]chan struct{})}
}

// acquire takes a slot for one start, waiting while all are taken.
func (st *starts) acquire(ctx context.Context) error {
	select {
	case st.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (st *starts) release() { <-st.slots }

// begin registers taskID's start (its slot already acquired) and returns
// the function that ends it.
func (st *starts) begin(taskID string) (end func()) {
	done := make(chan struct{})
	st.mu.Lock()
	st.inflight[taskID] = done
	st.mu.Unlock()
	st.wg.Add(1)
	return func() {
		st.mu.Lock()
		delete(st.inflight, taskID)
		st.mu.Unlock()
		close(done)
		st.release()
		st.wg.Done()
	}
}

// inFlight reports whether a start of taskID is in flight in this process.
func (st *starts) inFlight(taskID string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.inflight[taskID] != nil
}

// wait returns once no start of taskID is in flight in this process.
func (st *starts) wait(ctx context.Context, taskID string) error {
	st.mu.Lock()
	done := st.inflight[taskID]
	st.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// startLater starts the workflow of the task Open has just recorded, in the
// background, holding the slot Open acquired. See the top of this file.
func (s *Service) startLater(ctx context.Context, rec tasks.Record, in tasks.ApprovalInput) {
	end := s.starts.begin(rec.TaskID)
	// The call's trace and task, not its deadline: the caller has its
	// answer and may hang up.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), startTimeout)
	go func() {
		defer end()
		defer cancel()
		err := s.engine.Start(ctx, in)
		if err == nil {
			return
		}
		// Started all the same, it stands. Unknown, the record stays: an
		// identical call resumes it, or the reconciler fails it once it is
		// older than its grace.
		if s.startOutcome(ctx, rec.TaskID, err) == startedNot {
			s.failUnstarted(ctx, rec, err)
		}
	}()
}

// failUnstarted fails a task whose workflow start failed and never took
// effect, unless a resume has taken the record over meanwhile. Ending it
// gives back its pending reservation and dedup slot (tasks.Store.Update).
func (s *Service) failUnstarted(ctx context.Context, rec tasks.Record, startErr error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	now := s.now()
	_, err := s.store.Update(ctx, rec.TaskID, func(cur *tasks.Record) error {
		if _, unconfirmed := cur.Unconfirmed(now); cur.Status.Terminal() || !unconfirmed || !cur.StartAttemptAt.Equal(rec.StartAttemptAt) {
			return errNotResumable // resumed, started or ended meanwhile
		}
		tasks.FailUnstarted(cur, now, "workflow start failed")
		return nil
	})
	switch {
	case errors.Is(err, errNotResumable):
		return
	case err != nil:
		// The reconciler fails it later: it is a record without a workflow.
		s.log.ErrorContext(ctx, "approvals: could not fail a task whose workflow did not start", "task_id", rec.TaskID, "start_err", startErr, "err", err)
		return
	}
	s.metrics.TaskTransition(string(tasks.StatusFailed))
	s.log.WarnContext(ctx, "approvals: task failed: its workflow could not be started; the tool did not run", "task_id", rec.TaskID, "err", startErr)
}

// toWorkflow sends an update to the task's workflow (send), first waiting
// for a start of it this process has in flight. When the workflow is not
// found while the task's start may still be under way in another process,
// it waits for it to start (afterStart) and sends the update again.
func (s *Service) toWorkflow(ctx context.Context, taskID string, send func() error) error {
	if err := s.starts.wait(ctx, taskID); err != nil {
		return startPending(taskID, err)
	}
	err := send()
	if !errors.Is(err, tasks.ErrWorkflowGone) {
		return err
	}
	started, werr := s.afterStart(ctx, taskID)
	if werr != nil {
		return werr
	}
	if !started {
		return err
	}
	return send()
}

// afterStart waits while the task's record says its workflow may still be
// starting (not terminal, no workflow has written to it, its last start
// attempt younger than startTimeout) and reports whether the task has a
// workflow to send the update to now.
//
// A record older than that is an orphan: nothing is starting it. If its
// record can start it, the door resumes it first, as the reconciler would,
// and waits for it: answering "not cancelled" or "not pending" from a task
// the reconciler would start a moment later (and that would then run)
// would make the answer false.
func (s *Service) afterStart(ctx context.Context, taskID string) (bool, error) {
	resumed := false
	for {
		rec, err := s.store.Get(ctx, taskID)
		if err != nil {
			return false, err
		}
		age, unconfirmed := rec.Unconfirmed(s.now())
		switch {
		case rec.Status.Terminal():
			return false, nil
		case !unconfirmed:
			return true, nil
		case age >= startTimeout && resumed:
			return false, nil // an orphan nobody could resume: the reconciler fails it
		case age >= startTimeout:
			resumed = true
			exists, err := s.resumeForDoor(ctx, rec)
			if err != nil || exists {
				return exists, err
			}
			continue // re-read: another resume may have marked it
		}
		select {
		case <-ctx.Done():
			return false, startPending(taskID, ctx.Err())
		case <-time.After(afterStartPoll):
		}
	}
}

// resumeForDoor resumes an orphan an update door has found and reports
// whether the task has a workflow now: this resume's, or one that a late
// start or another resume has created meanwhile. A record its own start
// facts cannot start, or that a resume has marked already, is left to the
// reconciler, which resumes a record once.
func (s *Service) resumeForDoor(ctx context.Context, rec tasks.Record) (bool, error) {
	c, ok := callFromRecord(rec)
	if !ok || !rec.StartAttemptAt.IsZero() {
		return false, nil
	}
	if _, started, err := s.resume(ctx, c, rec); err != nil || started {
		return started, err
	}
	return s.engine.Running(ctx, rec.TaskID)
}

// afterStartPoll is how often afterStart re-reads the record.
const afterStartPoll = 20 * time.Millisecond

// startPending is the error of an update that was not sent because the
// task's workflow was still starting when the caller's context ended:
// sending it again is safe.
func startPending(taskID string, err error) error {
	return fmt.Errorf("%w: task %s: not sent, its workflow is still starting: %w", tasks.ErrUpdateInProgress, taskID, err)
}

// WaitStart returns once no workflow start of the task is in flight in this
// process (see the top of this file), or when ctx ends.
func (s *Service) WaitStart(ctx context.Context, taskID string) error {
	return s.starts.wait(ctx, taskID)
}

// Drain waits until the workflow starts in flight have ended, or ctx has.
// Call it after the doors have stopped taking calls and before the Temporal
// client closes.
func (s *Service) Drain(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		s.starts.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("approvals: workflow starts still in flight: %w", ctx.Err())
	}
}
