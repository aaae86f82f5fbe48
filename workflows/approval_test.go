package workflows_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/tasks"
	"github.com/countersign/countersign/workflows"
)

// acts is the activities' method set, for mock references.
var acts *activities.Activities

var t0 = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

// testLog writes log lines to t.Log while the test runs. A local activity
// the test environment abandoned (its deadline passed on the environment's
// clock) may still log after the test ended, which t.Log does not allow;
// those lines are dropped.
type testLog struct {
	t    *testing.T
	done *atomic.Bool
}

func newTestLog(t *testing.T) testLog {
	w := testLog{t: t, done: new(atomic.Bool)}
	t.Cleanup(func() { w.done.Store(true) })
	return w
}

func (w testLog) Write(p []byte) (int, error) {
	if !w.done.Load() {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

// harness runs one Approval workflow against mocked activities and records
// what the workflow asked of them.
type harness struct {
	t   *testing.T
	env *testsuite.TestWorkflowEnvironment
	in  tasks.ApprovalInput

	mu        sync.Mutex
	records   []activities.RecordStateInput
	audits    []activities.RecordAuditInput
	completes []activities.CompleteInput
	batches   []int // entries per Publish, in order
	lastSeq   int64
	// repeatsOK absorbs a batch sent again whole, as Publish's idempotence
	// does (counted in repeats); otherwise a repeat is an error.
	repeatsOK bool
	repeats   int
	verifies  []activities.VerifyDecisionInput
	reevals   []activities.ReevaluateInput
	executes  []activities.ExecuteToolInput

	// Behaviour of the mocks; tests override before run.
	reevaluate      func(activities.ReevaluateInput) (activities.ReevaluateOutput, error)
	reevaluateAfter time.Duration // delay on the workflow clock
	execute         func(activities.ExecuteToolInput) (activities.ExecuteToolOutput, error)
	executeAfter    time.Duration
	executePanic    bool
	completeAfter   time.Duration
	notifyErr       error
	// auditAfter delays the audit record of this kind (workflow clock).
	auditKind  activities.AuditKind
	auditAfter time.Duration
}

func newHarness(t *testing.T, quorum int) *harness {
	t.Helper()
	var s testsuite.WorkflowTestSuite
	// Workflow and SDK logs go to the test log: shown with -v or on failure.
	s.SetLogger(tlog.NewStructuredLogger(slog.New(slog.NewTextHandler(newTestLog(t), nil))))
	env := s.NewTestWorkflowEnvironment()
	env.SetStartTime(t0)
	// Wall-clock bound; generous because the machine is shared (-race).
	env.SetTestTimeout(time.Minute)
	taskID := tasks.NewID("tsk_")
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: taskID, TaskQueue: tasks.TaskQueue})
	env.RegisterWorkflowWithOptions(workflows.Approval, workflow.RegisterOptions{Name: tasks.WorkflowName})
	env.RegisterActivity(&activities.Activities{})

	h := &harness{
		t:   t,
		env: env,
		in: tasks.ApprovalInput{
			Version: tasks.ApprovalInputVersion,
			Envelope: tasks.Envelope{
				Version:    tasks.EnvelopeVersion,
				TaskID:     taskID,
				Tool:       "transfer_funds",
				Arguments:  json.RawMessage(`{"amount":5000,"to":"acme"}`),
				ActionHash: strings.Repeat("ab", 32),
				Principal:  "agent-1",
				Resource:   "tool:transfer_funds",
				ServerID:   "countersign-test",
				CreatedAt:  t0,
			},
			Requirement: tasks.Requirement{Group: "approvers", Quorum: quorum, TTL: 24 * time.Hour,
				AuthenticatorClass: "platform", Reason: "Transfers over 1,000 require approval"},
			ApprovalRef: tasks.NewID("apr_"),
			DisplayText: "Transfer 5,000 to acme",
			ExpiresAt:   t0.Add(24 * time.Hour),
		},
		reevaluate: func(activities.ReevaluateInput) (activities.ReevaluateOutput, error) {
			return activities.ReevaluateOutput{Version: activities.Version, Allow: true, Effect: "allow",
				Reason: "approved by quorum", PolicyVersion: "sha256:test"}, nil
		},
		execute: func(activities.ExecuteToolInput) (activities.ExecuteToolOutput, error) {
			return activities.ExecuteToolOutput{Version: activities.Version, Result: tasks.CallToolResult{
				Content: []json.RawMessage{tasks.TextContent("transferred")}}}, nil
		},
	}

	return h
}

// installMocks registers the activity mocks, as configured in h.
func (h *harness) installMocks() {
	env := h.env
	// The workflow writes everything it decides through one Publish
	// activity per outbox batch; the mock unpacks the batches in order.
	batchHas := func(pred func(activities.Projection) bool) func(activities.PublishInput) bool {
		return func(in activities.PublishInput) bool {
			for _, e := range in.Entries {
				if pred(e) {
					return true
				}
			}
			return false
		}
	}
	// Delayed expectations are registered before the catch-all: the first
	// matching expectation wins.
	if h.auditKind != "" {
		env.OnActivity(acts.Publish, mock.Anything, mock.MatchedBy(batchHas(func(e activities.Projection) bool {
			return e.Audit != nil && e.Audit.Kind == h.auditKind
		}))).Return(h.publish).After(h.auditAfter)
	}
	if h.completeAfter > 0 {
		env.OnActivity(acts.Publish, mock.Anything, mock.MatchedBy(batchHas(func(e activities.Projection) bool {
			return e.End != nil
		}))).Return(h.publish).After(h.completeAfter)
	}
	env.OnActivity(acts.Publish, mock.Anything, mock.Anything).Return(h.publish)
	env.OnActivity(acts.Notify, mock.Anything, mock.Anything).Return(h.notifyErr)
	// Challenge IDs script the verdict: "ok:<approver>" verifies as that
	// approver, "bad:<reason>" is rejected with reason, "down" is an
	// infrastructure failure.
	env.OnActivity(acts.VerifyDecision, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.VerifyDecisionInput) (activities.VerifyDecisionOutput, error) {
			h.mu.Lock()
			h.verifies = append(h.verifies, in)
			h.mu.Unlock()
			kind, arg, _ := strings.Cut(in.ChallengeID, ":")
			switch kind {
			case "ok":
				return activities.VerifyDecisionOutput{Version: activities.Version, Accepted: true,
					ApproverID: "id-" + arg, ApproverName: arg, CredentialID: "cred-" + arg}, nil
			case "bad":
				return activities.VerifyDecisionOutput{Version: activities.Version, Reason: arg}, nil
			default:
				return activities.VerifyDecisionOutput{}, temporal.NewNonRetryableApplicationError("nats down", "test", nil)
			}
		})
	re := env.OnActivity(acts.Reevaluate, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.ReevaluateInput) (activities.ReevaluateOutput, error) {
			h.mu.Lock()
			h.reevals = append(h.reevals, in)
			h.mu.Unlock()
			return h.reevaluate(in)
		})
	if h.reevaluateAfter > 0 {
		re.After(h.reevaluateAfter)
	}
	ex := env.OnActivity(acts.ExecuteTool, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.ExecuteToolInput) (activities.ExecuteToolOutput, error) {
			h.mu.Lock()
			h.executes = append(h.executes, in)
			h.mu.Unlock()
			if h.executePanic {
				panic("worker blew up")
			}
			return h.execute(in)
		})
	if h.executeAfter > 0 {
		ex.After(h.executeAfter)
	}
}

// publish records one outbox batch, checking that the sequence numbers
// follow each other with no gap and no repeat.
func (h *harness) publish(_ context.Context, in activities.PublishInput) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.repeatsOK && len(in.Entries) > 0 && in.Entries[0].Seq <= h.lastSeq {
		h.repeats++
		return nil
	}
	h.batches = append(h.batches, len(in.Entries))
	for _, e := range in.Entries {
		if e.Seq != h.lastSeq+1 {
			h.t.Errorf("outbox entry %d after %d", e.Seq, h.lastSeq)
		}
		h.lastSeq = e.Seq
		switch {
		case e.State != nil:
			st := *e.State
			st.TaskID = in.TaskID
			h.records = append(h.records, st)
		case e.Audit != nil:
			au := *e.Audit
			au.TaskID = in.TaskID
			h.audits = append(h.audits, au)
		case e.End != nil:
			end := *e.End
			end.TaskID = in.TaskID
			h.completes = append(h.completes, end)
		}
	}
	return nil
}

// auditKinds lists the audit steps the workflow published, in order.
func (h *harness) auditKinds() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var kinds []string
	for _, a := range h.audits {
		kinds = append(kinds, string(a.Kind))
	}
	return kinds
}

// updateOutcome is what the test environment reported for one update.
type updateOutcome struct {
	rejected error
	result   any
	err      error
	done     bool
}

func (u *updateOutcome) callbacks() *testsuite.TestUpdateCallback {
	return &testsuite.TestUpdateCallback{
		OnAccept: func() {},
		OnReject: func(err error) { u.rejected = err; u.done = true },
		OnComplete: func(v any, err error) {
			u.result, u.err, u.done = v, err, true
		},
	}
}

func (h *harness) decideAt(at time.Duration, updateID string, d tasks.DecisionUpdate) *updateOutcome {
	u := &updateOutcome{}
	h.env.RegisterDelayedCallback(func() {
		h.env.UpdateWorkflow(tasks.UpdateDecide, updateID, u.callbacks(), d)
	}, at)
	return u
}

func (h *harness) cancelAt(at time.Duration, updateID string) *updateOutcome {
	u := &updateOutcome{}
	h.env.RegisterDelayedCallback(func() {
		h.env.UpdateWorkflow(tasks.UpdateCancel, updateID, u.callbacks(), struct{}{})
	}, at)
	return u
}

func approve(who string) tasks.DecisionUpdate {
	return tasks.DecisionUpdate{ChallengeID: "ok:" + who, Decision: tasks.DecisionApprove, Response: json.RawMessage(`{"id":"x"}`)}
}

func deny(who, comment string) tasks.DecisionUpdate {
	return tasks.DecisionUpdate{ChallengeID: "ok:" + who, Decision: tasks.DecisionDeny, Comment: comment, Response: json.RawMessage(`{"id":"x"}`)}
}

// run executes the workflow and returns its outcome.
func (h *harness) run() (tasks.ApprovalOutcome, error) {
	h.t.Helper()
	h.installMocks()
	h.env.ExecuteWorkflow(tasks.WorkflowName, h.in)
	require.True(h.t, h.env.IsWorkflowCompleted(), "workflow did not complete")
	err := h.env.GetWorkflowError()
	var out tasks.ApprovalOutcome
	if err == nil {
		require.NoError(h.t, h.env.GetWorkflowResult(&out))
	}
	return out, err
}

// complete returns the single terminal write.
func (h *harness) complete() activities.CompleteInput {
	h.t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Len(h.t, h.completes, 1, "Complete must be called exactly once")
	return h.completes[0]
}

func (h *harness) executeCalls() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.executes)
}

func (h *harness) eventKinds() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var kinds []string
	for _, r := range h.records {
		kinds = append(kinds, string(r.Event.Kind))
	}
	return kinds
}

func decisionResult(t *testing.T, u *updateOutcome) tasks.DecisionResult {
	t.Helper()
	require.True(t, u.done, "update did not finish")
	require.NoError(t, u.rejected)
	require.NoError(t, u.err)
	res, ok := u.result.(tasks.DecisionResult)
	require.True(t, ok, "update result is %T", u.result)
	return res
}

func cancelResult(t *testing.T, u *updateOutcome) tasks.CancelResult {
	t.Helper()
	require.True(t, u.done, "cancel did not finish")
	require.NoError(t, u.rejected)
	require.NoError(t, u.err)
	res, ok := u.result.(tasks.CancelResult)
	require.True(t, ok, "cancel result is %T", u.result)
	return res
}

// requireAppErrType checks err is an application error of type typ.
func requireAppErrType(t *testing.T, err error, typ string) {
	t.Helper()
	var appErr *temporal.ApplicationError
	require.True(t, errors.As(err, &appErr), "want application error %q, got %v", typ, err)
	require.Equal(t, typ, appErr.Type())
}

func TestApprovedAfterSixHoursExecutesOnce(t *testing.T) {
	h := newHarness(t, 1)
	u := h.decideAt(6*time.Hour, "upd-alice", approve("alice"))

	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.ApprovalOutcome{Status: tasks.StatusCompleted, Disposition: tasks.ApprovedExecuted}, out)

	res := decisionResult(t, u)
	require.True(t, res.Accepted)
	require.Equal(t, 1, res.Approved)
	require.Equal(t, 1, res.Needed)

	require.Equal(t, 1, h.executeCalls(), "ExecuteTool must run exactly once")
	h.env.AssertActivityNumberOfCalls(t, "ExecuteTool", 1)
	require.Equal(t, h.in.Envelope, h.executes[0].Envelope, "the tool runs the bound envelope")

	require.Len(t, h.verifies, 1)
	require.Equal(t, "upd-alice", h.verifies[0].ConsumerKey, "consumer key is the update ID")
	require.Equal(t, h.in.Envelope, h.verifies[0].Envelope)
	require.Equal(t, h.in.Requirement, h.verifies[0].Requirement)

	require.Len(t, h.reevals, 1)
	require.Len(t, h.reevals[0].Approvals, 1)
	require.Equal(t, "id-alice", h.reevals[0].Approvals[0].ApproverID)
	require.Equal(t, t0.Add(6*time.Hour), h.reevals[0].At)

	c := h.complete()
	require.Equal(t, tasks.StatusCompleted, c.Status)
	require.Equal(t, tasks.ApprovedExecuted, c.Disposition)
	require.Equal(t, tasks.ApprovalExecuted, c.ApprovalState)
	require.NotNil(t, c.ToolResult)
	require.Equal(t, h.in.Envelope.TaskID, c.TaskID)
	require.Equal(t, t0.Add(6*time.Hour), c.Event.At)
	require.Equal(t, tasks.EventKind("executed"), c.Event.Kind)

	require.Equal(t, []string{"requested", "notified", "approval", "claimed"}, h.eventKinds())
	require.Equal(t, "Awaiting approval: Transfers over 1,000 require approval (0 of 1)", h.records[0].StatusMessage)
	require.Equal(t, tasks.ApprovalPending, h.records[0].ApprovalState)
	require.Equal(t, tasks.ApprovalApproved, h.records[3].ApprovalState)
}

func TestExpiryDeniesWithoutExecuting(t *testing.T) {
	h := newHarness(t, 1)

	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.ApprovalOutcome{Status: tasks.StatusCompleted, Disposition: tasks.DeniedNotExecuted}, out)
	require.Zero(t, h.executeCalls())
	h.env.AssertActivityNotCalled(t, "ExecuteTool", mock.Anything, mock.Anything)
	h.env.AssertActivityNotCalled(t, "Reevaluate", mock.Anything, mock.Anything)

	c := h.complete()
	require.Equal(t, tasks.EventKind("expired"), c.Event.Kind)
	require.Equal(t, tasks.ApprovalExpired, c.ApprovalState)
	require.Equal(t, h.in.ExpiresAt, c.Event.At, "expires exactly at ExpiresAt")
	require.Contains(t, c.Detail, "expired")
}

func TestCancelBeforeClaim(t *testing.T) {
	h := newHarness(t, 1)
	u := h.cancelAt(time.Hour, "upd-cancel")
	// A second cancel (after the end) also reports the task cancelled.
	late := h.cancelAt(time.Hour, "upd-cancel-2")

	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.ApprovalOutcome{Status: tasks.StatusCancelled}, out)
	require.Equal(t, tasks.CancelResult{Cancelled: true, Status: tasks.StatusCancelled}, cancelResult(t, u))
	require.Equal(t, tasks.CancelResult{Cancelled: true, Status: tasks.StatusCancelled}, cancelResult(t, late))
	require.Zero(t, h.executeCalls())

	c := h.complete()
	require.Equal(t, tasks.StatusCancelled, c.Status)
	require.Empty(t, c.Disposition)
	require.Nil(t, c.ToolResult)
	require.Equal(t, t0.Add(time.Hour), c.Event.At)
}

func TestCancelWhileReevaluatingWins(t *testing.T) {
	h := newHarness(t, 1)
	h.reevaluateAfter = time.Minute
	d := h.decideAt(time.Hour, "upd-alice", approve("alice"))
	c := h.cancelAt(time.Hour+30*time.Second, "upd-cancel")

	out, err := h.run()
	require.NoError(t, err)
	require.True(t, decisionResult(t, d).Accepted)
	require.Equal(t, tasks.CancelResult{Cancelled: true, Status: tasks.StatusCancelled}, cancelResult(t, c))
	require.Equal(t, tasks.ApprovalOutcome{Status: tasks.StatusCancelled}, out)
	require.Zero(t, h.executeCalls(), "a cancel before the claim means the tool never runs")
}

// Regression: a cancel that arrives while the step right after the
// re-evaluation is being written must not slip in between the last cancel
// check and the claim (it used to be accepted, and the tool ran anyway while
// the task reported cancelled).
func TestCancelDuringPostReevaluationStepIsRefused(t *testing.T) {
	h := newHarness(t, 1)
	// The records of the re-evaluation are slow to land, and the tool is
	// slow: the cancel arrives after the claim, before anything shows it.
	h.auditKind, h.auditAfter = "reevaluated", time.Minute
	h.executeAfter = 2 * time.Minute
	d := h.decideAt(time.Hour, "upd-alice", approve("alice"))
	c := h.cancelAt(time.Hour+30*time.Second, "upd-cancel")

	out, err := h.run()
	require.NoError(t, err)
	require.True(t, decisionResult(t, d).Accepted)
	require.Equal(t, tasks.CancelResult{Cancelled: false, Status: tasks.StatusWorking}, cancelResult(t, c))
	require.Equal(t, tasks.ApprovalOutcome{Status: tasks.StatusCompleted, Disposition: tasks.ApprovedExecuted}, out)
	require.Equal(t, 1, h.executeCalls())
	// The refused cancel is recorded after the claim, and the chain ends
	// with the execution.
	require.Equal(t, []string{"requested", "notified", "decision", "reevaluated", "claimed", "cancel-refused"}, h.auditKinds())
	require.Equal(t, tasks.ApprovedExecuted, h.complete().Disposition)
}

func TestCancelAfterClaimIsRefused(t *testing.T) {
	h := newHarness(t, 1)
	h.executeAfter = 10 * time.Minute
	d := h.decideAt(time.Hour, "upd-alice", approve("alice"))
	c := h.cancelAt(time.Hour+5*time.Minute, "upd-cancel")

	out, err := h.run()
	require.NoError(t, err)
	require.True(t, decisionResult(t, d).Accepted)
	require.Equal(t, tasks.CancelResult{Cancelled: false, Status: tasks.StatusWorking}, cancelResult(t, c))
	require.Equal(t, tasks.ApprovalOutcome{Status: tasks.StatusCompleted, Disposition: tasks.ApprovedExecuted}, out)
	require.Equal(t, 1, h.executeCalls())
}

func TestCancelAfterEndReportsStatus(t *testing.T) {
	h := newHarness(t, 1)
	h.completeAfter = time.Minute // the final write is slow
	d := h.decideAt(time.Hour, "upd-bob", deny("bob", ""))
	// While the denial is being written, cancel is too late; it answers
	// once the end is written, with the final status.
	var doneBeforeWrite bool
	c := h.cancelAt(time.Hour+time.Second, "upd-cancel")
	h.env.RegisterDelayedCallback(func() { doneBeforeWrite = c.done }, time.Hour+30*time.Second)

	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.DeniedNotExecuted, out.Disposition)
	require.True(t, decisionResult(t, d).Accepted)
	require.Equal(t, tasks.CancelResult{Cancelled: false, Status: tasks.StatusCompleted}, cancelResult(t, c))
	require.False(t, doneBeforeWrite, "cancel answered before the end was written")
}

// Cancel and approve arrive at the same instant, in either order: the task
// ends exactly one way, and a cancel that succeeded means the tool never ran.
func TestCancelApproveRace(t *testing.T) {
	for _, cancelFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("cancelFirst=%v", cancelFirst), func(t *testing.T) {
			h := newHarness(t, 1)
			var d, c *updateOutcome
			if cancelFirst {
				c = h.cancelAt(2*time.Hour, "upd-cancel")
				d = h.decideAt(2*time.Hour, "upd-alice", approve("alice"))
			} else {
				d = h.decideAt(2*time.Hour, "upd-alice", approve("alice"))
				c = h.cancelAt(2*time.Hour, "upd-cancel")
			}

			out, err := h.run()
			require.NoError(t, err)
			cr := cancelResult(t, c)
			require.True(t, d.done)
			// The approve is verified (an activity) before it can change
			// state, while the cancel changes state at once: cancel wins.
			require.True(t, cr.Cancelled)
			require.Equal(t, tasks.ApprovalOutcome{Status: tasks.StatusCancelled}, out)
			require.Zero(t, h.executeCalls())
			if cancelFirst {
				requireAppErrType(t, d.rejected, workflows.ErrTypeTaskNotPending)
				require.Empty(t, h.verifies, "the validator rejects before verification")
			} else {
				require.NoError(t, d.rejected)
				requireAppErrType(t, d.err, workflows.ErrTypeTaskNotPending)
			}
		})
	}
}

func TestExecuteFailureIsOutcomeUnknownAfterOneAttempt(t *testing.T) {
	tests := []struct {
		name  string
		setup func(h *harness)
	}{
		{"start-to-close timeout", func(h *harness) {
			h.execute = func(activities.ExecuteToolInput) (activities.ExecuteToolOutput, error) {
				return activities.ExecuteToolOutput{}, temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_START_TO_CLOSE, nil)
			}
		}},
		{"retryable error", func(h *harness) {
			h.execute = func(activities.ExecuteToolInput) (activities.ExecuteToolOutput, error) {
				return activities.ExecuteToolOutput{}, errors.New("connection reset by upstream")
			}
		}},
		{"panic", func(h *harness) { h.executePanic = true }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1)
			tt.setup(h)
			h.decideAt(time.Hour, "upd-alice", approve("alice"))

			out, err := h.run()
			require.NoError(t, err)
			require.Equal(t, tasks.ApprovalOutcome{Status: tasks.StatusCompleted, Disposition: tasks.OutcomeUnknown}, out)
			h.env.AssertActivityNumberOfCalls(t, "ExecuteTool", 1)
			c := h.complete()
			require.Equal(t, tasks.EventKind("outcome-unknown"), c.Event.Kind)
			require.Nil(t, c.ToolResult)
		})
	}
}

func TestExecuteRefusalBeforeRunningIsDenied(t *testing.T) {
	for _, typ := range []string{activities.ErrTypeEnvelopeMismatch, activities.ErrTypeUnknownTool} {
		t.Run(typ, func(t *testing.T) {
			h := newHarness(t, 1)
			h.execute = func(activities.ExecuteToolInput) (activities.ExecuteToolOutput, error) {
				return activities.ExecuteToolOutput{}, temporal.NewNonRetryableApplicationError("refused", typ, nil)
			}
			h.decideAt(time.Hour, "upd-alice", approve("alice"))

			out, err := h.run()
			require.NoError(t, err)
			require.Equal(t, tasks.DeniedNotExecuted, out.Disposition)
			h.env.AssertActivityNumberOfCalls(t, "ExecuteTool", 1)
		})
	}
}

// A tool that changed after the call was made (activities.ExecuteTool's
// pin check) ends the task denied, not run, with the error's detail saying
// what changed; a tool that is gone keeps its fixed detail.
func TestExecuteToolChangedDetail(t *testing.T) {
	const why = "The tool changed after the call was made: upstream fs now serves fs__write with another input schema."
	tests := []struct {
		name, wantDetail, wantMessage string
		details                       []any
	}{
		{"changed", why, "Denied: the tool changed", []any{why}},
		{"gone", "The tool is not available.", "Denied: tool not available", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1)
			h.execute = func(activities.ExecuteToolInput) (activities.ExecuteToolOutput, error) {
				return activities.ExecuteToolOutput{}, temporal.NewNonRetryableApplicationError("refused", activities.ErrTypeUnknownTool, nil, tt.details...)
			}
			h.decideAt(time.Hour, "upd-alice", approve("alice"))

			out, err := h.run()
			require.NoError(t, err)
			require.Equal(t, tasks.ApprovalOutcome{Status: tasks.StatusCompleted, Disposition: tasks.DeniedNotExecuted}, out)
			c := h.complete()
			require.Equal(t, tasks.EventDenied, c.Event.Kind)
			require.Equal(t, tt.wantDetail, c.Detail)
			require.Equal(t, tt.wantMessage, c.StatusMessage)
			require.Nil(t, c.ToolResult)
		})
	}
}

// An execution the task's record refuses (tasks.Store.ClaimExecution: the
// task was judged never started and failed) ends the task failed, saying
// the tool did not run, as the record already does.
func TestExecuteNotClaimedIsFailedNotRun(t *testing.T) {
	h := newHarness(t, 1)
	const why = "The task had already ended, or its record was gone, before its tool could run; the tool did not run."
	h.execute = func(activities.ExecuteToolInput) (activities.ExecuteToolOutput, error) {
		return activities.ExecuteToolOutput{}, temporal.NewNonRetryableApplicationError(why, activities.ErrTypeExecutionNotClaimed, nil)
	}
	h.decideAt(time.Hour, "upd-alice", approve("alice"))

	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.ApprovalOutcome{Status: tasks.StatusFailed}, out)
	h.env.AssertActivityNumberOfCalls(t, "ExecuteTool", 1)
	c := h.complete()
	require.Equal(t, tasks.ApprovalFailed, c.ApprovalState)
	require.Equal(t, tasks.EventFailed, c.Event.Kind)
	require.Equal(t, why, c.StatusMessage)
	require.Nil(t, c.ToolResult)
}

func TestToolErrorIsExecutionError(t *testing.T) {
	h := newHarness(t, 1)
	h.execute = func(activities.ExecuteToolInput) (activities.ExecuteToolOutput, error) {
		return activities.ExecuteToolOutput{Version: activities.Version, Result: tasks.CallToolResult{
			Content: []json.RawMessage{tasks.TextContent("insufficient funds")}, IsError: true}}, nil
	}
	h.decideAt(time.Hour, "upd-alice", approve("alice"))

	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.ApprovalOutcome{Status: tasks.StatusCompleted, Disposition: tasks.ExecutionError}, out)
	require.Equal(t, 1, h.executeCalls())
	c := h.complete()
	require.NotNil(t, c.ToolResult)
	require.True(t, c.ToolResult.IsError)
	require.Equal(t, tasks.ApprovalFailed, c.ApprovalState)
}

func TestDenyEndsWithoutExecuting(t *testing.T) {
	h := newHarness(t, 2)
	a := h.decideAt(time.Hour, "upd-alice", approve("alice"))
	d := h.decideAt(2*time.Hour, "upd-bob", deny("bob", "amount looks wrong"))

	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.ApprovalOutcome{Status: tasks.StatusCompleted, Disposition: tasks.DeniedNotExecuted}, out)
	require.True(t, decisionResult(t, a).Accepted)
	res := decisionResult(t, d)
	require.True(t, res.Accepted)
	require.Equal(t, tasks.ApprovalDenied, res.Status)
	require.Zero(t, h.executeCalls())
	h.env.AssertActivityNotCalled(t, "Reevaluate", mock.Anything, mock.Anything)

	c := h.complete()
	require.Equal(t, tasks.EventKind("denied"), c.Event.Kind)
	require.Equal(t, "Denied by bob: amount looks wrong", c.Detail)
	require.Equal(t, t0.Add(2*time.Hour), c.Event.At)
	require.Len(t, c.Approvals, 2)
	require.Equal(t, tasks.DecisionDeny, c.Approvals[1].Decision)
}

func TestQuorumOfTwo(t *testing.T) {
	h := newHarness(t, 2)
	first := h.decideAt(time.Hour, "upd-alice-1", approve("alice"))
	again := h.decideAt(2*time.Hour, "upd-alice-2", approve("alice"))
	var executedBeforeBob int
	h.env.RegisterDelayedCallback(func() { executedBeforeBob = h.executeCalls() }, 3*time.Hour-time.Second)
	second := h.decideAt(3*time.Hour, "upd-bob", approve("bob"))

	out, err := h.run()
	require.NoError(t, err)

	r1 := decisionResult(t, first)
	require.Equal(t, tasks.DecisionResult{Accepted: true, Status: tasks.ApprovalPending, Approved: 1, Needed: 2}, r1)
	r2 := decisionResult(t, again)
	require.Equal(t, tasks.DecisionResult{Accepted: false, Reason: workflows.ReasonAlreadyApproved,
		Status: tasks.ApprovalPending, Approved: 1, Needed: 2}, r2)
	require.Zero(t, executedBeforeBob, "one approval of two must not execute")
	r3 := decisionResult(t, second)
	require.True(t, r3.Accepted)
	require.Equal(t, 2, r3.Approved)

	require.Equal(t, tasks.ApprovalOutcome{Status: tasks.StatusCompleted, Disposition: tasks.ApprovedExecuted}, out)
	require.Equal(t, 1, h.executeCalls())
	require.Len(t, h.reevals, 1)
	var ids []string
	for _, e := range h.reevals[0].Approvals {
		ids = append(ids, e.ApproverID)
	}
	require.Equal(t, []string{"id-alice", "id-bob"}, ids)
	require.Equal(t, t0.Add(3*time.Hour), h.complete().Event.At)
	require.Contains(t, h.eventKinds(), "rejected-decision")
}

func TestInvalidEvidenceChangesNothing(t *testing.T) {
	h := newHarness(t, 1)
	bad := h.decideAt(time.Hour, "upd-bad", tasks.DecisionUpdate{ChallengeID: "bad:signature_verification_failed",
		Decision: tasks.DecisionApprove, Response: json.RawMessage(`{}`)})
	badDeny := h.decideAt(2*time.Hour, "upd-bad-deny", tasks.DecisionUpdate{ChallengeID: "bad:self_approval",
		Decision: tasks.DecisionDeny, Response: json.RawMessage(`{}`)})

	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.DecisionResult{Accepted: false, Reason: "signature_verification_failed",
		Status: tasks.ApprovalPending, Approved: 0, Needed: 1}, decisionResult(t, bad))
	require.Equal(t, tasks.DecisionResult{Accepted: false, Reason: "self_approval",
		Status: tasks.ApprovalPending, Approved: 0, Needed: 1}, decisionResult(t, badDeny))

	// Neither moved the task: it still expires, unexecuted, with no approvals.
	require.Equal(t, tasks.ApprovalOutcome{Status: tasks.StatusCompleted, Disposition: tasks.DeniedNotExecuted}, out)
	c := h.complete()
	require.Equal(t, tasks.EventKind("expired"), c.Event.Kind)
	require.Empty(t, c.Approvals)
	require.Zero(t, h.executeCalls())

	var details []string
	for _, r := range h.records {
		if r.Event.Kind == "rejected-decision" {
			details = append(details, r.Event.Detail)
			require.Equal(t, tasks.ApprovalPending, r.ApprovalState)
			require.Empty(t, r.Approvals)
		}
	}
	require.Equal(t, []string{"rejected decision: signature_verification_failed", "rejected decision: self_approval"}, details)
}

func TestInvalidEvidenceThenValidApproval(t *testing.T) {
	h := newHarness(t, 1)
	h.decideAt(time.Hour, "upd-bad", tasks.DecisionUpdate{ChallengeID: "bad:challenge_consumed",
		Decision: tasks.DecisionApprove, Response: json.RawMessage(`{}`)})
	ok := h.decideAt(2*time.Hour, "upd-alice", approve("alice"))

	out, err := h.run()
	require.NoError(t, err)
	require.True(t, decisionResult(t, ok).Accepted)
	require.Equal(t, tasks.ApprovedExecuted, out.Disposition)
	require.Len(t, h.complete().Approvals, 1)
}

func TestVerificationUnavailable(t *testing.T) {
	h := newHarness(t, 1)
	down := h.decideAt(time.Hour, "upd-down", tasks.DecisionUpdate{ChallengeID: "down",
		Decision: tasks.DecisionApprove, Response: json.RawMessage(`{}`)})

	out, err := h.run()
	require.NoError(t, err)
	require.True(t, down.done)
	requireAppErrType(t, down.err, workflows.ErrTypeVerificationUnavailable)
	require.Equal(t, tasks.DeniedNotExecuted, out.Disposition, "nothing changed: the task expires")
	require.Empty(t, h.complete().Approvals)
}

func TestValidatorRejections(t *testing.T) {
	resp := json.RawMessage(`{"id":"x"}`)
	malformed := []struct {
		name string
		d    tasks.DecisionUpdate
	}{
		{"unknown decision", tasks.DecisionUpdate{ChallengeID: "ok:alice", Decision: "maybe", Response: resp}},
		{"empty decision", tasks.DecisionUpdate{ChallengeID: "ok:alice", Response: resp}},
		{"no challenge", tasks.DecisionUpdate{Decision: tasks.DecisionApprove, Response: resp}},
		{"no response", tasks.DecisionUpdate{ChallengeID: "ok:alice", Decision: tasks.DecisionApprove}},
		{"blank response", tasks.DecisionUpdate{ChallengeID: "ok:alice", Decision: tasks.DecisionApprove, Response: json.RawMessage("null")}},
		{"long comment", tasks.DecisionUpdate{ChallengeID: "ok:alice", Decision: tasks.DecisionDeny, Response: resp,
			Comment: strings.Repeat("x", workflows.MaxCommentLen+1)}},
	}
	for _, tt := range malformed {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1)
			u := h.decideAt(time.Hour, "upd", tt.d)
			out, err := h.run()
			require.NoError(t, err)
			require.True(t, u.done)
			requireAppErrType(t, u.rejected, workflows.ErrTypeMalformedDecision)
			require.Empty(t, h.verifies, "a rejected update runs nothing")
			require.Equal(t, tasks.DeniedNotExecuted, out.Disposition)
		})
	}

	t.Run("after cancel", func(t *testing.T) {
		h := newHarness(t, 1)
		h.cancelAt(time.Hour, "upd-cancel")
		u := h.decideAt(time.Hour, "upd-alice", approve("alice"))
		out, err := h.run()
		require.NoError(t, err)
		require.Equal(t, tasks.StatusCancelled, out.Status)
		requireAppErrType(t, u.rejected, workflows.ErrTypeTaskNotPending)
		require.Empty(t, h.verifies)
	})

	t.Run("after deny", func(t *testing.T) {
		h := newHarness(t, 2)
		h.completeAfter = time.Minute
		h.decideAt(time.Hour, "upd-bob", deny("bob", ""))
		u := h.decideAt(time.Hour+time.Second, "upd-alice", approve("alice"))
		out, err := h.run()
		require.NoError(t, err)
		require.Equal(t, tasks.DeniedNotExecuted, out.Disposition)
		requireAppErrType(t, u.rejected, workflows.ErrTypeTaskNotPending)
		require.Len(t, h.verifies, 1)
	})

	t.Run("while executing", func(t *testing.T) {
		h := newHarness(t, 1)
		h.executeAfter = 10 * time.Minute
		h.decideAt(time.Hour, "upd-alice", approve("alice"))
		u := h.decideAt(time.Hour+time.Minute, "upd-bob", approve("bob"))
		out, err := h.run()
		require.NoError(t, err)
		require.Equal(t, tasks.ApprovedExecuted, out.Disposition)
		requireAppErrType(t, u.rejected, workflows.ErrTypeTaskNotPending)
		require.Equal(t, 1, h.executeCalls())
	})
}

func TestReevaluationDenies(t *testing.T) {
	tests := []struct {
		name       string
		reevaluate func(activities.ReevaluateInput) (activities.ReevaluateOutput, error)
		detail     string
	}{
		{"policy denies", func(activities.ReevaluateInput) (activities.ReevaluateOutput, error) {
			return activities.ReevaluateOutput{Version: activities.Version, Effect: "deny",
				Reason: "Transfers over 1,000,000 are never allowed"}, nil
		}, "Denied by policy on re-evaluation: Transfers over 1,000,000 are never allowed"},
		{"still requestable", func(activities.ReevaluateInput) (activities.ReevaluateOutput, error) {
			return activities.ReevaluateOutput{Version: activities.Version, Effect: "requestable",
				Reason: "Deleting records requires two approvers"}, nil
		}, "Denied by policy on re-evaluation: Deleting records requires two approvers"},
		{"policy error", func(activities.ReevaluateInput) (activities.ReevaluateOutput, error) {
			return activities.ReevaluateOutput{}, temporal.NewNonRetryableApplicationError("eval", activities.ErrTypePolicyInput, nil)
		}, "The policy could not be evaluated."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1)
			h.reevaluate = tt.reevaluate
			h.decideAt(time.Hour, "upd-alice", approve("alice"))

			out, err := h.run()
			require.NoError(t, err)
			require.Equal(t, tasks.ApprovalOutcome{Status: tasks.StatusCompleted, Disposition: tasks.DeniedNotExecuted}, out)
			require.Zero(t, h.executeCalls())
			require.Equal(t, tt.detail, h.complete().Detail)
		})
	}
}

func TestNotifyFailureDoesNotFailTheTask(t *testing.T) {
	h := newHarness(t, 1)
	h.notifyErr = errors.New("slack down")
	h.decideAt(time.Hour, "upd-alice", approve("alice"))

	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.ApprovedExecuted, out.Disposition)
	h.env.AssertActivityNumberOfCalls(t, "Notify", 5)
	require.Contains(t, h.eventKinds(), "notify-failed")
}

func TestInvalidInputFailsTheTask(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*tasks.ApprovalInput)
	}{
		{"input version", func(in *tasks.ApprovalInput) { in.Version = 99 }},
		{"envelope version", func(in *tasks.ApprovalInput) { in.Envelope.Version = 0 }},
		{"task id differs from workflow id", func(in *tasks.ApprovalInput) { in.Envelope.TaskID = tasks.NewID("tsk_") }},
		{"zero quorum", func(in *tasks.ApprovalInput) { in.Requirement.Quorum = 0 }},
		{"no expiry", func(in *tasks.ApprovalInput) { in.ExpiresAt = time.Time{} }},
		{"approval mode with quorum 0", func(in *tasks.ApprovalInput) {
			in.Mode, in.Requirement.Quorum, in.Requirement.Group = tasks.ModeApproval, 0, ""
		}},
		{"approval mode with a start time", func(in *tasks.ApprovalInput) { in.Mode, in.StartAt = tasks.ModeApproval, t0 }},
		{"unattended mode with a quorum", func(in *tasks.ApprovalInput) {
			in.Mode, in.StartAt, in.Requirement.Group = tasks.ModeUnattended, t0, ""
		}},
		{"unattended mode with a group", func(in *tasks.ApprovalInput) {
			in.Mode, in.StartAt, in.Requirement.Quorum = tasks.ModeUnattended, t0, 0
		}},
		{"unattended mode without a start time", func(in *tasks.ApprovalInput) {
			in.Mode, in.Requirement.Quorum, in.Requirement.Group = tasks.ModeUnattended, 0, ""
		}},
		{"unknown mode", func(in *tasks.ApprovalInput) { in.Mode = "later" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1)
			workflowID := h.in.Envelope.TaskID
			tt.mutate(&h.in)
			_, err := h.run()
			requireAppErrType(t, err, workflows.ErrTypeInvalidInput)
			c := h.complete()
			require.Equal(t, tasks.StatusFailed, c.Status)
			require.Equal(t, workflowID, c.TaskID, "the failure is written to the workflow's own task")
			require.Zero(t, h.executeCalls())
		})
	}
}

func TestExpiresAtInThePastExpiresAtOnce(t *testing.T) {
	h := newHarness(t, 1)
	h.in.ExpiresAt = t0.Add(-time.Minute)
	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.DeniedNotExecuted, out.Disposition)
	require.Equal(t, t0, h.complete().Event.At)
}

func TestDecisionFloodIsBounded(t *testing.T) {
	h := newHarness(t, 1)
	var last *updateOutcome
	for i := range workflows.MaxDecisionAttempts + 1 {
		last = h.decideAt(time.Hour+time.Duration(i)*time.Second, fmt.Sprintf("upd-%d", i), tasks.DecisionUpdate{
			ChallengeID: "bad:signature_verification_failed", Decision: tasks.DecisionApprove, Response: json.RawMessage(`{}`)})
	}
	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.DeniedNotExecuted, out.Disposition)
	requireAppErrType(t, last.rejected, workflows.ErrTypeTooManyDecisions)
	require.Len(t, h.verifies, workflows.MaxDecisionAttempts)
}

func (h *harness) rejectionAt(at time.Duration, updateID string, r tasks.RejectedDecision) *updateOutcome {
	u := &updateOutcome{}
	h.env.RegisterDelayedCallback(func() {
		h.env.UpdateWorkflow(tasks.UpdateRecordRejection, updateID, u.callbacks(), r)
	}, at)
	return u
}

// Rejected decisions (from the edge, and those the workflow's own
// verification rejects) are recorded up to MaxRecordedRejections; the rest
// are refused without history, and none of them keeps a valid approval out.
func TestRejectionsAreRecordedBoundedAndNeverBlockApproval(t *testing.T) {
	h := newHarness(t, 1)
	var edge []*updateOutcome
	for i := range workflows.MaxRecordedRejections + 10 {
		edge = append(edge, h.rejectionAt(time.Minute+time.Duration(i)*time.Second, fmt.Sprintf("rej-%d", i),
			tasks.RejectedDecision{ChallengeID: "c", Decision: tasks.DecisionApprove, Reason: "signature_verification_failed"}))
	}
	inWorkflow := h.decideAt(2*time.Minute, "upd-bad", tasks.DecisionUpdate{ChallengeID: "bad:challenge_consumed",
		Decision: tasks.DecisionApprove, Response: json.RawMessage(`{"id":"x"}`)})
	ok := h.decideAt(3*time.Minute, "upd-alice", approve("alice"))

	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.ApprovedExecuted, out.Disposition)
	require.True(t, decisionResult(t, ok).Accepted)
	require.False(t, decisionResult(t, inWorkflow).Accepted)
	refused := 0
	for _, u := range edge {
		require.True(t, u.done)
		if u.rejected != nil {
			requireAppErrType(t, u.rejected, workflows.ErrTypeTooManyDecisions)
			refused++
		}
	}
	require.Equal(t, 10, refused)
	rejectedRecords := 0
	for _, a := range h.audits {
		if a.Kind == "decision" && !a.Decision.Accepted {
			rejectedRecords++
		}
	}
	require.Equal(t, workflows.MaxRecordedRejections, rejectedRecords, "the in-workflow rejection is past the quota too")
	require.Equal(t, 1, h.executeCalls())
}

// Every update's answer comes after the facts it produced are written: an
// approval's answer after its read-model state, a cancel's after the end.
func TestAnswersFollowTheirRecords(t *testing.T) {
	h := newHarness(t, 2)
	h.completeAfter = time.Minute
	first := h.decideAt(time.Hour, "upd-alice", approve("alice"))
	c := h.cancelAt(2*time.Hour, "upd-cancel")

	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.StatusCancelled, out.Status)
	require.True(t, decisionResult(t, first).Accepted)
	require.Equal(t, tasks.CancelResult{Cancelled: true, Status: tasks.StatusCancelled}, cancelResult(t, c))
	require.Equal(t, tasks.StatusCancelled, h.complete().Status)
	require.Len(t, h.complete().Approvals, 1)
	require.Equal(t, []string{"requested", "notified", "decision"}, h.auditKinds())
	require.Zero(t, h.executeCalls())
}
