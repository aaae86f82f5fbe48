package web

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/tasks"
)

// lateAnswers is an engine whose next decisions' answers do not arrive in
// time: the workflow takes each decision, but the caller only learns that
// it is still in progress (tasks.ErrUpdateInProgress), as when a Temporal
// update outlives its caller's deadline.
type lateAnswers struct {
	approvals.Engine
	late atomic.Int32
}

func (e *lateAnswers) Decide(ctx context.Context, taskID string, d tasks.DecisionUpdate) (tasks.DecisionResult, error) {
	res, err := e.Engine.Decide(ctx, taskID, d)
	if err == nil && e.late.Add(-1) >= 0 {
		return tasks.DecisionResult{}, fmt.Errorf("decide %s: %w", taskID, tasks.ErrUpdateInProgress)
	}
	return res, err
}

// A decision whose outcome does not arrive in time is "in progress", never
// an internal error: the same request again gets its outcome.
func TestDecisionInProgressIsRetryable(t *testing.T) {
	late := &lateAnswers{}
	late.late.Store(1)
	e := newFlowEnv(t, func(_ *env, s *setup) {
		s.engine = func(en approvals.Engine) approvals.Engine { late.Engine = en; return late }
	})
	ann := e.enroll(t, "Ann", "approvers")
	rec := e.startTask(t, taskSpec{tool: "delete_records", args: `{"table":"t","filter":"id = 1"}`,
		display: "Delete records from t where id = 1", group: "approvers", quorum: 2})
	body := e.sign(t, ann, rec.ApprovalRef, "approve")

	r := e.do(t, "POST", "/approver/v1/approvals/"+rec.ApprovalRef+"/decision", body, "Origin", testPublicURL)
	wantError(t, r, http.StatusServiceUnavailable, "decision_in_progress")
	if got := r.hdr.Get("Retry-After"); got != "2" {
		t.Errorf("Retry-After = %q, want 2", got)
	}
	// The same request again: its outcome, counted once.
	for range 2 {
		r, got := e.decide(t, rec.ApprovalRef, body)
		wantStatus(t, r, http.StatusOK)
		if !got.Accepted || got.Approved != 1 {
			t.Fatalf("decision = %+v, want accepted, 1 approved", got)
		}
	}
}
