package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/internal/telemetry"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
)

// Activities holds the dependencies of the approval workflow's activities.
// The worker registers one instance; the workflow refers to its methods
// through a nil *Activities.
type Activities struct {
	Tasks    *tasks.Store
	PDP      *pdp.Engine
	Passkeys *passkey.Service
	Tools    *gateway.Registry
	// Notifier tells approvers about new tasks and how they go on (a
	// [Fanout] composes several); nil notifies nobody.
	Notifier Notifier
	// PublicURL is the approver site's base URL, e.g. https://approve.example.com.
	PublicURL string
	// Audit writes the tasks' signed audit chains; nil records nothing.
	Audit *audit.Log
	// ResultRetention is how long a terminal task's record (and its result)
	// stays readable after the task ends: [Activities.Complete] extends the
	// TTL to cover it. Zero means tasks.DefaultResultRetention.
	ResultRetention time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
	// Telemetry counts the transitions and ends the read model records and
	// times approval decisions; nil records nothing.
	Telemetry *telemetry.Telemetry
	// Crash, when set, is called at each [CrashPoint] with the task's ID,
	// and may kill the process there. Only a crash-trial build sets it
	// (internal/app, `go build -tags crashpoints`, for internal/e2e
	// TestCrashTrials); a release binary has no code that sets it, and no
	// flag, variable or file reaches it.
	Crash func(point CrashPoint, taskID string)
}

// CrashPoint names a step of a task where [Activities.Crash] is called.
type CrashPoint string

// The crash points, in the order a task passes them.
const (
	// CrashDecide: VerifyDecision has consumed the approver's challenge;
	// the workflow task that counts the decision has not committed.
	CrashDecide CrashPoint = "decide"
	// CrashClaim: before the claim. Reevaluate runs inside the workflow
	// task that takes the execution claim; that task has not committed.
	CrashClaim CrashPoint = "claim"
	// CrashExecute: between the claim and the execution. ExecuteTool has
	// started (the claim committed) and has not called the tool.
	CrashExecute CrashPoint = "execute"
	// CrashTool: during the tool. The tool has acted (the effect is made)
	// and its result is not reported.
	CrashTool CrashPoint = "tool"
	// CrashPublish: the outbox's Publish has written the first entry of a
	// batch of several and not the rest.
	CrashPublish CrashPoint = "publish"
	// CrashRecord: while the result is recorded. Complete has sealed the
	// audit chain and not written the terminal read model.
	CrashRecord CrashPoint = "record"
)

// CrashPoints lists every CrashPoint.
var CrashPoints = []CrashPoint{CrashDecide, CrashClaim, CrashExecute, CrashTool, CrashPublish, CrashRecord}

// crash calls the Crash hook, if any.
func (a *Activities) crash(point CrashPoint, taskID string) {
	if a.Crash != nil {
		a.Crash(point, taskID)
	}
}

func (a *Activities) resultRetention() time.Duration {
	if a.ResultRetention <= 0 {
		return tasks.DefaultResultRetention
	}
	return a.ResultRetention
}

func (a *Activities) log() *slog.Logger {
	if a.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return a.Logger
}

// approveURL is the approval page of the task with approval reference ref.
func (a *Activities) approveURL(ref string) string {
	return strings.TrimRight(a.PublicURL, "/") + "/approve/" + url.PathEscape(ref)
}

func checkVersion(v int) error {
	if v != Version {
		return temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("activities: input version %d, want %d", v, Version), ErrTypeUnsupportedVersion, nil)
	}
	return nil
}

// storeError classifies a task store error: a missing or already-ended
// record will not get better with retries; anything else is infrastructure.
func storeError(op, taskID string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, tasks.ErrTaskNotFound):
		return temporal.NewNonRetryableApplicationError("activities: "+op+" "+taskID+": task not found", ErrTypeTaskNotFound, err)
	case errors.Is(err, tasks.ErrTerminal):
		return temporal.NewNonRetryableApplicationError("activities: "+op+" "+taskID+": task already ended", ErrTypeTaskTerminal, err)
	default:
		return fmt.Errorf("activities: %s %s: %w", op, taskID, err)
	}
}

// errSkip aborts a store update that has nothing to do.
var errSkip = errors.New("activities: nothing to write")

// appendEvent appends e to the timeline unless it is already there (a retry).
func appendEvent(r *tasks.Record, e tasks.Event) {
	if e.Kind == "" {
		return
	}
	for _, old := range r.Timeline {
		if old.Kind == e.Kind && old.Detail == e.Detail && old.At.Equal(e.At) {
			return
		}
	}
	r.Timeline = append(r.Timeline, e)
}

// RecordState writes a non-terminal transition to the task's read model. It
// leaves a terminal record alone, so a late write cannot undo the end, and
// skips a write whose outbox sequence the record has already seen, so a
// retried or late batch cannot roll the record back.
func (a *Activities) RecordState(ctx context.Context, in RecordStateInput) error {
	if err := checkVersion(in.Version); err != nil {
		return err
	}
	var before tasks.Record // the record as this write found it
	_, err := a.Tasks.Update(ctx, in.TaskID, func(r *tasks.Record) error {
		if r.Status.Terminal() || (in.Seq > 0 && in.Seq <= r.Seq) {
			return errSkip
		}
		before = tasks.Record{Status: r.Status, ApprovalState: r.ApprovalState, CreatedAt: r.CreatedAt}
		if in.Seq > 0 {
			r.Seq = in.Seq
		}
		r.StatusMessage = in.StatusMessage
		r.ApprovalState = in.ApprovalState
		r.Approvals = in.Approvals
		if in.Status != "" && !in.Status.Terminal() {
			r.Status = in.Status
			r.InputRequests = in.InputRequests
		}
		appendEvent(r, in.Event)
		return nil
	})
	if errors.Is(err, errSkip) {
		a.log().Debug("activities: record state on terminal task ignored", "task_id", in.TaskID, "event", in.Event.Kind)
		return nil
	}
	if err == nil {
		if in.Status != "" && !in.Status.Terminal() && in.Status != before.Status {
			a.Telemetry.M().TaskTransition(string(in.Status))
		}
		a.observeDecision(before, in.ApprovalState, in.Event.At)
	}
	return storeError("record state", in.TaskID, err)
}

// Notify tells the approvers about the task, with a link to its approval
// page and the requester's identical calls.
func (a *Activities) Notify(ctx context.Context, in NotifyInput) error {
	if err := checkVersion(in.Version); err != nil {
		return err
	}
	if a.Notifier == nil && a.Passkeys == nil {
		return nil
	}
	r, err := a.Tasks.Get(ctx, in.TaskID)
	if err != nil {
		return storeError("notify", in.TaskID, err)
	}
	a.warnIfNobodyCanApprove(ctx, r)
	if a.Notifier == nil {
		return nil
	}
	if err := a.Notifier.ApprovalRequested(ctx, r, a.approveURL(r.ApprovalRef), a.identicalCalls(ctx, r)); err != nil {
		return fmt.Errorf("activities: notify %s: %w", in.TaskID, err)
	}
	return nil
}

// warnIfNobodyCanApprove logs a warning when fewer of r's approver group
// can decide it (active, with a passkey its authenticator class allows)
// than its quorum: the task waits until its expiry unless someone enrolls,
// and a group name the policy misspelt looks just like that. A look-up
// that fails is logged and changes nothing.
func (a *Activities) warnIfNobodyCanApprove(ctx context.Context, r tasks.Record) {
	req := r.Requirement
	if a.Passkeys == nil || req.Quorum == 0 {
		return
	}
	n, err := a.Passkeys.EligibleApprovers(ctx, req.Group, req.AuthenticatorClass, req.Quorum)
	if err != nil {
		a.log().WarnContext(ctx, "activities: approvers of the task's group not counted", "task_id", r.TaskID, "group", req.Group, "err", err)
		return
	}
	if n < req.Quorum {
		a.log().WarnContext(ctx, "activities: the task cannot be approved yet: too few approvers in its group can approve it; add or enroll approvers (countersign approvers add), or check the group name in the policy",
			"task_id", r.TaskID, "group", req.Group, "authenticator_class", req.AuthenticatorClass, "able", n, "quorum", req.Quorum, "expires_at", r.ExpiresAt)
	}
}

// NotifyUpdate tells the notifiers that the task moved on (an accepted
// approval, or its end). It reads the record when it runs, so it reports the
// newest state.
func (a *Activities) NotifyUpdate(ctx context.Context, in NotifyUpdateInput) error {
	if err := checkVersion(in.Version); err != nil {
		return err
	}
	if in.Kind != NotifyProgress && in.Kind != NotifyResolved {
		return temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("activities: unknown notification kind %q", in.Kind), ErrTypeInvalidInput, nil)
	}
	if a.Notifier == nil {
		return nil
	}
	r, err := a.Tasks.Get(ctx, in.TaskID)
	if err != nil {
		return storeError("notify update", in.TaskID, err)
	}
	if err := a.Notifier.ApprovalUpdated(ctx, r, a.approveURL(r.ApprovalRef), a.identicalCalls(ctx, r)); err != nil {
		return fmt.Errorf("activities: notify %s %s: %w", in.Kind, in.TaskID, err)
	}
	return nil
}

// identicalCalls looks up r's identical calls for a notification. A
// look-up that fails is logged and shown as unknown: it never holds the
// notification back.
func (a *Activities) identicalCalls(ctx context.Context, r tasks.Record) tasks.IdenticalCalls {
	identical, err := a.Tasks.IdenticalCalls(ctx, r)
	if err != nil {
		a.log().WarnContext(ctx, "activities: identical calls", "task_id", r.TaskID, "err", err)
	}
	return identical
}

// VerifyDecision verifies an approver's passkey assertion against the task.
// A rejected assertion is an output with Accepted false and the SEP-2672
// reason; an error means verification could not be carried out.
func (a *Activities) VerifyDecision(ctx context.Context, in VerifyDecisionInput) (VerifyDecisionOutput, error) {
	if err := checkVersion(in.Version); err != nil {
		return VerifyDecisionOutput{}, err
	}
	env := in.Envelope
	hash, err := canon.ParseActionHash(env.ActionHash)
	if err != nil {
		return VerifyDecisionOutput{}, temporal.NewNonRetryableApplicationError(
			"activities: envelope action hash is malformed", ErrTypeEnvelopeMismatch, err)
	}
	v, err := a.Passkeys.Verify(ctx, passkey.VerifyRequest{
		ChallengeID:        in.ChallengeID,
		TaskID:             env.TaskID,
		Tool:               env.Tool,
		ActionHash:         hash,
		Group:              in.Requirement.Group,
		AuthenticatorClass: in.Requirement.AuthenticatorClass,
		Requester:          env.Principal,
		ConsumerKey:        in.ConsumerKey,
		Decision:           in.Decision,
		Method:             in.Method,
		Response:           in.Response,
	})
	if err != nil {
		if reason := passkey.ReasonOf(err); reason != "" {
			a.log().Info("activities: decision rejected", "task_id", env.TaskID, "reason", reason)
			return VerifyDecisionOutput{Version: Version, Reason: reason}, nil
		}
		if errors.Is(err, passkey.ErrInvalidArgument) {
			return VerifyDecisionOutput{}, temporal.NewNonRetryableApplicationError(
				"activities: invalid verification request", ErrTypeInvalidVerification, err)
		}
		return VerifyDecisionOutput{}, fmt.Errorf("activities: verify decision for %s: %w", env.TaskID, err)
	}
	a.crash(CrashDecide, env.TaskID)
	return VerifyDecisionOutput{
		Version:      Version,
		Accepted:     true,
		ApproverID:   v.ApproverID,
		ApproverName: v.ApproverName,
		CredentialID: v.CredentialID,
		Assertion: &Assertion{
			CredentialID: v.CredentialID, PublicKey: v.PublicKey, ChallengeID: v.ChallengeID,
			AuthenticatorData: v.AuthenticatorData, ClientDataJSON: v.ClientDataJSON,
			Signature: v.Signature, SignCount: v.SignCount,
		},
	}, nil
}

// Reevaluate asks the current policy about the same envelope with the
// approvals as input. Approvers' groups are read now, not when they approved,
// so an approver removed from a group meanwhile no longer counts for it, and
// an approval whose approver or passkey an admin disabled or revoked
// meanwhile counts for no group (a stolen phone's approval, its passkey
// revoked, does not make up a quorum). The tool is the one served under the
// envelope's name now; a tool not served is a retryable error, never a
// decision about a resource without its upstream (see policyResource).
func (a *Activities) Reevaluate(ctx context.Context, in ReevaluateInput) (ReevaluateOutput, error) {
	if err := checkVersion(in.Version); err != nil {
		return ReevaluateOutput{}, err
	}
	env := in.Envelope
	a.crash(CrashClaim, env.TaskID)
	approvals := make([]pdp.Approval, 0, len(in.Approvals))
	for _, e := range in.Approvals {
		if e.Decision != tasks.DecisionApprove {
			continue
		}
		var groups []string
		ap, standing, err := a.Passkeys.Standing(ctx, e.ApproverID, e.CredentialID)
		if err != nil {
			return ReevaluateOutput{}, fmt.Errorf("activities: reevaluate %s: approver: %w", env.TaskID, err)
		}
		// An approver or passkey removed, disabled or revoked since
		// approving: the approval counts for no group.
		if standing {
			groups = ap.Groups
		}
		approvals = append(approvals, pdp.Approval{
			ApproverID:   e.ApproverID,
			Name:         e.ApproverName,
			Groups:       groups,
			CredentialID: e.CredentialID,
			ApprovedAt:   e.At,
		})
	}
	resource, err := a.policyResource(env.Tool)
	if err != nil {
		return ReevaluateOutput{}, fmt.Errorf("activities: reevaluate %s: %w", env.TaskID, err)
	}
	d, err := a.PDP.Evaluate(ctx, pdp.Input{
		Subject:  pdp.Entity{Type: "agent", ID: env.Principal, Properties: env.Subject},
		Action:   pdp.Action{Name: "tools/call"},
		Resource: resource,
		Context: pdp.Context{
			Arguments:  env.Arguments,
			ActionHash: env.ActionHash,
			Time:       in.At,
			Approvals:  approvals,
		},
	})
	if err != nil {
		if errors.Is(err, pdp.ErrInvalidInput) {
			return ReevaluateOutput{}, temporal.NewNonRetryableApplicationError(
				"activities: policy cannot evaluate this input", ErrTypePolicyInput, err)
		}
		return ReevaluateOutput{}, fmt.Errorf("activities: reevaluate %s: %w", env.TaskID, err)
	}
	a.log().Info("activities: reevaluated", "task_id", env.TaskID, "decision", d.Effect, "policy_version", d.PolicyVersion)
	return ReevaluateOutput{
		Version:       Version,
		Allow:         d.Effect == pdp.EffectAllow || (in.Verified && d.Effect == pdp.EffectVerify),
		Effect:        string(d.Effect),
		Reason:        d.Reason,
		PolicyVersion: d.PolicyVersion,
	}, nil
}

// ExecuteTool runs the held call once. It first recomputes the action hash
// from the envelope's tool, arguments and server ID: if it does not match the
// hash the approvers signed, the tool does not run. Nor does it when the
// envelope pins the tool (tasks.Envelope.ToolPin) and the tool served under
// that name now is another one: another upstream or endpoint, or another
// input schema ([ErrTypeUnknownTool], its details saying what changed). An
// envelope without a pin, made before pins existed, runs against the tool
// of that name as before. Both checks come before the task record's
// execution fence (tasks.Store.ClaimExecution), so a refusal claims
// nothing; the pin is compared once more on the tool that runs
// (gateway.Call.Pin), after the fence, so a tool that changed in between
// does not run either. Then it takes the fence: a task the read model says has ended, or
// whose execution was claimed before, is not run
// ([ErrTypeExecutionNotClaimed]). Any error after the tool was invoked means
// its outcome is unknown.
func (a *Activities) ExecuteTool(ctx context.Context, in ExecuteToolInput) (ExecuteToolOutput, error) {
	if err := checkVersion(in.Version); err != nil {
		return ExecuteToolOutput{}, err
	}
	env := in.Envelope
	want, err := canon.ParseActionHash(env.ActionHash)
	if err == nil {
		var got canon.ActionHash
		got, err = canon.Hash(env.Tool, env.Arguments, env.ServerID)
		if err == nil && got != want {
			err = errors.New("recomputed action hash differs")
		}
	}
	if err != nil {
		a.log().Error("activities: envelope does not match its action hash; not executing", "task_id", env.TaskID, "tool", env.Tool)
		return ExecuteToolOutput{}, temporal.NewNonRetryableApplicationError(
			"activities: envelope does not match its action hash", ErrTypeEnvelopeMismatch, err)
	}
	if err := a.checkPin(env); err != nil {
		return ExecuteToolOutput{}, err
	}
	stop := heartbeat(ctx)
	if err := a.claimExecution(ctx, env.TaskID); err != nil {
		stop()
		return ExecuteToolOutput{}, err
	}
	a.crash(CrashExecute, env.TaskID)
	res, err := a.Tools.Execute(ctx, env.Tool, gateway.Call{
		IdempotencyKey: env.TaskID,
		Principal:      env.Principal,
		Arguments:      env.Arguments,
		Inputs:         env.InputResponses,
		// Checked again on the tool that runs: the tool may have changed
		// since checkPin, while the fence was taken.
		Pin: env.ToolPin,
	})
	stop()
	a.crash(CrashTool, env.TaskID)
	if err != nil {
		var changed *gateway.ToolChangedError
		if errors.As(err, &changed) {
			return ExecuteToolOutput{}, a.pinRefusal(env, changed)
		}
		if errors.Is(err, gateway.ErrUnknownTool) || errors.Is(err, gateway.ErrNotSent) {
			// The tool is gone (its upstream is down) or could not be
			// reached: nothing was sent, so the call did not run.
			return ExecuteToolOutput{}, temporal.NewNonRetryableApplicationError(
				"activities: tool "+env.Tool+" is not available", ErrTypeUnknownTool, err)
		}
		var pe *gateway.ProtocolError
		if errors.As(err, &pe) {
			// The tool refused with a protocol error: it did not act.
			return ExecuteToolOutput{}, temporal.NewNonRetryableApplicationError(
				pe.Message, ErrTypeToolProtocolError, nil, pe.Code)
		}
		return ExecuteToolOutput{}, fmt.Errorf("activities: execute %s: %w", env.TaskID, err)
	}
	a.log().Info("activities: tool executed", "task_id", env.TaskID, "tool", env.Tool, "is_error", res.IsError)
	return ExecuteToolOutput{Version: Version, Result: res}, nil
}

// checkPin refuses, with a non-retryable [ErrTypeUnknownTool], to run a call
// whose envelope pins a tool the registry no longer serves under that name:
// the details carry [gateway.ToolChangedError]'s sentence, for the task's
// end. A tool that is gone is refused the same way, without details, as
// the execution would refuse it.
func (a *Activities) checkPin(env tasks.Envelope) error {
	if env.ToolPin == nil {
		return nil
	}
	err := a.Tools.CheckPin(env.Tool, *env.ToolPin)
	var changed *gateway.ToolChangedError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &changed):
		return a.pinRefusal(env, changed)
	default:
		return temporal.NewNonRetryableApplicationError(
			"activities: tool "+env.Tool+" is not available", ErrTypeUnknownTool, err)
	}
}

// pinRefusal is the non-retryable [ErrTypeUnknownTool] of a call not run
// because its tool changed, its details [gateway.ToolChangedError]'s
// sentence.
func (a *Activities) pinRefusal(env tasks.Envelope, changed *gateway.ToolChangedError) error {
	a.log().Error("activities: the tool changed after the call was made; not executing", "task_id", env.TaskID, "tool", env.Tool, "reason", changed.Reason)
	return temporal.NewNonRetryableApplicationError(
		"activities: tool "+env.Tool+" is not the tool the call was made against: "+changed.Reason+"; not run", ErrTypeUnknownTool, changed, changed.Error())
}

// claimTries bounds ExecuteTool's attempts at the execution fence while the
// store cannot be written: the activity has one attempt (a retry after the
// tool ran could run it twice), so a brief store outage is ridden out here.
const claimTries = 5

// claimExecution takes the task record's execution fence for ExecuteTool,
// retrying a store that cannot be reached for a few seconds. Any failure is
// a non-retryable [ErrTypeExecutionNotClaimed]: the tool has not run.
func (a *Activities) claimExecution(ctx context.Context, taskID string) error {
	settled := func(err error) bool {
		return errors.Is(err, tasks.ErrTerminal) || errors.Is(err, tasks.ErrTaskNotFound) || errors.Is(err, tasks.ErrExecutionClaimed)
	}
	claim := tasks.NewID("exe_") // this attempt's: a retry after a lost answer finds the fence its own
	var err error
	for try, wait := 1, 100*time.Millisecond; ; try, wait = try+1, 2*wait {
		if err = a.Tasks.ClaimExecution(ctx, taskID, claim); err == nil {
			return nil
		}
		if settled(err) || try == claimTries {
			break
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
			continue
		case <-ctx.Done():
			t.Stop()
			err = errors.Join(err, ctx.Err())
		}
		break
	}
	var msg string
	switch {
	case errors.Is(err, tasks.ErrTerminal), errors.Is(err, tasks.ErrTaskNotFound):
		msg = "The task had already ended, or its record was gone, before its tool could run; the tool did not run."
	case errors.Is(err, tasks.ErrExecutionClaimed):
		msg = "The task's execution was claimed before; the tool did not run again."
	default:
		msg = "The execution could not be recorded; the tool did not run."
	}
	a.log().Error("activities: execution not claimed; not executing", "task_id", taskID, "err", err)
	return temporal.NewNonRetryableApplicationError(msg, ErrTypeExecutionNotClaimed, err)
}

// heartbeat tells Temporal that this activity's worker is alive every
// fifth of the activity's heartbeat timeout until stop is called, so a tool
// that runs long is never cut off while a worker that dies mid-call fails
// the attempt within that timeout (workflows.Options). The worker sends at
// most one heartbeat per throttle interval (internal/app sets it to a third
// of the timeout), the latest one recorded. The timeout runs from the
// attempt's start, so none is sent at the start: a tool that answers within
// a fifth of the timeout, as most do, costs no heartbeat (each one is a
// write to the workflow's state on the Temporal server). Without a
// heartbeat timeout (an attempt scheduled before it existed, a direct call
// in a test) it does nothing.
func heartbeat(ctx context.Context) (stop func()) {
	if !activity.IsActivity(ctx) {
		return func() {}
	}
	every := activity.GetInfo(ctx).HeartbeatTimeout / 5
	if every <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				activity.RecordHeartbeat(ctx)
			}
		}
	}()
	return sync.OnceFunc(func() { close(done) })
}

// Complete writes the task's terminal state: status, disposition, result
// (built with tasks.Outcome), approvals and the last timeline event, and
// extends the TTL so the result stays readable for
// [Activities.ResultRetention] after the end. The store releases the task's
// dedup slot. Writing the same terminal state again is a no-op in effect.
//
// A record that has already ended as failed (a start judged failed,
// tasks.FailUnstarted, whose workflow reached Temporal late all the same)
// keeps its end: the store refuses another status, so the audit chain is
// sealed with the record's end, not this one, and tasks/get, the
// notifiers and the chain say the same. The tool did not run either way.
func (a *Activities) Complete(ctx context.Context, in CompleteInput) error {
	if err := checkVersion(in.Version); err != nil {
		return err
	}
	if !in.Status.Terminal() {
		return temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("activities: complete with non-terminal status %q", in.Status), ErrTypeInvalidInput, nil)
	}
	cur, err := a.Tasks.Get(ctx, in.TaskID)
	switch {
	case errors.Is(err, tasks.ErrTaskNotFound):
		// No record to agree with: the chain is still sealed below.
	case err != nil:
		return storeError("complete", in.TaskID, err)
	case cur.Status == tasks.StatusFailed && in.Status != tasks.StatusFailed:
		a.log().Warn("activities: the task's record ended failed before its workflow's end; the audit chain keeps the record's end",
			"task_id", in.TaskID, "status", in.Status, "disposition", in.Disposition)
		_, err := a.sealAudit(ctx, CompleteInput{TaskID: in.TaskID, Status: tasks.StatusFailed, Detail: cur.StatusMessage,
			Event: tasks.Event{At: in.Event.At, Kind: tasks.EventFailed}, Audit: in.Audit})
		return err
	}
	receipt, err := a.sealAudit(ctx, in)
	if err != nil {
		return err
	}
	a.crash(CrashRecord, in.TaskID)
	// without is the outcome without the tool's content, noting why.
	without := func(why string) json.RawMessage {
		out := tasks.Outcome(in.Disposition, in.Tool, strings.TrimSpace(in.Detail+" ("+why+")"), nil)
		if receipt != nil {
			out.Meta[audit.MetaKey] = receipt
		}
		b, _ := json.Marshal(out)
		return b
	}
	var result json.RawMessage
	if in.Status == tasks.StatusCompleted {
		out := tasks.Outcome(in.Disposition, in.Tool, in.Detail, in.ToolResult)
		if in.Disposition == "" && in.ToolResult != nil {
			// An unattended task (tasks.ModeUnattended): nothing was
			// approved, so its result is the tool's own, as is.
			out = *in.ToolResult
			out.Meta = maps.Clone(out.Meta)
			if out.Meta == nil {
				out.Meta = map[string]any{}
			}
		}
		if receipt != nil {
			out.Meta[audit.MetaKey] = receipt
		}
		b, err := json.Marshal(out)
		if err != nil {
			// The tool's content is not valid JSON: keep the disposition,
			// drop what cannot be stored.
			a.log().Warn("activities: tool result cannot be encoded; storing the outcome without it", "task_id", in.TaskID, "err", err)
			b = without("The tool's result could not be stored.")
		}
		result = b
	}
	retention := a.resultRetention()
	var before tasks.Record // the record as this write found it
	update := func(r *tasks.Record) error {
		before = tasks.Record{Status: r.Status, ApprovalState: r.ApprovalState, CreatedAt: r.CreatedAt}
		r.Status = in.Status
		if in.Seq > r.Seq {
			r.Seq = in.Seq
		}
		r.StatusMessage = in.StatusMessage
		r.Disposition = in.Disposition
		r.Result = result
		r.Error = nil
		if in.Status == tasks.StatusFailed {
			r.Error = &tasks.RPCError{Code: -32603, Message: in.Detail}
		}
		r.ApprovalState = in.ApprovalState
		r.Approvals = in.Approvals
		appendEvent(r, in.Event)
		if keep := in.Event.At.Sub(r.CreatedAt) + retention; keep > r.TTL {
			r.TTL = keep
		}
		return nil
	}
	_, err = a.Tasks.Update(ctx, in.TaskID, update)
	if errors.Is(err, nats.ErrMaxPayload) && in.Status == tasks.StatusCompleted {
		// The record with the tool's result is larger than a NATS message
		// may be (a server's max_payload, 1 MiB by default): no attempt
		// would ever write it, and tasks/get would say "working" for good
		// of a call that ran. Keep the outcome, without the content.
		a.log().Warn("activities: tool result too large to store; storing the outcome without it", "task_id", in.TaskID, "bytes", len(result))
		result = without("The tool's result was too large to store.")
		_, err = a.Tasks.Update(ctx, in.TaskID, update)
	}
	if err != nil {
		return storeError("complete", in.TaskID, err)
	}
	if !before.Status.Terminal() { // not a retry of this write
		m := a.Telemetry.M()
		m.TaskTransition(string(in.Status))
		m.Execution(string(in.Disposition))
		a.observeDecision(before, in.ApprovalState, in.Event.At)
	}
	a.log().Info("activities: task ended", "task_id", in.TaskID, "status", in.Status, "disposition", in.Disposition)
	return nil
}

// observeDecision times a task's approval decision: from its creation to
// the write that took its approval state from pending to approved, denied
// or expired, at the workflow's time of the event.
func (a *Activities) observeDecision(before tasks.Record, now tasks.ApprovalState, at time.Time) {
	if before.ApprovalState != tasks.ApprovalPending || before.CreatedAt.IsZero() || at.IsZero() {
		return
	}
	switch now {
	case tasks.ApprovalApproved, tasks.ApprovalDenied, tasks.ApprovalExpired:
		a.Telemetry.M().ApprovalDecided(string(now), at.Sub(before.CreatedAt))
	}
}

// policyResource is the held call's tool as policy sees it now: for an
// upstream's tool, with the upstream's current annotations and approval
// override. A tool no longer served (its upstream is down or restarting) is
// an error, and a retryable one: named alone, without its upstream, it would
// look to policy like one of Countersign's own tools, so the call would be
// judged as another one (a policy that allows its own tools and holds the
// upstreams' would allow it without approval). Should the upstream be back
// by the next attempt, the call is judged as it is; ExecuteTool then checks
// the tool against its pin.
func (a *Activities) policyResource(tool string) (pdp.Resource, error) {
	if a.Tools == nil {
		return pdp.Resource{Type: "tool", ID: tool}, nil
	}
	t, ok := a.Tools.Lookup(tool)
	if !ok {
		return pdp.Resource{}, fmt.Errorf("tool %s is not served now, so policy cannot see it as the call did: %w", tool, gateway.ErrUnknownTool)
	}
	return t.PolicyResource(), nil
}
