package workflows

import (
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/tasks"
)

// auditCtx runs RecordAudit as a local activity: in the worker, without a
// round trip through the Temporal server per step (measured on 2 shared
// cores, approval to execution p50: ~54 ms with regular activities,
// ~18–27 ms with local ones, ~14–18 ms without audit).
// Append is idempotent per step, so a local activity that runs again after
// a worker crash writes nothing twice.
func auditCtx(ctx workflow.Context) workflow.Context {
	return workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		ScheduleToCloseTimeout: 2 * time.Minute,
		StartToCloseTimeout:    10 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:    100 * time.Millisecond,
			BackoffCoefficient: 2,
			MaximumInterval:    10 * time.Second,
			MaximumAttempts:    10,
		},
	})
}

// audit appends one step to the task's audit chain, in order with every
// other step (under w.mu).
func (w *approval) audit(ctx workflow.Context, in activities.RecordAuditInput) {
	if err := w.mu.Lock(ctx); err != nil {
		return
	}
	defer w.mu.Unlock()
	w.auditLocked(ctx, in)
}

// auditLocked is audit with w.mu held. Nothing is appended once the end is
// written: the chain is sealed. A step that cannot be written is logged; the
// offline verifier reports the gap.
func (w *approval) auditLocked(ctx workflow.Context, in activities.RecordAuditInput) {
	if w.written {
		return
	}
	in.Version = activities.Version
	in.TaskID = w.taskID
	in.At = workflow.Now(ctx)
	if err := workflow.ExecuteLocalActivity(auditCtx(ctx), a.RecordAudit, in).Get(ctx, nil); err != nil {
		w.log.Error("audit record not written", "kind", in.Kind, "error", err)
	}
}

// auditDecisionLocked records one decision, accepted with its assertion or
// rejected with its reason. Its step is the Temporal update that carried it.
func (w *approval) auditDecisionLocked(ctx workflow.Context, d tasks.DecisionUpdate, v activities.VerifyDecisionOutput, accepted bool, reason string) {
	ad := &activities.AuditDecision{Decision: d.Decision, Accepted: accepted, Reason: reason, ChallengeID: d.ChallengeID}
	if accepted {
		ad.Comment = d.Comment
		ad.ApproverID, ad.ApproverName, ad.Assertion = v.ApproverID, v.ApproverName, v.Assertion
	}
	w.auditLocked(ctx, activities.RecordAuditInput{Kind: "decision",
		StepID: "decision/" + workflow.GetCurrentUpdateInfo(ctx).ID, Decision: ad})
}
