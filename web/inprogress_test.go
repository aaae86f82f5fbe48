package web

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

// A decision whose outcome does not arrive in time is "in progress", never
// an internal error: the same request again gets its outcome.
func TestDecisionInProgressIsRetryable(t *testing.T) {
	e := newFlowEnv(t)
	ann := e.enroll(t, "Ann", "approvers")
	rec := e.startTask(t, taskSpec{tool: "delete_records", args: `{"table":"t","filter":"id = 1"}`,
		display: "Delete records from t where id = 1", group: "approvers", quorum: 2})
	body := e.sign(t, ann, rec.ApprovalRef, "approve")

	// The update the API sends for body (same fields, so the same update ID).
	d := tasks.DecisionUpdate{ChallengeID: body["challengeId"].(string), Decision: "approve",
		Method: passkey.MethodWebAuthn, Response: body["response"].(json.RawMessage)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	if _, err := e.orch.Decide(ctx, rec.TaskID, d); !errors.Is(err, tasks.ErrUpdateInProgress) {
		t.Fatalf("Decide past its deadline: %v, want ErrUpdateInProgress", err)
	}
	// The same request through the API: counted once.
	for range 2 {
		r, got := e.decide(t, rec.ApprovalRef, body)
		wantStatus(t, r, http.StatusOK)
		if !got.Accepted || got.Approved != 1 {
			t.Fatalf("decision = %+v, want accepted, 1 approved", got)
		}
	}
}
