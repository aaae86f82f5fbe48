package approvals

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/countersign/countersign/tasks"
)

// cancelSettle bounds how long Cancel waits for the read model to show a
// cancellation the workflow has accepted.
const cancelSettle = 5 * time.Second

// Get returns owner's task: ErrNotFound for an unknown task or another
// principal's, ErrExpired for one past its TTL.
func (s *Service) Get(ctx context.Context, owner, taskID string) (tasks.Record, error) {
	rec, err := s.store.GetOwned(ctx, taskID, owner)
	if errors.Is(err, tasks.ErrTaskNotFound) {
		return tasks.Record{}, ErrNotFound
	}
	if err != nil {
		return tasks.Record{}, err
	}
	if rec.Expired(s.now()) {
		return tasks.Record{}, ErrExpired
	}
	return rec, nil
}

// List returns a page of owner's tasks that have not expired (those Get
// answers ErrExpired are left out), newest first, after cursor (the last
// task ID of the previous page; ErrUnknownCursor unless one of owner's
// tasks), and the cursor of the next page ("" at the end). A page may be
// shorter than limit with a next cursor: see tasks.Store.List for what a
// page reads.
func (s *Service) List(ctx context.Context, owner, cursor string, limit int) ([]tasks.Record, string, error) {
	page, next, err := s.store.List(ctx, owner, cursor, limit)
	if errors.Is(err, tasks.ErrInvalidCursor) {
		return nil, "", ErrUnknownCursor
	}
	if err != nil {
		return nil, "", err
	}
	// The store left out what had expired by its clock; this is Get's.
	now := s.now()
	return slices.DeleteFunc(page, func(r tasks.Record) bool { return r.Expired(now) }), next, nil
}

// Recent calls visit with owner's tasks that have not expired and that
// have not ended or ended at since or later, newest first, until visit
// returns false; see tasks.Store.Recent for what it reads.
func (s *Service) Recent(ctx context.Context, owner string, since time.Time, visit func(tasks.Record) bool) error {
	now := s.now()
	return s.store.Recent(ctx, owner, since, func(r tasks.Record) bool {
		// The store left out what had expired by its clock; this is Get's.
		return r.Expired(now) || visit(r)
	})
}

// Await waits until owner's task is terminal and returns it, or until ctx
// ends.
func (s *Service) Await(ctx context.Context, owner, taskID string) (tasks.Record, error) {
	rec, err := s.store.WaitTerminal(ctx, taskID, owner)
	if errors.Is(err, tasks.ErrTaskNotFound) {
		return tasks.Record{}, ErrNotFound
	}
	return rec, err
}

// Cancel asks to cancel owner's task and returns the task as it stands after
// the request, and whether the request cancelled it. A task that had ended,
// or whose call was claimed for execution, is not cancelled, and that is not
// an error: the record says why (a terminal status, or a claimed call still
// running). The workflow has the last word;
// when it accepted the cancel but the read model has not caught up within a
// few seconds, the returned record says cancelled all the same.
func (s *Service) Cancel(ctx context.Context, owner, taskID string) (tasks.Record, bool, error) {
	rec, err := s.Get(ctx, owner, taskID)
	if err != nil {
		return tasks.Record{}, false, err
	}
	if rec.Status.Terminal() {
		return rec, false, nil
	}
	// The call was claimed and a cancel already refused, which the
	// workflow records once: another would change nothing, and each
	// accepted update grows the workflow's history (an agent polling
	// cancel through a long tool run) toward Temporal's bound on the
	// updates one workflow takes.
	if countEvents(rec, tasks.EventCancelRefused) > 0 {
		return rec, false, nil
	}
	var res tasks.CancelResult
	err = s.toWorkflow(ctx, taskID, func() (err error) {
		res, err = s.engine.Cancel(ctx, taskID)
		return err
	})
	if err != nil && !settled(err) {
		return tasks.Record{}, false, err
	}
	if err == nil && res.Cancelled {
		return s.awaitCancelled(ctx, rec), true, nil
	}
	// Too late: the call was claimed for execution or the task ended.
	if now, gerr := s.store.GetOwned(ctx, taskID, owner); gerr == nil {
		rec = now
	}
	return rec, false, nil
}

// awaitCancelled waits briefly for the workflow to record the cancellation
// it has just accepted. The workflow's history is the source of truth, so if
// the read model lags the answer is still "cancelled".
func (s *Service) awaitCancelled(ctx context.Context, rec tasks.Record) tasks.Record {
	wctx, cancel := context.WithTimeout(ctx, cancelSettle)
	defer cancel()
	final, err := s.store.WaitTerminal(wctx, rec.TaskID, rec.Owner)
	if err == nil && final.Status == tasks.StatusCancelled {
		return final
	}
	s.log.WarnContext(ctx, "approvals: read model has not caught up with an accepted cancel", "task_id", rec.TaskID, "err", err)
	rec.Status = tasks.StatusCancelled
	rec.StatusMessage = "Cancelled by the requester"
	rec.LastUpdatedAt = s.now().UTC()
	return rec
}

// ProvideInput delivers a client's answers to owner's input_required task
// and returns once the workflow has recorded them, so the next Get shows
// what is still asked. Answers to unknown request IDs, or for a task that no
// longer waits for input, are accepted and ignored.
func (s *Service) ProvideInput(ctx context.Context, owner, taskID string, responses map[string]json.RawMessage) error {
	rec, err := s.Get(ctx, owner, taskID)
	if err != nil {
		return err
	}
	if rec.Status != tasks.StatusInputRequired || len(responses) == 0 {
		return nil
	}
	err = s.toWorkflow(ctx, taskID, func() error {
		_, err := s.engine.ProvideInput(ctx, taskID, tasks.InputUpdate{Responses: responses})
		return err
	})
	if err != nil && !settled(err) {
		return err
	}
	return nil
}

// settled reports a request that failed only because the task is past it:
// the workflow is gone or refused it.
func settled(err error) bool {
	var rejected *tasks.UpdateRejected
	return errors.Is(err, tasks.ErrWorkflowGone) || errors.As(err, &rejected)
}
