package approvalstest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/tasks"
	"github.com/countersign/countersign/workflows"
)

// Update validators and handlers. Validators run with mu held and change
// nothing; handlers run on their own goroutines.

func rejected(reason, msg string) error { return &tasks.UpdateRejected{Reason: reason, Message: msg} }

func (t *task) pendingErr() error {
	if t.phase == phasePending {
		return nil
	}
	return rejected(tasks.ErrTypeTaskNotPending, "task is no longer pending ("+string(t.approvalState())+")")
}

// takesDecisions refuses a decision when the task is no longer pending or
// has verified its quota of decisions.
func (t *task) takesDecisions() error {
	if err := t.pendingErr(); err != nil {
		return err
	}
	if t.attempts >= workflows.MaxDecisionAttempts {
		return rejected(tasks.ErrTypeTooManyDecisions, "too many decisions for this task")
	}
	return nil
}

func (t *task) validateDecision(d tasks.DecisionUpdate) error {
	switch {
	case d.Decision != tasks.DecisionApprove && d.Decision != tasks.DecisionDeny:
		return rejected(tasks.ErrTypeMalformedDecision, "decision must be approve or deny")
	case d.ChallengeID == "":
		return rejected(tasks.ErrTypeMalformedDecision, "decision has no challenge id")
	case noResponse(d.Response):
		return rejected(tasks.ErrTypeMalformedDecision, "decision has no passkey assertion")
	case len(d.Comment) > workflows.MaxCommentLen:
		return rejected(tasks.ErrTypeMalformedDecision, fmt.Sprintf("comment longer than %d bytes", workflows.MaxCommentLen))
	}
	return t.takesDecisions()
}

// noResponse reports an absent assertion: empty, blank or JSON null.
func noResponse(r json.RawMessage) bool {
	r = bytes.TrimSpace(r)
	return len(r) == 0 || string(r) == "null"
}

// lockDecisions takes the decision mutex; false when the engine closed
// first.
func (t *task) lockDecisions() bool {
	select {
	case t.decideMu <- struct{}{}:
		return true
	case <-t.e.ctx.Done():
		return false
	}
}

func (t *task) unlockDecisions() { <-t.decideMu }

// decide handles one approver decision whose update ID is id: verified
// (consuming the challenge under id) and counted before the next; the
// answer follows the writes it caused.
func (t *task) decide(id string, d tasks.DecisionUpdate) (tasks.DecisionResult, error) {
	t.mu.Lock()
	t.attempts++
	t.mu.Unlock()
	if !t.lockDecisions() {
		return tasks.DecisionResult{}, ErrClosed
	}
	defer t.unlockDecisions()
	// The task may have moved on while this update waited for the lock.
	t.mu.Lock()
	err := t.pendingErr()
	in := activities.VerifyDecisionInput{Version: activities.Version, Envelope: t.in.Envelope, Requirement: t.in.Requirement,
		ChallengeID: d.ChallengeID, Decision: d.Decision, Method: d.Method, Response: d.Response, ConsumerKey: id}
	t.mu.Unlock()
	if err != nil {
		return tasks.DecisionResult{}, err
	}
	v, err := t.e.verify(in)
	if err != nil {
		t.e.log.Error("approvalstest: decision could not be verified", "task_id", t.id, "decision", d.Decision, "error", err)
		return tasks.DecisionResult{}, rejected(tasks.ErrTypeVerificationUnavailable, "the decision could not be verified; try again")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	// ... or while the assertion was being verified (cancel, expiry).
	if err := t.pendingErr(); err != nil {
		return tasks.DecisionResult{}, err
	}
	if !v.Accepted {
		t.emitRejectionLocked(id, d.Decision, d.ChallengeID, v.Reason)
		return t.decisionResult(false, v.Reason), nil
	}
	if d.Decision == tasks.DecisionApprove && t.approvedBefore(len(t.approvals), v.ApproverID) {
		t.emitRejectionLocked(id, d.Decision, d.ChallengeID, tasks.ReasonAlreadyApproved)
		return t.decisionResult(false, tasks.ReasonAlreadyApproved), nil
	}
	t.approvals = append(t.approvals, tasks.ApprovalEntry{ApproverID: v.ApproverID, ApproverName: v.ApproverName,
		CredentialID: v.CredentialID, Decision: d.Decision, At: t.now()})
	t.emitAuditLocked(activities.RecordAuditInput{Kind: activities.StepDecision, StepID: "decision/" + id,
		Decision: &activities.AuditDecision{Decision: d.Decision, Accepted: true, ChallengeID: d.ChallengeID, Comment: d.Comment,
			ApproverID: v.ApproverID, ApproverName: v.ApproverName, Assertion: v.Assertion}})
	if d.Decision == tasks.DecisionDeny {
		detail := "Denied by " + v.ApproverName + "."
		if d.Comment != "" {
			detail = "Denied by " + v.ApproverName + ": " + d.Comment
		}
		t.endAsLocked(denied(tasks.EventDenied, detail, detail, tasks.ApprovalDenied))
		return t.decisionResult(true, ""), nil
	}
	n := t.approvedCount()
	if n >= t.in.Requirement.Quorum {
		t.phase = phaseApproved
		t.signal()
	}
	t.emitStateLocked(tasks.ApprovalEvent(v.ApproverName, n, t.in.Requirement.Quorum))
	t.queueNoteLocked(activities.NotifyProgress)
	return t.decisionResult(true, ""), nil
}

// verify runs the VerifyDecision activity. Without a passkey service the
// decision cannot be verified.
func (e *Engine) verify(in activities.VerifyDecisionInput) (activities.VerifyDecisionOutput, error) {
	if e.act.Passkeys == nil {
		return activities.VerifyDecisionOutput{}, errors.New("approvalstest: no passkey service to verify decisions")
	}
	var out activities.VerifyDecisionOutput
	err := e.retry(verifyAttempts, func(ctx context.Context) error {
		var err error
		out, err = e.act.VerifyDecision(ctx, in)
		return err
	})
	return out, err
}

// emitRejectionLocked records a rejected decision in the timeline and the
// audit chain, up to tasks.MaxRecordedRejections per task.
func (t *task) emitRejectionLocked(id, decision, challengeID, reason string) {
	if t.rejected >= tasks.MaxRecordedRejections {
		t.e.log.Warn("approvalstest: rejected decision not recorded: too many for this task", "task_id", t.id, "reason", reason)
		return
	}
	t.rejected++
	t.emitStateLocked(tasks.RejectedDecisionEvent(reason))
	t.emitAuditLocked(activities.RecordAuditInput{Kind: activities.StepDecision, StepID: "decision/" + id,
		Decision: &activities.AuditDecision{Decision: decision, Accepted: false, Reason: reason, ChallengeID: challengeID}})
}

func (t *task) validateRejection(r tasks.RejectedDecision) error {
	switch {
	case r.Reason == "" || len(r.Reason) > workflows.MaxReasonLen || len(r.ChallengeID) > workflows.MaxReasonLen:
		return rejected(tasks.ErrTypeMalformedDecision, "a rejection needs a reason")
	case r.Decision != tasks.DecisionApprove && r.Decision != tasks.DecisionDeny:
		return rejected(tasks.ErrTypeMalformedDecision, "decision must be approve or deny")
	case t.rejected >= tasks.MaxRecordedRejections:
		return rejected(tasks.ErrTypeTooManyDecisions, "this task has recorded its quota of rejected decisions")
	}
	return t.pendingErr()
}

// recordRejection records a decision the edge rejected; it changes nothing
// but the timeline and the audit chain.
func (t *task) recordRejection(id string, r tasks.RejectedDecision) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pendingErr() == nil {
		t.emitRejectionLocked(id, r.Decision, r.ChallengeID, r.Reason)
	}
	return nil
}

func (t *task) validateUnsignedDeny(d tasks.UnsignedDenial) error {
	switch {
	case d.ApproverID == "" || d.ApproverName == "":
		return rejected(tasks.ErrTypeMalformedDecision, "an unsigned deny must name its approver")
	case d.Via == "" || len(d.Via) > workflows.MaxViaLen:
		return rejected(tasks.ErrTypeMalformedDecision, "an unsigned deny must name its channel")
	case len(d.Comment) > workflows.MaxCommentLen:
		return rejected(tasks.ErrTypeMalformedDecision, fmt.Sprintf("comment longer than %d bytes", workflows.MaxCommentLen))
	}
	return t.takesDecisions()
}

// denyUnsigned ends a pending task as denied on the word of an approver
// another channel authenticated; it answers once the end is written.
func (t *task) denyUnsigned(id string, d tasks.UnsignedDenial) (tasks.DecisionResult, error) {
	t.mu.Lock()
	t.attempts++
	t.mu.Unlock()
	if !t.lockDecisions() {
		return tasks.DecisionResult{}, ErrClosed
	}
	defer t.unlockDecisions()
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.pendingErr(); err != nil {
		return tasks.DecisionResult{}, err
	}
	t.approvals = append(t.approvals, tasks.ApprovalEntry{ApproverID: d.ApproverID, ApproverName: d.ApproverName,
		Decision: tasks.DecisionDeny, At: t.now()})
	detail := "Denied by " + d.ApproverName + " via " + d.Via + " (without a passkey)."
	if d.Comment != "" {
		detail = "Denied by " + d.ApproverName + " via " + d.Via + " (without a passkey): " + d.Comment
	}
	t.emitAuditLocked(activities.RecordAuditInput{Kind: activities.StepDecision, StepID: "decision/" + id,
		Decision: &activities.AuditDecision{Decision: tasks.DecisionDeny, Accepted: true, Comment: d.Comment,
			ApproverID: d.ApproverID, ApproverName: d.ApproverName, Via: d.Via}})
	t.endAsLocked(denied(tasks.EventDenied, detail, detail, tasks.ApprovalDenied))
	return t.decisionResult(true, ""), nil
}

// cancelTask handles tasks/cancel: before the execution claim it ends the
// task as cancelled; after it, it says so and records the refusal once.
func (t *task) cancelTask() (tasks.CancelResult, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch t.phase {
	case phasePending, phaseApproved:
		t.endAsLocked(cancelledEnding())
	case phaseClaimed:
		if !t.refused {
			t.refused = true
			t.emitStateLocked(tasks.NewEvent(tasks.EventCancelRefused, ""))
			t.emitAuditLocked(activities.RecordAuditInput{Kind: activities.StepCancelRefused, StepID: "cancel-refused"})
		}
		return tasks.CancelResult{Cancelled: false, Status: tasks.StatusWorking}, nil
	}
	return tasks.CancelResult{Cancelled: t.end.status == tasks.StatusCancelled, Status: t.end.status}, nil
}

// validateInputUpdate refuses answers for a task that is not waiting for any
// (also one that never asked: see the package documentation).
func (t *task) validateInputUpdate() error {
	if t.input == nil || t.phase != phasePending || len(t.input.pending) == 0 {
		return rejected(tasks.ErrTypeNotWaitingForInput, "the task is not waiting for input")
	}
	return nil
}

// provideInput records the answers to pending requests (others are
// ignored) and answers once the read model shows what is still pending.
func (t *task) provideInput(u tasks.InputUpdate) (tasks.InputResult, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, id := range slices.Sorted(maps.Keys(u.Responses)) {
		if _, ok := t.input.pending[id]; ok && t.phase == phasePending {
			t.input.answers[id] = u.Responses[id]
			delete(t.input.pending, id)
			n++
		}
	}
	if n > 0 {
		t.emitStateLocked(tasks.NewEvent(tasks.EventInput, fmt.Sprintf("%d input request(s) answered, %d pending", n, len(t.input.pending))))
		t.signal()
	}
	return tasks.InputResult{Pending: len(t.input.pending)}, nil
}
