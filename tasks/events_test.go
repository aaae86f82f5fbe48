package tasks_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/countersign/countersign/tasks"
)

func TestEventText(t *testing.T) {
	tests := []struct {
		name string
		ev   tasks.Event
		want string
	}{
		{"requested", tasks.NewEvent(tasks.EventRequested, "Payments over 50 need two people"), "Payments over 50 need two people"},
		{"notified", tasks.NewEvent(tasks.EventNotified, ""), ""},
		{"notify failed", tasks.NewEvent(tasks.EventNotifyFailed, ""), "approvers could not be notified"},
		{"approval", tasks.ApprovalEvent("Ann Lee", 1, 2), "approved by Ann Lee (1 of 2)"},
		{"rejected decision", tasks.RejectedDecisionEvent("challenge_consumed"), "rejected decision: challenge_consumed"},
		{"already approved", tasks.RejectedDecisionEvent(tasks.ReasonAlreadyApproved), "rejected decision: already_approved"},
		{"claimed", tasks.ClaimedEvent("pv-7"), "policy allowed (pv-7)"},
		{"claimed without version", tasks.ClaimedEvent(""), "policy allowed ()"},
		{"cancel refused", tasks.NewEvent(tasks.EventCancelRefused, ""), "cancel refused: the call was already claimed for execution"},
		{"input", tasks.NewEvent(tasks.EventInput, "1 input request(s) answered, 0 pending"), "1 input request(s) answered, 0 pending"},
		{"denied", tasks.NewEvent(tasks.EventDenied, "Denied by Ann: no"), "Denied by Ann: no"},
		{"unknown kind", tasks.Event{Kind: "reevaluated", Detail: "as recorded"}, "as recorded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.ev.Text(); got != tt.want {
				t.Errorf("Text() = %q, want %q", got, tt.want)
			}
			// Detail holds the same words, for readers that know only it.
			if tt.ev.Detail != tt.want {
				t.Errorf("Detail = %q, want %q", tt.ev.Detail, tt.want)
			}
		})
	}
}

// TestEventOldFormat reads events as records written before events carried
// structured fields hold them: Detail only.
func TestEventOldFormat(t *testing.T) {
	const old = `[
		{"at":"2026-01-02T03:04:05Z","kind":"approval","detail":"approved by Ann Lee (1 of 2)"},
		{"at":"2026-01-02T03:04:06Z","kind":"rejected-decision","detail":"rejected decision: self_approval"},
		{"at":"2026-01-02T03:04:07Z","kind":"claimed","detail":"policy allowed (pv-1)"},
		{"at":"2026-01-02T03:04:08Z","kind":"executed","detail":"Approved; transfer_funds ran once"}
	]`
	var evs []tasks.Event
	if err := json.Unmarshal([]byte(old), &evs); err != nil {
		t.Fatal(err)
	}
	var texts []string
	for _, e := range evs {
		texts = append(texts, e.Text())
	}
	want := []string{"approved by Ann Lee (1 of 2)", "rejected decision: self_approval", "policy allowed (pv-1)", "Approved; transfer_funds ran once"}
	if diff := cmp.Diff(want, texts); diff != "" {
		t.Errorf("Text() (-want +got):\n%s", diff)
	}
	if got := evs[1].RejectionReason(); got != "self_approval" {
		t.Errorf("RejectionReason() of an old record = %q, want self_approval", got)
	}
	if got := evs[0].RejectionReason(); got != "" {
		t.Errorf("RejectionReason() of an approval = %q, want none", got)
	}
}

// TestEventWire checks that a structured event keeps the old fields' values,
// so readers of records that know only them are unaffected.
func TestEventWire(t *testing.T) {
	e := tasks.RejectedDecisionEvent("challenge_expired")
	e.At = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	var old struct {
		At     time.Time `json:"at"`
		Kind   string    `json:"kind"`
		Detail string    `json:"detail"`
	}
	if err := json.Unmarshal(b, &old); err != nil {
		t.Fatal(err)
	}
	if old.Kind != "rejected-decision" || old.Detail != "rejected decision: challenge_expired" || !old.At.Equal(e.At) {
		t.Errorf("old view = %+v", old)
	}
	var back tasks.Event
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(e, back); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	if got := back.RejectionReason(); got != "challenge_expired" {
		t.Errorf("RejectionReason() = %q", got)
	}
}

func TestOutcomeText(t *testing.T) {
	tests := []struct {
		name     string
		kind     tasks.EventKind
		attended bool
		want     string
	}{
		{"executed", tasks.EventExecuted, true, "Approved; transfer_funds ran once"},
		{"executed unattended", tasks.EventExecuted, false, "transfer_funds ran once"},
		{"execution error", tasks.EventExecutionError, true, "Approved; transfer_funds ran and returned an error"},
		{"execution error unattended", tasks.EventExecutionError, false, "transfer_funds ran and returned an error"},
		{"outcome unknown", tasks.EventOutcomeUnknown, true, "Outcome unknown: transfer_funds was started but did not report back"},
		{"failed", tasks.EventFailed, false, "Failed: transfer_funds reported a protocol error"},
		{"cancelled", tasks.EventCancelled, true, "Cancelled before execution"},
		{"expired", tasks.EventExpired, true, "Approval expired"},
		{"denied", tasks.EventDenied, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tasks.OutcomeText(tt.kind, "transfer_funds", tt.attended); got != tt.want {
				t.Errorf("OutcomeText = %q, want %q", got, tt.want)
			}
		})
	}
}
