// Package approvalstest is an in-memory approvals.Engine for the adapters'
// tests: the MCP endpoint, the approver API and the notifiers run over the
// real approvals.Service and task store without Temporal.
package approvalstest

import (
	"context"
	"errors"
	"time"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/tasks"
)

// Options configures an [Engine].
type Options struct {
	// Activities are the side effects the engine runs as the workflow
	// would: verification, policy re-evaluation, tool execution and the
	// read-model writes. Tasks (the store) is required; Passkeys is needed
	// for decisions, Tools for calls that run, PDP for re-evaluation (nil:
	// re-evaluation allows).
	Activities *activities.Activities
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Engine is an in-memory stand-in for the approval workflow.
type Engine struct{}

// New returns an engine. Close stops its timers.
func New(opts Options) *Engine { panic("approvalstest: not implemented yet") }

// Close stops every task's timers; tasks still waiting stay as they are.
func (e *Engine) Close() {}

// FailNextStart makes the next Start return err; started says whether the
// workflow exists all the same (Running answers it).
func (e *Engine) FailNextStart(err error, started bool) {}

// Start implements approvals.Engine.
func (e *Engine) Start(ctx context.Context, in tasks.ApprovalInput) error {
	return errors.New("not implemented")
}

// Running implements approvals.Engine.
func (e *Engine) Running(ctx context.Context, taskID string) (bool, error) {
	return false, errors.New("not implemented")
}

// Decide implements approvals.Engine.
func (e *Engine) Decide(ctx context.Context, taskID string, d tasks.DecisionUpdate) (tasks.DecisionResult, error) {
	return tasks.DecisionResult{}, errors.New("not implemented")
}

// RecordRejection implements approvals.Engine.
func (e *Engine) RecordRejection(ctx context.Context, taskID string, r tasks.RejectedDecision) error {
	return errors.New("not implemented")
}

// DenyUnsigned implements approvals.Engine.
func (e *Engine) DenyUnsigned(ctx context.Context, taskID string, d tasks.UnsignedDenial) (tasks.DecisionResult, error) {
	return tasks.DecisionResult{}, errors.New("not implemented")
}

// Cancel implements approvals.Engine.
func (e *Engine) Cancel(ctx context.Context, taskID string) (tasks.CancelResult, error) {
	return tasks.CancelResult{}, errors.New("not implemented")
}

// ProvideInput implements approvals.Engine.
func (e *Engine) ProvideInput(ctx context.Context, taskID string, in tasks.InputUpdate) (tasks.InputResult, error) {
	return tasks.InputResult{}, errors.New("not implemented")
}
