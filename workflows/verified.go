package workflows

import (
	"go.temporal.io/sdk/workflow"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/tasks"
)

// Verified tasks (tasks.ModeVerified): a call its own caller approved
// in-band (SEP-2672). The MCP endpoint verified the passkey assertion and
// consumed its challenge (compare-and-set, single use across replicas)
// before it started this workflow, whose ID is fresh for every consume; the
// approval arrives in the input. The workflow records it exactly as an
// accepted approve decision (audit step "decision", with the assertion),
// then goes on as after any approval: policy re-evaluated (where "verify"
// counts as allow), the execution claim, ExecuteTool once, the end (an
// approved call: disposition approved-executed, so the audit verifier reads
// it as any approved task) in the read model and the sealed audit chain. No
// one is notified and nothing waits: the caller is waiting on the result.
func (w *approval) acceptVerified(ctx workflow.Context) {
	v := w.in.Verified
	w.approvals = append(w.approvals, tasks.ApprovalEntry{
		ApproverID:   v.ApproverID,
		ApproverName: v.ApproverName,
		CredentialID: v.CredentialID,
		Decision:     tasks.DecisionApprove,
		At:           v.At,
	})
	w.emitAudit(ctx, activities.RecordAuditInput{Kind: activities.StepDecision, StepID: "decision/verified",
		Decision: &activities.AuditDecision{Decision: tasks.DecisionApprove, Accepted: true, ChallengeID: v.ChallengeID,
			ApproverID: v.ApproverID, ApproverName: v.ApproverName, Assertion: &activities.Assertion{
				CredentialID: v.CredentialID, PublicKey: v.PublicKey, ChallengeID: v.ChallengeID,
				AuthenticatorData: v.AuthenticatorData, ClientDataJSON: v.ClientDataJSON,
				Signature: v.Signature, SignCount: v.SignCount,
			}}})
	w.emitState(ctx, tasks.ApprovalEvent(v.ApproverName, 1, 1))
	w.phase = phaseApproved
}
