package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/temporalproto"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/devtest"
	"github.com/countersign/countersign/tasks"
	"github.com/countersign/countersign/workflows"
)

// recordEnv names the release whose histories TestRecordHistories writes to
// workflows/testdata/replay/<release>/ (see "Safe upgrades" in
// workflows/doc.go). Unset, the histories go to a temporary directory.
const recordEnv = "COUNTERSIGN_RECORD_HISTORIES"

// TestRecordHistories runs the approval workflow of today's code on the
// real embedded Temporal, once for each way a task ends (and once left
// pending), and takes each workflow's history from the server. Every
// history must replay on today's workflow (a history that does not is
// nondeterministic code), and each workflow must end as its name says.
//
// With COUNTERSIGN_RECORD_HISTORIES=<release> it writes them where the
// replay test (workflows/replay_test.go) reads them:
//
//	COUNTERSIGN_RECORD_HISTORIES=2026-11-25 go test -count=1 -run '^TestRecordHistories$' ./internal/e2e
func TestRecordHistories(t *testing.T) {
	outDir := t.TempDir()
	if release := os.Getenv(recordEnv); release != "" {
		if !regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z._-]*$`).MatchString(release) {
			t.Fatalf("%s=%q: want a release name such as 2026-11-25", recordEnv, release)
		}
		outDir = filepath.Join("..", "..", "workflows", "testdata", "replay", release)
		if err := os.MkdirAll(outDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	rec := func(t *testing.T, s *stack, name, taskID string, want tasks.ApprovalOutcome) {
		t.Helper()
		hist := workflowHistory(t, s, taskID, &want)
		writeHistory(t, filepath.Join(outDir, name+".history.json"), hist)
	}

	// The upstream "slow" holds its one tool's call until it is killed:
	// the way an approved call ends outcome-unknown (TestUpstreamKilledMidCall).
	pidFile := filepath.Join(t.TempDir(), "pid")
	cmd, _ := json.Marshal([]string{os.Args[0], "-test.run=^TestHoldingUpstreamProcess$", "-test.count=1", "-test.timeout=0"})
	cfgPath := filepath.Join(t.TempDir(), "countersign.yaml")
	cfg := "upstreams:\n  - name: slow\n    command: " + string(cmd) + "\n    env: {HOLD_PID_FILE: \"" + pidFile + "\"}\n    timeout: 5m\n"
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startStackConfig(t, app.Config{ConfigFile: cfgPath}, 0)
	alice := s.Enroll("alice", "approvers")
	bob := s.Enroll("bob", "approvers")
	transfer := map[string]any{"to": "acct-history", "amount": 5000, "currency": "EUR"}
	deletion := map[string]any{"table": "customers", "filter": "inactive > 5y"}
	done := tasks.ApprovalOutcome{Status: tasks.StatusCompleted, Disposition: tasks.ApprovedExecuted}
	denied := tasks.ApprovalOutcome{Status: tasks.StatusCompleted, Disposition: tasks.DeniedNotExecuted}

	t.Run("approval-executed", func(t *testing.T) {
		task := s.CreateTask(s.AgentToken, "transfer_funds", transfer)
		if r := s.Approve(alice, s.RefOf(task.TaskID), "approve"); !r.Accepted {
			t.Fatalf("approval rejected: %+v", r)
		}
		rec(t, s, "approval-executed", task.TaskID, done)
	})
	t.Run("approval-denied", func(t *testing.T) {
		task := s.CreateTask(s.AgentToken, "transfer_funds", transfer)
		if r := s.Approve(bob, s.RefOf(task.TaskID), "deny"); !r.Accepted {
			t.Fatalf("deny rejected: %+v", r)
		}
		rec(t, s, "approval-denied", task.TaskID, denied)
	})
	t.Run("approval-cancelled", func(t *testing.T) {
		task := s.CreateTask(s.AgentToken, "transfer_funds", transfer)
		s.RefOf(task.TaskID) // the approvers have been told
		if r := s.Call2026(s.AgentToken, "tasks/cancel", task.TaskID, map[string]any{"taskId": task.TaskID}, true); r.Error != nil {
			t.Fatalf("tasks/cancel: %d %s", r.Error.Code, r.Error.Message)
		}
		rec(t, s, "approval-cancelled", task.TaskID, tasks.ApprovalOutcome{Status: tasks.StatusCancelled})
	})
	t.Run("approval-quorum2", func(t *testing.T) {
		// Two approvals, the same approver's second one refused between them.
		task := s.CreateTask(s.AgentToken, "delete_records", deletion)
		ref := s.RefOf(task.TaskID)
		if r := s.Approve(alice, ref, "approve"); !r.Accepted || r.Approved != 1 || r.Needed != 2 {
			t.Fatalf("first approval: %+v", r)
		}
		if r := s.Approve(alice, ref, "approve"); r.Accepted || r.Reason != workflows.ReasonAlreadyApproved {
			t.Fatalf("same approver twice: %+v", r)
		}
		if r := s.Approve(bob, ref, "approve"); !r.Accepted {
			t.Fatalf("second approval: %+v", r)
		}
		rec(t, s, "approval-quorum2", task.TaskID, done)
	})
	t.Run("approval-pending", func(t *testing.T) {
		// Quorum 2 with one approval: what a worker of the next release
		// finds in flight.
		task := s.CreateTask(s.AgentToken, "delete_records", deletion)
		if r := s.Approve(alice, s.RefOf(task.TaskID), "approve"); !r.Accepted || r.Approved != 1 {
			t.Fatalf("first approval: %+v", r)
		}
		rec(t, s, "approval-pending", task.TaskID, tasks.ApprovalOutcome{Status: tasks.StatusWorking})
	})
	t.Run("approval-outcome-unknown", func(t *testing.T) {
		s.waitTool(t, "slow__hold")
		task := s.CreateTask(s.AgentToken, "slow__hold", map[string]any{})
		if r := s.Approve(alice, s.RefOf(task.TaskID), "approve"); !r.Accepted {
			t.Fatalf("approval rejected: %+v", r)
		}
		killHolder(t, pidFile)
		rec(t, s, "approval-outcome-unknown", task.TaskID, tasks.ApprovalOutcome{Status: tasks.StatusCompleted, Disposition: tasks.OutcomeUnknown})
	})

	t.Run("verified-executed", func(t *testing.T) {
		// A SEP-2672 call its caller signed in-band: an extra case, recorded
		// since 2026-11-27 (the releases before recorded approvals only).
		k := enrollInBand(t, s.Stack)
		args := map[string]any{"symbol": "HIST", "side": "buy", "quantity": 1, "limit": 10}
		taskID := ranTask(postVerified(http.DefaultClient, s.Base, s.AgentToken, args, k.evidence(t, s.Stack, args)))
		if taskID == "" {
			t.Fatal("the verified call did not run")
		}
		rec(t, s, "verified-executed", taskID, done)
	})

	// Expiry needs a policy whose approvals expire at once: a stack of its own.
	t.Run("approval-expired", func(t *testing.T) {
		s := startStackWithPolicy(t, devtest.ShortApprovalPolicy(t))
		task := s.CreateTask(s.AgentToken, "transfer_funds", transfer)
		rec(t, s, "approval-expired", task.TaskID, denied)
	})
}

// killHolder kills the holding upstream once the call has reached it.
func killHolder(t *testing.T, pidFile string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the call never reached the upstream")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// workflowHistory waits until the task's workflow has ended with want (or,
// for want.Status working, has nothing left to do until its next input),
// then returns its history, which must replay on today's workflow.
func workflowHistory(t *testing.T, s *stack, taskID string, want *tasks.ApprovalOutcome) *historypb.History {
	t.Helper()
	tc := s.App.Temporal()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	awaitStarted(ctx, t, tc, taskID)
	if want.Status == tasks.StatusWorking {
		awaitQuiet(ctx, t, tc, taskID)
	} else {
		var got tasks.ApprovalOutcome
		if err := tc.GetWorkflow(ctx, taskID, "").Get(ctx, &got); err != nil {
			t.Fatalf("workflow %s: %v", taskID, err)
		}
		if got != *want {
			t.Fatalf("workflow %s ended %+v, want %+v", taskID, got, *want)
		}
	}
	hist := &historypb.History{}
	it := tc.GetWorkflowHistory(ctx, taskID, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			t.Fatalf("history of %s: %v", taskID, err)
		}
		hist.Events = append(hist.Events, ev)
	}
	r := worker.NewWorkflowReplayer()
	r.RegisterWorkflowWithOptions(workflows.Approval, workflow.RegisterOptions{Name: tasks.WorkflowName})
	if err := r.ReplayWorkflowHistoryWithOptions(tlog.NewStructuredLogger(slog.New(slog.DiscardHandler)), hist, worker.ReplayWorkflowHistoryOptions{
		OriginalExecution: workflow.Execution{ID: taskID, RunID: "recorded"},
	}); err != nil {
		t.Fatalf("today's workflow does not replay its own history of %s: %v", taskID, err)
	}
	return hist
}

// awaitStarted waits until the task's workflow exists. Open records the
// task and answers before the workflow starts (approvals/start.go), so a
// history asked for at once can find none yet: approval-expired, which
// waits for nothing else, did so about one run in fifteen.
func awaitStarted(ctx context.Context, t *testing.T, tc client.Client, taskID string) {
	t.Helper()
	for {
		_, err := tc.DescribeWorkflowExecution(ctx, taskID, "")
		var notFound *serviceerror.NotFound
		switch {
		case err == nil:
			return
		case !errors.As(err, &notFound):
			t.Fatalf("describe %s: %v", taskID, err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("workflow %s never started", taskID)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// awaitQuiet waits until a running workflow has no activity, workflow task
// or update in flight: its history is what a worker finds after an upgrade.
func awaitQuiet(ctx context.Context, t *testing.T, tc client.Client, taskID string) {
	t.Helper()
	for {
		d, err := tc.DescribeWorkflowExecution(ctx, taskID, "")
		if err != nil {
			t.Fatalf("describe %s: %v", taskID, err)
		}
		if d.GetWorkflowExecutionInfo().GetStatus() != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
			t.Fatalf("workflow %s is %s, want running", taskID, d.GetWorkflowExecutionInfo().GetStatus())
		}
		if len(d.GetPendingActivities()) == 0 && d.GetPendingWorkflowTask() == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("workflow %s never went quiet", taskID)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// writeHistory writes hist as the JSON client.HistoryFromJSON reads, and
// checks that it reads back.
func writeHistory(t *testing.T, path string, hist *historypb.History) {
	t.Helper()
	b, err := temporalproto.CustomJSONMarshalOptions{Indent: "  "}.Marshal(hist)
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, '\n')
	if _, err := client.HistoryFromJSON(bytes.NewReader(b), client.HistoryJSONOptions{}); err != nil {
		t.Fatalf("%s does not read back: %v", path, err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
