package approvals

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"

	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/internal/telemetry"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

// Approval is an approval as approvers see it: the task's record and the
// identical calls of its requester.
type Approval struct {
	tasks.Record
	// Identical are the requester's other tasks for the same call (same
	// tool, same action hash), pending or recently ended, as they stand
	// when the approval is viewed (tasks.Store.IdenticalCalls).
	Identical tasks.IdenticalCalls
}

// View returns the approval with reference ref as approvers may see it:
// ErrNotFound when there is none. Its timeline is read from the task's
// signed audit chain when there is one (see timeline.go). Its identical
// calls are looked up now; a look-up that fails is logged and shown as
// unknown, never failing the view.
func (s *Service) View(ctx context.Context, ref string) (Approval, error) {
	rec, err := s.byRef(ctx, ref)
	if err != nil {
		return Approval{}, err
	}
	a := Approval{Record: rec}
	var wg sync.WaitGroup
	wg.Go(func() {
		var err error
		if a.Identical, err = s.store.IdenticalCalls(ctx, rec); err != nil {
			s.log.WarnContext(ctx, "approvals: identical calls", "task_id", rec.TaskID, "err", err)
		}
	})
	a.Record = s.withAuditTimeline(ctx, rec)
	wg.Wait()
	return a, nil
}

// Pending returns every task that still waits, oldest first: the admin list
// and the approvers' inboxes.
func (s *Service) Pending(ctx context.Context) ([]tasks.Record, error) {
	return s.store.Pending(ctx)
}

// byRef resolves an approval reference. A reference that cannot be one is
// ErrNotFound without touching the store.
func (s *Service) byRef(ctx context.Context, ref string) (tasks.Record, error) {
	if !tasks.ValidID(ref) {
		return tasks.Record{}, ErrNotFound
	}
	rec, err := s.store.ByRef(ctx, ref)
	if errors.Is(err, tasks.ErrTaskNotFound) {
		return tasks.Record{}, ErrNotFound
	}
	return rec, err
}

// pending reports whether an approval can still take a decision, as far as
// the read model knows; the workflow has the last word.
func (s *Service) pending(rec tasks.Record) bool {
	return rec.AwaitsApproval() && s.now().Before(rec.ExpiresAt)
}

// Challenge issues a fresh single-use SEP-2672 challenge (nonce ‖ action
// hash) for one decision on the approval, bound to that decision, so that an
// assertion signed to deny can never be submitted as an approval. Errors:
// ErrNotFound, ErrInvalidDecision, ErrNotPending, ErrTooManyChallenges,
// ErrLimitUnavailable, and
// the passkey service's rejections (*passkey.Error, such as
// no_eligible_credential).
func (s *Service) Challenge(ctx context.Context, ref, decision string) (passkey.Challenge, error) {
	rec, err := s.byRef(ctx, ref)
	if err != nil {
		return passkey.Challenge{}, err
	}
	if decision != tasks.DecisionApprove && decision != tasks.DecisionDeny {
		return passkey.Challenge{}, ErrInvalidDecision
	}
	if !s.pending(rec) {
		return passkey.Challenge{}, ErrNotPending
	}
	ok, err := s.challenges.Allow(ctx, "ref:"+rec.ApprovalRef, s.now())
	if err != nil {
		return passkey.Challenge{}, fmt.Errorf("%w: approval %s: %w", ErrLimitUnavailable, rec.ApprovalRef, err)
	}
	if !ok {
		return passkey.Challenge{}, ErrTooManyChallenges
	}
	hash, err := canon.ParseActionHash(rec.ActionHash)
	if err != nil {
		return passkey.Challenge{}, fmt.Errorf("approvals: record of approval %s: %w", rec.ApprovalRef, err)
	}
	ch, err := s.passkeys.IssueChallenge(ctx, passkey.ChallengeRequest{
		TaskID:             rec.TaskID,
		Tool:               rec.Tool,
		ActionHash:         hash,
		Group:              rec.Requirement.Group,
		AuthenticatorClass: rec.Requirement.AuthenticatorClass,
		// Cut as a new call's is (mcpserver): a record stored before
		// calls' display texts were cut may hold more than a challenge
		// takes, and its approvers must still be able to decide it.
		DisplayText: passkey.ClipDisplayText(rec.DisplayText),
		Decision:    decision,
		Asker:       passkey.AskerApprover,
	})
	if err != nil && passkey.ReasonOf(err) == "" {
		// Invalid arguments here come from our own record: internal.
		return passkey.Challenge{}, fmt.Errorf("approvals: issue challenge: %w", err)
	}
	return ch, err
}

// Verdict is the answer to one decision. Approved, Needed and Status are the
// approval's standing after it (or before it, when it was not counted).
type Verdict struct {
	Accepted bool
	// Reason names why a decision was not counted: a SEP-2672 reason (the
	// evidence failed) or, with Refused, a tasks.ErrType* name.
	Reason string
	// Refused is set when the task refused the decision without weighing
	// its evidence: it takes no more decisions (task_not_pending), or the
	// decision was malformed or could not be verified.
	Refused  bool
	Status   tasks.ApprovalState
	Approved int
	Needed   int
}

// Decide delivers one approver's passkey-signed decision on the approval
// with reference ref and returns the workflow's verdict.
//
// The evidence is checked first without consuming its challenge: invalid
// evidence is turned away here, before it reaches the task's workflow, so it
// spends no budget valid decisions share; the workflow records a bounded
// number of such rejections. Valid evidence goes to the workflow, which
// verifies again and consumes under the decision's update ID — also on a task
// that looks decided: if it is the retry of a decision the workflow took (the
// answer was lost, or the server died right after), the update has the same
// ID and the answer is its verdict.
//
// Errors: ErrNotFound; ErrVerificationUnavailable and ErrInProgress, after
// which the same request may be sent again; anything else is internal.
func (s *Service) Decide(ctx context.Context, ref string, d tasks.DecisionUpdate) (Verdict, error) {
	rec, err := s.byRef(ctx, ref)
	if err != nil {
		return Verdict{}, err
	}
	current := Verdict{Status: rec.ApprovalState, Approved: rec.Approved(), Needed: rec.Requirement.Quorum}
	if d.Decision != tasks.DecisionApprove && d.Decision != tasks.DecisionDeny {
		return Verdict{}, ErrInvalidDecision
	}
	// The decision is a request of its own (an approver's, maybe hours
	// later): its span starts its own trace, linked to the tools/call that
	// created the task.
	ctx, span := s.opts.Telemetry.StartLinkedSpan(ctx, "approval decision", rec.TraceParent,
		attribute.String(telemetry.AttrTaskID, rec.TaskID), attribute.String("countersign.approval_decision", string(d.Decision)))
	defer span.End()
	ctx = telemetry.WithTaskID(ctx, rec.TaskID)
	reason, err := s.checkEvidence(ctx, rec, d)
	if err != nil {
		return Verdict{}, err
	}
	if reason != "" {
		s.metrics.VerificationFailed(telemetry.VerifyPasskey, reason)
		if !s.pending(rec) {
			// Nothing to record on a task that takes no more decisions.
			current.Reason, current.Refused = tasks.ErrTypeTaskNotPending, true
			s.metrics.Decision(telemetry.DecisionRefused, current.Reason)
			return current, nil
		}
		s.recordRejection(ctx, rec, d, reason)
		current.Reason = reason
		s.metrics.Decision(telemetry.DecisionRejected, reason)
		s.log.InfoContext(ctx, "approvals: decision rejected", "approval_ref", rec.ApprovalRef, "reason", reason)
		return current, nil
	}
	var res tasks.DecisionResult
	err = s.toWorkflow(ctx, rec.TaskID, func() (err error) {
		res, err = s.engine.Decide(ctx, rec.TaskID, d)
		return err
	})
	var rejected *tasks.UpdateRejected
	switch {
	case errors.As(err, &rejected):
		current.Reason, current.Refused = rejected.Reason, true
		s.metrics.Decision(telemetry.DecisionRefused, rejected.Reason)
		s.log.InfoContext(ctx, "approvals: decision refused", "approval_ref", rec.ApprovalRef, "reason", rejected.Reason)
		return current, nil
	case errors.Is(err, tasks.ErrWorkflowGone):
		current.Reason, current.Refused = tasks.ErrTypeTaskNotPending, true
		s.metrics.Decision(telemetry.DecisionRefused, current.Reason)
		return current, nil
	case errors.Is(err, tasks.ErrUpdateInProgress):
		return Verdict{}, fmt.Errorf("%w: %w", ErrInProgress, err)
	case err != nil:
		return Verdict{}, fmt.Errorf("approvals: decide: %w", err)
	}
	if res.Accepted {
		s.metrics.Decision(telemetry.DecisionAccepted, "")
		s.log.InfoContext(ctx, "approvals: decision accepted", "approval_ref", rec.ApprovalRef, "decision", d.Decision)
	} else {
		s.metrics.Decision(telemetry.DecisionRejected, res.Reason)
		s.log.InfoContext(ctx, "approvals: decision rejected", "approval_ref", rec.ApprovalRef, "reason", res.Reason)
	}
	return Verdict{Accepted: res.Accepted, Reason: res.Reason, Status: res.Status, Approved: res.Approved, Needed: res.Needed}, nil
}

// checkEvidence runs every passkey check on a decision without consuming
// its challenge and returns the rejection reason, or "" when the evidence
// holds. The workflow verifies again and consumes, under the decision's
// update ID (a retry of the same request passes here too).
func (s *Service) checkEvidence(ctx context.Context, rec tasks.Record, d tasks.DecisionUpdate) (string, error) {
	hash, err := canon.ParseActionHash(rec.ActionHash)
	if err != nil {
		return "", fmt.Errorf("approvals: task %s: action hash: %w", rec.TaskID, err)
	}
	_, err = s.passkeys.Verify(ctx, passkey.VerifyRequest{
		ChallengeID:        d.ChallengeID,
		TaskID:             rec.TaskID,
		Tool:               rec.Tool,
		ActionHash:         hash,
		Group:              rec.Requirement.Group,
		AuthenticatorClass: rec.Requirement.AuthenticatorClass,
		Requester:          rec.Owner,
		ConsumerKey:        tasks.DecisionUpdateID(d),
		Decision:           d.Decision,
		Method:             d.Method,
		Response:           d.Response,
		CheckOnly:          true,
	})
	if reason := passkey.ReasonOf(err); reason != "" {
		return reason, nil
	}
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrVerificationUnavailable, err)
	}
	return "", nil
}

// recordRejection asks the task's workflow to record a rejected decision in
// its timeline and audit chain. The workflow records a bounded number per
// task and refuses the rest without writing anything; either way the
// approver's answer is the same, so failures are only logged.
func (s *Service) recordRejection(ctx context.Context, rec tasks.Record, d tasks.DecisionUpdate, reason string) {
	if countEvents(rec, tasks.EventRejectedDecision) >= tasks.MaxRecordedRejections {
		return // the workflow would refuse it: spare it the round trip
	}
	r := tasks.RejectedDecision{ChallengeID: clipID(d.ChallengeID), Decision: d.Decision, Reason: reason}
	err := s.toWorkflow(ctx, rec.TaskID, func() error { return s.engine.RecordRejection(ctx, rec.TaskID, r) })
	if err != nil {
		s.log.DebugContext(ctx, "approvals: rejection not recorded", "task_id", rec.TaskID, "reason", reason, "error", err)
	}
}

// countEvents counts the events of a kind in the task's timeline.
func countEvents(rec tasks.Record, kind tasks.EventKind) (n int) {
	for _, ev := range rec.Timeline {
		if ev.Kind == kind {
			n++
		}
	}
	return n
}

// clipID keeps a client-chosen challenge ID short enough to record.
func clipID(id string) string {
	const maxLen = 64
	if len(id) > maxLen || !utf8.ValidString(id) {
		return "(invalid)"
	}
	return id
}

// DenyUnsigned denies the approval with reference ref on behalf of an
// approver authenticated by another channel than a passkey (via names it,
// such as "slack"). Only a deny takes this path: a deny can only stop a
// call. The approver must exist (ErrUnknownApprover), be active (not
// disabled or revoked by an admin) and be in the approval's group
// (ErrNotEligible); a task that no longer takes decisions
// is ErrNotPending. The workflow records who denied, through what, and when.
func (s *Service) DenyUnsigned(ctx context.Context, ref, approverID, via string, at time.Time) error {
	ap, err := s.passkeys.Approver(ctx, approverID)
	if errors.Is(err, passkey.ErrNotFound) {
		return ErrUnknownApprover
	}
	if err != nil {
		return err
	}
	rec, err := s.byRef(ctx, ref)
	if err != nil {
		return err
	}
	if !ap.Active() || !slices.Contains(ap.Groups, rec.Requirement.Group) {
		// A disabled or revoked approver decides nothing, by any channel.
		s.log.InfoContext(ctx, "approvals: unsigned deny by a non-eligible approver refused", "approver_id", ap.ID, "approval_ref", ref, "via", via)
		return ErrNotEligible
	}
	denial := tasks.UnsignedDenial{ApproverID: ap.ID, ApproverName: ap.Name, Via: via, At: at}
	err = s.toWorkflow(ctx, rec.TaskID, func() error {
		_, err := s.engine.DenyUnsigned(ctx, rec.TaskID, denial)
		return err
	})
	var rejected *tasks.UpdateRejected
	switch {
	case errors.As(err, &rejected), errors.Is(err, tasks.ErrWorkflowGone):
		return ErrNotPending
	case errors.Is(err, tasks.ErrUpdateInProgress):
		return fmt.Errorf("%w: %w", ErrInProgress, err)
	case err != nil:
		return fmt.Errorf("approvals: deny: %w", err)
	}
	s.log.InfoContext(ctx, "approvals: denied without a passkey", "approval_ref", ref, "approver_id", ap.ID, "via", via)
	return nil
}
