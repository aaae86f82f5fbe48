package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/devtest"
	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/tasks"
)

var transferArgs = map[string]any{"to": "acct-991", "amount": 50000, "currency": "USD", "memo": "Q3 invoice"}

func resultText(t *testing.T, result json.RawMessage) string {
	t.Helper()
	var r struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	if err := json.Unmarshal(result, &r); err != nil {
		t.Fatalf("result: %v: %s", err, result)
	}
	var parts []string
	for _, c := range r.Content {
		parts = append(parts, c.Text)
	}
	return strings.Join(parts, "\n")
}

func metaOf(t *testing.T, result json.RawMessage) map[string]any {
	t.Helper()
	var r struct {
		Meta map[string]any `json:"_meta"`
	}
	json.Unmarshal(result, &r)
	return r.Meta
}

// One stack serves the tests that do not restart it; each test uses its own
// arguments so dedup never joins two tests' tasks.
func TestGatedCallLifecycle(t *testing.T) {
	s := startStack(t, "", 0)
	alice := s.Enroll("alice", "approvers")
	bob := s.Enroll("bob", "approvers")
	outsider := s.Enroll("olga", "finance")

	t.Run("approve executes exactly once", func(t *testing.T) {
		before := s.Transfers()
		task := s.CreateTask(s.AgentToken, "transfer_funds", transferArgs)
		if task.Status != tasks.StatusWorking || task.TTLMs == nil || task.PollIntervalMs == nil || task.StatusMessage == "" {
			t.Fatalf("CreateTaskResult: %+v", task)
		}
		if s.Transfers() != before {
			t.Fatal("the tool ran before approval")
		}
		ref := s.RefOf(task.TaskID)
		if ref == task.TaskID {
			t.Fatal("approval ref equals the task id")
		}
		res := s.Approve(alice, ref, "approve")
		if !res.Accepted {
			t.Fatalf("approval rejected: %+v", res)
		}
		d := s.WaitTerminal(s.AgentToken, task.TaskID)
		if d.Status != tasks.StatusCompleted || disposition(d) != tasks.ApprovedExecuted {
			t.Fatalf("want completed/approved-executed, got %s/%s: %s", d.Status, disposition(d), d.Result)
		}
		m := metaOf(t, d.Result)
		if m[tasks.MetaDispositionAuthZEN] != string(tasks.ApprovedExecuted) {
			t.Fatalf("authzen disposition key missing: %v", m)
		}
		if txt := resultText(t, d.Result); !strings.Contains(txt, "approved-executed") || !strings.Contains(txt, "Transferred 50,000.00 USD") {
			t.Fatalf("result text: %q", txt)
		}
		if got := s.Transfers(); got != before+1 {
			t.Fatalf("transfers = %d, want %d", got, before+1)
		}
		// A later decision on the finished task changes nothing.
		if late := s.decideFresh(bob, ref, "approve"); late.Accepted {
			t.Fatalf("decision on a finished task accepted: %+v", late)
		}
		if got := s.Transfers(); got != before+1 {
			t.Fatal("late approval executed again")
		}
	})

	t.Run("approver denies", func(t *testing.T) {
		before := s.Transfers()
		task := s.CreateTask(s.AgentToken, "transfer_funds", map[string]any{"to": "acct-2", "amount": 2500, "currency": "EUR"})
		res := s.Approve(bob, s.RefOf(task.TaskID), "deny")
		if !res.Accepted {
			t.Fatalf("deny rejected: %+v", res)
		}
		d := s.WaitTerminal(s.AgentToken, task.TaskID)
		if disposition(d) != tasks.DeniedNotExecuted || !strings.Contains(resultText(t, d.Result), "did NOT run") {
			t.Fatalf("want denied-not-executed, got %s: %s", disposition(d), d.Result)
		}
		if s.Transfers() != before {
			t.Fatal("denied transfer executed")
		}
	})

	t.Run("quorum of two distinct approvers", func(t *testing.T) {
		task := s.CreateTask(s.AgentToken, "delete_records", map[string]any{"table": "customers", "filter": "inactive > 5y"})
		ref := s.RefOf(task.TaskID)
		if r := s.Approve(alice, ref, "approve"); !r.Accepted || r.Approved != 1 || r.Needed != 2 {
			t.Fatalf("first approval: %+v", r)
		}
		if d, _ := s.GetTask(s.AgentToken, task.TaskID); d.Status != tasks.StatusWorking {
			t.Fatalf("executed after one of two approvals: %s", d.Status)
		}
		if r := s.Approve(alice, ref, "approve"); r.Accepted || r.Reason != "already_approved" {
			t.Fatalf("same approver twice: %+v", r)
		}
		if r := s.Approve(bob, ref, "approve"); !r.Accepted {
			t.Fatalf("second approval: %+v", r)
		}
		d := s.WaitTerminal(s.AgentToken, task.TaskID)
		if disposition(d) != tasks.ApprovedExecuted {
			t.Fatalf("quorum reached but %s", disposition(d))
		}
	})

	t.Run("bad evidence changes nothing", func(t *testing.T) {
		before := s.Transfers()
		task := s.CreateTask(s.AgentToken, "transfer_funds", map[string]any{"to": "acct-3", "amount": 7000, "currency": "USD"})
		ref := s.RefOf(task.TaskID)
		other := s.CreateTask(s.AgentToken, "transfer_funds", map[string]any{"to": "acct-4", "amount": 8000, "currency": "USD"})
		otherRef := s.RefOf(other.TaskID)

		// Replay: the same signed assertion twice.
		c := s.Challenge(ref, "approve")
		sig := alice.Sign(t, c)
		// Forged: a flipped byte in the signature.
		forged := testpasskey.FlipSignature(t, sig)
		if r := s.Decide(ref, c, "approve", forged); r.Accepted || r.Reason != "signature_verification_failed" {
			t.Fatalf("forged assertion: %+v", r)
		}
		// Cross-task: an assertion over task A's challenge sent to task B.
		if r := s.Decide(otherRef, c, "approve", sig); r.Accepted {
			t.Fatalf("cross-task assertion accepted: %+v", r)
		}
		// A signed denial cannot be turned into an approval.
		cd := s.Challenge(ref, "deny")
		if r := s.Decide(ref, cd, "approve", bob.Sign(t, cd)); r.Accepted || r.Reason != "challenge_wrong_decision" {
			t.Fatalf("deny assertion posted as approve: %+v", r)
		}
		// Not eligible: an approver outside the group.
		if r := s.Approve(outsider, ref, "approve"); r.Accepted || r.Reason != "approver_not_eligible" {
			t.Fatalf("outsider: %+v", r)
		}
		if d, _ := s.GetTask(s.AgentToken, task.TaskID); d.Status != tasks.StatusWorking {
			t.Fatalf("bad evidence moved the task to %s", d.Status)
		}
		// The genuine assertion still works after the failures (verify
		// before consume), and only once.
		if r := s.Decide(ref, c, "approve", sig); !r.Accepted {
			t.Fatalf("genuine assertion after failures: %+v", r)
		}
		if r := s.Decide(otherRef, c, "approve", sig); r.Accepted {
			t.Fatalf("replayed assertion accepted on another task: %+v", r)
		}
		s.WaitTerminal(s.AgentToken, task.TaskID)
		c2 := s.Challenge(otherRef, "deny")
		sig2 := bob.Sign(t, c2)
		if r := s.Decide(otherRef, c2, "deny", sig2); !r.Accepted {
			t.Fatalf("deny: %+v", r)
		}
		if r := s.Decide(otherRef, c2, "approve", sig2); r.Accepted {
			t.Fatalf("replay accepted: %+v", r)
		}
		s.WaitTerminal(s.AgentToken, other.TaskID)
		if got := s.Transfers(); got != before+1 {
			t.Fatalf("transfers = %d, want %d", got, before+1)
		}
	})

	t.Run("self approval is refused", func(t *testing.T) {
		var agent struct {
			Token string `json:"token"`
		}
		s.HTTPJSON("POST", "/admin/v1/agents", s.AdminToken, map[string]any{"name": "alice"}, &agent)
		if agent.Token == "" {
			t.Fatal("no agent token")
		}
		task := s.CreateTask(agent.Token, "transfer_funds", map[string]any{"to": "acct-self", "amount": 3000, "currency": "USD"})
		if r := s.Approve(alice, s.RefOf(task.TaskID), "approve"); r.Accepted || r.Reason != "self_approval" {
			t.Fatalf("self approval: %+v", r)
		}
	})

	t.Run("tasks are owned", func(t *testing.T) {
		var agent struct {
			Token string `json:"token"`
		}
		s.HTTPJSON("POST", "/admin/v1/agents", s.AdminToken, map[string]any{"name": "mallory"}, &agent)
		task := s.CreateTask(s.AgentToken, "transfer_funds", map[string]any{"to": "acct-own", "amount": 3000, "currency": "USD"})
		_, foreign := s.GetTask(agent.Token, task.TaskID)
		_, unknown := s.GetTask(agent.Token, tasks.NewID("tsk_"))
		if foreign.Error == nil || unknown.Error == nil {
			t.Fatal("foreign or unknown task answered")
		}
		if foreign.Error.Code != unknown.Error.Code || foreign.Error.Message != unknown.Error.Message {
			t.Fatalf("foreign task distinguishable from unknown: %+v vs %+v", foreign.Error, unknown.Error)
		}
		if r := s.Call2026(agent.Token, "tasks/cancel", task.TaskID, map[string]any{"taskId": task.TaskID}, true); r.Error == nil {
			t.Fatal("foreign cancel accepted")
		}
		if d, _ := s.GetTask(s.AgentToken, task.TaskID); d.Status != tasks.StatusWorking {
			t.Fatalf("foreign cancel changed the task: %s", d.Status)
		}
	})

	t.Run("cancel before approval", func(t *testing.T) {
		before := s.Transfers()
		task := s.CreateTask(s.AgentToken, "transfer_funds", map[string]any{"to": "acct-c", "amount": 4000, "currency": "USD"})
		ref := s.RefOf(task.TaskID)
		if r := s.Call2026(s.AgentToken, "tasks/cancel", task.TaskID, map[string]any{"taskId": task.TaskID}, true); r.Error != nil {
			t.Fatalf("cancel: %+v", r.Error)
		}
		d := s.WaitTerminal(s.AgentToken, task.TaskID)
		if d.Status != tasks.StatusCancelled {
			t.Fatalf("status %s, want cancelled", d.Status)
		}
		if r := s.decideFresh(alice, ref, "approve"); r.Accepted {
			t.Fatalf("approval after cancel accepted: %+v", r)
		}
		if s.Transfers() != before {
			t.Fatal("cancelled transfer executed")
		}
	})

	t.Run("identical pending call returns the same task", func(t *testing.T) {
		args := map[string]any{"to": "acct-dup", "amount": 3333, "currency": "USD"}
		a := s.CreateTask(s.AgentToken, "transfer_funds", args)
		b := s.CreateTask(s.AgentToken, "transfer_funds", map[string]any{"currency": "USD", "amount": 3333.0, "to": "acct-dup"})
		if a.TaskID != b.TaskID {
			t.Fatalf("identical call made a second task: %s vs %s", a.TaskID, b.TaskID)
		}
	})

	t.Run("allowed and hard-denied calls do not make tasks", func(t *testing.T) {
		before := s.Transfers()
		r := s.Call2026(s.AgentToken, "tools/call", "transfer_funds", map[string]any{"name": "transfer_funds", "arguments": map[string]any{"to": "acct-small", "amount": 20, "currency": "USD"}}, true)
		if r.Error != nil || strings.Contains(string(r.Result), `"resultType":"task"`) {
			t.Fatalf("small transfer: %s %+v", r.Result, r.Error)
		}
		if s.Transfers() != before+1 {
			t.Fatal("allowed transfer did not run")
		}
		r = s.Call2026(s.AgentToken, "tools/call", "transfer_funds", map[string]any{"name": "transfer_funds", "arguments": map[string]any{"to": "acct-big", "amount": 5000000, "currency": "USD"}}, true)
		if r.Error != nil || !strings.Contains(string(r.Result), `"isError":true`) || !strings.Contains(string(r.Result), string(tasks.DeniedNotExecuted)) {
			t.Fatalf("huge transfer: %s %+v", r.Result, r.Error)
		}
		if s.Transfers() != before+1 {
			t.Fatal("denied transfer ran")
		}
	})

	t.Run("client without tasks gets [approval-pending]", func(t *testing.T) {
		before := s.Transfers()
		r := s.Call2026(s.AgentToken, "tools/call", "transfer_funds", map[string]any{"name": "transfer_funds", "arguments": map[string]any{"to": "acct-nt", "amount": 6000, "currency": "USD"}}, false)
		var res struct {
			IsError           bool `json:"isError"`
			StructuredContent struct {
				TaskID string `json:"taskId"`
			} `json:"structuredContent"`
		}
		if r.Error != nil || json.Unmarshal(r.Result, &res) != nil || !res.IsError || res.StructuredContent.TaskID == "" ||
			!strings.Contains(string(r.Result), "[approval-pending]") {
			t.Fatalf("pending result: %s %+v", r.Result, r.Error)
		}
		if s.Transfers() != before {
			t.Fatal("tool ran for a client without tasks")
		}
		id := res.StructuredContent.TaskID
		s.Call2026(s.AgentToken, "tools/call", "countersign_cancel", map[string]any{"name": "countersign_cancel", "arguments": map[string]any{"taskId": id}}, false)
		if d := s.WaitTerminal(s.AgentToken, id); d.Status != tasks.StatusCancelled {
			t.Fatalf("after countersign_cancel: %+v", d)
		}
	})

	t.Run("concurrent approvals and cancel race", func(t *testing.T) {
		before := s.Transfers()
		task := s.CreateTask(s.AgentToken, "transfer_funds", map[string]any{"to": "acct-race", "amount": 4500, "currency": "USD"})
		ref := s.RefOf(task.TaskID)
		c := s.Challenge(ref, "approve")
		sig := alice.Sign(t, c)
		var wg sync.WaitGroup
		wg.Go(func() { s.Decide(ref, c, "approve", sig) })
		wg.Go(func() {
			s.Call2026(s.AgentToken, "tasks/cancel", task.TaskID, map[string]any{"taskId": task.TaskID}, true)
		})
		wg.Wait()
		d := s.WaitTerminal(s.AgentToken, task.TaskID)
		ran := s.Transfers() - before
		switch {
		case d.Status == tasks.StatusCancelled && ran == 0:
		case disposition(d) == tasks.ApprovedExecuted && ran == 1:
		default:
			t.Fatalf("inconsistent race outcome: status %s disposition %s, transfers +%d", d.Status, disposition(d), ran)
		}
	})
}

// decideFresh asks for a challenge and decides; a challenge refusal counts as
// a rejected decision.
func (s *stack) decideFresh(a *approver, ref, decision string) decisionResult {
	s.T.Helper()
	var c challenge
	code := s.HTTPJSON("POST", "/approver/v1/approvals/"+ref+"/challenge", "", map[string]any{"decision": decision}, &c)
	if code != 200 && code != 201 {
		return decisionResult{Reason: "challenge refused"}
	}
	return s.Decide(ref, c, decision, a.Sign(s.T, c))
}

func TestPendingTaskSurvivesRestartAndRunsOnce(t *testing.T) {
	dir := t.TempDir()
	s := startStack(t, dir, 0)
	alice := s.Enroll("alice", "approvers")
	task := s.CreateTask(s.AgentToken, "transfer_funds", transferArgs)
	ref := s.RefOf(task.TaskID)
	s.Stop()

	s2 := startStack(t, dir, s.Port)
	if s2.AgentToken != s.AgentToken {
		t.Fatal("agent token changed across restart")
	}
	if d, r := s2.GetTask(s2.AgentToken, task.TaskID); r.Error != nil || d.Status != tasks.StatusWorking {
		t.Fatalf("pending task after restart: %+v %+v", d, r.Error)
	}
	start := time.Now()
	if r := s2.Approve(alice, ref, "approve"); !r.Accepted {
		t.Fatalf("approval after restart: %+v", r)
	}
	t.Logf("decision accepted after restart in %v", time.Since(start))
	d := s2.WaitTerminal(s2.AgentToken, task.TaskID)
	if disposition(d) != tasks.ApprovedExecuted {
		t.Fatalf("after restart: %s", disposition(d))
	}
	t.Logf("approval → executed after restart: %v", time.Since(start))
	if n := s2.Transfers(); n != 1 {
		t.Fatalf("transfers = %d, want exactly 1", n)
	}
}

func TestApprovalExpires(t *testing.T) {
	// A policy whose approvals expire after one second.
	policy := devtest.ShortApprovalPolicy(t)
	s := startStackWithPolicy(t, policy)
	task := s.CreateTask(s.AgentToken, "transfer_funds", transferArgs)
	d := s.WaitTerminal(s.AgentToken, task.TaskID)
	if d.Status != tasks.StatusCompleted || disposition(d) != tasks.DeniedNotExecuted || !strings.Contains(strings.ToLower(resultText(t, d.Result)), "expired") {
		t.Fatalf("want an expired denial, got %s/%s: %s", d.Status, disposition(d), d.Result)
	}
	if s.Transfers() != 0 {
		t.Fatal("expired transfer executed")
	}
}

func TestOrphanedRecordIsFailed(t *testing.T) {
	s := startStack(t, "", 0)
	ctx := context.Background()
	// A record whose workflow was never started: what a crash between the
	// two steps of task creation leaves behind.
	now := time.Now().UTC()
	orphan := tasks.Record{
		TaskID: tasks.NewID("tsk_"), Owner: app.DevAgentName, Era: tasks.Era2026, Status: tasks.StatusWorking,
		CreatedAt: now.Add(-2 * time.Minute), LastUpdatedAt: now.Add(-2 * time.Minute), TTL: time.Hour,
		Tool: "transfer_funds", ApprovalRef: tasks.NewID("apr_"), ApprovalState: tasks.ApprovalPending,
	}
	if err := s.App.Store.Create(ctx, orphan); err != nil {
		t.Fatal(err)
	}
	live := s.CreateTask(s.AgentToken, "transfer_funds", map[string]any{"to": "acct-live", "amount": 2000, "currency": "USD"})
	// The app's own reconciler may get there first; either way the orphan
	// ends failed and the live task is untouched.
	if n, err := tasks.Reconcile(ctx, s.App.Store, s.App.Orchestrator, time.Minute, nil); err != nil || n > 1 {
		t.Fatalf("reconcile: %d %v", n, err)
	}
	if d, _ := s.GetTask(s.AgentToken, orphan.TaskID); d.Status != tasks.StatusFailed || d.Error == nil {
		t.Fatalf("orphan: %+v", d)
	}
	if d, _ := s.GetTask(s.AgentToken, live.TaskID); d.Status != tasks.StatusWorking {
		t.Fatalf("live task touched: %s", d.Status)
	}
}
