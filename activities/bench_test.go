package activities_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/internal/proccpu"
	"github.com/countersign/countersign/internal/testnats"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
)

// BenchmarkVerifiedStepsInProcess: what a verified call (SEP-2672) writes
// and runs after its assertion is verified, called in process in the
// order the workflow calls it, with no Temporal: the task record created,
// policy re-evaluated, the first outbox batch published (the requested,
// decision-with-assertion, reevaluated and claimed audit records, three
// read-model transitions), ExecuteTool (the execution fence, then the demo
// place_trade over its ledger) and Complete (the executed and outcome audit
// records, the seal, the terminal record). Everything is real and durable:
// file-backed NATS connected in process as `countersign dev` runs it, OPA
// with the default policy, Ed25519-signed audit records. cpu-µs/op is the
// whole process's CPU (internal/proccpu).
//
// It measures issue 12's question, what the ceremony would cost on a path
// without the workflow, not a path the product has: a verified call runs
// through the workflow (docs/benchmarks.md, "What 0.6 ms would have to
// hold").
func BenchmarkVerifiedStepsInProcess(b *testing.B) {
	ctx := context.Background()
	js, _ := testnats.StartInProcess(b)
	store, err := tasks.NewStore(ctx, js, tasks.StoreOptions{})
	if err != nil {
		b.Fatal(err)
	}
	engine, err := pdp.New(ctx, pdp.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ledger, err := gateway.NewLedger(ctx, js, gateway.LedgerOptions{})
	if err != nil {
		b.Fatal(err)
	}
	tools, err := gateway.NewRegistry(gateway.DemoTools(ledger)...)
	if err != nil {
		b.Fatal(err)
	}
	keys, err := audit.OpenKeyring(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	log, err := audit.Open(ctx, js, audit.Options{Keys: keys})
	if err != nil {
		b.Fatal(err)
	}
	a := &activities.Activities{Tasks: store, PDP: engine, Tools: tools, Audit: log}

	args := json.RawMessage(`{"symbol":"ACME","side":"buy","quantity":10,"limit":101.25}`)
	hash, err := canon.Hash("place_trade", args, testServerID)
	if err != nil {
		b.Fatal(err)
	}
	approver := tasks.ApprovalEntry{ApproverID: "apv_1", ApproverName: "alice", CredentialID: "cred-1", Decision: tasks.DecisionApprove}
	// An assertion of a real one's shape and size (its signature is not
	// checked here: the endpoint verified it before these steps).
	assertion := &activities.Assertion{CredentialID: "cred-1", PublicKey: make([]byte, 77), ChallengeID: "ch-1",
		AuthenticatorData: make([]byte, 37), Signature: make([]byte, 71), SignCount: 1,
		ClientDataJSON: []byte(`{"type":"webauthn.get","challenge":"q7JXyX0oZ8cH4s2a6kq1v3l9mB0tR5wE8uY2iO4pA6s","origin":"http://localhost:8080","crossOrigin":false}`)}

	n, last := 0, ""
	start := proccpu.Used()
	for b.Loop() {
		now := time.Now().UTC()
		env := tasks.Envelope{Version: tasks.EnvelopeVersion, TaskID: tasks.NewID("tsk_"), Tool: "place_trade",
			Arguments: args, ActionHash: hash.String(), Principal: "agent-1", Resource: "tool:place_trade",
			ServerID: testServerID, CreatedAt: now}
		in := tasks.ApprovalInput{Version: tasks.ApprovalInputVersion, Mode: tasks.ModeVerified, Envelope: env,
			Requirement: tasks.Requirement{Quorum: 1, Reason: "verified"}, ApprovalRef: tasks.NewID("apr_"),
			DisplayText: "Buy 10 ACME at 101.25", ExpiresAt: now.Add(time.Minute)}
		rec := tasks.Record{TaskID: env.TaskID, Owner: env.Principal, Era: tasks.Era2026, Status: tasks.StatusWorking,
			CreatedAt: now, LastUpdatedAt: now, TTL: time.Hour, PollInterval: time.Second, Tool: env.Tool,
			Arguments: args, ActionHash: env.ActionHash, DisplayText: in.DisplayText, ApprovalRef: in.ApprovalRef,
			Requirement: in.Requirement, ExpiresAt: in.ExpiresAt, ApprovalState: tasks.ApprovalPending}
		if err := store.Create(ctx, rec); err != nil {
			b.Fatal(err)
		}
		re, err := a.Reevaluate(ctx, activities.ReevaluateInput{Version: activities.Version, Envelope: env,
			Approvals: []tasks.ApprovalEntry{approver}, At: now, Verified: true})
		if err != nil {
			b.Fatal(err)
		}
		state := func(ev tasks.Event, s tasks.ApprovalState) activities.Projection {
			ev.At = now
			return activities.Projection{State: &activities.RecordStateInput{StatusMessage: "Running place_trade",
				ApprovalState: s, Approvals: []tasks.ApprovalEntry{approver}, Event: ev}}
		}
		auditStep := func(in activities.RecordAuditInput) activities.Projection {
			in.At = now
			return activities.Projection{Audit: &in}
		}
		batch := []activities.Projection{
			auditStep(activities.RecordAuditInput{Kind: activities.StepRequested, StepID: "requested", Input: &in}),
			state(tasks.NewEvent(tasks.EventRequested, "verified"), tasks.ApprovalPending),
			auditStep(activities.RecordAuditInput{Kind: activities.StepDecision, StepID: "decision/verified",
				Decision: &activities.AuditDecision{Decision: tasks.DecisionApprove, Accepted: true, ChallengeID: "ch-1",
					ApproverID: approver.ApproverID, ApproverName: approver.ApproverName, Assertion: assertion}}),
			state(tasks.ApprovalEvent(approver.ApproverName, 1, 1), tasks.ApprovalApproved),
			auditStep(activities.RecordAuditInput{Kind: activities.StepReevaluated, StepID: "reevaluated", Policy: &re}),
			state(tasks.ClaimedEvent(re.PolicyVersion), tasks.ApprovalApproved),
			auditStep(activities.RecordAuditInput{Kind: activities.StepClaimed, StepID: "claimed", Policy: &re}),
		}
		for i := range batch {
			batch[i].Seq = int64(i + 1)
		}
		if err := a.Publish(ctx, activities.PublishInput{Version: activities.Version, TaskID: env.TaskID, Entries: batch}); err != nil {
			b.Fatal(err)
		}
		out, err := a.ExecuteTool(ctx, activities.ExecuteToolInput{Version: activities.Version, Envelope: env})
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Complete(ctx, activities.CompleteInput{Version: activities.Version, TaskID: env.TaskID, Seq: int64(len(batch) + 1),
			Tool: env.Tool, Status: tasks.StatusCompleted, Disposition: tasks.ApprovedExecuted, ToolResult: &out.Result,
			StatusMessage: "Approved; place_trade ran once", ApprovalState: tasks.ApprovalExecuted,
			Approvals: []tasks.ApprovalEntry{approver}, Event: tasks.Event{At: now, Kind: tasks.EventExecuted}, Audit: true}); err != nil {
			b.Fatal(err)
		}
		last = env.TaskID
		n++
	}
	b.ReportMetric(proccpu.PerOp(start, n), "cpu-µs/op")
	b.StopTimer()
	// What each op wrote is the whole verified task: its chain from
	// requested to outcome verifies, and its record says it ran.
	lines, err := log.Chain(ctx, last)
	if err != nil {
		b.Fatal(err)
	}
	// (It does not verify: its assertion is a dummy.)
	if rep := audit.Verify(lines, keys.PublicKeys(), audit.VerifyOptions{}); len(lines) != 6 || len(rep.Tasks) != 1 ||
		!rep.Tasks[0].Complete || rep.Tasks[0].Disposition != string(tasks.ApprovedExecuted) {
		b.Fatalf("the last task's chain: %d records, report %+v", len(lines), rep)
	}
	if got, err := store.Get(ctx, last); err != nil || got.Status != tasks.StatusCompleted || got.ExecutionClaimedAt.IsZero() {
		b.Fatalf("the last task's record: %s, claimed %v (%v)", got.Status, got.ExecutionClaimedAt, err)
	}
}
