package workflows

import (
	"testing"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/tasks"
)

// requestOnly lets through only the request and the notice's outcome: a
// batch with any decision, rejection, cancel or end is written by the
// Publish activity, after the workflow task that decided it commits.
func TestRequestOnly(t *testing.T) {
	state := func(k tasks.EventKind) activities.Projection {
		return activities.Projection{State: &activities.RecordStateInput{Event: tasks.NewEvent(k, "")}}
	}
	step := func(k activities.AuditKind) activities.Projection {
		return activities.Projection{Audit: &activities.RecordAuditInput{Kind: k}}
	}
	first := []activities.Projection{step(activities.StepRequested), state(tasks.EventRequested), state(tasks.EventNotified), step(activities.StepNotified)}
	approved := state(tasks.EventRequested)
	approved.State.Approvals = []tasks.ApprovalEntry{{}}
	for _, tc := range []struct {
		name  string
		batch []activities.Projection
		want  bool
	}{
		{"request and notice", first, true},
		{"request, notice failed", []activities.Projection{step(activities.StepRequested), state(tasks.EventNotifyFailed), step(activities.StepNotifyFailed)}, true},
		{"empty", nil, false},
		{"an approval", append(first[:4:4], state(tasks.EventApproval)), false},
		{"a decision step", append(first[:4:4], step(activities.StepDecision)), false},
		{"an end", append(first[:4:4], activities.Projection{End: &activities.CompleteInput{}}), false},
		{"a state carrying approvals", []activities.Projection{approved}, false},
		{"an entry with nothing", []activities.Projection{{}}, false},
		{"state and audit, one not allowed", []activities.Projection{{State: state(tasks.EventRequested).State, Audit: step(activities.StepClaimed).Audit}}, false},
	} {
		if got := requestOnly(tc.batch); got != tc.want {
			t.Errorf("%s: requestOnly = %v, want %v", tc.name, got, tc.want)
		}
	}
}
