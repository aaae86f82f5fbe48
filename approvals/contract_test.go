package approvals_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"go.temporal.io/server/temporaltest"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
	"github.com/countersign/countersign/workflows"
)

// The contract test: the approval lifecycle's scenarios, driven through
// approvals.Service, against both engines — the real workflow on an
// embedded Temporal server, and the in-memory engine the adapters' tests
// use (approvalstest) — with everything else real (NATS stores, passkeys
// signed by a software authenticator, the default policy, the demo tools).
// Each scenario checks what it expects; then the engines' observations
// must be equal.

// temporalEngine runs the approval workflow and its activities on an
// embedded Temporal server.
func temporalEngine(t *testing.T, act *activities.Activities) approvals.Engine {
	ts := temporaltest.NewServer(temporaltest.WithT(t))
	ts.NewWorker(tasks.TaskQueue, func(r worker.Registry) {
		r.RegisterWorkflowWithOptions(workflows.Approval, workflow.RegisterOptions{Name: tasks.WorkflowName})
		r.RegisterActivity(act)
	})
	return tasks.NewOrchestrator(ts.GetDefaultClient())
}

// observed is what a scenario saw, compared across engines.
type observed struct {
	Verdicts      []approvals.Verdict
	Errors        []string
	Cancelled     []bool
	Status        tasks.Status
	Disposition   tasks.Disposition
	ApprovalState tasks.ApprovalState
	StatusMessage string
	Approved      int
	Effects       int
	ResultHead    string   // the result's first text block
	Timeline      []string // kind: words, notifications left out (they race the rest)
}

// observe records the task's end.
func (f *fixture) observe(t *testing.T, o observed, final tasks.Record) observed {
	t.Helper()
	o.Status, o.Disposition, o.ApprovalState = final.Status, final.Disposition, final.ApprovalState
	o.StatusMessage, o.Approved = final.StatusMessage, final.Approved()
	o.Effects = f.effects(t, final.TaskID)
	if len(final.Result) > 0 {
		var res tasks.CallToolResult
		var head tasks.Content
		if err := json.Unmarshal(final.Result, &res); err != nil || len(res.Content) == 0 || json.Unmarshal(res.Content[0], &head) != nil {
			t.Errorf("result %s: %v", final.Result, err)
		}
		// A transfer's text names its ID, the task's.
		o.ResultHead = strings.ReplaceAll(head.Text, final.TaskID, "<task>")
	}
	for _, ev := range final.Timeline {
		switch ev.Kind {
		case tasks.EventNotified, tasks.EventNotifyFailed:
		default:
			o.Timeline = append(o.Timeline, string(ev.Kind)+": "+ev.Text())
		}
	}
	return o
}

// actors are the approvers of a fixture: ann and bob approve in the
// policy's group, carl is in another.
type actors struct{ ann, bob, carl approver }

type scenario struct {
	name string
	run  func(t *testing.T, f *fixture, a actors) observed
}

func TestContract(t *testing.T) {
	engines := []struct {
		name  string
		start func(*testing.T, *activities.Activities) approvals.Engine
	}{
		{"temporal", temporalEngine},
		{"memory", nil},
	}
	var mu sync.Mutex
	seen := map[string]map[string]observed{}
	for _, eng := range engines {
		seen[eng.name] = map[string]observed{}
		t.Run(eng.name, func(t *testing.T) {
			f := newFixture(t, eng.start)
			a := actors{ann: f.enroll(t, "ann", "approvers"), bob: f.enroll(t, "bob", "approvers"), carl: f.enroll(t, "carl", "ops")}
			for _, sc := range contractScenarios {
				t.Run(sc.name, func(t *testing.T) {
					t.Parallel()
					o := sc.run(t, f, a)
					mu.Lock()
					defer mu.Unlock()
					seen[eng.name][sc.name] = o
				})
			}
		})
	}
	for _, sc := range contractScenarios {
		want, ok1 := seen["temporal"][sc.name]
		got, ok2 := seen["memory"][sc.name]
		if !ok1 || !ok2 {
			continue // filtered out, or failed before the end
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: the engines disagree (-temporal +memory):\n%s", sc.name, diff)
		}
	}
}

var contractScenarios = []scenario{
	{"approve at quorum 1", func(t *testing.T, f *fixture, a actors) observed {
		rec := f.open(t, f.call(t, "agent-quorum1", "transfer_funds", transfer(5000, "quorum 1"), 0))
		d := f.sign(t, a.ann, rec.ApprovalRef, tasks.DecisionApprove)
		v, err := f.svc.Decide(context.Background(), rec.ApprovalRef, d)
		want := approvals.Verdict{Accepted: true, Status: tasks.ApprovalApproved, Approved: 1, Needed: 1}
		if err != nil || v != want {
			t.Errorf("approval: %+v, %v; want %+v", v, err, want)
		}
		final := f.await(t, rec)
		// The same request after the end is the same decision: its verdict.
		again, err := f.svc.Decide(context.Background(), rec.ApprovalRef, d)
		if err != nil || again != want {
			t.Errorf("the same request after the end: %+v, %v; want %+v", again, err, want)
		}
		o := f.observe(t, observed{Verdicts: []approvals.Verdict{v, again}}, final)
		if o.Status != tasks.StatusCompleted || o.Disposition != tasks.ApprovedExecuted || o.ApprovalState != tasks.ApprovalExecuted || o.Effects != 1 {
			t.Errorf("end: %+v", o)
		}
		return o
	}},
	{"quorum 2 with distinct approvers", func(t *testing.T, f *fixture, a actors) observed {
		rec := f.open(t, f.call(t, "agent-quorum2", "delete_records", `{"table":"customers","filter":"id = 2"}`, 0))
		var o observed
		for _, step := range []struct {
			who  approver
			want approvals.Verdict
		}{
			{a.ann, approvals.Verdict{Accepted: true, Status: tasks.ApprovalPending, Approved: 1, Needed: 2}},
			{a.ann, approvals.Verdict{Reason: tasks.ReasonAlreadyApproved, Status: tasks.ApprovalPending, Approved: 1, Needed: 2}},
			{a.bob, approvals.Verdict{Accepted: true, Status: tasks.ApprovalApproved, Approved: 2, Needed: 2}},
		} {
			v, err := f.svc.Decide(context.Background(), rec.ApprovalRef, f.sign(t, step.who, rec.ApprovalRef, tasks.DecisionApprove))
			if err != nil || v != step.want {
				t.Errorf("decision %d: %+v, %v; want %+v", len(o.Verdicts), v, err, step.want)
			}
			o.Verdicts = append(o.Verdicts, v)
		}
		o = f.observe(t, o, f.await(t, rec))
		if o.Disposition != tasks.ApprovedExecuted || o.Approved != 2 || o.Effects != 1 {
			t.Errorf("end: %+v", o)
		}
		return o
	}},
	{"deny", func(t *testing.T, f *fixture, a actors) observed {
		rec := f.open(t, f.call(t, "agent-deny", "transfer_funds", transfer(5000, "deny"), 0))
		v, err := f.svc.Decide(context.Background(), rec.ApprovalRef, f.sign(t, a.ann, rec.ApprovalRef, tasks.DecisionDeny))
		if want := (approvals.Verdict{Accepted: true, Status: tasks.ApprovalDenied, Needed: 1}); err != nil || v != want {
			t.Errorf("deny: %+v, %v; want %+v", v, err, want)
		}
		o := f.observe(t, observed{Verdicts: []approvals.Verdict{v}}, f.await(t, rec))
		if o.Disposition != tasks.DeniedNotExecuted || o.ApprovalState != tasks.ApprovalDenied || o.Effects != 0 {
			t.Errorf("end: %+v", o)
		}
		return o
	}},
	{"cancel before a decision, then a decision", func(t *testing.T, f *fixture, a actors) observed {
		rec := f.open(t, f.call(t, "agent-cancel", "transfer_funds", transfer(5000, "cancel"), 0))
		d := f.sign(t, a.ann, rec.ApprovalRef, tasks.DecisionApprove) // signed in time, sent too late
		got, cancelled, err := f.svc.Cancel(context.Background(), rec.Owner, rec.TaskID)
		if err != nil || !cancelled || got.Status != tasks.StatusCancelled {
			t.Fatalf("cancel: %v, %s, %v", cancelled, got.Status, err)
		}
		v, err := f.svc.Decide(context.Background(), rec.ApprovalRef, d)
		if want := (approvals.Verdict{Refused: true, Reason: tasks.ErrTypeTaskNotPending, Status: tasks.ApprovalCancelled, Needed: 1}); err != nil || v != want {
			t.Errorf("decision after the end: %+v, %v; want %+v", v, err, want)
		}
		_, cerr := f.svc.Challenge(context.Background(), rec.ApprovalRef, tasks.DecisionApprove)
		if !errors.Is(cerr, approvals.ErrNotPending) {
			t.Errorf("challenge after the end: %v", cerr)
		}
		_, again, err := f.svc.Cancel(context.Background(), rec.Owner, rec.TaskID)
		o := f.observe(t, observed{Verdicts: []approvals.Verdict{v}, Cancelled: []bool{cancelled, again},
			Errors: []string{errName(cerr), errName(err)}}, f.await(t, rec))
		if o.Status != tasks.StatusCancelled || o.ApprovalState != tasks.ApprovalCancelled || o.Effects != 0 || again {
			t.Errorf("end: %+v", o)
		}
		return o
	}},
	{"the same request twice", func(t *testing.T, f *fixture, a actors) observed {
		rec := f.open(t, f.call(t, "agent-twice", "delete_records", `{"table":"customers","filter":"id = 3"}`, 0))
		d := f.sign(t, a.ann, rec.ApprovalRef, tasks.DecisionApprove)
		var o observed
		for range 2 {
			v, err := f.svc.Decide(context.Background(), rec.ApprovalRef, d)
			if want := (approvals.Verdict{Accepted: true, Status: tasks.ApprovalPending, Approved: 1, Needed: 2}); err != nil || v != want {
				t.Errorf("decision: %+v, %v; want %+v", v, err, want)
			}
			o.Verdicts = append(o.Verdicts, v)
		}
		if _, _, err := f.svc.Cancel(context.Background(), rec.Owner, rec.TaskID); err != nil {
			t.Fatal(err)
		}
		o = f.observe(t, o, f.await(t, rec))
		if o.Approved != 1 || count1(o.Timeline, "approval") != 1 {
			t.Errorf("counted %d times: %v", o.Approved, o.Timeline)
		}
		return o
	}},
	{"invalid evidence", func(t *testing.T, f *fixture, a actors) observed {
		rec := f.open(t, f.call(t, "agent-invalid", "transfer_funds", transfer(5000, "invalid"), 0))
		d := f.sign(t, a.ann, rec.ApprovalRef, tasks.DecisionApprove)
		d.Response = testpasskey.FlipSignature(t, d.Response)
		v, err := f.svc.Decide(context.Background(), rec.ApprovalRef, d)
		if want := (approvals.Verdict{Reason: passkey.ReasonSignatureVerificationFailed, Status: tasks.ApprovalPending, Needed: 1}); err != nil || v != want {
			t.Errorf("forged decision: %+v, %v; want %+v", v, err, want)
		}
		got, err := f.svc.Get(context.Background(), rec.Owner, rec.TaskID)
		if err != nil || count(got, tasks.EventRejectedDecision) != 1 {
			t.Errorf("the rejection is not recorded: %+v (%v)", got.Timeline, err)
		}
		if _, _, err := f.svc.Cancel(context.Background(), rec.Owner, rec.TaskID); err != nil {
			t.Fatal(err)
		}
		return f.observe(t, observed{Verdicts: []approvals.Verdict{v}}, f.await(t, rec))
	}},
	{"unsigned deny", func(t *testing.T, f *fixture, a actors) observed {
		ctx := context.Background()
		rec := f.open(t, f.call(t, "agent-unsigned", "transfer_funds", transfer(5000, "unsigned"), 0))
		at := time.Now()
		var o observed
		for _, step := range []struct {
			approverID string
			want       error
		}{
			{a.carl.id, approvals.ErrNotEligible},
			{"0123456789abcdef", approvals.ErrUnknownApprover},
			{a.ann.id, nil},
			{a.bob.id, approvals.ErrNotPending},
		} {
			err := f.svc.DenyUnsigned(ctx, rec.ApprovalRef, step.approverID, "slack:U012AB3CD", at)
			if !errors.Is(err, step.want) {
				t.Errorf("deny by %s: %v, want %v", step.approverID, err, step.want)
			}
			o.Errors = append(o.Errors, errName(err))
		}
		o = f.observe(t, o, f.await(t, rec))
		if o.Disposition != tasks.DeniedNotExecuted || o.ApprovalState != tasks.ApprovalDenied ||
			o.StatusMessage != "Denied by ann via slack:U012AB3CD (without a passkey)." || o.Effects != 0 {
			t.Errorf("end: %+v", o)
		}
		return o
	}},
	{"expiry", func(t *testing.T, f *fixture, a actors) observed {
		c := f.call(t, "agent-expiry", "transfer_funds", transfer(5000, "expiry"), 0)
		c.Policy.ApprovalTTL = 500 * time.Millisecond
		o := f.observe(t, observed{}, f.await(t, f.open(t, c)))
		if o.Disposition != tasks.DeniedNotExecuted || o.ApprovalState != tasks.ApprovalExpired || o.Effects != 0 {
			t.Errorf("end: %+v", o)
		}
		return o
	}},
	{"cancel after the claim", func(t *testing.T, f *fixture, a actors) observed {
		ctx := context.Background()
		rec := f.open(t, f.call(t, "agent-claimed", "deploy_service", `{"service":"`+gatedService+`","version":"1.2","environment":"production"}`, 0))
		v, err := f.svc.Decide(ctx, rec.ApprovalRef, f.sign(t, a.ann, rec.ApprovalRef, tasks.DecisionApprove))
		if err != nil || !v.Accepted {
			t.Fatalf("approval: %+v, %v", v, err)
		}
		f.waitFor(t, rec, "the claim", func(r tasks.Record) bool { return count(r, tasks.EventClaimed) == 1 })
		o := observed{Verdicts: []approvals.Verdict{v}}
		// An agent polling cancel through the run: the workflow is asked
		// once, which records the refusal; the others are answered from it.
		counted := &cancelCounter{Engine: f.engine}
		svc := f.service(t, func(o *approvals.Options) { o.Engine = counted })
		for range 20 {
			got, cancelled, err := svc.Cancel(ctx, rec.Owner, rec.TaskID)
			if err != nil || cancelled || got.Status != tasks.StatusWorking || count(got, tasks.EventCancelRefused) != 1 {
				t.Errorf("cancel after the claim: %v, %v: %s, %d cancel-refused", cancelled, err, got.Status, count(got, tasks.EventCancelRefused))
			}
			o.Cancelled = append(o.Cancelled, cancelled)
		}
		if n := counted.calls.Load(); n != 1 {
			t.Errorf("20 cancels after the claim asked the engine %d times, want 1", n)
		}
		f.release()
		o = f.observe(t, o, f.await(t, rec))
		if o.Disposition != tasks.ApprovedExecuted || o.Effects != 1 {
			t.Errorf("end: %+v", o)
		}
		return o
	}},
	{"unattended", func(t *testing.T, f *fixture, a actors) observed {
		rec := f.open(t, f.call(t, "agent-unattended", "transfer_funds", transfer(10, "unattended"), 200*time.Millisecond))
		if rec.Status != tasks.StatusWorking || rec.AwaitsApproval() {
			t.Errorf("created %s, awaits approval %v", rec.Status, rec.AwaitsApproval())
		}
		o := f.observe(t, observed{}, f.await(t, rec))
		// Nothing was approved: the result is the tool's own, without a
		// disposition.
		if o.Status != tasks.StatusCompleted || o.Disposition != "" || o.ApprovalState != tasks.ApprovalExecuted || o.Effects != 1 {
			t.Errorf("end: %+v", o)
		}
		return o
	}},
	{"unattended with input, then cancelled", func(t *testing.T, f *fixture, a actors) observed {
		ctx := context.Background()
		c := f.call(t, "agent-input", "transfer_funds", transfer(20, "input"), time.Hour)
		c.InputRequests = map[string]json.RawMessage{
			"confirm": json.RawMessage(`{"method":"elicitation/create","params":{"message":"Sure?"}}`),
			"reason":  json.RawMessage(`{"method":"elicitation/create","params":{"message":"Why?"}}`),
		}
		rec := f.open(t, c)
		if rec.Status != tasks.StatusInputRequired {
			t.Fatalf("created %s", rec.Status)
		}
		if err := f.svc.ProvideInput(ctx, rec.Owner, rec.TaskID, map[string]json.RawMessage{"confirm": json.RawMessage(`{"action":"accept"}`)}); err != nil {
			t.Fatal(err)
		}
		got, err := f.svc.Get(ctx, rec.Owner, rec.TaskID)
		if err != nil || got.Status != tasks.StatusInputRequired || len(got.InputRequests) != 1 || got.InputRequests["reason"] == nil {
			t.Errorf("after one answer: %s %v (%v)", got.Status, got.InputRequests, err)
		}
		if err := f.svc.ProvideInput(ctx, rec.Owner, rec.TaskID, map[string]json.RawMessage{"reason": json.RawMessage(`{"action":"accept"}`)}); err != nil {
			t.Fatal(err)
		}
		// Answered: it waits its delay again, cancellably.
		got = f.waitFor(t, rec, "status working", func(r tasks.Record) bool { return r.Status == tasks.StatusWorking })
		if len(got.InputRequests) != 0 {
			t.Errorf("input requests left: %v", got.InputRequests)
		}
		_, cancelled, err := f.svc.Cancel(ctx, rec.Owner, rec.TaskID)
		if err != nil || !cancelled {
			t.Errorf("cancel: %v, %v", cancelled, err)
		}
		o := f.observe(t, observed{Cancelled: []bool{cancelled}}, f.await(t, rec))
		if o.Status != tasks.StatusCancelled || o.Effects != 0 {
			t.Errorf("end: %+v", o)
		}
		return o
	}},
}

func count1(timeline []string, kind string) int {
	n := 0
	for _, e := range timeline {
		if strings.HasPrefix(e, kind+":") {
			n++
		}
	}
	return n
}

// cancelCounter counts the cancels that reach the engine.
type cancelCounter struct {
	approvals.Engine
	calls atomic.Int64
}

func (c *cancelCounter) Cancel(ctx context.Context, taskID string) (tasks.CancelResult, error) {
	c.calls.Add(1)
	return c.Engine.Cancel(ctx, taskID)
}
