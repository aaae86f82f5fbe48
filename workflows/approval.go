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
// The edges read them through the same constants in tasks, the vocabulary
// next to the task model.
const (
	// ErrTypeMalformedDecision: the decision is not approve/deny, or lacks a
	// challenge ID or an assertion, or its comment is too long.
	ErrTypeMalformedDecision = tasks.ErrTypeMalformedDecision
	// ErrTypeTaskNotPending: the task no longer takes decisions (decided,
	// claimed, cancelled, expired or ended).
	ErrTypeTaskNotPending = tasks.ErrTypeTaskNotPending
	// ErrTypeTooManyDecisions: the task has taken [MaxDecisionAttempts]
	// decisions past validation; more would only grow its history.
	ErrTypeTooManyDecisions = tasks.ErrTypeTooManyDecisions
	// ErrTypeVerificationUnavailable: the assertion could not be verified
	// (infrastructure); nothing changed and the approver may try again.
	ErrTypeVerificationUnavailable = tasks.ErrTypeVerificationUnavailable
	// ErrTypeInvalidInput: the workflow was started with an input it cannot
	// run; the task is failed.
	ErrTypeInvalidInput = "invalid_input"
)

// ReasonAlreadyApproved is the DecisionResult.Reason when an approver who
// already approved approves again.
const ReasonAlreadyApproved = tasks.ReasonAlreadyApproved

// MaxCommentLen bounds a decision's comment, in bytes.
const MaxCommentLen = 1000

// MaxDecisionAttempts bounds the decisions one task verifies (each costs
// history events). Only evidence that passed the edge's check (a signature
// of an enrolled, eligible approver) reaches the workflow, so invalid
// decisions do not spend it. Far above any honest use.
const MaxDecisionAttempts = 100

// MaxRecordedRejections bounds the rejected decisions one task records in
// its timeline and audit chain; later ones are refused and logged, never
// recorded, so a flood of invalid evidence cannot grow the chain or the
// history without limit. It is never a budget that valid decisions share.
const MaxRecordedRejections = tasks.MaxRecordedRejections

// NotifyDrainTimeout bounds how long an ended task waits for its last
// notifications (Slack down, retries under way) before the workflow closes.
// The task's result is written before; only the workflow's end waits.
const NotifyDrainTimeout = 10 * time.Minute

// MaxViaLen bounds an unsigned deny's channel name, in bytes.
const MaxViaLen = 64

// MaxReasonLen bounds a recorded rejection's reason and challenge ID, in bytes.
const MaxReasonLen = 128

// ExecuteTimeout is the single ExecuteTool attempt's start-to-close timeout.
// When it passes, the outcome is unknown. An upstream's configured timeout
// may not exceed it (internal/config.MaxTimeout; a test in internal/app
// keeps the two equal).
const ExecuteTimeout = 5 * time.Minute

// DefaultExecuteHeartbeatTimeout is the ExecuteTool attempt's heartbeat
// timeout unless [Options] say otherwise. The attempt heartbeats while the
// tool runs (activities.Activities.ExecuteTool), so a slow tool on a live
// worker is never cut off by it; when no heartbeat arrives for this long,
// the worker running the call is gone (killed, its host lost, cut off from
// Temporal), the attempt fails and the task ends outcome-unknown, without
// waiting out ExecuteTimeout.
const DefaultExecuteHeartbeatTimeout = 30 * time.Second

// Options are a worker's settings of the approval workflow. They shape only
// activity options, which the history records when an activity is
// scheduled and a replay does not compare, so workers with different
// Options can share a task queue and replay each other's histories.
type Options struct {
	// ExecuteHeartbeatTimeout is ExecuteTool's heartbeat timeout; zero is
	// DefaultExecuteHeartbeatTimeout. It must be below ExecuteTimeout.
	ExecuteHeartbeatTimeout time.Duration
}

// Validate reports Options a worker must not run with.
func (o Options) Validate() error {
	if o.ExecuteHeartbeatTimeout < 0 || o.ExecuteHeartbeatTimeout >= ExecuteTimeout {
		return fmt.Errorf("workflows: execute heartbeat timeout %s must be from 0 (the default, %s) to below %s",
			o.ExecuteHeartbeatTimeout, DefaultExecuteHeartbeatTimeout, ExecuteTimeout)
	}
	return nil
}

func (o Options) executeHeartbeatTimeout() time.Duration {
	if o.ExecuteHeartbeatTimeout <= 0 {
		return DefaultExecuteHeartbeatTimeout
	}
	return o.ExecuteHeartbeatTimeout
}

// changeFirstTask names the change, recorded with workflow.GetVersion,
// after which the first workflow task does its work before the outbox takes
// a batch: the approvers' request notice runs inside it as a local activity
// (approval mode), and a verified call's facts up to its claim go out in one
// Publish. Before it, the first task published the request, a Notify
// activity followed, then another Publish: three workflow tasks and three
// activities where one activity and two tasks do.
//
// The request notice states no decision: the task was requested by the
// committed start, and the notice reads the record written before the start.
// A discarded first task may send it twice; the notifiers are idempotent per
// task (a repeat updates the message). Its outcome, notified or
// notify-failed, is a fact of the committed task and goes through the
// outbox like any other.
const (
	changeFirstTask  = "first-task-before-outbox"
	versionFirstTask = 1
)

// versionFirstBatchLocal, the second version of changeFirstTask: an
// approval-mode task's first outbox batch, when it states no decision (the
// request and the request notice's outcome, nothing else: requestOnly), is
// written by a local activity inside the first workflow task instead of a
// Publish activity that needs a second workflow task. The first task then
// commits the start's whole work at once, as a bare waiting workflow does:
// one workflow task, no activity, for a gated call. (A version of the same
// change, not a change of its own: each GetVersion marker also upserts a
// search attribute, one more visibility write per task.)
//
// Those facts are true from the committed start on: the request is the
// start, and the notice's outcome is what the notifier did (it may have
// done it twice, from a discarded first task, and says so idempotently).
// A discarded first task may write them again: Publish is idempotent per
// entry. A batch that holds anything else, and any batch after the first
// (but the end of versionEndLocal, below), goes through the Publish
// activity as before, so no decision or outcome is ever written before the
// workflow task that decides it commits. If the local activity fails, the
// same batch goes through the activity.
const versionFirstBatchLocal = 2

// versionEndLocal, the third version of changeFirstTask: the terminal
// batch of a task whose end follows from its ExecuteTool attempt alone
// (the tool's result, its error, or the attempt's timeout) is written by a
// local activity inside the workflow task that reads that outcome, and the
// workflow completes in the same task. Before it, the end went through a
// Publish activity and one more workflow task: a verified call took three
// workflow tasks and three activities, now two of each.
//
// That end states nothing the committed history does not already hold: the
// attempt's outcome is an event committed before the workflow task that
// reads it, and after the claim no update can change the end (a cancel is
// refused, a decision has nothing to decide). A discarded task, retried,
// reads the same event and decides the same end, and the terminal write
// happens once. Only a batch that holds the end alone goes this way (an
// entry an update produced in the same task waits for the task to commit);
// if the local activity fails, the batch goes through the activity.
const versionEndLocal = 3

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
	event         tasks.EventKind // timeline kind
	detail        string          // outcome detail: the agent reads it in the result
	message       string          // status message
	toolResult    *tasks.CallToolResult
}

// approval is the state of one Approval workflow.
type approval struct {
	in        tasks.ApprovalInput
	opts      Options
	taskID    string
	phase     phase
	approvals []tasks.ApprovalEntry // accepted decisions, in order
	end       *ending
	out       outbox     // facts to write to the read model and audit chain; see outbox.go
	attempts  int        // decisions past the validator
	rejected  int        // rejected decisions recorded
	refused   bool       // a cancel after the claim is recorded
	notes     *noteQueue // nil for unattended tasks: no one is notified
	input     *inputWait // unattended tasks asking their client; see unattended.go

	// mu serializes decisions: each is verified and counted before the next.
	mu  workflow.Mutex
	log log.Logger
}

// Approval is the approval workflow of one held tool call, with the default
// [Options]. See the package documentation for the state machine.
func Approval(ctx workflow.Context, in tasks.ApprovalInput) (tasks.ApprovalOutcome, error) {
	return Options{}.Approval(ctx, in)
}

// Approval is the approval workflow with these Options; a worker registers
// the method value (workflows.Options{…}.Approval) under
// tasks.WorkflowName.
func (o Options) Approval(ctx workflow.Context, in tasks.ApprovalInput) (tasks.ApprovalOutcome, error) {
	// An input from before tasks.Mode existed reads as it always did.
	in = in.Normalized()
	taskID := workflow.GetInfo(ctx).WorkflowExecution.ID
	w := &approval{
		in:     in,
		opts:   o,
		taskID: taskID,
		mu:     workflow.NewMutex(ctx),
		log:    log.With(workflow.GetLogger(ctx), "task_id", taskID),
	}
	// The outbox writer runs from the start, on a disconnected context: a
	// cancelled workflow still writes its end.
	pctx, _ := workflow.NewDisconnectedContext(ctx)
	workflow.Go(pctx, w.publishLoop)
	if err := validateInput(in, taskID); err != nil {
		w.log.Error("invalid approval input; failing the task", "error", err)
		w.endAs(&ending{
			status:        tasks.StatusFailed,
			approvalState: tasks.ApprovalFailed,
			event:         tasks.EventFailed,
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
	if err := workflow.SetUpdateHandlerWithOptions(ctx, tasks.UpdateRecordRejection, w.recordRejection,
		workflow.UpdateHandlerOptions{Validator: w.validateRejection}); err != nil {
		return tasks.ApprovalOutcome{}, err
	}

	// Since versionFirstTask, the first workflow task does its work before
	// the outbox takes a batch (see firstTask), so the task's first facts
	// go out in one Publish.
	version := workflow.GetVersion(ctx, changeFirstTask, workflow.DefaultVersion, versionEndLocal)
	firstTask := version >= versionFirstTask
	w.out.firstLocal = version >= versionFirstBatchLocal && in.Mode == tasks.ModeApproval
	w.out.endLocal = version >= versionEndLocal
	w.out.hold = firstTask
	w.emitAudit(ctx, activities.RecordAuditInput{Kind: activities.StepRequested, StepID: "requested", Input: &w.in})
	w.emitState(ctx, tasks.NewEvent(tasks.EventRequested, in.Requirement.Reason))
	if in.Mode == tasks.ModeApproval {
		// Approvers are told in order: the request, each approval, the end.
		// Disconnected: a cancelled workflow still reports its end.
		w.notes = &noteQueue{}
		if firstTask {
			// The request notice goes out from inside the first workflow
			// task (a local activity), before the outbox batch; see
			// firstTask.
			w.notify(ctx, true)
			w.out.hold = false
		} else {
			// Before versionFirstTask: the request notification went out
			// once the request was in the read model and the audit chain.
			w.notes.notes = []note{{kind: noteRequested, seq: w.out.seq}}
		}
		nctx, _ := workflow.NewDisconnectedContext(ctx)
		workflow.Go(nctx, w.notifyLoop)
	}
	if in.Mode != tasks.ModeVerified {
		w.out.hold = false
	}

	switch in.Mode {
	case tasks.ModeUnattended:
		w.awaitStart(ctx) // see unattended.go
	case tasks.ModeVerified:
		w.acceptVerified(ctx) // see verified.go
	default:
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
	}
	switch in.Mode {
	case tasks.ModeApproval:
		switch {
		case in.Requirement.Quorum < 1:
			return fmt.Errorf("workflows: quorum %d, want at least 1", in.Requirement.Quorum)
		case in.ExpiresAt.IsZero():
			return errors.New("workflows: no expiry time")
		case !in.StartAt.IsZero():
			return errors.New("workflows: an approval has no start time")
		}
	case tasks.ModeUnattended:
		switch {
		case in.Requirement.Quorum != 0 || in.Requirement.Group != "":
			return fmt.Errorf("workflows: an unattended task has approvers (group %q, quorum %d)", in.Requirement.Group, in.Requirement.Quorum)
		case in.StartAt.IsZero():
			return errors.New("workflows: an unattended task has no start time")
		}
	case tasks.ModeVerified:
		switch {
		case in.Verified == nil || in.Verified.ApproverID == "":
			return errors.New("workflows: a verified task has no verified approval")
		case in.Requirement.Quorum != 1 || in.Requirement.Group != "":
			return fmt.Errorf("workflows: a verified task has group %q, quorum %d", in.Requirement.Group, in.Requirement.Quorum)
		}
	default:
		return fmt.Errorf("workflows: unknown mode %q", in.Mode)
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

// withLocalRetry is withRetry for local activities. Only steps that state
// nothing run as local activities: verification (its one write, the
// challenge consume, is keyed by the update ID, so a workflow task that is
// discarded and retried gets the same answer), re-evaluation (a read), the
// request notice, the first outbox batch when it holds only the request
// and the notice's outcome (changeFirstTask, versionFirstBatchLocal), and
// the terminal batch of an end that follows from the ExecuteTool attempt
// alone (versionEndLocal).
// A local activity runs inside a workflow task, before that task commits,
// so anything that states a decision or an outcome is published through the
// outbox instead (outbox.go).
func withLocalRetry(ctx workflow.Context, startToClose, maxInterval time.Duration, attempts int32) workflow.Context {
	return workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: startToClose,
		RetryPolicy:         backoff(maxInterval, attempts),
	})
}

// publishLocalCtx runs a Publish inside a workflow task (the first batch,
// versionFirstBatchLocal; the end after the tool, versionEndLocal): a few
// quick attempts, then the batch goes through the Publish activity, whose
// retries never end.
func publishLocalCtx(ctx workflow.Context) workflow.Context {
	return withLocalRetry(ctx, 5*time.Second, time.Second, 3)
}

func notifyCtx(ctx workflow.Context) workflow.Context {
	return withRetry(ctx, 30*time.Second, 30*time.Second, 5)
}

// notifyLocalCtx is notifyCtx for the request notice sent from inside the
// first workflow task: the same attempts, run by the worker that holds the
// task.
func notifyLocalCtx(ctx workflow.Context) workflow.Context {
	return withLocalRetry(ctx, 30*time.Second, 30*time.Second, 5)
}

func verifyCtx(ctx workflow.Context) workflow.Context {
	// An approver waits on the answer: a few quick attempts.
	return withLocalRetry(ctx, 15*time.Second, 2*time.Second, 3)
}

func reevaluateCtx(ctx workflow.Context) workflow.Context {
	return withLocalRetry(ctx, 30*time.Second, 30*time.Second, 5)
}

// executeCtx runs the one ExecuteTool attempt: never retried (after the
// claim, a second attempt could run the tool twice), failed when its
// worker stops heartbeating.
func (w *approval) executeCtx(ctx workflow.Context) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: ExecuteTimeout,
		HeartbeatTimeout:    w.opts.executeHeartbeatTimeout(),
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
		w.endAs(denied(tasks.EventExpired, "Approval expired.", tasks.OutcomeText(tasks.EventExpired, w.in.Envelope.Tool, true), tasks.ApprovalExpired))
	}
}

func (w *approval) reevaluateAndExecute(ctx workflow.Context) {
	var re activities.ReevaluateOutput
	err := workflow.ExecuteLocalActivity(reevaluateCtx(ctx), a.Reevaluate, activities.ReevaluateInput{
		Version:   activities.Version,
		Envelope:  w.in.Envelope,
		Approvals: slices.Clone(w.approvals),
		At:        workflow.Now(ctx),
		Verified:  w.in.Mode == tasks.ModeVerified,
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
		w.endAs(denied(tasks.EventDenied, "The policy could not be evaluated.", "Denied: policy could not be evaluated", tasks.ApprovalDenied))
		return
	}
	if !re.Allow {
		w.log.Info("policy denied on re-evaluation", "decision", re.Effect, "policy_version", re.PolicyVersion)
		w.emitAudit(ctx, activities.RecordAuditInput{Kind: activities.StepReevaluated, StepID: "reevaluated", Policy: &re})
		w.endAs(denied(tasks.EventDenied, "Denied by policy on re-evaluation: "+re.Reason, "Denied by policy: "+re.Reason, tasks.ApprovalDenied))
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
	w.emitAudit(ctx, activities.RecordAuditInput{Kind: activities.StepReevaluated, StepID: "reevaluated", Policy: &re})
	w.emitState(ctx, tasks.ClaimedEvent(re.PolicyVersion))
	w.emitAudit(ctx, activities.RecordAuditInput{Kind: activities.StepClaimed, StepID: "claimed", Policy: &re})

	w.out.hold = false // the first task's facts (a verified call's) go out with the tool
	var out activities.ExecuteToolOutput
	err = workflow.ExecuteActivity(w.executeCtx(ctx), a.ExecuteTool, activities.ExecuteToolInput{
		Version:  activities.Version,
		Envelope: w.in.Envelope,
	}).Get(ctx, &out)
	// The end follows from the attempt's committed outcome alone unless
	// something ended the task first (versionEndLocal).
	w.out.endFromHistory = w.end == nil
	w.endAs(w.executed(out, err))
}

// executed classifies the single ExecuteTool attempt.
func (w *approval) executed(out activities.ExecuteToolOutput, err error) *ending {
	tool := w.in.Envelope.Tool
	if err == nil {
		res := out.Result
		if unattended(w.in) {
			return unattendedEnding(tool, res) // see unattended.go
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
			w.log.Error("envelope does not match its action hash; tool not run", "error", err)
			return denied(tasks.EventDenied, "The held call no longer matches what was approved.", "Denied: stale envelope", tasks.ApprovalDenied)
		case activities.ErrTypeToolProtocolError:
			w.log.Warn("tool failed with a protocol error; it did not act", "error", err)
			return protocolErrorEnding(tool, appErr)
		case activities.ErrTypeUnknownTool:
			w.log.Error("tool not available; not run", "error", err)
			return unavailableEnding(appErr)
		case activities.ErrTypeExecutionNotClaimed:
			w.log.Error("execution not claimed in the task's record; tool not run", "error", err)
			return notClaimedEnding(appErr)
		}
	}
	w.log.Error("execution outcome unknown", "error", err)
	return &ending{status: tasks.StatusCompleted, disposition: tasks.OutcomeUnknown, approvalState: tasks.ApprovalFailed,
		event: tasks.EventOutcomeUnknown, message: tasks.OutcomeText(tasks.EventOutcomeUnknown, tool, true)}
}

// notClaimedEnding is the end of a task whose ExecuteTool could not take
// its record's execution fence: the task is failed, and the tool did not
// run. The usual cause is a start judged failed (its task already failed in
// the read model) that reached the Temporal server late all the same; the
// end then states what the record already says.
func notClaimedEnding(appErr *temporal.ApplicationError) *ending {
	return &ending{status: tasks.StatusFailed, approvalState: tasks.ApprovalFailed,
		event: tasks.EventFailed, detail: appErr.Message(), message: appErr.Message()}
}

// unavailableEnding is the end of a task whose tool ExecuteTool did not
// run because it is not available: gone from the registry, or no longer the
// tool the envelope pins, which the error's detail explains
// (activities.ErrTypeUnknownTool).
func unavailableEnding(appErr *temporal.ApplicationError) *ending {
	var changed string
	if appErr.HasDetails() && appErr.Details(&changed) == nil && changed != "" {
		return denied(tasks.EventDenied, changed, "Denied: the tool changed", tasks.ApprovalDenied)
	}
	return denied(tasks.EventDenied, "The tool is not available.", "Denied: tool not available", tasks.ApprovalDenied)
}

func denied(event tasks.EventKind, detail, message string, state tasks.ApprovalState) *ending {
	return &ending{status: tasks.StatusCompleted, disposition: tasks.DeniedNotExecuted, approvalState: state,
		event: event, detail: detail, message: message}
}

func cancelledEnding() *ending {
	return &ending{status: tasks.StatusCancelled, approvalState: tasks.ApprovalCancelled,
		event: tasks.EventCancelled, message: tasks.OutcomeText(tasks.EventCancelled, "", false)}
}

// endAs makes e the task's outcome. Only the first outcome counts.
func (w *approval) endAs(e *ending) {
	if w.end == nil {
		w.end = e
	}
	w.phase = phaseEnded
}

// finish queues the terminal write of w.end, which every path to it has
// set, and waits until it is written. It waits on a disconnected context so
// a cancelled workflow still writes its end.
func (w *approval) finish(ctx workflow.Context) {
	e := w.end
	seq := w.emitEnd(ctx)
	w.out.hold = false
	ctx, _ = workflow.NewDisconnectedContext(ctx)
	if err := w.awaitPublished(ctx, seq); err != nil {
		w.log.Error("final record not written", "error", err)
	}
	w.log.Info("task ended", "status", e.status, "disposition", e.disposition)
}

func (w *approval) outcome() tasks.ApprovalOutcome {
	if w.end == nil {
		return tasks.ApprovalOutcome{Status: tasks.StatusWorking}
	}
	return tasks.ApprovalOutcome{Status: w.end.status, Disposition: w.end.disposition}
}

// notify tells the approvers. A notification that keeps failing is logged
// and noted in the timeline; it never fails the task. local runs it as a
// local activity, inside the current workflow task (versionFirstTask).
func (w *approval) notify(ctx workflow.Context, local bool) {
	in := activities.NotifyInput{Version: activities.Version, TaskID: w.taskID}
	var err error
	if local {
		err = workflow.ExecuteLocalActivity(notifyLocalCtx(ctx), a.Notify, in).Get(ctx, nil)
	} else {
		err = workflow.ExecuteActivity(notifyCtx(ctx), a.Notify, in).Get(ctx, nil)
	}
	if err != nil {
		w.log.Warn("approvers could not be notified", "error", err)
		w.emitState(ctx, tasks.NewEvent(tasks.EventNotifyFailed, ""))
		w.emitAudit(ctx, activities.RecordAuditInput{Kind: activities.StepNotifyFailed, StepID: "notify"})
		return
	}
	w.emitState(ctx, tasks.NewEvent(tasks.EventNotified, ""))
	w.emitAudit(ctx, activities.RecordAuditInput{Kind: activities.StepNotified, StepID: "notify"})
}

// noteQueue orders the notifications of one task: requested first, then each
// accepted approval, then the end, one activity at a time, so a notifier
// never sees an older state after a newer one.
type noteQueue struct {
	notes  []note
	closed bool // the end is queued; nothing follows
	done   bool // the loop has sent everything
}

// noteRequested queues the request notification (the Notify activity);
// the other kinds are NotifyUpdate's.
const noteRequested activities.NotifyKind = "requested"

// note is one queued notification. A notifier reads the read model when it
// runs, so a note waits until the outbox has written up to seq, the state it
// announces.
type note struct {
	kind activities.NotifyKind
	seq  int64
}

// queueNote queues a notification of the state the outbox has queued so
// far; a no-op for unattended tasks.
func (w *approval) queueNote(kind activities.NotifyKind) {
	if w.notes == nil || w.notes.closed {
		return
	}
	w.notes.notes = append(w.notes.notes, note{kind: kind, seq: w.out.seq})
}

// notifyLoop sends the request notification, then the queued updates. A
// notification that keeps failing is logged; it never fails the task.
func (w *approval) notifyLoop(ctx workflow.Context) {
	defer func() { w.notes.done = true }()
	for {
		if err := workflow.Await(ctx, func() bool { return len(w.notes.notes) > 0 || w.notes.closed }); err != nil {
			return
		}
		if len(w.notes.notes) == 0 {
			return
		}
		n := w.notes.notes[0]
		w.notes.notes = w.notes.notes[1:]
		kind := n.kind
		if kind == activities.NotifyProgress && len(w.notes.notes) > 0 {
			continue // a later notification reads a newer state anyway
		}
		if err := w.awaitPublished(ctx, n.seq); err != nil {
			return
		}
		if kind == noteRequested {
			w.notify(ctx, false)
			continue
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
	if unattended(w.in) && w.end == nil {
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
func (w *approval) validateDecision(ctx workflow.Context, d tasks.DecisionUpdate) error {
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
	return w.takesDecisions(ctx)
}

// takesDecisions rejects a decision when the task is no longer pending, has
// reached its expiry (an approval's), or has verified its quota of decisions. The expiry is
// read from the clock, not only from the phase: the timer that expires the
// task fires a little after ExpiresAt (Temporal's timer queue, a worker
// catching up), and a decision that arrives in between must not count. A
// validator does not run on replay, so this changes no history.
func (w *approval) takesDecisions(ctx workflow.Context) error {
	if err := w.pendingErr(); err != nil {
		return err
	}
	if !w.in.ExpiresAt.IsZero() && !workflow.Now(ctx).Before(w.in.ExpiresAt) {
		return temporal.NewApplicationError("task is no longer pending (expired)", ErrTypeTaskNotPending)
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
// time. The answer waits until what the decision changed is written, so the
// approver's page, tasks/get and the audit chain agree with it; a deny
// answers once the task's end is written.
func (w *approval) decide(ctx workflow.Context, d tasks.DecisionUpdate) (tasks.DecisionResult, error) {
	w.attempts++
	if err := w.mu.Lock(ctx); err != nil {
		return tasks.DecisionResult{}, err
	}
	res, err := w.decideLocked(ctx, d)
	seq := w.out.seq
	w.mu.Unlock()
	if err != nil {
		return res, err
	}
	if res.Accepted && d.Decision == tasks.DecisionDeny {
		if err := workflow.Await(ctx, w.ended); err != nil {
			return tasks.DecisionResult{}, err
		}
		return w.decisionResult(true, ""), nil
	}
	if err := w.awaitPublished(ctx, seq); err != nil {
		return tasks.DecisionResult{}, err
	}
	return res, nil
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
		w.emitRejection(ctx, d.Decision, d.ChallengeID, v.Reason)
		return w.decisionResult(false, v.Reason), nil
	}
	if d.Decision == tasks.DecisionApprove && w.approvedBefore(len(w.approvals), v.ApproverID) {
		w.log.Info("decision rejected", "decision", d.Decision, "reason", ReasonAlreadyApproved, "approver_id", v.ApproverID)
		w.emitRejection(ctx, d.Decision, d.ChallengeID, ReasonAlreadyApproved)
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
	w.emitAudit(ctx, activities.RecordAuditInput{Kind: activities.StepDecision, StepID: "decision/" + workflow.GetCurrentUpdateInfo(ctx).ID,
		Decision: &activities.AuditDecision{Decision: d.Decision, Accepted: true, ChallengeID: d.ChallengeID, Comment: d.Comment,
			ApproverID: v.ApproverID, ApproverName: v.ApproverName, Assertion: v.Assertion}})

	if d.Decision == tasks.DecisionDeny {
		detail := "Denied by " + v.ApproverName + "."
		if d.Comment != "" {
			detail = "Denied by " + v.ApproverName + ": " + d.Comment
		}
		w.endAs(denied(tasks.EventDenied, detail, detail, tasks.ApprovalDenied))
		return w.decisionResult(true, ""), nil
	}
	n := w.approvedCount()
	if n >= w.in.Requirement.Quorum {
		w.phase = phaseApproved
	}
	w.emitState(ctx, tasks.ApprovalEvent(v.ApproverName, n, w.in.Requirement.Quorum))
	w.queueNote(activities.NotifyProgress)
	return w.decisionResult(true, ""), nil
}

// emitRejection records a rejected decision in the timeline and the audit
// chain, up to [MaxRecordedRejections] per task.
func (w *approval) emitRejection(ctx workflow.Context, decision, challengeID, reason string) {
	if w.rejected >= MaxRecordedRejections {
		w.log.Warn("rejected decision not recorded: too many for this task", "reason", reason)
		return
	}
	w.rejected++
	w.emitState(ctx, tasks.RejectedDecisionEvent(reason))
	w.emitAudit(ctx, activities.RecordAuditInput{Kind: activities.StepDecision,
		StepID:   "decision/" + workflow.GetCurrentUpdateInfo(ctx).ID,
		Decision: &activities.AuditDecision{Decision: decision, Accepted: false, Reason: reason, ChallengeID: challengeID}})
}

// validateRejection refuses, without writing history, a rejection to
// record when the task no longer takes decisions or has recorded its quota.
func (w *approval) validateRejection(_ workflow.Context, r tasks.RejectedDecision) error {
	switch {
	case r.Reason == "" || len(r.Reason) > MaxReasonLen || len(r.ChallengeID) > MaxReasonLen:
		return temporal.NewApplicationError("a rejection needs a reason", ErrTypeMalformedDecision)
	case r.Decision != tasks.DecisionApprove && r.Decision != tasks.DecisionDeny:
		return temporal.NewApplicationError("decision must be approve or deny", ErrTypeMalformedDecision)
	case w.rejected >= MaxRecordedRejections:
		return temporal.NewApplicationError("this task has recorded its quota of rejected decisions", ErrTypeTooManyDecisions)
	}
	return w.pendingErr()
}

// recordRejection records a decision the edge rejected before it reached
// the workflow (invalid evidence: see tasks.Orchestrator.RecordRejection).
// It changes nothing but the timeline and the audit chain.
func (w *approval) recordRejection(ctx workflow.Context, r tasks.RejectedDecision) error {
	if w.pendingErr() != nil {
		return nil
	}
	w.emitRejection(ctx, r.Decision, r.ChallengeID, r.Reason)
	return w.awaitPublished(ctx, w.out.seq)
}

// validateUnsignedDeny rejects, without writing history, an unsigned deny
// that is malformed or arrives when the task no longer takes decisions.
func (w *approval) validateUnsignedDeny(ctx workflow.Context, d tasks.UnsignedDenial) error {
	switch {
	case d.ApproverID == "" || d.ApproverName == "":
		return temporal.NewApplicationError("an unsigned deny must name its approver", ErrTypeMalformedDecision)
	case d.Via == "" || len(d.Via) > MaxViaLen:
		return temporal.NewApplicationError("an unsigned deny must name its channel", ErrTypeMalformedDecision)
	case len(d.Comment) > MaxCommentLen:
		return temporal.NewApplicationError(fmt.Sprintf("comment longer than %d bytes", MaxCommentLen), ErrTypeMalformedDecision)
	}
	return w.takesDecisions(ctx)
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
	w.emitAudit(ctx, activities.RecordAuditInput{Kind: activities.StepDecision, StepID: "decision/" + workflow.GetCurrentUpdateInfo(ctx).ID,
		Decision: &activities.AuditDecision{Decision: tasks.DecisionDeny, Accepted: true, Comment: d.Comment,
			ApproverID: d.ApproverID, ApproverName: d.ApproverName, Via: d.Via}})
	w.endAs(denied(tasks.EventDenied, detail, detail, tasks.ApprovalDenied))
	w.mu.Unlock()
	if err := workflow.Await(ctx, w.ended); err != nil {
		return tasks.DecisionResult{}, err
	}
	return w.decisionResult(true, ""), nil
}

// cancel handles tasks/cancel. Before the execution claim it ends the task as
// cancelled; after it, or once the task has another end, it says so. A
// cancel refused after the claim is recorded (once) in the timeline and the
// audit chain, as refused.
func (w *approval) cancel(ctx workflow.Context, _ struct{}) (tasks.CancelResult, error) {
	switch w.phase {
	case phasePending, phaseApproved:
		w.log.Info("task cancelled")
		w.endAs(cancelledEnding())
	case phaseClaimed:
		if !w.refused {
			w.refused = true
			w.emitState(ctx, tasks.NewEvent(tasks.EventCancelRefused, ""))
			w.emitAudit(ctx, activities.RecordAuditInput{Kind: activities.StepCancelRefused, StepID: "cancel-refused"})
		}
		if err := w.awaitPublished(ctx, w.out.seq); err != nil {
			return tasks.CancelResult{}, err
		}
		return tasks.CancelResult{Cancelled: false, Status: tasks.StatusWorking}, nil
	}
	// Answer once the end is written, so tasks/get agrees with the answer.
	if err := workflow.Await(ctx, w.ended); err != nil {
		return tasks.CancelResult{}, err
	}
	return tasks.CancelResult{Cancelled: w.end.status == tasks.StatusCancelled, Status: w.end.status}, nil
}
