package notify_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/notify"
	"github.com/countersign/countersign/tasks"
)

func TestEventsRequestedAndResolved(t *testing.T) {
	js, _ := startNATS(t)
	ctx := testCtx(t)
	ev, err := notify.NewEvents(ctx, js, notify.EventsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := pendingRecord()
	url := "http://localhost:8080/approve/" + r.ApprovalRef
	// Twice each: the activity's retries must be stored once.
	for range 2 {
		if err := ev.ApprovalRequested(ctx, r, url, tasks.IdenticalCalls{}); err != nil {
			t.Fatal(err)
		}
	}
	r.Approvals = []tasks.ApprovalEntry{{ApproverID: "a1", ApproverName: "alice", CredentialID: "cred", Decision: tasks.DecisionApprove, At: t0}}
	if err := ev.ApprovalUpdated(ctx, r, url, tasks.IdenticalCalls{}); err != nil { // progress: no event
		t.Fatal(err)
	}
	r.Status, r.Disposition, r.ApprovalState, r.StatusMessage = tasks.StatusCompleted, tasks.ApprovedExecuted, tasks.ApprovalExecuted, "Approved; transfer_funds ran once"
	for range 2 {
		if err := ev.ApprovalUpdated(ctx, r, url, tasks.IdenticalCalls{}); err != nil {
			t.Fatal(err)
		}
	}

	s, err := js.Stream(ctx, notify.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("stream holds %d events, want 2 (requested, resolved; retries deduplicated)", info.State.Msgs)
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []jetstream.Msg
	for m := range batch.Messages() {
		got = append(got, m)
	}
	if len(got) != 2 {
		t.Fatalf("fetched %d events", len(got))
	}
	if got[0].Subject() != "countersign.approvals.requested.transfer_funds" || got[1].Subject() != "countersign.approvals.resolved.transfer_funds" {
		t.Errorf("subjects = %s, %s", got[0].Subject(), got[1].Subject())
	}
	for _, m := range got {
		raw := string(m.Data())
		for _, secret := range []string{r.TaskID, "pay now", "arguments", "amount", "cred"} {
			if strings.Contains(raw, secret) {
				t.Errorf("event carries %q: %s", secret, raw)
			}
		}
	}
	var req, res notify.Event
	if err := json.Unmarshal(got[0].Data(), &req); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(got[1].Data(), &res); err != nil {
		t.Fatal(err)
	}
	if req.V != 1 || req.Type != "requested" || req.Ref != r.ApprovalRef || req.ApproveURL != url || req.Quorum != 2 || req.DisplayText != r.DisplayText {
		t.Errorf("requested event = %+v", req)
	}
	if res.V != 1 || res.Type != "resolved" || res.Disposition != tasks.ApprovedExecuted || res.State != tasks.ApprovalExecuted ||
		len(res.Approvals) != 1 || res.Approvals[0].ApproverName != "alice" {
		t.Errorf("resolved event = %+v", res)
	}
}

func TestToolToken(t *testing.T) {
	for in, want := range map[string]string{
		"transfer_funds": "transfer_funds",
		"a.b":            "a_b",
		"x*>y":           "x__y",
		"sp ace":         "sp_ace",
		"":               "_",
		"é":              "_",
	} {
		if got := notify.ToolToken(in); got != want {
			t.Errorf("ToolToken(%q) = %q, want %q", in, got, want)
		}
	}
}
