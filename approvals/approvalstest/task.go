package approvalstest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/tasks"
	"github.com/countersign/countersign/workflows"
)

// The model of one approval workflow (workflows/approval.go, outbox.go,
// unattended.go): its state, main line, outbox and notifications here, its
// update handlers in updates.go. Names follow the workflow's, so the two
// read side by side; where the workflow awaits a condition, the task waits
// on its changed channel.

// phase is where the task is in its state machine.
type phase int

const (
	phasePending  phase = iota // collecting decisions (or, unattended, waiting to start)
	phaseApproved              // quorum reached (or start time passed); policy being re-evaluated
	phaseClaimed               // execution claimed; the tool runs at most once
	phaseEnded                 // outcome decided and written
)

// ending is how a task ends.
type ending struct {
	status        tasks.Status
	disposition   tasks.Disposition
	approvalState tasks.ApprovalState
	event         tasks.EventKind // timeline kind
	detail        string          // outcome detail: the agent reads it in the result
	message       string          // status message
	toolResult    *tasks.CallToolResult
}

// noteRequested queues the request notification (the Notify activity);
// the other kinds are NotifyUpdate's.
const noteRequested activities.NotifyKind = "requested"

// noteQueue orders a task's notifications: the request, each accepted
// approval, the end.
type noteQueue struct {
	notes  []activities.NotifyKind
	closed bool // the end is queued; nothing follows
	done   bool // the loop has sent everything
}

// inputWait is an unattended task's input requests and the answers so far.
type inputWait struct {
	pending map[string]json.RawMessage // unanswered requests, by ID
	answers map[string]json.RawMessage
}

// task is one workflow.
type task struct {
	e  *Engine
	id string

	// decideMu serializes decisions, as the workflow's mutex does: each is
	// verified and counted before the next. A channel of one, so that a
	// decision waiting for it stops when the engine closes.
	decideMu chan struct{}

	// mu guards every field below and orders the outbox: an entry is
	// written while mu is held, so entries are written in the order the
	// task decided them.
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change (signal)

	in        tasks.ApprovalInput
	phase     phase
	approvals []tasks.ApprovalEntry // accepted decisions, in order
	end       *ending
	seq       int64 // last outbox sequence
	endSeq    int64 // sequence of the terminal entry; 0 until the end
	attempts  int   // decisions past the validator
	rejected  int   // rejected decisions recorded
	refused   bool  // a cancel after the claim is recorded
	notes     *noteQueue
	input     *inputWait
	updates   map[string]*call // admitted updates, by ID
	inflight  int              // update handlers running
	returned  bool             // the workflow function has returned
}

func newTask(e *Engine, id string, in tasks.ApprovalInput) *task {
	return &task{e: e, id: id, in: in, decideMu: make(chan struct{}, 1),
		changed: make(chan struct{}), updates: map[string]*call{}}
}

// signal wakes everything waiting for the task to change. Call with mu
// held.
func (t *task) signal() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// awaitLocked waits, with mu held (and released while waiting), until cond
// holds, timeout fires (nil: never) or the engine closes. ok is cond when it
// returns; closed reports the engine's close, after which the caller leaves
// the task as it is.
func (t *task) awaitLocked(cond func() bool, timeout <-chan time.Time) (ok, closed bool) {
	for !cond() {
		changed := t.changed
		t.mu.Unlock()
		select {
		case <-changed:
		case <-timeout:
			t.mu.Lock()
			return cond(), false
		case <-t.e.ctx.Done():
			t.mu.Lock()
			return false, true
		}
		t.mu.Lock()
	}
	return true, false
}

func (t *task) now() time.Time { return t.e.now().UTC() }

func unattended(in tasks.ApprovalInput) bool { return in.Mode == tasks.ModeUnattended }

// beginLocked is the workflow's start, up to its first wait: it checks the
// input, writes the request and starts the workflow's goroutines.
func (t *task) beginLocked() {
	if err := validateInput(t.in); err != nil {
		t.e.log.Error("approvalstest: invalid approval input; failing the task", "task_id", t.id, "error", err)
		t.endAsLocked(&ending{status: tasks.StatusFailed, approvalState: tasks.ApprovalFailed, event: tasks.EventFailed,
			detail: "The approval could not start.", message: "Failed: the approval could not start"})
		t.returned = true // the workflow fails at once
		return
	}
	if unattended(t.in) && len(t.in.InputRequests) > 0 {
		t.input = &inputWait{pending: maps.Clone(t.in.InputRequests), answers: map[string]json.RawMessage{}}
	}
	in := t.in
	t.emitAuditLocked(activities.RecordAuditInput{Kind: activities.StepRequested, StepID: "requested", Input: &in})
	t.emitStateLocked(tasks.NewEvent(tasks.EventRequested, t.in.Requirement.Reason))
	if t.in.Mode == tasks.ModeApproval {
		t.notes = &noteQueue{notes: []activities.NotifyKind{noteRequested}}
		t.e.spawn(t.notifyLoop)
	}
	t.e.spawn(t.run)
}

// validateInput is the workflow's check of its input (workflows.Approval);
// the task ID is the workflow ID by construction.
func validateInput(in tasks.ApprovalInput) error {
	switch {
	case in.Version != tasks.ApprovalInputVersion:
		return fmt.Errorf("approval input version %d, want %d", in.Version, tasks.ApprovalInputVersion)
	case in.Envelope.Version != tasks.EnvelopeVersion:
		return fmt.Errorf("envelope version %d, want %d", in.Envelope.Version, tasks.EnvelopeVersion)
	}
	switch in.Mode {
	case tasks.ModeApproval:
		switch {
		case in.Requirement.Quorum < 1:
			return fmt.Errorf("quorum %d, want at least 1", in.Requirement.Quorum)
		case in.ExpiresAt.IsZero():
			return errors.New("no expiry time")
		case !in.StartAt.IsZero():
			return errors.New("an approval has no start time")
		}
	case tasks.ModeUnattended:
		switch {
		case in.Requirement.Quorum != 0 || in.Requirement.Group != "":
			return fmt.Errorf("an unattended task has approvers (group %q, quorum %d)", in.Requirement.Group, in.Requirement.Quorum)
		case in.StartAt.IsZero():
			return errors.New("an unattended task has no start time")
		}
	case tasks.ModeVerified:
		switch {
		case in.Verified == nil || in.Verified.ApproverID == "":
			return errors.New("a verified task has no verified approval")
		case in.Requirement.Quorum != 1 || in.Requirement.Group != "":
			return fmt.Errorf("a verified task has group %q, quorum %d", in.Requirement.Group, in.Requirement.Quorum)
		}
	default:
		return fmt.Errorf("unknown mode %q", in.Mode)
	}
	return nil
}

// run is the workflow's main line after its first steps: wait for the
// decision (or the start time), re-evaluate and execute, then wait for the
// last notifications and update handlers, and return. When the engine
// closes it stops where it is.
func (t *task) run() {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ok bool
	switch t.in.Mode {
	case tasks.ModeUnattended:
		ok = t.awaitStartLocked()
	case tasks.ModeVerified:
		ok = t.acceptVerifiedLocked()
	default:
		ok = t.awaitDecisionLocked()
	}
	if !ok {
		return
	}
	if t.end == nil && t.phase == phaseApproved && !t.reevaluateAndExecuteLocked() {
		return
	}
	if t.notes != nil {
		t.queueNoteLocked(activities.NotifyResolved)
		t.notes.closed = true
		t.signal()
		timer := time.NewTimer(workflows.NotifyDrainTimeout)
		defer timer.Stop()
		if _, closed := t.awaitLocked(func() bool { return t.notes.done }, timer.C); closed {
			return
		}
	}
	if _, closed := t.awaitLocked(func() bool { return t.inflight == 0 }, nil); closed {
		return
	}
	t.returned = true
}

// acceptVerifiedLocked records a verified task's in-band approval as an
// accepted approve decision (workflows/verified.go).
func (t *task) acceptVerifiedLocked() bool {
	v := t.in.Verified
	t.approvals = append(t.approvals, tasks.ApprovalEntry{ApproverID: v.ApproverID, ApproverName: v.ApproverName,
		CredentialID: v.CredentialID, Decision: tasks.DecisionApprove, At: v.At})
	t.emitAuditLocked(activities.RecordAuditInput{Kind: activities.StepDecision, StepID: "decision/verified",
		Decision: &activities.AuditDecision{Decision: tasks.DecisionApprove, Accepted: true, ChallengeID: v.ChallengeID,
			ApproverID: v.ApproverID, ApproverName: v.ApproverName, Assertion: &activities.Assertion{
				CredentialID: v.CredentialID, PublicKey: v.PublicKey, ChallengeID: v.ChallengeID,
				AuthenticatorData: v.AuthenticatorData, ClientDataJSON: v.ClientDataJSON,
				Signature: v.Signature, SignCount: v.SignCount,
			}}})
	t.emitStateLocked(tasks.ApprovalEvent(v.ApproverName, 1, 1))
	t.phase = phaseApproved
	return true
}

// awaitDecisionLocked waits until the task leaves pending or ExpiresAt
// passes; false when the engine closed.
func (t *task) awaitDecisionLocked() bool {
	left := func() bool { return t.phase != phasePending }
	ok := left()
	if remaining := t.in.ExpiresAt.Sub(t.e.now()); !ok && remaining > 0 {
		timer := time.NewTimer(remaining)
		defer timer.Stop()
		var closed bool
		if ok, closed = t.awaitLocked(left, timer.C); closed {
			return false
		}
	}
	if !ok {
		t.endAsLocked(denied(tasks.EventExpired, "Approval expired.",
			tasks.OutcomeText(tasks.EventExpired, t.in.Envelope.Tool, true), tasks.ApprovalExpired))
	}
	return true
}

// awaitStartLocked waits, cancellably, for an unattended task's answers and
// then its start time, and moves it on as if approved; false when the
// engine closed.
func (t *task) awaitStartLocked() bool {
	left := func() bool { return t.phase != phasePending }
	start := t.in.StartAt
	if t.input != nil {
		answered := func() bool { return len(t.input.pending) == 0 || left() }
		timer := time.NewTimer(workflows.InputWaitTimeout)
		defer timer.Stop()
		ok, closed := t.awaitLocked(answered, timer.C)
		switch {
		case closed:
			return false
		case left():
			return true // cancelled
		case !ok:
			t.endAsLocked(&ending{status: tasks.StatusFailed, approvalState: tasks.ApprovalExpired, event: tasks.EventExpired,
				detail: "The client did not answer the task's input requests in time.", message: "Failed: input not provided in time"})
			return true
		}
		b, err := json.Marshal(t.input.answers)
		if err != nil {
			t.endAsLocked(&ending{status: tasks.StatusFailed, approvalState: tasks.ApprovalFailed, event: tasks.EventFailed,
				detail: "The answers could not be encoded.", message: "Failed: invalid input"})
			return true
		}
		t.in.Envelope.InputResponses = b
		start = t.e.now().Add(t.in.Requirement.TTL)
	}
	if remaining := start.Sub(t.e.now()); remaining > 0 {
		timer := time.NewTimer(remaining)
		defer timer.Stop()
		if _, closed := t.awaitLocked(left, timer.C); closed {
			return false
		}
	}
	if t.phase == phasePending {
		t.phase = phaseApproved
		t.signal()
	}
	return true
}

// reevaluateAndExecuteLocked re-evaluates policy, claims the call and runs
// it once; false when the engine closed before the outcome was known. mu
// is released while the activities run.
func (t *task) reevaluateAndExecuteLocked() bool {
	in := activities.ReevaluateInput{Version: activities.Version, Envelope: t.in.Envelope,
		Approvals: slices.Clone(t.approvals), At: t.now(), Verified: t.in.Mode == tasks.ModeVerified}
	t.mu.Unlock()
	re, err := t.e.reevaluate(in)
	t.mu.Lock()
	switch {
	case t.end != nil:
		return true // cancelled while policy was being evaluated
	case t.e.ctx.Err() != nil:
		return false
	case err != nil:
		t.e.log.Error("approvalstest: policy could not be evaluated; denying", "task_id", t.id, "error", err)
		t.endAsLocked(denied(tasks.EventDenied, "The policy could not be evaluated.", "Denied: policy could not be evaluated", tasks.ApprovalDenied))
		return true
	case !re.Allow:
		t.emitAuditLocked(activities.RecordAuditInput{Kind: activities.StepReevaluated, StepID: "reevaluated", Policy: &re})
		t.endAsLocked(denied(tasks.EventDenied, "Denied by policy on re-evaluation: "+re.Reason, "Denied by policy: "+re.Reason, tasks.ApprovalDenied))
		return true
	}

	// The execution claim, in the same step as the last check for a
	// cancel, a deny or the expiry (mu has been held since): from here on
	// cancel is refused and the tool is called once at most.
	t.phase = phaseClaimed
	t.signal()
	t.emitAuditLocked(activities.RecordAuditInput{Kind: activities.StepReevaluated, StepID: "reevaluated", Policy: &re})
	t.emitStateLocked(tasks.ClaimedEvent(re.PolicyVersion))
	t.emitAuditLocked(activities.RecordAuditInput{Kind: activities.StepClaimed, StepID: "claimed", Policy: &re})
	env := t.in.Envelope
	t.mu.Unlock()
	out, err := t.e.execute(env)
	t.mu.Lock()
	if t.e.ctx.Err() != nil {
		return false // the engine closed under the tool: leave the task claimed
	}
	t.endAsLocked(t.executed(out, err))
	return true
}

// reevaluate runs the Reevaluate activity; without a PDP it allows, under
// the policy version the call was decided by.
func (e *Engine) reevaluate(in activities.ReevaluateInput) (activities.ReevaluateOutput, error) {
	if e.act.PDP == nil {
		return activities.ReevaluateOutput{Version: activities.Version, Allow: true, Effect: "allow",
			Reason: "no policy engine: re-evaluation allows", PolicyVersion: in.Envelope.PolicyVersion}, nil
	}
	var out activities.ReevaluateOutput
	err := e.retry(reevaluateAttempts, func(ctx context.Context) error {
		var err error
		out, err = e.act.Reevaluate(ctx, in)
		return err
	})
	return out, err
}

// execute runs the ExecuteTool activity once, as the workflow does: a
// single attempt bounded by workflows.ExecuteTimeout. A panic is a failed
// attempt (its outcome is unknown).
func (e *Engine) execute(env tasks.Envelope) (out activities.ExecuteToolOutput, err error) {
	if e.act.Tools == nil {
		return out, temporal.NewNonRetryableApplicationError("approvalstest: no tools", activities.ErrTypeUnknownTool, nil)
	}
	ctx, cancel := context.WithTimeout(e.ctx, workflows.ExecuteTimeout)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("approvalstest: tool %s panicked: %v", env.Tool, r)
		}
	}()
	return e.act.ExecuteTool(ctx, activities.ExecuteToolInput{Version: activities.Version, Envelope: env})
}

// executed classifies the single ExecuteTool attempt.
func (t *task) executed(out activities.ExecuteToolOutput, err error) *ending {
	tool := t.in.Envelope.Tool
	if err == nil {
		res := out.Result
		if unattended(t.in) {
			// Nothing was approved: the task's result is the tool's own.
			message := tasks.OutcomeText(tasks.EventExecuted, tool, false)
			if res.IsError {
				message = tasks.OutcomeText(tasks.EventExecutionError, tool, false)
			}
			return &ending{status: tasks.StatusCompleted, approvalState: tasks.ApprovalExecuted,
				event: tasks.EventExecuted, message: message, toolResult: &res}
		}
		if res.IsError {
			return &ending{status: tasks.StatusCompleted, disposition: tasks.ExecutionError, approvalState: tasks.ApprovalFailed,
				event: tasks.EventExecutionError, message: tasks.OutcomeText(tasks.EventExecutionError, tool, true), toolResult: &res}
		}
		return &ending{status: tasks.StatusCompleted, disposition: tasks.ApprovedExecuted, approvalState: tasks.ApprovalExecuted,
			event: tasks.EventExecuted, message: tasks.OutcomeText(tasks.EventExecuted, tool, true), toolResult: &res}
	}
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		switch appErr.Type() {
		case activities.ErrTypeEnvelopeMismatch:
			return denied(tasks.EventDenied, "The held call no longer matches what was approved.", "Denied: stale envelope", tasks.ApprovalDenied)
		case activities.ErrTypeToolProtocolError:
			// The tool refused with a protocol error: it did not act.
			return &ending{status: tasks.StatusFailed, approvalState: tasks.ApprovalFailed,
				event: tasks.EventFailed, detail: appErr.Message(), message: tasks.OutcomeText(tasks.EventFailed, tool, false)}
		case activities.ErrTypeUnknownTool:
			// As workflows does: a changed tool's error details say what
			// changed.
			var changed string
			if appErr.HasDetails() && appErr.Details(&changed) == nil && changed != "" {
				return denied(tasks.EventDenied, changed, "Denied: the tool changed", tasks.ApprovalDenied)
			}
			return denied(tasks.EventDenied, "The tool is not available.", "Denied: tool not available", tasks.ApprovalDenied)
		case activities.ErrTypeExecutionNotClaimed:
			// The task's record had ended (or its execution was claimed
			// before): the tool did not run.
			return &ending{status: tasks.StatusFailed, approvalState: tasks.ApprovalFailed,
				event: tasks.EventFailed, detail: appErr.Message(), message: appErr.Message()}
		}
	}
	t.e.log.Error("approvalstest: execution outcome unknown", "task_id", t.id, "error", err)
	return &ending{status: tasks.StatusCompleted, disposition: tasks.OutcomeUnknown, approvalState: tasks.ApprovalFailed,
		event: tasks.EventOutcomeUnknown, message: tasks.OutcomeText(tasks.EventOutcomeUnknown, tool, true)}
}

func denied(event tasks.EventKind, detail, message string, state tasks.ApprovalState) *ending {
	return &ending{status: tasks.StatusCompleted, disposition: tasks.DeniedNotExecuted, approvalState: state,
		event: event, detail: detail, message: message}
}

func cancelledEnding() *ending {
	return &ending{status: tasks.StatusCancelled, approvalState: tasks.ApprovalCancelled,
		event: tasks.EventCancelled, message: tasks.OutcomeText(tasks.EventCancelled, "", false)}
}

// endAsLocked makes e the task's outcome and writes it (the outbox's
// terminal entry). Only the first outcome counts.
func (t *task) endAsLocked(e *ending) {
	if t.end == nil {
		t.end = e
		t.emitLocked(activities.Projection{End: &activities.CompleteInput{
			Tool:          t.in.Envelope.Tool,
			Status:        e.status,
			Disposition:   e.disposition,
			Detail:        e.detail,
			ToolResult:    e.toolResult,
			StatusMessage: e.message,
			ApprovalState: e.approvalState,
			Approvals:     slices.Clone(t.approvals),
			Event:         tasks.Event{At: t.now(), Kind: e.event, Detail: e.message},
			Audit:         true,
		}})
	}
	t.phase = phaseEnded
	t.signal()
}

// The outbox (workflows/outbox.go), written as it is filled.

// emitLocked numbers one entry and writes it. Nothing is written after the
// terminal entry: the chain is sealed and the record ended.
func (t *task) emitLocked(p activities.Projection) {
	if t.endSeq != 0 {
		return
	}
	t.seq++
	p.Seq = t.seq
	if p.End != nil {
		t.endSeq = p.Seq
	}
	t.e.publish(t.id, p)
}

// emitStateLocked writes the task's current state and one timeline event.
func (t *task) emitStateLocked(ev tasks.Event) {
	ev.At = t.now()
	t.emitLocked(activities.Projection{State: &activities.RecordStateInput{
		StatusMessage: t.statusMessage(),
		ApprovalState: t.approvalState(),
		Approvals:     slices.Clone(t.approvals),
		Event:         ev,
		Status:        t.inputStatus(),
		InputRequests: t.pendingInputs(),
	}})
}

// emitAuditLocked writes one step of the task's audit chain.
func (t *task) emitAuditLocked(in activities.RecordAuditInput) {
	in.At = t.now()
	t.emitLocked(activities.Projection{Audit: &in})
}

// Notifications.

// queueNoteLocked queues a notification; a no-op for unattended tasks and
// after the end is queued.
func (t *task) queueNoteLocked(kind activities.NotifyKind) {
	if t.notes == nil || t.notes.closed {
		return
	}
	t.notes.notes = append(t.notes.notes, kind)
	t.signal()
}

// notifyLoop sends the request notification, then the queued updates, one
// at a time. A notification that keeps failing is logged (the request's is
// recorded as notify-failed); it never fails the task.
func (t *task) notifyLoop() {
	t.mu.Lock()
	defer func() {
		t.notes.done = true
		t.signal()
		t.mu.Unlock()
	}()
	for {
		if _, closed := t.awaitLocked(func() bool { return len(t.notes.notes) > 0 || t.notes.closed }, nil); closed {
			return
		}
		if len(t.notes.notes) == 0 {
			return
		}
		kind := t.notes.notes[0]
		t.notes.notes = t.notes.notes[1:]
		if kind == activities.NotifyProgress && len(t.notes.notes) > 0 {
			continue // a later notification reads a newer state anyway
		}
		t.mu.Unlock()
		var err error
		if kind == noteRequested {
			err = t.e.retry(notifyAttempts, func(ctx context.Context) error {
				return t.e.act.Notify(ctx, activities.NotifyInput{Version: activities.Version, TaskID: t.id})
			})
		} else {
			err = t.e.retry(notifyAttempts, func(ctx context.Context) error {
				return t.e.act.NotifyUpdate(ctx, activities.NotifyUpdateInput{Version: activities.Version, TaskID: t.id, Kind: kind})
			})
		}
		t.mu.Lock()
		switch {
		case kind != noteRequested:
			if err != nil {
				t.e.log.Warn("approvalstest: notifiers could not be updated", "task_id", t.id, "kind", kind, "error", err)
			}
		case err != nil:
			t.e.log.Warn("approvalstest: approvers could not be notified", "task_id", t.id, "error", err)
			t.emitStateLocked(tasks.NewEvent(tasks.EventNotifyFailed, ""))
			t.emitAuditLocked(activities.RecordAuditInput{Kind: activities.StepNotifyFailed, StepID: "notify"})
		default:
			t.emitStateLocked(tasks.NewEvent(tasks.EventNotified, ""))
			t.emitAuditLocked(activities.RecordAuditInput{Kind: activities.StepNotified, StepID: "notify"})
		}
	}
}

// Views of the state, for the read model and the answers.

func (t *task) approvedCount() int {
	n := 0
	for i, e := range t.approvals {
		if e.Decision == tasks.DecisionApprove && !t.approvedBefore(i, e.ApproverID) {
			n++
		}
	}
	return n
}

// approvedBefore reports whether approver approved among the first n
// decisions.
func (t *task) approvedBefore(n int, approver string) bool {
	for _, e := range t.approvals[:n] {
		if e.Decision == tasks.DecisionApprove && e.ApproverID == approver {
			return true
		}
	}
	return false
}

func (t *task) statusMessage() string {
	if unattended(t.in) && t.end == nil {
		switch {
		case t.input != nil && len(t.input.pending) > 0:
			return fmt.Sprintf("Waiting for the client's input (%d request(s))", len(t.input.pending))
		case t.phase == phasePending:
			return "Scheduled: " + t.in.Envelope.Tool + " runs without approval when its wait ends"
		}
		return "Running " + t.in.Envelope.Tool
	}
	switch t.phase {
	case phasePending:
		return fmt.Sprintf("Awaiting approval: %s (%d of %d)", t.in.Requirement.Reason, t.approvedCount(), t.in.Requirement.Quorum)
	case phaseApproved:
		return "Approved; re-checking policy"
	case phaseClaimed:
		return "Approved; running " + t.in.Envelope.Tool
	}
	if t.end != nil {
		return t.end.message
	}
	return ""
}

func (t *task) approvalState() tasks.ApprovalState {
	switch t.phase {
	case phasePending:
		return tasks.ApprovalPending
	case phaseApproved, phaseClaimed:
		return tasks.ApprovalApproved
	}
	if t.end != nil {
		return t.end.approvalState
	}
	return tasks.ApprovalPending
}

// inputStatus is the read-model status of an unattended task that asks for
// input: input_required while requests are pending, then working; "" (no
// change) for every other task.
func (t *task) inputStatus() tasks.Status {
	switch {
	case t.input == nil || t.end != nil:
		return ""
	case len(t.input.pending) > 0:
		return tasks.StatusInputRequired
	}
	return tasks.StatusWorking
}

// pendingInputs are the unanswered input requests, for the read model.
func (t *task) pendingInputs() map[string]json.RawMessage {
	if t.input == nil || t.end != nil || len(t.input.pending) == 0 {
		return nil
	}
	return maps.Clone(t.input.pending)
}

func (t *task) decisionResult(accepted bool, reason string) tasks.DecisionResult {
	return tasks.DecisionResult{Accepted: accepted, Reason: reason, Status: t.approvalState(),
		Approved: t.approvedCount(), Needed: t.in.Requirement.Quorum}
}
