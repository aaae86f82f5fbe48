package workflows

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/tasks"
)

// Error types of the application errors the workflow's update handlers
// return. tasks.Orchestrator surfaces them as tasks.UpdateRejected.Reason.
const (
	// ErrTypeMalformedDecision: the decision is not approve/deny, or lacks a
	// challenge ID or an assertion, or its comment is too long.
	ErrTypeMalformedDecision = "malformed_decision"
	// ErrTypeTaskNotPending: the task no longer takes decisions (decided,
	// claimed, cancelled, expired or ended).
	ErrTypeTaskNotPending = "task_not_pending"
	// ErrTypeTooManyDecisions: the task has taken [MaxDecisionAttempts]
	// decisions past validation; more would only grow its history.
	ErrTypeTooManyDecisions = "too_many_decisions"
	// ErrTypeVerificationUnavailable: the assertion could not be verified
	// (infrastructure); nothing changed and the approver may try again.
	ErrTypeVerificationUnavailable = "verification_unavailable"
	// ErrTypeInvalidInput: the workflow was started with an input it cannot
	// run; the task is failed.
	ErrTypeInvalidInput = "invalid_input"
)

// ReasonAlreadyApproved is the DecisionResult.Reason when an approver who
// already approved approves again.
const ReasonAlreadyApproved = "already_approved"

// MaxCommentLen bounds a decision's comment, in bytes.
const MaxCommentLen = 1000

// MaxDecisionAttempts bounds the decisions one task verifies (each costs
// history events), so a flood of invalid evidence cannot grow the workflow's
// history without limit. Far above any honest use: quorum ≤ a few approvers.
const MaxDecisionAttempts = 100

// NotifyDrainTimeout bounds how long an ended task waits for its last
// notifications (Slack down, retries under way) before the workflow closes.
// The task's result is written before; only the workflow's end waits.
const NotifyDrainTimeout = 10 * time.Minute

// MaxViaLen bounds an unsigned deny's channel name, in bytes.
const MaxViaLen = 64

// ExecuteTimeout is the single ExecuteTool attempt's start-to-close timeout.
// When it passes, the outcome is unknown.
const ExecuteTimeout = 5 * time.Minute

// a is the activities' method set, for references only.
var a *activities.Activities

// phase is where the task is in its state machine.
type phase int

const (
	phasePending  phase = iota // collecting decisions
	phaseApproved              // quorum reached; policy being re-evaluated
	phaseClaimed               // execution claimed; the tool runs at most once
	phaseEnded                 // outcome decided; the final record may still be being written
)

// ending is how a task ends.
type ending struct {
	status        tasks.Status
	disposition   tasks.Disposition
	approvalState tasks.ApprovalState
	event         string // timeline kind
	detail        string // outcome detail: the agent reads it in the result
	message       string // status message
	toolResult    *tasks.CallToolResult
}

// approval is the state of one Approval workflow.
type approval struct {
	in        tasks.ApprovalInput
	taskID    string
	phase     phase
	approvals []tasks.ApprovalEntry // accepted decisions, in order
	end       *ending
	written   bool       // the terminal record is written (or given up on)
	attempts  int        // decisions past the validator
	notes     *noteQueue // nil for unattended tasks: no one is notified
	input     *inputWait // unattended tasks asking their client; see unattended.go

	// mu serializes decisions and read-model writes.
	mu  workflow.Mutex
	log log.Logger
}

// Approval is the approval workflow of one held tool call. See the package
// documentation for the state machine.
func Approval(ctx workflow.Context, in tasks.ApprovalInput) (tasks.ApprovalOutcome, error) {
	taskID := workflow.GetInfo(ctx).WorkflowExecution.ID
	w := &approval{
		in:     in,
		taskID: taskID,
		mu:     workflow.NewMutex(ctx),
		log:    log.With(workflow.GetLogger(ctx), "task_id", taskID),
	}
	if err := validateInput(in, taskID); err != nil {
		w.log.Error("invalid approval input; failing the task", "error", err)
		w.endAs(&ending{
			status:        tasks.StatusFailed,
			approvalState: tasks.ApprovalFailed,
			event:         "failed",
			detail:        "The approval could not start.",
			message:       "Failed: the approval could not start",
		})
		w.finish(ctx)
		return w.outcome(), temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeInvalidInput, nil)
	}
	if err := workflow.SetUpdateHandlerWithOptions(ctx, tasks.UpdateDecide, w.decide,
		workflow.UpdateHandlerOptions{Validator: w.validateDecision}); err != nil {
		return tasks.ApprovalOutcome{}, err
	}
	if err := workflow.SetUpdateHandler(ctx, tasks.UpdateCancel, w.cancel); err != nil {
		return tasks.ApprovalOutcome{}, err
	}
	if err := w.registerInput(ctx); err != nil { // see unattended.go
		return tasks.ApprovalOutcome{}, err
	}
	if err := workflow.SetUpdateHandlerWithOptions(ctx, tasks.UpdateDenyUnsigned, w.denyUnsigned,
		workflow.UpdateHandlerOptions{Validator: w.validateUnsignedDeny}); err != nil {
		return tasks.ApprovalOutcome{}, err
	}

	w.audit(ctx, activities.RecordAuditInput{Kind: "requested", StepID: "requested", Input: &w.in})
	w.record(ctx, "requested", in.Requirement.Reason)
	if !unattended(in.Requirement) {
		// Approvers are told in order: the request, each approval, the end.
		// Disconnected: a cancelled workflow still reports its end.
		w.notes = &noteQueue{}
		nctx, _ := workflow.NewDisconnectedContext(ctx)
		workflow.Go(nctx, w.notifyLoop)
	}

	if unattended(in.Requirement) {
		w.awaitStart(ctx) // see unattended.go
	} else {
		w.awaitDecision(ctx)
	}
	if w.end == nil && w.phase == phaseApproved {
		w.reevaluateAndExecute(ctx)
	}
	w.finish(ctx)
	w.drainNotes(ctx)

	if err := workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) }); err != nil {
		w.log.Warn("stopped waiting for update handlers", "error", err)
	}
	return w.outcome(), nil
}

func validateInput(in tasks.ApprovalInput, taskID string) error {
	switch {
	case in.Version != tasks.ApprovalInputVersion:
		return fmt.Errorf("workflows: approval input version %d, want %d", in.Version, tasks.ApprovalInputVersion)
	case in.Envelope.Version != tasks.EnvelopeVersion:
		return fmt.Errorf("workflows: envelope version %d, want %d", in.Envelope.Version, tasks.EnvelopeVersion)
	case in.Envelope.TaskID != taskID:
		return errors.New("workflows: envelope task id differs from the workflow id")
	case in.Requirement.Quorum < 1 && !unattended(in.Requirement):
		return fmt.Errorf("workflows: quorum %d, want at least 1", in.Requirement.Quorum)
	case in.ExpiresAt.IsZero():
		return errors.New("workflows: no expiry time")
	}
	return nil
}

// Activity options. Every activity but ExecuteTool retries; the bounded ones
// give up and the workflow carries on (notification, intermediate read-model
// writes) or decides safely (verification, policy).
func withRetry(ctx workflow.Context, startToClose, maxInterval time.Duration, attempts int32) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: startToClose,
		RetryPolicy:         backoff(maxInterval, attempts),
	})
}

// backoff retries after 1 s, doubling up to maxInterval; attempts 0 means
// until it succeeds.
func backoff(maxInterval time.Duration, attempts int32) *temporal.RetryPolicy {
	return &temporal.RetryPolicy{
		InitialInterval:    time.Second,
		BackoffCoefficient: 2,
		MaximumInterval:    maxInterval,
		MaximumAttempts:    attempts,
	}
}

// withLocalRetry is withRetry for local activities: the short steps that
// only touch NATS KV or evaluate policy (read model, verification,
// re-evaluation, the terminal write) run in the worker inside the workflow
// task, without a round trip through the Temporal server and its three
// history events per activity. Measured with the embedded server on two
// cores, that takes the decision round trip and approval-to-execution
// latency down by a factor of two or more. Each of these activities is
// idempotent, so a local activity that runs again after a worker crash
// changes nothing twice.
func withLocalRetry(ctx workflow.Context, startToClose, maxInterval time.Duration, attempts int32) workflow.Context {
	return workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: startToClose,
		RetryPolicy:         backoff(maxInterval, attempts),
	})
}

func recordCtx(ctx workflow.Context) workflow.Context {
	return withLocalRetry(ctx, 10*time.Second, 10*time.Second, 5)
}

func notifyCtx(ctx workflow.Context) workflow.Context {
	return withRetry(ctx, 30*time.Second, 30*time.Second, 5)
}

func verifyCtx(ctx workflow.Context) workflow.Context {
	// An approver waits on the answer: a few quick attempts.
	return withLocalRetry(ctx, 15*time.Second, 2*time.Second, 3)
}

func reevaluateCtx(ctx workflow.Context) workflow.Context {
	return withLocalRetry(ctx, 30*time.Second, 30*time.Second, 5)
}

func completeCtx(ctx workflow.Context) workflow.Context {
	// The terminal record must land: retry until the store is back.
	return withLocalRetry(ctx, 30*time.Second, time.Minute, 0)
}

func executeCtx(ctx workflow.Context) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: ExecuteTimeout,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 1},
	})
}

// awaitDecision waits until the task leaves pending or ExpiresAt passes.
func (w *approval) awaitDecision(ctx workflow.Context) {
	left := func() bool { return w.phase != phasePending }
	ok := left()
	if remaining := w.in.ExpiresAt.Sub(workflow.Now(ctx)); !ok && remaining > 0 {
		var err error
		ok, err = workflow.AwaitWithTimeout(ctx, remaining, left)
		if err != nil && !ok {
			// The workflow itself was cancelled (not tasks/cancel): end the
			// task as cancelled, writing with a context that still works.
			w.log.Warn("workflow cancelled while pending", "error", err)
			w.endAs(cancelledEnding())
			return
		}
	}
	if !ok {
		w.endAs(denied("expired", "Approval expired.", "Approval expired", tasks.ApprovalExpired))
	}
}

func (w *approval) reevaluateAndExecute(ctx workflow.Context) {
	var re activities.ReevaluateOutput
	err := workflow.ExecuteLocalActivity(reevaluateCtx(ctx), a.Reevaluate, activities.ReevaluateInput{
		Version:   activities.Version,
		Envelope:  w.in.Envelope,
		Approvals: slices.Clone(w.approvals),
		At:        workflow.Now(ctx),
	}).Get(ctx, &re)
	if w.end != nil {
		return // cancelled while policy was being evaluated
	}
	if ctx.Err() != nil {
		w.endAs(cancelledEnding()) // the workflow itself was cancelled
		return
	}
	if err != nil {
		w.log.Error("policy could not be evaluated; denying", "error", err)
		w.endAs(denied("denied", "The policy could not be evaluated.", "Denied: policy could not be evaluated", tasks.ApprovalDenied))
		return
	}
	if !re.Allow {
		w.log.Info("policy denied on re-evaluation", "decision", re.Effect, "policy_version", re.PolicyVersion)
		w.endAs(denied("denied", "Denied by policy on re-evaluation: "+re.Reason, "Denied by policy: "+re.Reason, tasks.ApprovalDenied))
		w.audit(ctx, activities.RecordAuditInput{Kind: "reevaluated", StepID: "reevaluated", Policy: &re})
		return
	}

	// The execution claim. It is taken in the same step as the last check
	// for a cancel, expiry or denial (nothing above yields since the
	// re-evaluation returned), so claim and cancel exclude each other: from
	// here on cancel is refused and the tool is called once at most.
	w.phase = phaseClaimed
	// A claimed call is carried through, with its records, even if the
	// workflow itself is cancelled meanwhile (SEP-2848): on a cancelled
	// context the activity would never be scheduled and the task would
	// wrongly end outcome-unknown.
	ctx, _ = workflow.NewDisconnectedContext(ctx)
	w.log.Info("execution claimed", "policy_version", re.PolicyVersion)
	w.audit(ctx, activities.RecordAuditInput{Kind: "reevaluated", StepID: "reevaluated", Policy: &re})
	w.record(ctx, "claimed", "policy allowed ("+re.PolicyVersion+")")
	w.audit(ctx, activities.RecordAuditInput{Kind: "claimed", StepID: "claimed", Policy: &re})

	var out activities.ExecuteToolOutput
	err = workflow.ExecuteActivity(executeCtx(ctx), a.ExecuteTool, activities.ExecuteToolInput{
		Version:  activities.Version,
		Envelope: w.in.Envelope,
	}).Get(ctx, &out)
	w.endAs(w.executed(out, err))
}

// executed classifies the single ExecuteTool attempt.
func (w *approval) executed(out activities.ExecuteToolOutput, err error) *ending {
	tool := w.in.Envelope.Tool
	if err == nil {
		res := out.Result
		if unattended(w.in.Requirement) {
			return unattendedEnding(tool, res) // see unattended.go
		}
		if res.IsError {
			return &ending{status: tasks.StatusCompleted, disposition: tasks.ExecutionError, approvalState: tasks.ApprovalFailed,
				event: "execution-error", message: "Approved; " + tool + " ran and returned an error", toolResult: &res}
		}
		return &ending{status: tasks.StatusCompleted, disposition: tasks.ApprovedExecuted, approvalState: tasks.ApprovalExecuted,
			event: "executed", message: "Approved; " + tool + " ran once", toolResult: &res}
	}
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		switch appErr.Type() {
		case activities.ErrTypeEnvelopeMismatch:
			w.log.Error("envelope does not match its action hash; tool not run", "error", err)
			return denied("denied", "The held call no longer matches what was approved.", "Denied: stale envelope", tasks.ApprovalDenied)
		case activities.ErrTypeToolProtocolError:
			w.log.Warn("tool failed with a protocol error; it did not act", "error", err)
			return protocolErrorEnding(tool, appErr)
		case activities.ErrTypeUnknownTool:
			w.log.Error("tool not available; not run", "error", err)
			return denied("denied", "The tool is not available.", "Denied: tool not available", tasks.ApprovalDenied)
		}
	}
	w.log.Error("execution outcome unknown", "error", err)
	return &ending{status: tasks.StatusCompleted, disposition: tasks.OutcomeUnknown, approvalState: tasks.ApprovalFailed,
		event: "outcome-unknown", message: "Outcome unknown: " + tool + " was started but did not report back"}
}

func denied(event, detail, message string, state tasks.ApprovalState) *ending {
	return &ending{status: tasks.StatusCompleted, disposition: tasks.DeniedNotExecuted, approvalState: state,
		event: event, detail: detail, message: message}
}

func cancelledEnding() *ending {
	return &ending{status: tasks.StatusCancelled, approvalState: tasks.ApprovalCancelled,
		event: "cancelled", message: "Cancelled before execution"}
}

// endAs makes e the task's outcome. Only the first outcome counts.
func (w *approval) endAs(e *ending) {
	if w.end == nil {
		w.end = e
	}
	w.phase = phaseEnded
}

// finish writes the terminal record of w.end, which every path to it has
// set. It runs on a disconnected context so a cancelled workflow still writes
// its end.
func (w *approval) finish(ctx workflow.Context) {
	e := w.end
	ctx, _ = workflow.NewDisconnectedContext(ctx)
	if err := w.mu.Lock(ctx); err != nil {
		w.log.Error("could not lock for the final record", "error", err)
	} else {
		err := workflow.ExecuteLocalActivity(completeCtx(ctx), a.Complete, activities.CompleteInput{
			Version:       activities.Version,
			TaskID:        w.taskID,
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
		}).Get(ctx, nil)
		w.mu.Unlock()
		if err != nil {
			w.log.Error("final record not written", "error", err)
		}
	}
	w.written = true
	w.log.Info("task ended", "status", e.status, "disposition", e.disposition)
}

func (w *approval) outcome() tasks.ApprovalOutcome {
	if w.end == nil {
		return tasks.ApprovalOutcome{Status: tasks.StatusWorking}
	}
	return tasks.ApprovalOutcome{Status: w.end.status, Disposition: w.end.disposition}
}

// notify tells the approvers. A notification that keeps failing is logged
// and noted in the timeline; it never fails the task.
func (w *approval) notify(ctx workflow.Context) {
	err := workflow.ExecuteActivity(notifyCtx(ctx), a.Notify, activities.NotifyInput{
		Version: activities.Version,
		TaskID:  w.taskID,
	}).Get(ctx, nil)
	if err != nil {
		w.log.Warn("approvers could not be notified", "error", err)
		w.record(ctx, "notify-failed", "approvers could not be notified")
		w.audit(ctx, activities.RecordAuditInput{Kind: "notify-failed", StepID: "notify"})
		return
	}
	w.record(ctx, "notified", "")
	w.audit(ctx, activities.RecordAuditInput{Kind: "notified", StepID: "notify"})
}

// noteQueue orders the notifications of one task: requested first, then each
// accepted approval, then the end, one activity at a time, so a notifier
// never sees an older state after a newer one.
type noteQueue struct {
	kinds  []activities.NotifyKind
	closed bool // the end is queued; nothing follows
	done   bool // the loop has sent everything
}

// queueNote queues a notification; a no-op for unattended tasks.
func (w *approval) queueNote(kind activities.NotifyKind) {
	if w.notes == nil || w.notes.closed {
		return
	}
	w.notes.kinds = append(w.notes.kinds, kind)
}

// notifyLoop sends the request notification, then the queued updates. A
// notification that keeps failing is logged; it never fails the task.
func (w *approval) notifyLoop(ctx workflow.Context) {
	defer func() { w.notes.done = true }()
	w.notify(ctx)
	for {
		if err := workflow.Await(ctx, func() bool { return len(w.notes.kinds) > 0 || w.notes.closed }); err != nil {
			return
		}
		if len(w.notes.kinds) == 0 {
			return
		}
		kind := w.notes.kinds[0]
		w.notes.kinds = w.notes.kinds[1:]
		if kind == activities.NotifyProgress && len(w.notes.kinds) > 0 {
			continue // a later notification reads a newer state anyway
		}
		err := workflow.ExecuteActivity(notifyCtx(ctx), a.NotifyUpdate, activities.NotifyUpdateInput{
			Version: activities.Version,
			TaskID:  w.taskID,
			Kind:    kind,
		}).Get(ctx, nil)
		if err != nil {
			w.log.Warn("notifiers could not be updated", "kind", kind, "error", err)
		}
	}
}

// drainNotes queues the end notification and waits, at most
// NotifyDrainTimeout, until it is sent.
func (w *approval) drainNotes(ctx workflow.Context) {
	if w.notes == nil {
		return
	}
	w.queueNote(activities.NotifyResolved)
	w.notes.closed = true
	ctx, _ = workflow.NewDisconnectedContext(ctx)
	ok, err := workflow.AwaitWithTimeout(ctx, NotifyDrainTimeout, func() bool { return w.notes.done })
	if !ok {
		w.log.Warn("gave up waiting for the last notifications", "error", err)
	}
}

// record writes the current state and one timeline event to the read model.
func (w *approval) record(ctx workflow.Context, kind, detail string) {
	if err := w.mu.Lock(ctx); err != nil {
		return
	}
	defer w.mu.Unlock()
	w.recordLocked(ctx, kind, detail)
}

// recordLocked is record with w.mu held. A failed write is logged: the read
// model catches up with the next one, and the terminal write retries until
// it lands.
func (w *approval) recordLocked(ctx workflow.Context, kind, detail string) {
	if w.written {
		return
	}
	err := workflow.ExecuteLocalActivity(recordCtx(ctx), a.RecordState, activities.RecordStateInput{
		Version:       activities.Version,
		TaskID:        w.taskID,
		StatusMessage: w.statusMessage(),
		ApprovalState: w.approvalState(),
		Approvals:     slices.Clone(w.approvals),
		Event:         tasks.Event{At: workflow.Now(ctx), Kind: kind, Detail: detail},
		Status:        w.inputStatus(),
		InputRequests: w.pendingInputs(),
	}).Get(ctx, nil)
	if err != nil {
		w.log.Warn("read model not updated", "event", kind, "error", err)
	}
}

func (w *approval) approvedCount() int {
	n := 0
	for i, e := range w.approvals {
		if e.Decision == tasks.DecisionApprove && !w.approvedBefore(i, e.ApproverID) {
			n++
		}
	}
	return n
}

// approvedBefore reports whether approver approved among the first n decisions.
func (w *approval) approvedBefore(n int, approver string) bool {
	for _, e := range w.approvals[:n] {
		if e.Decision == tasks.DecisionApprove && e.ApproverID == approver {
			return true
		}
	}
	return false
}

func (w *approval) statusMessage() string {
	if unattended(w.in.Requirement) && w.end == nil {
		return w.unattendedStatus()
	}
	switch w.phase {
	case phasePending:
		return fmt.Sprintf("Awaiting approval: %s (%d of %d)", w.in.Requirement.Reason, w.approvedCount(), w.in.Requirement.Quorum)
	case phaseApproved:
		return "Approved; re-checking policy"
	case phaseClaimed:
		return "Approved; running " + w.in.Envelope.Tool
	default:
		if w.end != nil {
			return w.end.message
		}
		return ""
	}
}

func (w *approval) approvalState() tasks.ApprovalState {
	switch w.phase {
	case phasePending:
		return tasks.ApprovalPending
	case phaseApproved, phaseClaimed:
		return tasks.ApprovalApproved
	default:
		if w.end != nil {
			return w.end.approvalState
		}
		return tasks.ApprovalPending
	}
}

// validateDecision rejects, without writing history, decisions that are
// malformed or arrive when the task no longer takes them. It must not change
// any state.
func (w *approval) validateDecision(_ workflow.Context, d tasks.DecisionUpdate) error {
	switch {
	case d.Decision != tasks.DecisionApprove && d.Decision != tasks.DecisionDeny:
		return temporal.NewApplicationError("decision must be approve or deny", ErrTypeMalformedDecision)
	case d.ChallengeID == "":
		return temporal.NewApplicationError("decision has no challenge id", ErrTypeMalformedDecision)
	case noResponse(d.Response):
		return temporal.NewApplicationError("decision has no passkey assertion", ErrTypeMalformedDecision)
	case len(d.Comment) > MaxCommentLen:
		return temporal.NewApplicationError(fmt.Sprintf("comment longer than %d bytes", MaxCommentLen), ErrTypeMalformedDecision)
	}
	return w.takesDecisions()
}

// takesDecisions rejects a decision when the task is no longer pending or
// has verified its quota of decisions.
func (w *approval) takesDecisions() error {
	if err := w.pendingErr(); err != nil {
		return err
	}
	if w.attempts >= MaxDecisionAttempts {
		return temporal.NewApplicationError("too many decisions for this task", ErrTypeTooManyDecisions)
	}
	return nil
}

// noResponse reports an absent assertion: empty, blank or JSON null (how an
// unset field arrives).
func noResponse(r json.RawMessage) bool {
	r = bytes.TrimSpace(r)
	return len(r) == 0 || string(r) == "null"
}

func (w *approval) pendingErr() error {
	if w.phase == phasePending {
		return nil
	}
	return temporal.NewApplicationError("task is no longer pending ("+string(w.approvalState())+")", ErrTypeTaskNotPending)
}

func (w *approval) decisionResult(accepted bool, reason string) tasks.DecisionResult {
	return tasks.DecisionResult{
		Accepted: accepted,
		Reason:   reason,
		Status:   w.approvalState(),
		Approved: w.approvedCount(),
		Needed:   w.in.Requirement.Quorum,
	}
}

// decide handles one approver decision. Decisions are processed one at a
// time; a deny answers once the task's end is written, so the approver's page
// and tasks/get agree.
func (w *approval) decide(ctx workflow.Context, d tasks.DecisionUpdate) (tasks.DecisionResult, error) {
	w.attempts++
	if err := w.mu.Lock(ctx); err != nil {
		return tasks.DecisionResult{}, err
	}
	res, err := w.decideLocked(ctx, d)
	w.mu.Unlock()
	if err == nil && res.Accepted && d.Decision == tasks.DecisionDeny {
		if err := workflow.Await(ctx, func() bool { return w.written }); err != nil {
			return tasks.DecisionResult{}, err
		}
		res = w.decisionResult(true, "")
	}
	return res, err
}

func (w *approval) decideLocked(ctx workflow.Context, d tasks.DecisionUpdate) (tasks.DecisionResult, error) {
	// The task may have moved on while this update waited for the lock.
	if err := w.pendingErr(); err != nil {
		return tasks.DecisionResult{}, err
	}
	var v activities.VerifyDecisionOutput
	err := workflow.ExecuteLocalActivity(verifyCtx(ctx), a.VerifyDecision, activities.VerifyDecisionInput{
		Version:     activities.Version,
		Envelope:    w.in.Envelope,
		Requirement: w.in.Requirement,
		ChallengeID: d.ChallengeID,
		Decision:    d.Decision,
		Method:      d.Method,
		Response:    d.Response,
		ConsumerKey: workflow.GetCurrentUpdateInfo(ctx).ID,
	}).Get(ctx, &v)
	if err != nil {
		w.log.Error("decision could not be verified", "decision", d.Decision, "error", err)
		return tasks.DecisionResult{}, temporal.NewApplicationError("the decision could not be verified; try again", ErrTypeVerificationUnavailable)
	}
	// ... or while the assertion was being verified (cancel, expiry).
	if err := w.pendingErr(); err != nil {
		return tasks.DecisionResult{}, err
	}
	if !v.Accepted {
		w.log.Info("decision rejected", "decision", d.Decision, "reason", v.Reason)
		w.recordLocked(ctx, "rejected-decision", "rejected decision: "+v.Reason)
		w.auditDecisionLocked(ctx, d, v, false, v.Reason)
		return w.decisionResult(false, v.Reason), nil
	}
	if d.Decision == tasks.DecisionApprove && w.approvedBefore(len(w.approvals), v.ApproverID) {
		w.log.Info("decision rejected", "decision", d.Decision, "reason", ReasonAlreadyApproved, "approver_id", v.ApproverID)
		w.recordLocked(ctx, "rejected-decision", "rejected decision: "+ReasonAlreadyApproved)
		w.auditDecisionLocked(ctx, d, v, false, ReasonAlreadyApproved)
		return w.decisionResult(false, ReasonAlreadyApproved), nil
	}
	w.approvals = append(w.approvals, tasks.ApprovalEntry{
		ApproverID:   v.ApproverID,
		ApproverName: v.ApproverName,
		CredentialID: v.CredentialID,
		Decision:     d.Decision,
		At:           workflow.Now(ctx),
	})
	w.log.Info("decision accepted", "decision", d.Decision, "approver_id", v.ApproverID)
	w.auditDecisionLocked(ctx, d, v, true, "")

	if d.Decision == tasks.DecisionDeny {
		detail := "Denied by " + v.ApproverName + "."
		if d.Comment != "" {
			detail = "Denied by " + v.ApproverName + ": " + d.Comment
		}
		w.endAs(denied("denied", detail, detail, tasks.ApprovalDenied))
		return w.decisionResult(true, ""), nil
	}
	n := w.approvedCount()
	if n >= w.in.Requirement.Quorum {
		w.phase = phaseApproved
	}
	w.recordLocked(ctx, "approval", fmt.Sprintf("approved by %s (%d of %d)", v.ApproverName, n, w.in.Requirement.Quorum))
	w.queueNote(activities.NotifyProgress)
	return w.decisionResult(true, ""), nil
}

// validateUnsignedDeny rejects, without writing history, an unsigned deny
// that is malformed or arrives when the task no longer takes decisions.
func (w *approval) validateUnsignedDeny(_ workflow.Context, d tasks.UnsignedDenial) error {
	switch {
	case d.ApproverID == "" || d.ApproverName == "":
		return temporal.NewApplicationError("an unsigned deny must name its approver", ErrTypeMalformedDecision)
	case d.Via == "" || len(d.Via) > MaxViaLen:
		return temporal.NewApplicationError("an unsigned deny must name its channel", ErrTypeMalformedDecision)
	case len(d.Comment) > MaxCommentLen:
		return temporal.NewApplicationError(fmt.Sprintf("comment longer than %d bytes", MaxCommentLen), ErrTypeMalformedDecision)
	}
	return w.takesDecisions()
}

// denyUnsigned ends a pending task as denied on the word of an approver whom
// another channel (Slack) authenticated, without a passkey. It can only stop
// the call. The denial is recorded with the approver, the channel and the
// time; it answers once the end is written.
func (w *approval) denyUnsigned(ctx workflow.Context, d tasks.UnsignedDenial) (tasks.DecisionResult, error) {
	w.attempts++
	if err := w.mu.Lock(ctx); err != nil {
		return tasks.DecisionResult{}, err
	}
	if err := w.pendingErr(); err != nil {
		w.mu.Unlock()
		return tasks.DecisionResult{}, err
	}
	w.approvals = append(w.approvals, tasks.ApprovalEntry{
		ApproverID:   d.ApproverID,
		ApproverName: d.ApproverName,
		Decision:     tasks.DecisionDeny,
		At:           workflow.Now(ctx),
	})
	detail := "Denied by " + d.ApproverName + " via " + d.Via + " (without a passkey)."
	if d.Comment != "" {
		detail = "Denied by " + d.ApproverName + " via " + d.Via + " (without a passkey): " + d.Comment
	}
	w.log.Info("unsigned deny accepted", "approver_id", d.ApproverID, "via", d.Via)
	w.auditLocked(ctx, activities.RecordAuditInput{Kind: "decision", StepID: "decision/" + workflow.GetCurrentUpdateInfo(ctx).ID,
		Decision: &activities.AuditDecision{Decision: tasks.DecisionDeny, Accepted: true, Comment: d.Comment,
			ApproverID: d.ApproverID, ApproverName: d.ApproverName, Via: d.Via}})
	w.endAs(denied("denied", detail, detail, tasks.ApprovalDenied))
	w.mu.Unlock()
	if err := workflow.Await(ctx, func() bool { return w.written }); err != nil {
		return tasks.DecisionResult{}, err
	}
	return w.decisionResult(true, ""), nil
}

// cancel handles tasks/cancel. Before the execution claim it ends the task as
// cancelled; after it, or once the task has another end, it says so.
func (w *approval) cancel(ctx workflow.Context, _ struct{}) (tasks.CancelResult, error) {
	switch w.phase {
	case phasePending, phaseApproved:
		w.log.Info("task cancelled")
		w.endAs(cancelledEnding())
	case phaseClaimed:
		return tasks.CancelResult{Cancelled: false, Status: tasks.StatusWorking}, nil
	}
	// Answer once the end is written, so tasks/get agrees with the answer.
	if err := workflow.Await(ctx, func() bool { return w.written }); err != nil {
		return tasks.CancelResult{}, err
	}
	return tasks.CancelResult{Cancelled: w.end.status == tasks.StatusCancelled, Status: w.end.status}, nil
}
