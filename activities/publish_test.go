package activities_test

import (
	"context"
	"testing"
	"time"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/tasks"
)

// A Publish batch lands in order, a retried batch changes nothing, a late
// batch cannot roll the record back, and the terminal entry seals the chain.
func TestPublishIsOrderedAndIdempotent(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.openAudit(t)
	env := envelope(t, "agent-1", `{"amount":5000,"to":"acme"}`)
	rec := w.createTask(t, env)
	in := tasks.ApprovalInput{Version: tasks.ApprovalInputVersion, Envelope: env, Requirement: rec.Requirement,
		ApprovalRef: rec.ApprovalRef, DisplayText: rec.DisplayText, ExpiresAt: rec.ExpiresAt}
	at := env.CreatedAt.Add(time.Minute)
	state := func(msg string) *activities.RecordStateInput {
		return &activities.RecordStateInput{StatusMessage: msg, ApprovalState: tasks.ApprovalPending,
			Event: tasks.Event{At: at, Kind: "note", Detail: msg}}
	}
	first := activities.PublishInput{Version: activities.Version, TaskID: env.TaskID, Entries: []activities.Projection{
		{Seq: 1, Audit: &activities.RecordAuditInput{Kind: audit.KindRequested, StepID: "requested", Input: &in, At: at}},
		{Seq: 2, State: state("one")},
		{Seq: 3, Audit: &activities.RecordAuditInput{Kind: "cancel-refused", StepID: "cancel-refused", At: at}},
		{Seq: 4, State: state("two")},
	}}
	for range 2 { // the retry of a batch that landed
		if err := w.run(t, w.acts.Publish, first); err != nil {
			t.Fatal(err)
		}
	}
	got, err := w.store.Get(ctx, env.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if got.StatusMessage != "two" || got.Seq != 4 || len(got.Timeline) != 2 {
		t.Fatalf("after the first batch: message %q seq %d timeline %d, want two, 4, 2", got.StatusMessage, got.Seq, len(got.Timeline))
	}
	// A zombie attempt of an older batch lands late: nothing moves back.
	late := activities.PublishInput{Version: activities.Version, TaskID: env.TaskID, Entries: []activities.Projection{{Seq: 2, State: state("one")}}}
	if err := w.run(t, w.acts.Publish, late); err != nil {
		t.Fatal(err)
	}
	if got, _ = w.store.Get(ctx, env.TaskID); got.StatusMessage != "two" {
		t.Fatalf("a late entry rolled the record back to %q", got.StatusMessage)
	}
	end := activities.PublishInput{Version: activities.Version, TaskID: env.TaskID, Entries: []activities.Projection{
		{Seq: 5, State: state("three")},
		{Seq: 6, End: &activities.CompleteInput{Tool: env.Tool, Status: tasks.StatusCancelled, ApprovalState: tasks.ApprovalCancelled,
			StatusMessage: "Cancelled before execution", Event: tasks.Event{At: at, Kind: "cancelled"}, Audit: true}},
	}}
	for range 2 {
		if err := w.run(t, w.acts.Publish, end); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ = w.store.Get(ctx, env.TaskID); got.Status != tasks.StatusCancelled || got.Seq != 6 {
		t.Fatalf("after the end: status %s seq %d", got.Status, got.Seq)
	}
	chain, err := w.acts.Audit.Chain(ctx, env.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	// requested, cancel-refused, cancelled, outcome: each once.
	if len(chain) != 4 {
		t.Fatalf("chain has %d records, want 4", len(chain))
	}
	// An entry that holds nothing is refused, alone: the batch goes on.
	bad := activities.PublishInput{Version: activities.Version, TaskID: env.TaskID, Entries: []activities.Projection{{Seq: 7}}}
	if err := w.run(t, w.acts.Publish, bad); err != nil {
		t.Fatalf("an entry that can never be written failed the batch: %v", err)
	}
}
