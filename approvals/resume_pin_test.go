package approvals

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
)

// A task resumed from its record (an orphan of a crash between the record
// and the workflow's start) keeps the tool pin of the call that opened it,
// so its execution is checked as the original start's would have been.
func TestResumeKeepsToolPin(t *testing.T) {
	pin := &tasks.ToolPin{Source: "fs", Origin: "o", Schema: "s"}
	policy := pdp.Decision{PolicyVersion: "p1", ApproverGroup: "approvers", Quorum: 1, ApprovalTTL: time.Hour}
	c := Call{Principal: "agent-1", Era: tasks.Era2026, Tool: "fs__write", ActionHash: "h", ServerID: "srv",
		Policy: policy, Mode: tasks.ModeApproval, ToolPin: pin, At: time.Now()}
	var s Service
	rec, in := s.newTask(c, tasks.NewID("tsk_"), "")
	if !cmp.Equal(in.Envelope.ToolPin, pin) {
		t.Fatalf("envelope pin %+v, want %+v", in.Envelope.ToolPin, pin)
	}
	again, ok := callFromRecord(rec)
	if !ok {
		t.Fatal("the record cannot be resumed")
	}
	if _, resumed := s.newTask(again, rec.TaskID, ""); !cmp.Equal(resumed.Envelope.ToolPin, pin) {
		t.Fatalf("resumed envelope pin %+v, want %+v", resumed.Envelope.ToolPin, pin)
	}
}
