package tasks

import (
	"context"
	"time"
)

// UpdateDenyUnsigned is the workflow update that denies a task without a
// passkey assertion. Only a deny takes this path: a deny can only stop a
// call, never run one. The caller (the Slack interactivity endpoint) has
// authenticated the approver by other means and names them; the workflow
// records who denied, through what, and when.
const UpdateDenyUnsigned = "deny-unsigned"

// UnsignedDenial is a deny that carries no passkey assertion.
type UnsignedDenial struct {
	ApproverID   string `json:"approverId"`
	ApproverName string `json:"approverName"`
	// Via names the channel that authenticated the approver, e.g.
	// "slack:U012AB3CD".
	Via     string    `json:"via"`
	Comment string    `json:"comment,omitempty"`
	At      time.Time `json:"at"` // when the channel received it (informational)
}

// DenyUnsigned delivers an unsigned deny and waits for the workflow's answer.
// A task that no longer takes decisions answers *UpdateRejected with reason
// task_not_pending, or ErrWorkflowGone.
func (o *Orchestrator) DenyUnsigned(ctx context.Context, taskID string, d UnsignedDenial) (DecisionResult, error) {
	var res DecisionResult
	err := o.update(ctx, taskID, UpdateDenyUnsigned, d, &res)
	return res, err
}
