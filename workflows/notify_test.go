package workflows_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/tasks"
	"github.com/countersign/countersign/workflows"
)

// notes records the NotifyUpdate calls, and whether the terminal record was
// written when the resolved notification was sent.
type notes struct {
	h              *harness
	kinds          []activities.NotifyKind
	completeBefore bool
	fail           error
}

func (h *harness) captureNotes() *notes {
	n := &notes{h: h}
	h.env.OnActivity(acts.NotifyUpdate, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.NotifyUpdateInput) error {
			h.mu.Lock()
			defer h.mu.Unlock()
			if in.Version != activities.Version || in.TaskID != h.in.Envelope.TaskID {
				h.t.Errorf("NotifyUpdate input = %+v", in)
			}
			n.kinds = append(n.kinds, in.Kind)
			if in.Kind == activities.NotifyResolved {
				n.completeBefore = len(h.completes) == 1
			}
			return n.fail
		})
	return n
}

func (h *harness) denyUnsignedAt(at time.Duration, updateID string, d tasks.UnsignedDenial) *updateOutcome {
	u := &updateOutcome{}
	h.env.RegisterDelayedCallback(func() {
		h.env.UpdateWorkflow(tasks.UpdateDenyUnsigned, updateID, u.callbacks(), d)
	}, at)
	return u
}

func TestNotifiesEachApprovalAndTheEnd(t *testing.T) {
	h := newHarness(t, 2)
	n := h.captureNotes()
	h.decideAt(time.Hour, "u1", approve("alice"))
	h.decideAt(2*time.Hour, "u2", approve("bob"))
	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.ApprovedExecuted, out.Disposition)
	require.Equal(t, []activities.NotifyKind{activities.NotifyProgress, activities.NotifyProgress, activities.NotifyResolved}, n.kinds)
	require.True(t, n.completeBefore, "the end must be notified after the terminal record is written")
	h.env.AssertActivityNumberOfCalls(t, "Notify", 1)
}

func TestNotifiesExpiry(t *testing.T) {
	h := newHarness(t, 1)
	n := h.captureNotes()
	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.DeniedNotExecuted, out.Disposition)
	require.Equal(t, []activities.NotifyKind{activities.NotifyResolved}, n.kinds)
}

// Slack and NATS down for good: the task still ends normally; the
// notifications are retried, then given up on.
func TestNotifyUpdateFailureDoesNotFailTheTask(t *testing.T) {
	h := newHarness(t, 1)
	h.notifyErr = errors.New("slack down")
	n := h.captureNotes()
	n.fail = errors.New("slack down")
	h.decideAt(time.Hour, "u1", approve("alice"))
	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.ApprovedExecuted, out.Disposition)
	require.Equal(t, 1, h.executeCalls())
	require.Equal(t, activities.NotifyResolved, n.kinds[len(n.kinds)-1])
	h.env.AssertActivityNumberOfCalls(t, "NotifyUpdate", 10) // 2 notifications × 5 attempts
}

func TestUnsignedDenyEndsWithoutExecuting(t *testing.T) {
	h := newHarness(t, 2)
	n := h.captureNotes()
	h.decideAt(time.Hour, "u1", approve("alice"))
	u := h.denyUnsignedAt(2*time.Hour, "d1", tasks.UnsignedDenial{ApproverID: "id-bob", ApproverName: "bob", Via: "slack", At: t0})
	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.StatusCompleted, out.Status)
	require.Equal(t, tasks.DeniedNotExecuted, out.Disposition)
	require.Equal(t, 0, h.executeCalls())
	res := decisionResult(t, u)
	require.True(t, res.Accepted)
	require.Equal(t, tasks.ApprovalDenied, res.Status)

	c := h.complete()
	require.Equal(t, tasks.ApprovalDenied, c.ApprovalState)
	require.Contains(t, c.Detail, "Denied by bob via slack (without a passkey)")
	require.Len(t, c.Approvals, 2)
	last := c.Approvals[1]
	require.Equal(t, "id-bob", last.ApproverID)
	require.Equal(t, tasks.DecisionDeny, last.Decision)
	require.Empty(t, last.CredentialID)
	require.Equal(t, t0.Add(2*time.Hour), last.At)
	require.Equal(t, activities.NotifyResolved, n.kinds[len(n.kinds)-1])
}

func TestUnsignedDenyValidator(t *testing.T) {
	h := newHarness(t, 1)
	h.captureNotes()
	ok := tasks.UnsignedDenial{ApproverID: "id-bob", ApproverName: "bob", Via: "slack"}
	noApprover := ok
	noApprover.ApproverID = ""
	noVia := ok
	noVia.Via = ""
	long := ok
	long.Comment = string(make([]byte, workflows.MaxCommentLen+1))
	bad := []*updateOutcome{
		h.denyUnsignedAt(time.Minute, "b1", noApprover),
		h.denyUnsignedAt(2*time.Minute, "b2", noVia),
		h.denyUnsignedAt(3*time.Minute, "b3", long),
	}
	h.decideAt(time.Hour, "u1", approve("alice"))
	h.completeAfter = 2 * time.Hour // the workflow is still open, its outcome decided
	late := h.denyUnsignedAt(90*time.Minute, "late", ok)
	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.ApprovedExecuted, out.Disposition, "malformed unsigned denials changed nothing")
	for _, u := range bad {
		require.True(t, u.done)
		requireAppErrType(t, u.rejected, workflows.ErrTypeMalformedDecision)
	}
	require.True(t, late.done)
	requireAppErrType(t, late.rejected, workflows.ErrTypeTaskNotPending)
}

// publishPaths records, per Publish call, whether it ran as a local
// activity ("local") or an activity ("activity"), with its batch size.
func (h *harness) publishPaths() *[]string {
	var paths []string
	record := func(kind string, info *activity.Info, args []any) {
		if info.ActivityType.Name != "Publish" {
			return
		}
		in, _ := args[0].(activities.PublishInput)
		h.mu.Lock()
		defer h.mu.Unlock()
		paths = append(paths, fmt.Sprintf("%s:%d", kind, len(in.Entries)))
	}
	h.env.SetOnLocalActivityStartedListener(func(info *activity.Info, _ context.Context, args []any) { record("local", info, args) })
	h.env.SetOnActivityStartedListener(func(info *activity.Info, _ context.Context, args converter.EncodedValues) {
		var in activities.PublishInput
		if info.ActivityType.Name == "Publish" && args.Get(&in) == nil {
			record("activity", info, []any{in})
		}
	})
	return &paths
}

// The first workflow task tells the approvers itself (a local activity)
// and writes the request with the notice's outcome in one batch, itself
// too (versionFirstBatchLocal): no Publish or Notify activity before anyone
// decides; the end goes through the Publish activity.
func TestFirstTaskNotifiesAndPublishesOnce(t *testing.T) {
	h := newHarness(t, 1)
	paths := h.publishPaths()
	_, err := h.run() // expires
	require.NoError(t, err)
	require.Equal(t, []int{4, 1}, h.batches, "the first task's facts, then the end")
	require.Equal(t, []string{"local:4", "activity:1"}, *paths)
	require.Equal(t, []string{"requested", "notified"}, h.auditKinds()[:2])
	h.env.AssertActivityNumberOfCalls(t, "Notify", 1)
}

// A first batch the local activity cannot write (the store is down for its
// three quick attempts) goes through the Publish activity, whole and in
// order: nothing is lost or written twice.
func TestFirstBatchFallsBackToTheActivity(t *testing.T) {
	h := newHarness(t, 1)
	h.repeatsOK = true
	paths := h.publishPaths()
	h.env.OnActivity(acts.Publish, mock.Anything, mock.Anything).Return(errors.New("nats: no responders")).Times(3)
	_, err := h.run() // expires
	require.NoError(t, err)
	// Local attempts, then the activity: usually three local failures and
	// one activity attempt. Between the local attempts the test
	// environment may skip its clock ahead to the approval's expiry (seen
	// on a loaded CI machine: "LocalActivity completed after activity
	// deadline"): the local tries end early, the failures left in the mock
	// fall on the activity, which retries, and a local write that succeeded
	// past its deadline is sent again by the activity, which Publish's
	// idempotence absorbs (as it does in production for a write slower than
	// the local deadline). Either way each batch takes effect once, in order.
	// (A local attempt the environment abandoned may still reach the mock
	// after the activity started, so the attempts' order is not checked
	// beyond: local first, the activity for the first batch, the end last.)
	require.Regexp(t, `^local:4 ((local|activity):4 )*activity:1$`, strings.Join(*paths, " "))
	require.Contains(t, *paths, "activity:4", "the first batch fell back to the activity")
	require.Equal(t, []int{4, 1}, h.batches, "each batch written once, in order")
	require.LessOrEqual(t, h.repeats, 1, "at most the late local write sent again")
	require.Equal(t, []string{"requested", "notified"}, h.auditKinds()[:2])
}

// Only approval mode writes its first batch in the first task: a verified
// call's first batch holds its accepted assertion and claim, an
// unattended task's its run. The end after the tool is written inside the
// workflow task that reads the tool's outcome, in every mode
// (versionEndLocal).
func TestFirstBatchLocalOnlyForApprovals(t *testing.T) {
	h := unattendedHarness(t, time.Minute)
	paths := h.publishPaths()
	_, err := h.run()
	require.NoError(t, err)
	require.Greater(t, len(*paths), 1)
	require.Equal(t, "local:1", (*paths)[len(*paths)-1], "the end after the tool: %v", *paths)
	for _, p := range (*paths)[:len(*paths)-1] {
		require.NotContains(t, p, "local", "unattended: %v", *paths)
	}
}

// An approved task's end after its tool is written by a local activity,
// once, and the chain ends as before (versionEndLocal).
func TestEndAfterTheToolIsWrittenInItsTask(t *testing.T) {
	h := newHarness(t, 1)
	paths := h.publishPaths()
	// A slow tool: everything before the end is written before it, so the
	// end is alone in its batch (an end batched with other entries goes
	// through the activity).
	h.executeAfter = time.Minute
	h.decideAt(time.Hour, "upd-alice", approve("alice"))
	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.ApprovedExecuted, out.Disposition)
	require.Equal(t, "local:4", (*paths)[0], "the request and its notice: %v", *paths)
	require.Equal(t, "local:1", (*paths)[len(*paths)-1], "the end: %v", *paths)
	for _, p := range (*paths)[1 : len(*paths)-1] {
		require.Contains(t, p, "activity", "a decision's batch waits for its task to commit: %v", *paths)
	}
	require.Equal(t, 1, h.executeCalls())
	require.Equal(t, tasks.ApprovedExecuted, h.complete().Disposition)
	require.Equal(t, 1, h.batches[len(h.batches)-1], "the end written once")
}

// An end the local activity cannot write (the store is down for its three
// quick attempts) goes through the Publish activity: written once, last.
func TestEndFallsBackToTheActivity(t *testing.T) {
	h := verifiedHarness(t)
	h.repeatsOK = true
	paths := h.publishPaths()
	h.env.OnActivity(acts.Publish, mock.Anything, mock.MatchedBy(func(in activities.PublishInput) bool {
		return len(in.Entries) == 1 && in.Entries[0].End != nil
	})).Return(errors.New("nats: no responders")).Times(3)
	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.ApprovedExecuted, out.Disposition)
	require.Regexp(t, `^activity:7 local:1 ((local|activity):1 )*activity:1$`, strings.Join(*paths, " "))
	require.Equal(t, []int{7, 1}, h.batches, "each batch written once, in order")
	require.Equal(t, 1, h.executeCalls())
}

// An end that does not follow from the tool's run (an approver denied the
// call) goes through the Publish activity: it commits before it is written.
func TestEndNotFromTheToolWaitsForItsTask(t *testing.T) {
	h := newHarness(t, 1)
	paths := h.publishPaths()
	h.decideAt(time.Hour, "upd-bob", deny("bob", ""))
	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.DeniedNotExecuted, out.Disposition)
	require.Equal(t, []string{"local:4", "activity:2"}, *paths, "the denial and the end, after their task commits")
	require.Equal(t, 0, h.executeCalls())
}
