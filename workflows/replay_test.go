package workflows_test

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/countersign/countersign/tasks"
	"github.com/countersign/countersign/workflows"
)

// releasedCases are the histories every release records in
// testdata/replay/<release>/ (internal/e2e TestRecordHistories writes them
// from real runs on the embedded Temporal server), with the outcome each
// workflow returned. A pending history has no outcome yet: it is what a
// worker of the next release finds in flight. See "Safe upgrades" in doc.go.
var releasedCases = map[string]*tasks.ApprovalOutcome{
	"approval-executed":        {Status: tasks.StatusCompleted, Disposition: tasks.ApprovedExecuted},
	"approval-denied":          {Status: tasks.StatusCompleted, Disposition: tasks.DeniedNotExecuted},
	"approval-expired":         {Status: tasks.StatusCompleted, Disposition: tasks.DeniedNotExecuted},
	"approval-cancelled":       {Status: tasks.StatusCancelled},
	"approval-quorum2":         {Status: tasks.StatusCompleted, Disposition: tasks.ApprovedExecuted},
	"approval-outcome-unknown": {Status: tasks.StatusCompleted, Disposition: tasks.OutcomeUnknown},
	"approval-pending":         nil,
}

// TestReleasedHistoriesReplay replays every recorded history of every
// release on today's workflow. A failure means that a worker running this
// code would fail (or, worse, take another path on) a task a worker of that
// release started: the change needs workflow.GetVersion (doc.go).
func TestReleasedHistoriesReplay(t *testing.T) {
	releases, err := filepath.Glob(filepath.Join("testdata", "replay", "*"))
	require.NoError(t, err)
	require.NotEmpty(t, releases, "no recorded release in testdata/replay")
	for _, dir := range releases {
		release := filepath.Base(dir)
		for name, want := range releasedCases {
			t.Run(release+"/"+name, func(t *testing.T) {
				hist := readHistory(t, filepath.Join(dir, name+".history.json"))
				require.Equal(t, want, outcomeOf(t, hist), "the recorded workflow's outcome")
				replay(t, hist)
			})
		}
		// A release may record more cases than every release must.
		extra, err := filepath.Glob(filepath.Join(dir, "*.history.json"))
		require.NoError(t, err)
		for _, path := range extra {
			name := strings.TrimSuffix(filepath.Base(path), ".history.json")
			if _, ok := releasedCases[name]; ok {
				continue
			}
			t.Run(release+"/"+name, func(t *testing.T) { replay(t, readHistory(t, path)) })
		}
	}
}

// replay replays hist on today's workflow, registered as the worker
// registers it, under the workflow ID it ran with (the workflow checks its
// input against its ID).
func replay(t *testing.T, hist *historypb.History) {
	t.Helper()
	r := worker.NewWorkflowReplayer()
	r.RegisterWorkflowWithOptions(workflows.Approval, workflow.RegisterOptions{Name: tasks.WorkflowName})
	log := tlog.NewStructuredLogger(slog.New(slog.NewTextHandler(newTestLog(t), nil)))
	require.NoError(t, r.ReplayWorkflowHistoryWithOptions(log, hist, worker.ReplayWorkflowHistoryOptions{
		OriginalExecution: workflow.Execution{ID: startInput(t, hist).Envelope.TaskID, RunID: "replay-run"},
	}))
}

func readHistory(t *testing.T, path string) *historypb.History {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	hist, err := client.HistoryFromJSON(f, client.HistoryJSONOptions{})
	require.NoError(t, err)
	require.NotEmpty(t, hist.GetEvents(), path)
	return hist
}

// startInput is the workflow input of hist: the payload of its first event.
func startInput(t *testing.T, hist *historypb.History) tasks.ApprovalInput {
	t.Helper()
	payloads := hist.GetEvents()[0].GetWorkflowExecutionStartedEventAttributes().GetInput().GetPayloads()
	require.Len(t, payloads, 1)
	var in tasks.ApprovalInput
	require.NoError(t, json.Unmarshal(payloads[0].GetData(), &in))
	return in
}

// outcomeOf is the result the workflow of hist returned; nil while it runs.
func outcomeOf(t *testing.T, hist *historypb.History) *tasks.ApprovalOutcome {
	t.Helper()
	events := hist.GetEvents()
	last := events[len(events)-1]
	if last.GetEventType() != enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED {
		return nil
	}
	payloads := last.GetWorkflowExecutionCompletedEventAttributes().GetResult().GetPayloads()
	require.Len(t, payloads, 1)
	var out tasks.ApprovalOutcome
	require.NoError(t, json.Unmarshal(payloads[0].GetData(), &out))
	return &out
}
