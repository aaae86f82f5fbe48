package workflows_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/tasks"
)

// verifiedHarness is a harness for a call its caller approved in-band
// (SEP-2672), as mcpserver starts it: ModeVerified, quorum 1, no group, the
// verified approval in the input.
func verifiedHarness(t *testing.T) *harness {
	h := newHarness(t, 0)
	h.in.Mode = tasks.ModeVerified
	h.in.Requirement = tasks.Requirement{Quorum: 1, TTL: time.Hour, AuthenticatorClass: "cross-platform", Reason: "signed by the caller"}
	h.in.ExpiresAt = t0.Add(time.Hour)
	h.in.Verified = &tasks.VerifiedApproval{ApproverID: "ap-1", ApproverName: "agent", CredentialID: "cred-1", ChallengeID: "ch-1",
		PublicKey: []byte{1}, AuthenticatorData: []byte{2}, ClientDataJSON: []byte(`{}`), Signature: []byte{3}, SignCount: 7, At: t0}
	return h
}

// A verified call runs at once, exactly once, after the same re-evaluation
// and claim as an approved task, and its audit chain holds the approval
// with the assertion; no one is notified.
func TestVerifiedRunsOnceWithItsAssertion(t *testing.T) {
	h := verifiedHarness(t)
	out, err := h.run()
	require.NoError(t, err)
	require.Equal(t, tasks.StatusCompleted, out.Status)
	require.Equal(t, 1, h.executeCalls(), "ExecuteTool must run exactly once")
	require.Empty(t, h.verifies, "the endpoint verified the evidence already")
	require.Len(t, h.reevals, 1)
	require.True(t, h.reevals[0].Verified, "verify counts as allow only for a verified task")
	require.Len(t, h.reevals[0].Approvals, 1)
	require.Equal(t, t0, h.reevals[0].At, "it runs at once")
	require.Equal(t, []string{"requested", "decision", "reevaluated", "claimed"}, h.auditKinds()[:4])
	var dec *activities.AuditDecision
	for _, a := range h.audits {
		if a.Decision != nil {
			dec = a.Decision
		}
	}
	require.NotNil(t, dec)
	require.True(t, dec.Accepted)
	require.Equal(t, "ch-1", dec.ChallengeID)
	require.NotNil(t, dec.Assertion)
	require.Equal(t, uint32(7), dec.Assertion.SignCount)
	c := h.complete()
	require.Equal(t, tasks.ApprovedExecuted, c.Disposition, "an approved call, as after a task approval")
	require.NotNil(t, c.ToolResult)
	h.env.AssertActivityNumberOfCalls(t, "Notify", 0)
}

// A verified input without its approval fails before anything runs.
func TestVerifiedInputWithoutApproval(t *testing.T) {
	h := verifiedHarness(t)
	h.in.Verified = nil
	_, err := h.run()
	require.Error(t, err)
	require.Equal(t, 0, h.executeCalls())
}

// Its facts up to the claim (requested, the decision, re-evaluated,
// claimed) go out in one Publish activity, with the tool's run; the end in
// another Publish, a local activity in the workflow task that reads the
// tool's outcome (versionEndLocal).
func TestVerifiedPublishesTwice(t *testing.T) {
	h := verifiedHarness(t)
	paths := h.publishPaths()
	_, err := h.run()
	require.NoError(t, err)
	require.Equal(t, []int{7, 1}, h.batches)
	require.Equal(t, []string{"activity:7", "local:1"}, *paths)
}
