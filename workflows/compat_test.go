package workflows_test

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"

	"github.com/countersign/countersign/tasks"
)

// The histories in testdata/compat were written by the code on main before
// the approvals service (commit f964e8f), with the workflow input as the MCP
// endpoint built it then (no mode, no start time; an unattended task was
// quorum 0 with its start in ExpiresAt), each up to the point its name says:
//
//   - approval-pending: quorum 2, one approval counted, one rejected
//     decision recorded, waiting for the second approver;
//   - approval-executed: approved and executed;
//   - approval-cancelled: cancelled while waiting;
//   - unattended-pending: waiting for its start;
//   - unattended-ran: started and ran.
//
// A worker running today's code picks such a workflow up by replaying its
// history: a replay that fails is a task stuck for good (or worse, a
// different path taken).
var compatCases = []string{"approval-pending", "approval-executed", "approval-cancelled", "unattended-pending", "unattended-ran"}

// TestOldHistoriesReplay replays the histories written by the old code on
// today's workflow.
func TestOldHistoriesReplay(t *testing.T) {
	for _, name := range compatCases {
		t.Run(name, func(t *testing.T) {
			hist := oldHistory(t, name)
			inputOf(t, hist)
			replay(t, hist) // replay_test.go
		})
	}
}

func oldHistory(t *testing.T, name string) *historypb.History {
	t.Helper()
	return readHistory(t, filepath.Join("testdata", "compat", name+".history.json"))
}

// oldInput returns the workflow input exactly as the old code sent it: the
// payload of the history's first event.
func oldInput(t *testing.T, name string) tasks.ApprovalInput {
	t.Helper()
	return inputOf(t, oldHistory(t, name))
}

func inputOf(t *testing.T, hist *historypb.History) tasks.ApprovalInput {
	t.Helper()
	in := startInput(t, hist)
	var fields map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(hist.GetEvents()[0].GetWorkflowExecutionStartedEventAttributes().GetInput().GetPayloads()[0].GetData(), &fields))
	require.NotContains(t, fields, "mode", "the old input had no mode")
	return in
}

// A task pending on the old code is finished by today's: its input, read
// as the old code wrote it, takes decisions and runs the call exactly once.
func TestOldPendingApprovalFinishes(t *testing.T) {
	h := newHarness(t, 2)
	h.in = oldInput(t, "approval-pending")
	h.env.SetStartTime(h.in.Envelope.CreatedAt)
	h.env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: h.in.Envelope.TaskID, TaskQueue: tasks.TaskQueue})
	h.decideAt(time.Hour, "upd-alice", approve("alice"))
	u := h.decideAt(2*time.Hour, "upd-bob", approve("bob"))

	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.ApprovalOutcome{Status: tasks.StatusCompleted, Disposition: tasks.ApprovedExecuted}, out)
	require.True(t, decisionResult(t, u).Accepted)
	require.Equal(t, 1, h.executeCalls(), "the call runs exactly once")
	require.Equal(t, h.in.Envelope, h.executes[0].Envelope, "the tool runs the envelope the old code bound")
}

// An unattended task written by the old code (quorum 0, start in ExpiresAt)
// runs at its start, without approvers.
func TestOldUnattendedTaskRunsAtItsStart(t *testing.T) {
	h := newHarness(t, 0)
	h.in = oldInput(t, "unattended-pending")
	require.Zero(t, h.in.Requirement.Quorum)
	h.env.SetStartTime(h.in.Envelope.CreatedAt)
	h.env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: h.in.Envelope.TaskID, TaskQueue: tasks.TaskQueue})

	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.StatusCompleted, out.Status)
	require.Equal(t, 1, h.executeCalls(), "the call runs exactly once")
	require.Len(t, h.reevals, 1)
	require.Equal(t, h.in.ExpiresAt, h.reevals[0].At, "it runs at the start the old input set")
}
