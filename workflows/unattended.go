package workflows

import (
	"encoding/json"
	"fmt"
	"maps"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/countersign/countersign/tasks"
)

// Unattended tasks (tasks.ModeUnattended): a call that policy allowed on an
// asynchronous tool (a conformance fixture, gateway/conformance) runs in this
// workflow without approval. Its requirement has no approver group and
// quorum 0, and it starts at StartAt. Until then tasks/cancel ends it
// cancelled; then policy is re-evaluated and the tool runs once, exactly as
// after an approval. An input from before the mode existed is normalized
// first (tasks.ApprovalInput.Normalized).
//
// unattended reports a (normalized) input that runs without approvers.
func unattended(in tasks.ApprovalInput) bool {
	return in.Mode == tasks.ModeUnattended
}

// awaitStart waits, cancellably, until the unattended task's start time,
// then moves it on as if approved.
func (w *approval) awaitStart(ctx workflow.Context) {
	left := func() bool { return w.phase != phasePending }
	start := w.in.StartAt
	if w.input != nil {
		// First the client's answers (tasks/update), then the wait.
		answered := func() bool { return len(w.input.pending) == 0 || left() }
		ok, err := workflow.AwaitWithTimeout(ctx, InputWaitTimeout, answered)
		switch {
		case err != nil && !ok:
			w.log.Warn("workflow cancelled while waiting for input", "error", err)
			w.endAs(cancelledEnding())
			return
		case left():
			return // cancelled
		case !ok:
			w.endAs(&ending{status: tasks.StatusFailed, approvalState: tasks.ApprovalExpired, event: tasks.EventExpired,
				detail: "The client did not answer the task's input requests in time.", message: "Failed: input not provided in time"})
			return
		}
		// encoding/json writes map keys sorted: deterministic.
		b, err := json.Marshal(w.input.answers) //workflowcheck:ignore
		if err != nil {
			w.endAs(&ending{status: tasks.StatusFailed, approvalState: tasks.ApprovalFailed, event: tasks.EventFailed,
				detail: "The answers could not be encoded.", message: "Failed: invalid input"})
			return
		}
		w.in.Envelope.InputResponses = b
		start = workflow.Now(ctx).Add(w.in.Requirement.TTL)
	}
	if remaining := start.Sub(workflow.Now(ctx)); remaining > 0 {
		ok, err := workflow.AwaitWithTimeout(ctx, remaining, left)
		if err != nil && !ok {
			w.log.Warn("workflow cancelled while waiting to start", "error", err)
			w.endAs(cancelledEnding())
			return
		}
	}
	if w.phase == phasePending {
		w.phase = phaseApproved
	}
}

// unattendedStatus is the status message of an unattended task before it
// ends.
func (w *approval) unattendedStatus() string {
	if w.input != nil && len(w.input.pending) > 0 {
		return fmt.Sprintf("Waiting for the client's input (%d request(s))", len(w.input.pending))
	}
	if w.phase == phasePending {
		return "Scheduled: " + w.in.Envelope.Tool + " runs without approval when its wait ends"
	}
	return "Running " + w.in.Envelope.Tool
}

// protocolErrorEnding is the end of a tool that failed with a protocol
// error: the task is failed (SEP-2663: "failed" is for JSON-RPC errors), the
// tool did not act.
func protocolErrorEnding(tool string, appErr *temporal.ApplicationError) *ending {
	return &ending{status: tasks.StatusFailed, approvalState: tasks.ApprovalFailed,
		event: tasks.EventFailed, detail: appErr.Message(), message: tasks.OutcomeText(tasks.EventFailed, tool, false)}
}

// unattendedEnding is the end of an unattended task whose tool ran: no
// disposition, because nothing was approved, so the task's result is the
// tool's own result, exactly as a synchronous allowed call returns it.
func unattendedEnding(tool string, res tasks.CallToolResult) *ending {
	message := tasks.OutcomeText(tasks.EventExecuted, tool, false)
	if res.IsError {
		message = tasks.OutcomeText(tasks.EventExecutionError, tool, false)
	}
	return &ending{status: tasks.StatusCompleted, approvalState: tasks.ApprovalExecuted,
		event: tasks.EventExecuted, message: message, toolResult: &res}
}

// InputWaitTimeout bounds how long an unattended task waits for its client's
// answers; then it fails.
const InputWaitTimeout = 24 * time.Hour

// ErrTypeNotWaitingForInput rejects (without history) answers for a task that
// is not waiting for any.
const ErrTypeNotWaitingForInput = tasks.ErrTypeNotWaitingForInput

// inputWait is an unattended task's input requests (SEP-2322) and the
// answers so far.
type inputWait struct {
	pending map[string]json.RawMessage // unanswered requests, by ID
	answers map[string]json.RawMessage
}

// registerInput sets up the input requests of an unattended task that has
// any, and the update that answers them (tasks/update).
func (w *approval) registerInput(ctx workflow.Context) error {
	if !unattended(w.in) || len(w.in.InputRequests) == 0 {
		return nil
	}
	w.input = &inputWait{pending: maps.Clone(w.in.InputRequests), answers: map[string]json.RawMessage{}}
	return workflow.SetUpdateHandlerWithOptions(ctx, tasks.UpdateInput, w.provideInput,
		workflow.UpdateHandlerOptions{Validator: w.validateInputUpdate})
}

func (w *approval) validateInputUpdate(_ workflow.Context, u tasks.InputUpdate) error {
	if w.phase != phasePending || len(w.input.pending) == 0 {
		return temporal.NewApplicationError("the task is not waiting for input", ErrTypeNotWaitingForInput)
	}
	return nil
}

// provideInput records the answers to pending requests (others are
// ignored) and answers once the read model shows what is still pending.
func (w *approval) provideInput(ctx workflow.Context, u tasks.InputUpdate) (tasks.InputResult, error) {
	n := 0
	for _, id := range workflow.DeterministicKeys(u.Responses) {
		answer := u.Responses[id]
		if _, ok := w.input.pending[id]; ok && w.phase == phasePending {
			w.input.answers[id] = answer
			delete(w.input.pending, id)
			n++
		}
	}
	if n > 0 {
		seq := w.emitState(ctx, tasks.NewEvent(tasks.EventInput, fmt.Sprintf("%d input request(s) answered, %d pending", n, len(w.input.pending))))
		if err := w.awaitPublished(ctx, seq); err != nil {
			return tasks.InputResult{}, err
		}
	}
	return tasks.InputResult{Pending: len(w.input.pending)}, nil
}

// inputStatus is the read model status of an unattended task that asks for
// input: input_required while requests are pending, then working; "" (no
// change) for every other task.
func (w *approval) inputStatus() tasks.Status {
	switch {
	case w.input == nil || w.end != nil:
		return ""
	case len(w.input.pending) > 0:
		return tasks.StatusInputRequired
	default:
		return tasks.StatusWorking
	}
}

// pendingInputs are the unanswered input requests, for the read model.
func (w *approval) pendingInputs() map[string]json.RawMessage {
	if w.input == nil || w.end != nil || len(w.input.pending) == 0 {
		return nil
	}
	return maps.Clone(w.input.pending)
}
