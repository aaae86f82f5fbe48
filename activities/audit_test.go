package activities_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/tasks"
)

// The audit activities write a chain that the offline verifier accepts, and
// retries write nothing twice; Complete puts the receipt in the result.
func TestAuditChainFromActivities(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	keys := w.openAudit(t)
	alice := w.enroll(t, "alice", "approvers")
	req := tasks.Requirement{Group: "approvers", Quorum: 1, AuthenticatorClass: "platform", Reason: "big"}
	env := envelope(t, "agent-1", `{"amount":5000,"to":"acme"}`)
	rec := w.createTask(t, env)
	in := tasks.ApprovalInput{Version: tasks.ApprovalInputVersion, Envelope: env, Requirement: req,
		ApprovalRef: rec.ApprovalRef, DisplayText: rec.DisplayText, ExpiresAt: rec.ExpiresAt}
	ch := w.challenge(t, env, req)
	v, err := w.verify(t, activities.VerifyDecisionInput{Envelope: env, Requirement: req, ChallengeID: ch.ID,
		Response: alice.sign(ch), ConsumerKey: "update-1"})
	if err != nil || !v.Accepted {
		t.Fatalf("verify: %v %+v", err, v)
	}
	at := env.CreatedAt
	policy := activities.ReevaluateOutput{Version: activities.Version, Allow: true, Effect: "allow", PolicyVersion: "pv"}
	steps := []activities.RecordAuditInput{
		{Kind: audit.KindRequested, StepID: "requested", Input: &in},
		{Kind: audit.KindNotified, StepID: "notify"},
		{Kind: audit.KindDecision, StepID: "decision/u0", Decision: &activities.AuditDecision{Decision: "approve", Reason: "challenge_unknown", ChallengeID: "nope"}},
		{Kind: audit.KindDecision, StepID: "decision/u1", Decision: &activities.AuditDecision{Decision: "approve", Accepted: true,
			ChallengeID: ch.ID, ApproverID: v.ApproverID, ApproverName: v.ApproverName, Assertion: v.Assertion}},
		{Kind: audit.KindReevaluated, StepID: "reevaluated", Policy: &policy},
		{Kind: audit.KindClaimed, StepID: "claimed", Policy: &policy},
	}
	for _, retry := range []bool{false, true} {
		for _, s := range steps {
			s.Version, s.TaskID, s.At = activities.Version, env.TaskID, at
			if err := w.run(t, w.acts.RecordAudit, s); err != nil {
				t.Fatalf("RecordAudit %s (retry %t): %v", s.Kind, retry, err)
			}
		}
	}
	if err := w.run(t, w.acts.RecordAudit, activities.RecordAuditInput{Version: activities.Version, TaskID: env.TaskID,
		StepID: "x", Kind: audit.KindDecision}); err == nil {
		t.Fatal("a decision step without its decision was recorded")
	}
	done := activities.CompleteInput{Version: activities.Version, TaskID: env.TaskID, Tool: env.Tool,
		Status: tasks.StatusCompleted, Disposition: tasks.ApprovedExecuted,
		ToolResult:    &tasks.CallToolResult{Content: []json.RawMessage{tasks.TextContent("done")}},
		StatusMessage: "ran", ApprovalState: tasks.ApprovalExecuted,
		Event: tasks.Event{At: at.Add(time.Minute), Kind: "executed"}, Audit: true}
	for range 2 {
		if err := w.run(t, w.acts.Complete, done); err != nil {
			t.Fatal(err)
		}
	}
	got, err := w.store.Get(ctx, env.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Meta map[string]audit.Receipt `json:"_meta"`
	}
	json.Unmarshal(got.Result, &res)
	rc := res.Meta[audit.MetaKey]
	lines, err := w.acts.Audit.Chain(ctx, env.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != len(steps)+2 {
		t.Fatalf("chain has %d records, want %d", len(lines), len(steps)+2)
	}
	if rc.Hash != audit.Hash(lines[len(lines)-1]) || rc.KeyID != keys.CurrentID() {
		t.Fatalf("receipt %+v is not the outcome record", rc)
	}
	rep := audit.Verify(lines, keys.PublicKeys(), audit.VerifyOptions{})
	if !rep.OK || rep.Tasks[0].Approvals != 1 || rep.Tasks[0].Disposition != "approved-executed" {
		b, _ := json.MarshalIndent(rep, "", " ")
		t.Fatalf("chain does not verify:\n%s", b)
	}
}

// A chain that cannot be sealed (its requested record was never written)
// never blocks the task's end: Complete writes the result without a receipt.
func TestCompleteWithBrokenAuditChain(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.openAudit(t)
	env := envelope(t, "agent-1", `{"amount":5000,"to":"acme"}`)
	w.createTask(t, env)
	err := w.run(t, w.acts.Complete, activities.CompleteInput{Version: activities.Version, TaskID: env.TaskID, Tool: env.Tool,
		Status: tasks.StatusCompleted, Disposition: tasks.DeniedNotExecuted, ApprovalState: tasks.ApprovalExpired,
		Event: tasks.Event{At: env.CreatedAt.Add(time.Hour), Kind: "expired"}, Audit: true})
	if err != nil {
		t.Fatal(err)
	}
	got, err := w.store.Get(ctx, env.TaskID)
	if err != nil || got.Status != tasks.StatusCompleted || tasks.DispositionOf(got.Result) != tasks.DeniedNotExecuted {
		t.Fatalf("task not completed: %v %+v", err, got)
	}
	if _, err := w.acts.Audit.Chain(ctx, env.TaskID); err != audit.ErrNotFound {
		t.Fatalf("chain: %v, want ErrNotFound", err)
	}
}

// openAudit gives the world's activities a real audit log on its NATS and
// returns its keyring.
func (w *world) openAudit(t *testing.T) *audit.Keyring {
	t.Helper()
	js, err := jetstream.New(w.nc)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := audit.OpenKeyring(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if w.acts.Audit, err = audit.Open(context.Background(), js, audit.Options{Keys: keys}); err != nil {
		t.Fatal(err)
	}
	return keys
}

// A start judged failed (the record failed, "the tool did not run") whose
// workflow reached Temporal late all the same runs its course and ends
// otherwise (here it expires). Its end cannot change the record, which
// ended first; the audit chain must not tell another story: it is sealed
// with the record's end, and the chain, tasks/get and the verifier agree.
func TestCompleteOnARecordThatEndedFirst(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	keys := w.openAudit(t)
	req := tasks.Requirement{Group: "approvers", Quorum: 1, AuthenticatorClass: "platform", Reason: "big"}
	env := envelope(t, "agent-1", `{"amount":5000,"to":"acme"}`)
	rec := w.createTask(t, env)
	in := tasks.ApprovalInput{Version: tasks.ApprovalInputVersion, Envelope: env, Requirement: req,
		ApprovalRef: rec.ApprovalRef, DisplayText: rec.DisplayText, ExpiresAt: rec.ExpiresAt}
	if _, err := w.store.Update(ctx, env.TaskID, func(r *tasks.Record) error {
		tasks.FailUnstarted(r, env.CreatedAt.Add(5*time.Second), "workflow start failed")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []activities.RecordAuditInput{
		{Kind: audit.KindRequested, StepID: "requested", Input: &in},
		{Kind: audit.KindNotified, StepID: "notify"},
	} {
		s.Version, s.TaskID, s.At = activities.Version, env.TaskID, env.CreatedAt
		if err := w.run(t, w.acts.RecordAudit, s); err != nil {
			t.Fatal(err)
		}
	}
	expired := activities.CompleteInput{Version: activities.Version, TaskID: env.TaskID, Tool: env.Tool,
		Status: tasks.StatusCompleted, Disposition: tasks.DeniedNotExecuted, ApprovalState: tasks.ApprovalExpired,
		Detail: "Approval expired.", StatusMessage: "Expired",
		Event: tasks.Event{At: env.CreatedAt.Add(24 * time.Hour), Kind: tasks.EventExpired}, Audit: true}
	for range 2 { // a retried activity
		if err := w.run(t, w.acts.Complete, expired); err != nil {
			t.Fatalf("Complete: %v", err)
		}
	}
	got, err := w.store.Get(ctx, env.TaskID)
	if err != nil || got.Status != tasks.StatusFailed {
		t.Fatalf("record: %v %+v, want it still failed", err, got)
	}
	lines, err := w.acts.Audit.Chain(ctx, env.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	rep := audit.Verify(lines, keys.PublicKeys(), audit.VerifyOptions{})
	if !rep.OK || len(rep.Tasks) != 1 {
		b, _ := json.MarshalIndent(rep, "", " ")
		t.Fatalf("chain does not verify:\n%s", b)
	}
	if v := rep.Tasks[0]; v.Status != string(got.Status) || v.Disposition != string(got.Disposition) {
		t.Fatalf("the chain ends %s/%s, tasks/get says %s/%s", v.Status, v.Disposition, got.Status, got.Disposition)
	}
	var end audit.Record
	if err := json.Unmarshal(lines[len(lines)-2], &end); err != nil || end.Kind != audit.KindFailed {
		t.Fatalf("terminal record %s (%v), want %s", end.Kind, err, audit.KindFailed)
	}
}
