package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/tasks"
)

// TestDecisionFlood: someone holding an approval link posts hundreds of
// forged decisions at once, and the approver's valid approval is among
// them. Each forged decision is rejected; the approval must be accepted
// within roundStall and the task must run once. Every invalid decision
// asks the task's workflow to record it, up to a quota, and those records
// take turns with the approval (tasks.Orchestrator). Before the turn, 300
// forged decisions were enough for the approval to get a 503 after 30 s.
//
//	COUNTERSIGN_FLOOD=2000 go test ./internal/e2e -run '^TestDecisionFlood$' -v
func TestDecisionFlood(t *testing.T) {
	forged := envIntDefault(t, "COUNTERSIGN_FLOOD", 300)
	rounds := envIntDefault(t, "COUNTERSIGN_FLOOD_ROUNDS", 3)
	if forged < 1 {
		t.Fatalf("COUNTERSIGN_FLOOD=%d: the approval waits for a forged decision's answer, so at least 1", forged)
	}
	s := startStack(t, "", 0)
	r := &racer{s: s}
	ann := s.Enroll("ann", "approvers")
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: forged + 1}}
	for round := range rounds {
		before := s.Transfers()
		task := s.CreateTask(s.AgentToken, "transfer_funds", map[string]any{"to": fmt.Sprintf("acct-flood-%d", round), "amount": 1500 + round, "currency": "USD"})
		ref := s.RefOf(task.TaskID)
		c := s.Challenge(ref, "approve")
		resp := ann.Sign(t, c)
		bad := testpasskey.FlipSignature(t, resp)

		barrier := make(chan struct{})
		firstAnswer := make(chan struct{})
		var answered sync.Once
		var wg sync.WaitGroup
		answers := make([]httpAnswer, forged)
		took := make([]time.Duration, forged)
		var approval httpAnswer
		var approvalAt time.Duration
		var released time.Time
		for i := range forged {
			req := r.decisionRequest(ref, decisionBody(c.ChallengeID, "approve", bad))
			wg.Go(func() {
				<-barrier
				answers[i] = send(client, req)
				took[i] = time.Since(released)
				answered.Do(func() { close(firstAnswer) })
			})
		}
		valid := r.decisionRequest(ref, decisionBody(c.ChallengeID, "approve", resp))
		wg.Go(func() {
			<-barrier
			// Among the flood, not ahead of it: a forged decision is
			// answered once its rejection is recorded (or dropped with the
			// task's quota already in line), so after the first answer the
			// task holds at least one rejection while the rest are in flight.
			<-firstAnswer
			approval = send(client, valid)
			approvalAt = time.Since(released)
		})
		released = time.Now()
		close(barrier)
		wg.Wait()
		all := time.Since(released)

		var d decisionResult
		json.Unmarshal(approval.body, &d)
		if approval.err != nil || approval.code != 200 || !d.Accepted {
			t.Fatalf("round %d: the valid approval: HTTP %d %s %v", round, approval.code, approval.body, approval.err)
		}
		for i, a := range answers {
			if a.err != nil || a.code != 422 {
				t.Fatalf("round %d: forged decision %d: HTTP %d %s %v", round, i, a.code, a.body, a.err)
			}
		}
		if d, ok := r.waitTerminal(task.TaskID, 30*time.Second); !ok || viewOf(d.Status, disposition(d)) != "approved-executed" {
			t.Fatalf("round %d: task ended %s %s", round, d.Status, disposition(d))
		}
		if n := s.Transfers() - before; n != 1 {
			t.Fatalf("round %d: %d transfers, want 1", round, n)
		}
		// The task records rejected decisions up to its quota (those in
		// line after the approval find the task no longer pending).
		rec, err := s.App.Store.Get(context.Background(), task.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		recorded := 0
		for _, ev := range rec.Timeline {
			if ev.Kind == tasks.EventRejectedDecision {
				recorded++
			}
		}
		if recorded < 1 || recorded > tasks.MaxRecordedRejections {
			t.Errorf("round %d: %d rejected decisions recorded, want 1 to %d", round, recorded, tasks.MaxRecordedRejections)
		}
		sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
		t.Logf("round %d: %d forged decisions and one approval at once: the approval answered in %v; forged p50 %v, max %v; all in %v",
			round, forged, approvalAt.Round(time.Millisecond), took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), all.Round(time.Millisecond))
		if approvalAt > roundStall {
			t.Errorf("round %d: the approval took %v among %d forged decisions (bound %v)", round, approvalAt, forged, roundStall)
		}
	}
}
