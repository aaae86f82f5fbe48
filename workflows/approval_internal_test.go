package workflows

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/countersign/countersign/tasks"
)

// A decision that arrives once the task's expiry has passed is refused by
// the validator even while the expiry timer has not fired yet (the phase
// still says pending): Temporal fires timers a little late, and a worker
// that catches up sees the decision before it runs the timer's wake-up.
func TestDecisionAtExpiryIsRefused(t *testing.T) {
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.SetStartTime(time.Date(2026, 11, 27, 9, 0, 0, 0, time.UTC))
	type verdicts struct{ Before, At, After, DenyAt, Unexpiring string }
	probe := func(ctx workflow.Context) (verdicts, error) {
		now := workflow.Now(ctx)
		at := func(expires time.Time, deny bool) string {
			w := &approval{in: tasks.ApprovalInput{Mode: tasks.ModeApproval, ExpiresAt: expires}, phase: phasePending}
			var err error
			if deny {
				err = w.validateUnsignedDeny(ctx, tasks.UnsignedDenial{ApproverID: "apv_1", ApproverName: "alice", Via: "slack"})
			} else {
				err = w.validateDecision(ctx, tasks.DecisionUpdate{Decision: tasks.DecisionApprove, ChallengeID: "ch",
					Response: json.RawMessage(`{"id":"x"}`)})
			}
			var appErr *temporal.ApplicationError
			switch {
			case err == nil:
				return "accepted"
			case errors.As(err, &appErr):
				return appErr.Type()
			default:
				return err.Error()
			}
		}
		return verdicts{
			Before:     at(now.Add(time.Millisecond), false),
			At:         at(now, false),
			After:      at(now.Add(-time.Second), false),
			DenyAt:     at(now, true),
			Unexpiring: at(time.Time{}, false),
		}, nil
	}
	env.RegisterWorkflow(probe)
	env.ExecuteWorkflow(probe)
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	var got verdicts
	if err := env.GetWorkflowResult(&got); err != nil {
		t.Fatal(err)
	}
	want := verdicts{Before: "accepted", At: ErrTypeTaskNotPending, After: ErrTypeTaskNotPending,
		DenyAt: ErrTypeTaskNotPending, Unexpiring: "accepted"}
	if got != want {
		t.Fatalf("verdicts = %+v, want %+v", got, want)
	}
}
