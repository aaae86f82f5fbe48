package notify_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/notify"
	"github.com/countersign/countersign/tasks"
)

// The notices of a call its requester already made, and which ran, carry
// the warning and the earlier call, as the Notify activity looks them up
// when it sends them; a call with other arguments or by another principal
// is not listed.
func TestNoticesShowIdenticalCalls(t *testing.T) {
	js, _ := startNATS(t)
	ctx := testCtx(t)
	store, err := tasks.NewStore(ctx, js, tasks.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f := newFakeSlack(t)
	slack, err := notify.NewSlack(ctx, js, notify.SlackOptions{Token: "xoxb-test", DefaultChannel: "#approvals", APIURL: f.URL()})
	if err != nil {
		t.Fatal(err)
	}
	events, err := notify.NewEvents(ctx, js, notify.EventsOptions{})
	if err != nil {
		t.Fatal(err)
	}

	now := time.Now().UTC()
	again := pendingRecord()
	again.CreatedAt, again.LastUpdatedAt, again.ExpiresAt = now, now, now.Add(24*time.Hour)
	first := again
	first.TaskID, first.ApprovalRef = tasks.NewID("tsk_"), tasks.NewID("apr_")
	first.CreatedAt = now.Add(-10 * time.Minute)
	first.Status, first.Disposition, first.ApprovalState = tasks.StatusCompleted, tasks.ApprovedExecuted, tasks.ApprovalExecuted
	first.LastUpdatedAt = now.Add(-3 * time.Minute)
	otherArgs := first
	otherArgs.TaskID, otherArgs.ApprovalRef, otherArgs.ActionHash = tasks.NewID("tsk_"), tasks.NewID("apr_"), strings.Repeat("cd", 32)
	otherOwner := first
	otherOwner.TaskID, otherOwner.ApprovalRef, otherOwner.Owner = tasks.NewID("tsk_"), tasks.NewID("apr_"), "agent-2"
	for _, r := range []tasks.Record{first, otherArgs, otherOwner, again} {
		if err := store.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}

	acts := &activities.Activities{Tasks: store, PublicURL: "http://localhost:8080",
		Notifier: &activities.Fanout{Notifiers: []activities.Notifier{slack, events}}}
	if err := acts.Notify(ctx, activities.NotifyInput{Version: activities.Version, TaskID: again.TaskID}); err != nil {
		t.Fatal(err)
	}
	warning := tasks.IdenticalCalls{Calls: []tasks.IdenticalCall{{MayHaveRun: true}}}.Warning()

	calls := f.Calls()
	if len(calls) != 1 || calls[0].Method != "chat.postMessage" {
		t.Fatalf("calls = %+v, want one chat.postMessage", calls)
	}
	blocks := calls[0].blocksText()
	for _, want := range []string{warning, "Identical calls", first.ApprovalRef + "` approved-executed, ended"} {
		if !strings.Contains(blocks, want) {
			t.Errorf("Slack message lacks %q:\n%s", want, blocks)
		}
	}
	for _, r := range []tasks.Record{otherArgs, otherOwner} {
		if strings.Contains(blocks, r.ApprovalRef) {
			t.Errorf("Slack message lists %s's call %s:\n%s", r.Owner, r.ApprovalRef, blocks)
		}
	}
	if text := calls[0].Form.Get("text"); !strings.Contains(text, "an identical call already ran or may have run") {
		t.Errorf("notification text = %q, want the warning", text)
	}

	s, err := js.Stream(ctx, notify.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var ev notify.Event
	if err := json.Unmarshal(msg.Data(), &ev); err != nil {
		t.Fatal(err)
	}
	ic := ev.IdenticalCalls
	if ev.Ref != again.ApprovalRef || !ic.Checked || ic.Warning != warning || len(ic.Calls) != 1 ||
		ic.Calls[0].Ref != first.ApprovalRef || ic.Calls[0].Disposition != tasks.ApprovedExecuted || !ic.Calls[0].MayHaveRun {
		t.Errorf("requested event: %s", msg.Data())
	}
	if strings.Contains(string(msg.Data()), first.TaskID) {
		t.Errorf("the event carries the first call's task ID: %s", msg.Data())
	}
}
