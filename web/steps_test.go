package web

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/countersign/countersign/tasks"
)

// TestTimelineStepsOldRecords checks that the page shows the same steps for
// events written before they carried structured fields (Detail only) as for
// events written with them.
func TestTimelineStepsOldRecords(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	stamp := func(e tasks.Event) tasks.Event { e.At = at; return e }
	structured := []tasks.Event{
		stamp(tasks.RejectedDecisionEvent("challenge_consumed")),
		stamp(tasks.RejectedDecisionEvent("made_up_reason")),
		stamp(tasks.ApprovalEvent("Ann Lee", 1, 2)),
		stamp(tasks.ClaimedEvent("pv-7")),
	}
	old := []tasks.Event{
		{At: at, Kind: "rejected-decision", Detail: "rejected decision: challenge_consumed"},
		{At: at, Kind: "rejected-decision", Detail: "rejected decision: made_up_reason"},
		{At: at, Kind: "approval", Detail: "approved by Ann Lee (1 of 2)"},
		{At: at, Kind: "claimed", Detail: "policy allowed (pv-7)"},
	}
	rec := tasks.Record{TaskID: "tsk_1", Owner: "agent-1", Tool: "transfer_funds", Requirement: tasks.Requirement{Quorum: 2}}
	rec.Timeline = old
	fromOld := timeline(rec, tasks.ApprovalExecuted)
	rec.Timeline = structured
	fromNew := timeline(rec, tasks.ApprovalExecuted)
	if diff := cmp.Diff(fromOld, fromNew); diff != "" {
		t.Errorf("steps differ (-old +structured):\n%s", diff)
	}
	want := []struct{ kind, title, detail string }{
		{"warn", "A decision was refused", "A confirmation was replayed; nothing changed."},
		{"warn", "A decision was refused", "Reason: made_up_reason; nothing changed."},
		{"ok", "Approved by Ann Lee (1 of 2)", ""},
		{"done", "Policy re-checked: allowed", "The call is claimed and runs once."},
	}
	for i, w := range want {
		s := fromNew[i]
		if s.Kind != w.kind || s.Title != w.title || s.Detail != w.detail {
			t.Errorf("step %d = %+v, want %+v", i, s, w)
		}
	}
}
