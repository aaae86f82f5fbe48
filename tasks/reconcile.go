package tasks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.temporal.io/api/serviceerror"
)

// Running reports whether the task's workflow exists in Temporal (running or
// closed). It is false only when Temporal has never heard of it.
func (o *Orchestrator) Running(ctx context.Context, taskID string) (bool, error) {
	_, err := o.c.DescribeWorkflowExecution(ctx, taskID, "")
	if err == nil {
		return true, nil
	}
	var notFound *serviceerror.NotFound
	if errors.As(err, &notFound) {
		return false, nil
	}
	return false, fmt.Errorf("tasks: describe %s: %w", taskID, err)
}

// Reconcile fails the orphans of a crash: records that were created but
// whose workflow was never started (the process died between the two steps
// of task creation). Without this, such a record would stay "working" and
// its dedup slot would hand the dead task to identical calls until its TTL.
// Only records older than grace are considered, so a creation in flight is
// never touched. It returns how many records it failed.
func Reconcile(ctx context.Context, s *Store, o *Orchestrator, grace time.Duration, log *slog.Logger) (int, error) {
	pending, err := s.nonTerminal(ctx, func(r Record) bool { return !r.Status.Terminal() })
	if err != nil {
		return 0, err
	}
	now := s.now()
	n := 0
	for _, r := range pending {
		if now.Sub(r.CreatedAt) < grace {
			continue
		}
		ok, err := o.Running(ctx, r.TaskID)
		if err != nil {
			return n, err
		}
		if ok {
			continue
		}
		_, err = s.Update(ctx, r.TaskID, func(r *Record) error {
			if r.Status.Terminal() {
				return nil
			}
			r.Status = StatusFailed
			r.StatusMessage = "The task could not be started; the tool did not run."
			r.Error = &RPCError{Code: -32603, Message: "task could not be started"}
			r.ApprovalState = ApprovalFailed
			r.Timeline = append(r.Timeline, Event{At: now.UTC(), Kind: "failed", Detail: "workflow was never started"})
			return nil
		})
		if err != nil && !errors.Is(err, ErrTerminal) {
			return n, err
		}
		if log != nil {
			log.Warn("tasks: failed an orphaned task whose workflow never started", "task_id", r.TaskID)
		}
		n++
	}
	return n, nil
}
