package tasks

import (
	"context"
	"encoding/json"
)

// UpdateInput is the workflow update that delivers a client's answers to an
// input_required task's input requests (SEP-2663 tasks/update with
// inputResponses). Only unattended tasks (allowed by policy, no approvers)
// ask their client for input: an approval never waits on the caller.
const UpdateInput = "input"

// InputUpdate carries answers keyed by input request ID. Answers to IDs the
// task is not waiting for are ignored.
type InputUpdate struct {
	Responses map[string]json.RawMessage `json:"responses"`
}

// InputResult answers an [InputUpdate]: the requests still unanswered.
type InputResult struct {
	Pending int `json:"pending"`
}

// ProvideInput delivers answers and waits until the workflow has recorded
// them, so a tasks/get that follows sees the remaining requests.
func (o *Orchestrator) ProvideInput(ctx context.Context, taskID string, in InputUpdate) (InputResult, error) {
	var res InputResult
	err := o.update(ctx, taskID, UpdateInput, in, &res)
	return res, err
}
