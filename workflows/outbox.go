package workflows

import (
	"slices"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/tasks"
)

// The outbox: how the workflow's facts reach the read model and the audit
// chain. See "Committed history is the only source of truth" in doc.go.

// outbox holds the entries the workflow has decided but not yet published.
type outbox struct {
	queue     []activities.Projection
	seq       int64 // last sequence assigned
	published int64 // last sequence written
	endSeq    int64 // sequence of the terminal entry; 0 until the end is queued
	// hold keeps the writer from taking a batch while the first workflow
	// task is still deciding (versionFirstTask): its facts go out together.
	hold bool
	// firstLocal: the first batch, if it states no decision, is written by
	// a local activity (versionFirstBatchLocal).
	firstLocal bool
	// endLocal: a batch that holds only the end, when the end follows from
	// the ExecuteTool attempt's committed outcome (endFromHistory), is
	// written by a local activity (versionEndLocal).
	endLocal       bool
	endFromHistory bool
}

// emit queues one entry and returns its sequence. It never yields, so the
// entries follow the workflow's state changes exactly. Nothing is queued
// after the terminal entry: the chain is sealed and the record ended.
func (w *approval) emit(p activities.Projection) int64 {
	o := &w.out
	if o.endSeq != 0 {
		return o.endSeq
	}
	o.seq++
	p.Seq = o.seq
	o.queue = append(o.queue, p)
	if p.End != nil {
		o.endSeq = p.Seq
	}
	return p.Seq
}

// emitState queues the task's current state and one timeline event for the
// read model, stamped with the workflow's time.
func (w *approval) emitState(ctx workflow.Context, ev tasks.Event) int64 {
	ev.At = workflow.Now(ctx)
	return w.emit(activities.Projection{State: &activities.RecordStateInput{
		StatusMessage: w.statusMessage(),
		ApprovalState: w.approvalState(),
		Approvals:     slices.Clone(w.approvals),
		Event:         ev,
		Status:        w.inputStatus(),
		InputRequests: w.pendingInputs(),
	}})
}

// emitAudit queues one step of the task's audit chain.
func (w *approval) emitAudit(ctx workflow.Context, in activities.RecordAuditInput) int64 {
	in.At = workflow.Now(ctx)
	return w.emit(activities.Projection{Audit: &in})
}

// emitEnd queues the terminal write of w.end: the read model's final state
// and the audit chain's end and outcome records.
func (w *approval) emitEnd(ctx workflow.Context) int64 {
	e := w.end
	return w.emit(activities.Projection{End: &activities.CompleteInput{
		Tool:          w.in.Envelope.Tool,
		Status:        e.status,
		Disposition:   e.disposition,
		Detail:        e.detail,
		ToolResult:    e.toolResult,
		StatusMessage: e.message,
		ApprovalState: e.approvalState,
		Approvals:     slices.Clone(w.approvals),
		Event:         tasks.Event{At: workflow.Now(ctx), Kind: e.event, Detail: e.message},
		Audit:         true,
	}})
}

// ended reports whether the terminal entry is written: tasks/get and the
// audit chain show the end.
func (w *approval) ended() bool {
	return w.out.endSeq != 0 && w.out.published >= w.out.endSeq
}

// awaitPublished waits until the entries up to seq are written, so an
// update's answer never runs ahead of what tasks/get and the approver's page
// show.
func (w *approval) awaitPublished(ctx workflow.Context, seq int64) error {
	return workflow.Await(ctx, func() bool { return w.out.published >= seq })
}

// publishCtx: the outbox must land, in order, however long the store is
// down; Publish itself skips entries that can never be written.
func publishCtx(ctx workflow.Context) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:    200 * time.Millisecond,
			BackoffCoefficient: 2,
			MaximumInterval:    time.Minute,
		},
	})
}

// publishLoop writes the outbox, one Publish at a time, in order, until the
// terminal entry is written: an activity, or a local activity for the
// batches versionFirstBatchLocal and versionEndLocal allow. It runs on a
// disconnected context from the workflow's start: a cancelled workflow
// still writes its end.
func (w *approval) publishLoop(ctx workflow.Context) {
	o := &w.out
	for {
		if err := workflow.Await(ctx, func() bool { return len(o.queue) > 0 && !o.hold }); err != nil {
			w.log.Error("outbox stopped", "error", err)
			return
		}
		n := min(len(o.queue), activities.MaxPublishBatch)
		batch := slices.Clone(o.queue[:n])
		o.queue = o.queue[n:]
		in := activities.PublishInput{Version: activities.Version, TaskID: w.taskID, Entries: batch}
		var err error
		local := (o.firstLocal && o.published == 0 && requestOnly(batch)) ||
			(o.endLocal && o.endFromHistory && endOnly(batch))
		if local {
			err = workflow.ExecuteLocalActivity(publishLocalCtx(ctx), a.Publish, in).Get(ctx, nil)
			if err != nil {
				w.log.Warn("outbox batch not written inside the workflow task; publishing it as an activity",
					"first_seq", batch[0].Seq, "error", err)
			}
		}
		if !local || err != nil {
			err = workflow.ExecuteActivity(publishCtx(ctx), a.Publish, in).Get(ctx, nil)
		}
		if err != nil {
			// Only a refused input gets here (the retry policy is unbounded):
			// nothing after it would fare better.
			w.log.Error("outbox batch not written", "first_seq", batch[0].Seq, "error", err)
		}
		o.published = batch[n-1].Seq
		if o.endSeq != 0 && o.published >= o.endSeq {
			return
		}
	}
}

// requestOnly reports whether a batch states only what the committed start
// and the request notice make true: the request (its audit step and its
// state) and the notice's outcome. Anything else (an approval, a
// rejection, a cancel, an end) waits for the workflow task that decides it
// to commit (versionFirstBatchLocal).
func requestOnly(batch []activities.Projection) bool {
	for _, p := range batch {
		if p.End != nil || (p.Audit == nil && p.State == nil) {
			return false
		}
		if a := p.Audit; a != nil {
			switch a.Kind {
			case activities.StepRequested, activities.StepNotified, activities.StepNotifyFailed:
			default:
				return false
			}
		}
		if st := p.State; st != nil {
			switch st.Event.Kind {
			case tasks.EventRequested, tasks.EventNotified, tasks.EventNotifyFailed:
			default:
				return false
			}
			if len(st.Approvals) > 0 {
				return false
			}
		}
	}
	return len(batch) > 0
}

// endOnly reports whether a batch holds the terminal entry and nothing
// else (versionEndLocal).
func endOnly(batch []activities.Projection) bool {
	return len(batch) == 1 && batch[0].End != nil
}
