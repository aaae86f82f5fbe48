package activities

import (
	"context"
	"errors"
	"fmt"

	"go.temporal.io/sdk/temporal"
)

// MaxPublishBatch bounds the entries of one [PublishInput].
const MaxPublishBatch = 64

// Publish writes a batch of the task workflow's outbox, in order: read-model
// transitions (RecordState), audit steps (RecordAudit) and the terminal write
// (Complete, which seals the audit chain).
//
// It is a regular activity, never a local one: Temporal dispatches it only
// after the workflow task that scheduled it has committed, so everything it
// writes is a fact of the workflow's committed history (see the workflows
// package documentation). Every entry is idempotent (read-model writes are
// skipped at or below the record's sequence, audit steps are keyed by step
// ID, the terminal write is the first and only one), so a retried batch
// changes nothing twice. An entry that can never be written (a non-retryable
// error: an input this worker refuses) is logged and skipped, so it cannot
// hold back the entries after it; any other error fails the batch, which
// Temporal retries.
func (a *Activities) Publish(ctx context.Context, in PublishInput) error {
	if err := checkVersion(in.Version); err != nil {
		return err
	}
	if len(in.Entries) > MaxPublishBatch {
		return temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("activities: publish batch of %d entries, at most %d", len(in.Entries), MaxPublishBatch), ErrTypeInvalidInput, nil)
	}
	for i, e := range in.Entries {
		if i == 1 {
			a.crash(CrashPublish, in.TaskID)
		}
		err := a.publishOne(ctx, in.TaskID, e)
		if err == nil {
			continue
		}
		var appErr *temporal.ApplicationError
		if errors.As(err, &appErr) && appErr.NonRetryable() {
			a.log().Error("activities: outbox entry cannot be written; skipped", "task_id", in.TaskID, "seq", e.Seq, "error", err)
			continue
		}
		return err
	}
	return nil
}

func (a *Activities) publishOne(ctx context.Context, taskID string, e Projection) error {
	switch {
	case e.State != nil && e.Audit == nil && e.End == nil:
		in := *e.State
		in.Version, in.TaskID, in.Seq = Version, taskID, e.Seq
		return a.RecordState(ctx, in)
	case e.Audit != nil && e.State == nil && e.End == nil:
		in := *e.Audit
		in.Version, in.TaskID = Version, taskID
		return a.RecordAudit(ctx, in)
	case e.End != nil && e.State == nil && e.Audit == nil:
		in := *e.End
		in.Version, in.TaskID, in.Seq = Version, taskID, e.Seq
		return a.Complete(ctx, in)
	}
	return temporal.NewNonRetryableApplicationError(
		fmt.Sprintf("activities: outbox entry %d must hold exactly one of state, audit, end", e.Seq), ErrTypeInvalidInput, nil)
}
