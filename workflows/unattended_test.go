package workflows_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/tasks"
	"github.com/countersign/countersign/workflows"
)

// unattendedHarness is a harness for an allowed call to an asynchronous
// tool, as mcpserver starts it: ModeUnattended, no approver group, quorum 0,
// starting after wait.
func unattendedHarness(t *testing.T, wait time.Duration) *harness {
	h := newHarness(t, 0)
	h.in.Mode = tasks.ModeUnattended
	h.in.Requirement = tasks.Requirement{Quorum: 0, TTL: wait, Reason: "allowed by policy; runs asynchronously without approval"}
	h.in.ExpiresAt = t0.Add(wait)
	h.in.StartAt = t0.Add(wait)
	return h
}

// TestUnattendedInputShapes starts the workflow with the input the previous
// code wrote (no mode: quorum 0 and no group meant unattended, ExpiresAt
// meant the start time) and with the explicit shape; both run unattended,
// once, at their start time.
func TestUnattendedInputShapes(t *testing.T) {
	tests := []struct {
		name  string
		shape func(in *tasks.ApprovalInput)
		want  time.Time
	}{
		{"previous shape", func(in *tasks.ApprovalInput) { in.Mode, in.StartAt = "", time.Time{} }, t0.Add(2 * time.Second)},
		{"explicit mode and start", func(in *tasks.ApprovalInput) { in.ExpiresAt = t0.Add(time.Hour) }, t0.Add(2 * time.Second)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := unattendedHarness(t, 2*time.Second)
			tt.shape(&h.in)

			out, err := h.run()
			require.NoError(t, err)
			require.Equal(t, tasks.ApprovalOutcome{Status: tasks.StatusCompleted}, out, "nothing was approved: no disposition")
			require.Equal(t, 1, h.executeCalls())
			require.Empty(t, h.verifies)
			require.Len(t, h.reevals, 1)
			require.Equal(t, tt.want, h.reevals[0].At, "it runs at its start time")
			c := h.complete()
			require.Empty(t, c.Disposition)
			require.NotNil(t, c.ToolResult, "the tool's own result is the task's result")
			h.env.AssertActivityNumberOfCalls(t, "Notify", 0)
		})
	}
}

func TestUnattendedRunsOnceAfterItsWait(t *testing.T) {
	h := unattendedHarness(t, 2*time.Second)

	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.ApprovalOutcome{Status: tasks.StatusCompleted}, out, "nothing was approved: no disposition")
	require.Equal(t, 1, h.executeCalls(), "ExecuteTool must run exactly once")
	require.Empty(t, h.verifies, "no approval is verified")
	require.Len(t, h.reevals, 1, "policy is re-evaluated before the run")
	require.Empty(t, h.reevals[0].Approvals)
	require.Equal(t, t0.Add(2*time.Second), h.reevals[0].At, "it runs when the wait ends, not before")
	c := h.complete()
	require.Equal(t, tasks.StatusCompleted, c.Status)
	require.Empty(t, c.Disposition)
	require.NotNil(t, c.ToolResult, "the tool's own result is the task's result")
}

func TestUnattendedCancelDuringWait(t *testing.T) {
	h := unattendedHarness(t, time.Minute)
	u := h.cancelAt(10*time.Second, "upd-cancel")

	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.ApprovalOutcome{Status: tasks.StatusCancelled}, out)
	require.Equal(t, tasks.CancelResult{Cancelled: true, Status: tasks.StatusCancelled}, cancelResult(t, u))
	require.Zero(t, h.executeCalls(), "a cancelled task never runs")
	require.Empty(t, h.reevals)
	require.Equal(t, t0.Add(10*time.Second), h.complete().Event.At)
}

func TestUnattendedReevaluationDenies(t *testing.T) {
	h := unattendedHarness(t, time.Second)
	h.reevaluate = func(activities.ReevaluateInput) (activities.ReevaluateOutput, error) {
		return activities.ReevaluateOutput{Version: activities.Version, Effect: "deny", Reason: "policy changed", PolicyVersion: "sha256:new"}, nil
	}

	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.ApprovalOutcome{Status: tasks.StatusCompleted, Disposition: tasks.DeniedNotExecuted}, out)
	require.Zero(t, h.executeCalls())
}

func TestToolProtocolErrorFailsTheTask(t *testing.T) {
	h := unattendedHarness(t, time.Second)
	h.execute = func(activities.ExecuteToolInput) (activities.ExecuteToolOutput, error) {
		return activities.ExecuteToolOutput{}, temporal.NewNonRetryableApplicationError(
			"the job failed", activities.ErrTypeToolProtocolError, nil, int64(-32603))
	}

	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.StatusFailed, out.Status)
	require.Empty(t, out.Disposition)
	c := h.complete()
	require.Equal(t, tasks.StatusFailed, c.Status)
	require.Nil(t, c.ToolResult)
	require.Equal(t, 1, h.executeCalls())
}

func TestQuorumZeroWithAGroupStaysInvalid(t *testing.T) {
	h := newHarness(t, 0) // group "approvers", quorum 0: a policy mistake, never "no approval"
	_, err := h.run()
	require.ErrorContains(t, err, "quorum 0")
	require.Equal(t, tasks.StatusFailed, h.complete().Status)
	require.Zero(t, h.executeCalls())
}

func (h *harness) inputAt(at time.Duration, updateID string, responses map[string]string) *updateOutcome {
	u := &updateOutcome{}
	in := tasks.InputUpdate{Responses: map[string]json.RawMessage{}}
	for k, v := range responses {
		in.Responses[k] = json.RawMessage(v)
	}
	h.env.RegisterDelayedCallback(func() {
		h.env.UpdateWorkflow(tasks.UpdateInput, updateID, u.callbacks(), in)
	}, at)
	return u
}

func TestUnattendedWaitsForEveryInputThenRuns(t *testing.T) {
	h := unattendedHarness(t, time.Second)
	h.in.InputRequests = map[string]json.RawMessage{
		"a": json.RawMessage(`{"method":"elicitation/create"}`),
		"b": json.RawMessage(`{"method":"elicitation/create"}`),
	}
	early := h.inputAt(time.Minute, "upd-1", map[string]string{"a": `{"action":"accept"}`, "zzz": `{}`})
	late := h.inputAt(time.Hour, "upd-2", map[string]string{"b": `{"action":"decline"}`})
	after := h.inputAt(time.Hour+500*time.Millisecond, "upd-3", map[string]string{"b": `{}`}) // during the delay

	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.StatusCompleted, out.Status)
	require.Equal(t, 1, h.executeCalls())
	require.JSONEq(t, `{"a":{"action":"accept"},"b":{"action":"decline"}}`, string(h.executes[0].Envelope.InputResponses),
		"the tool runs with every answer and nothing else")
	require.Equal(t, t0.Add(time.Hour+time.Second), h.reevals[0].At, "the delay starts once every request is answered")
	require.Equal(t, tasks.InputResult{Pending: 1}, early.result)
	require.Equal(t, tasks.InputResult{Pending: 0}, late.result)
	require.True(t, after.done)
	require.Error(t, after.rejected, "a task that no longer waits rejects answers")

	// The read model saw input_required with both, then one, then working.
	var statuses []tasks.Status
	var pending []int
	for _, r := range h.records {
		statuses = append(statuses, r.Status)
		pending = append(pending, len(r.InputRequests))
	}
	require.Equal(t, tasks.StatusInputRequired, statuses[0])
	require.Equal(t, 2, pending[0])
	require.Contains(t, pending, 1, "a partial answer is recorded")
	last := len(statuses) - 1
	require.Equal(t, tasks.StatusWorking, statuses[last], "once answered the task is working")
	require.Zero(t, pending[last])
	for i := 1; i < len(pending); i++ {
		require.LessOrEqual(t, pending[i], pending[i-1], "answers only ever shrink the pending requests")
	}
}

func TestUnattendedInputNeverComes(t *testing.T) {
	h := unattendedHarness(t, time.Second)
	h.in.InputRequests = map[string]json.RawMessage{"a": json.RawMessage(`{}`)}

	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.StatusFailed, out.Status)
	require.Zero(t, h.executeCalls())
	require.Equal(t, t0.Add(workflows.InputWaitTimeout), h.complete().Event.At)
}
