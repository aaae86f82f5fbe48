package approvalstest

import (
	"context"
	"sync"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/tasks"
)

// Recording is an approvals.Engine that keeps the workflow inputs it
// starts, then hands each start to the engine it wraps.
type Recording struct {
	approvals.Engine
	mu     sync.Mutex
	inputs []tasks.ApprovalInput
}

// Start records in and starts it with the wrapped engine.
func (r *Recording) Start(ctx context.Context, in tasks.ApprovalInput) error {
	r.mu.Lock()
	r.inputs = append(r.inputs, in)
	r.mu.Unlock()
	return r.Engine.Start(ctx, in)
}

// Inputs returns the inputs started so far, in order.
func (r *Recording) Inputs() []tasks.ApprovalInput {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]tasks.ApprovalInput(nil), r.inputs...)
}
