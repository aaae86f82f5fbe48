package approvalstest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/descope/virtualwebauthn"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/approvals/approvalstest"
	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/internal/testnats"
	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
)

// These tests drive the engine through the real approvals.Service, task
// store and passkey service (embedded NATS), without a policy engine
// (re-evaluation allows). approvals/contract_test.go checks that the
// engine answers as the Temporal workflow does.

const (
	testOrigin   = "http://localhost:8080"
	testServerID = "countersign-test"
	testGroup    = "approvers"
)

type env struct {
	store    *tasks.Store
	passkeys *passkey.Service
	ledger   *gateway.Ledger
	engine   *approvalstest.Engine
	svc      *approvals.Service
	// release lets deploy_service run; until then a claimed deploy waits.
	release func()
	rp      virtualwebauthn.RelyingParty
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	js, _ := testnats.Start(t)
	e := &env{rp: virtualwebauthn.RelyingParty{ID: "localhost", Name: "Countersign", Origin: testOrigin}}
	var err error
	if e.store, err = tasks.NewStore(ctx, js, tasks.StoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if e.passkeys, err = passkey.New(ctx, js, passkey.Options{RPID: "localhost", RPOrigins: []string{testOrigin}}); err != nil {
		t.Fatal(err)
	}
	if e.ledger, err = gateway.NewLedger(ctx, js, gateway.LedgerOptions{}); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	var once sync.Once
	e.release = func() { once.Do(func() { close(gate) }) }
	tools := gateway.DemoTools(e.ledger)
	for i := range tools {
		if tools[i].Name == "deploy_service" {
			run := tools[i].Run
			tools[i].Run = func(ctx context.Context, c gateway.Call) (tasks.CallToolResult, error) {
				select {
				case <-gate:
				case <-ctx.Done():
					return tasks.CallToolResult{}, ctx.Err()
				}
				return run(ctx, c)
			}
		}
	}
	tools = append(tools, gateway.Tool{
		Name:        "echo_inputs",
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Run: func(_ context.Context, c gateway.Call) (tasks.CallToolResult, error) {
			return tasks.CallToolResult{Content: []json.RawMessage{tasks.TextContent(string(c.Inputs))}}, nil
		},
	})
	reg, err := gateway.NewRegistry(tools...)
	if err != nil {
		t.Fatal(err)
	}
	e.engine = approvalstest.New(approvalstest.Options{
		Activities: &activities.Activities{Tasks: e.store, Passkeys: e.passkeys, Tools: reg},
	})
	t.Cleanup(e.release)
	t.Cleanup(e.engine.Close) // before NATS stops (cleanups run in reverse)
	if e.svc, err = approvals.New(approvals.Options{Store: e.store, Engine: e.engine, Passkeys: e.passkeys}); err != nil {
		t.Fatal(err)
	}
	return e
}

// callSpec is a call to open as a task.
type callSpec struct {
	principal string
	tool      string // default transfer_funds
	args      string // default a transfer with memo
	quorum    int    // approval; 0 means unattended
	ttl       time.Duration
	inputs    map[string]json.RawMessage // unattended input requests
}

func (e *env) open(t *testing.T, s callSpec) tasks.Record {
	t.Helper()
	if s.principal == "" {
		s.principal = "agent-1"
	}
	if s.tool == "" {
		s.tool = "transfer_funds"
	}
	if s.args == "" {
		s.args = fmt.Sprintf(`{"to":"acct-1","amount":5000,"currency":"EUR","memo":%q}`, t.Name())
	}
	if s.ttl == 0 {
		s.ttl = time.Hour
	}
	args := json.RawMessage(s.args)
	hash, err := canon.Hash(s.tool, args, testServerID)
	if err != nil {
		t.Fatal(err)
	}
	c := approvals.Call{Principal: s.principal, Era: tasks.Era2026, Tool: s.tool, Arguments: args, ActionHash: hash.String(),
		ServerID: testServerID, DisplayText: "a test call", At: time.Now()}
	if s.quorum > 0 {
		c.Mode = tasks.ModeApproval
		c.Policy = pdp.Decision{Effect: pdp.EffectRequestable, Reason: "needs a human", ApproverGroup: testGroup, Quorum: s.quorum,
			ApprovalTTL: s.ttl, AuthenticatorClass: passkey.ClassPlatform, PolicyVersion: "sha256:test"}
	} else {
		c.Mode = tasks.ModeUnattended
		c.Policy = pdp.Decision{Effect: pdp.EffectAllow, Reason: "allowed", PolicyVersion: "sha256:test"}
		c.Delay = s.ttl
		c.InputRequests = s.inputs
	}
	o, err := e.svc.Open(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	// Its workflow starts after the answer; these tests drive the engine
	// directly, not through the service's doors, which wait for it.
	if err := e.svc.WaitStart(context.Background(), o.Task.TaskID); err != nil {
		t.Fatal(err)
	}
	return o.Task
}

// approver is a virtual phone holding one enrolled passkey.
type approver struct {
	id   string
	auth virtualwebauthn.Authenticator
	cred virtualwebauthn.Credential
}

func (e *env) enroll(t *testing.T, name string, groups ...string) approver {
	t.Helper()
	ctx := context.Background()
	ap, token, err := e.passkeys.AddApprover(ctx, name, groups)
	if err != nil {
		t.Fatal(err)
	}
	creation, err := e.passkeys.BeginEnrollment(ctx, token)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(creation)
	opts, err := virtualwebauthn.ParseAttestationOptions(string(b))
	if err != nil {
		t.Fatal(err)
	}
	a := approver{id: ap.ID, cred: testpasskey.NewEC2Credential(),
		auth: virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(ap.ID)})}
	att := virtualwebauthn.CreateAttestationResponse(e.rp, a.auth, a.cred, *opts)
	if _, err := e.passkeys.FinishEnrollment(ctx, token, []byte(att)); err != nil {
		t.Fatal(err)
	}
	a.auth.AddCredential(a.cred)
	return a
}

// sign is the approver's side of one decision: a challenge and its
// assertion.
func (e *env) sign(t *testing.T, a approver, ref, decision string) tasks.DecisionUpdate {
	t.Helper()
	ch, err := e.svc.Challenge(context.Background(), ref, decision)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(ch.RequestOptions)
	opts, err := virtualwebauthn.ParseAssertionOptions(string(b))
	if err != nil {
		t.Fatal(err)
	}
	resp := virtualwebauthn.CreateAssertionResponse(e.rp, a.auth, a.cred, *opts)
	return tasks.DecisionUpdate{ChallengeID: ch.ID, Decision: decision, Response: json.RawMessage(resp)}
}

func (e *env) await(t *testing.T, rec tasks.Record) tasks.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	final, err := e.svc.Await(ctx, rec.Owner, rec.TaskID)
	if err != nil {
		t.Fatalf("await %s: %v", rec.TaskID, err)
	}
	return final
}

// waitFor polls the record until ok holds.
func (e *env) waitFor(t *testing.T, taskID string, what string, ok func(tasks.Record) bool) tasks.Record {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		rec, err := e.store.Get(context.Background(), taskID)
		if err == nil && ok(rec) {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s: timed out waiting for %s; record %+v (%v)", taskID, what, rec, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *env) effects(t *testing.T, taskID string) int {
	t.Helper()
	entries, err := e.ledger.Entries(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, en := range entries {
		if en.Key == taskID {
			n++
		}
	}
	return n
}

func count(rec tasks.Record, kind tasks.EventKind) int {
	n := 0
	for _, ev := range rec.Timeline {
		if ev.Kind == kind {
			n++
		}
	}
	return n
}

func TestStart(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rec := e.open(t, callSpec{quorum: 1})
	if ok, err := e.engine.Running(ctx, rec.TaskID); !ok || err != nil {
		t.Fatalf("Running = %v, %v", ok, err)
	}
	e.waitFor(t, rec.TaskID, "the requested step", func(r tasks.Record) bool { return count(r, tasks.EventRequested) == 1 })
	in := tasks.ApprovalInput{Version: tasks.ApprovalInputVersion, Envelope: tasks.Envelope{Version: tasks.EnvelopeVersion, TaskID: rec.TaskID}}
	if err := e.engine.Start(ctx, in); !errors.Is(err, approvalstest.ErrAlreadyStarted) {
		t.Errorf("second start: %v, want ErrAlreadyStarted", err)
	}
	if ok, err := e.engine.Running(ctx, tasks.NewID("tsk_")); ok || err != nil {
		t.Errorf("Running(unknown) = %v, %v", ok, err)
	}

	boom := errors.New("boom")
	for _, started := range []bool{false, true} {
		t.Run(fmt.Sprint("started=", started), func(t *testing.T) {
			id := tasks.NewID("tsk_")
			in := tasks.ApprovalInput{Version: tasks.ApprovalInputVersion, Envelope: tasks.Envelope{Version: tasks.EnvelopeVersion, TaskID: id}}
			e.engine.FailNextStart(boom, started)
			if err := e.engine.Start(ctx, in); err != boom {
				t.Fatalf("Start = %v, want %v", err, boom)
			}
			if ok, _ := e.engine.Running(ctx, id); ok != started {
				t.Errorf("Running = %v, want %v", ok, started)
			}
			// The failure is spent.
			if err := e.engine.Start(ctx, in); (err == nil) != !started {
				t.Errorf("next Start = %v", err)
			}
		})
	}
}

// TestSameDecisionConcurrently sends one decision request many times at
// once: it is one update, counted once, and every sender gets its verdict.
func TestSameDecisionConcurrently(t *testing.T) {
	e := newEnv(t)
	ann := e.enroll(t, "ann", testGroup)
	rec := e.open(t, callSpec{quorum: 1})
	d := e.sign(t, ann, rec.ApprovalRef, tasks.DecisionApprove)
	const n = 8
	verdicts := make([]approvals.Verdict, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { verdicts[i], errs[i] = e.svc.Decide(context.Background(), rec.ApprovalRef, d) })
	}
	wg.Wait()
	want := approvals.Verdict{Accepted: true, Status: tasks.ApprovalApproved, Approved: 1, Needed: 1}
	for i := range n {
		if errs[i] != nil || verdicts[i] != want {
			t.Errorf("decision %d: %+v, %v; want %+v", i, verdicts[i], errs[i], want)
		}
	}
	final := e.await(t, rec)
	if final.Disposition != tasks.ApprovedExecuted || len(final.Approvals) != 1 || e.effects(t, rec.TaskID) != 1 {
		t.Errorf("final %s %s, %d approvals, %d effects", final.Status, final.Disposition, len(final.Approvals), e.effects(t, rec.TaskID))
	}
	// After the workflow has returned, the same request still gets its
	// verdict; another one finds the workflow gone.
	e.waitGone(t, rec.TaskID)
	if v, err := e.svc.Decide(context.Background(), rec.ApprovalRef, d); err != nil || v != want {
		t.Errorf("same decision after the end: %+v, %v", v, err)
	}
}

// waitGone waits until the task's workflow has returned.
func (e *env) waitGone(t *testing.T, taskID string) {
	t.Helper()
	probe := tasks.DecisionUpdate{ChallengeID: "probe", Decision: tasks.DecisionApprove, Response: json.RawMessage(`{}`)}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := e.engine.Decide(context.Background(), taskID, probe)
		if errors.Is(err, tasks.ErrWorkflowGone) {
			return
		}
		var rej *tasks.UpdateRejected
		if !errors.As(err, &rej) || rej.Reason != tasks.ErrTypeTaskNotPending {
			t.Fatalf("decision on an ended task: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the workflow did not return")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestApproveRacesCancel: whichever of the last approval and a cancel the
// workflow takes first wins, and every view agrees with it.
func TestApproveRacesCancel(t *testing.T) {
	e := newEnv(t)
	ann, bob := e.enroll(t, "ann", testGroup), e.enroll(t, "bob", testGroup)
	for i := range 5 {
		rec := e.open(t, callSpec{quorum: 2, args: fmt.Sprintf(`{"to":"acct-%d","amount":5000,"currency":"EUR"}`, i)})
		if v, err := e.svc.Decide(context.Background(), rec.ApprovalRef, e.sign(t, ann, rec.ApprovalRef, tasks.DecisionApprove)); err != nil || !v.Accepted {
			t.Fatalf("ann: %+v, %v", v, err)
		}
		d := e.sign(t, bob, rec.ApprovalRef, tasks.DecisionApprove)
		var wg sync.WaitGroup
		var v approvals.Verdict
		var cancelled bool
		var verr, cerr error
		wg.Go(func() { v, verr = e.svc.Decide(context.Background(), rec.ApprovalRef, d) })
		wg.Go(func() { _, cancelled, cerr = e.svc.Cancel(context.Background(), rec.Owner, rec.TaskID) })
		wg.Wait()
		if verr != nil || cerr != nil {
			t.Fatalf("decide: %v; cancel: %v", verr, cerr)
		}
		final := e.await(t, rec)
		effects := e.effects(t, rec.TaskID)
		switch {
		case cancelled:
			if final.Status != tasks.StatusCancelled || effects != 0 {
				t.Errorf("cancelled, yet %s with %d effects (verdict %+v)", final.Status, effects, v)
			}
		default:
			if !v.Accepted || final.Disposition != tasks.ApprovedExecuted || effects != 1 {
				t.Errorf("cancel refused, yet verdict %+v, %s %s with %d effects", v, final.Status, final.Disposition, effects)
			}
		}
	}
}

func TestCancelAfterClaim(t *testing.T) {
	e := newEnv(t)
	rec := e.open(t, callSpec{tool: "deploy_service", args: `{"service":"api","version":"1.2","environment":"staging"}`, ttl: time.Millisecond})
	e.waitFor(t, rec.TaskID, "the claim", func(r tasks.Record) bool { return count(r, tasks.EventClaimed) == 1 })
	for range 2 {
		got, cancelled, err := e.svc.Cancel(context.Background(), rec.Owner, rec.TaskID)
		if err != nil || cancelled || got.Status != tasks.StatusWorking || count(got, tasks.EventCancelRefused) != 1 {
			t.Fatalf("cancel after the claim: %v, %v, %s with %d cancel-refused", cancelled, err, got.Status, count(got, tasks.EventCancelRefused))
		}
	}
	e.release()
	final := e.await(t, rec)
	if final.Status != tasks.StatusCompleted || final.ApprovalState != tasks.ApprovalExecuted || final.Disposition != "" || e.effects(t, rec.TaskID) != 1 {
		t.Errorf("final %s %s %q, %d effects", final.Status, final.ApprovalState, final.Disposition, e.effects(t, rec.TaskID))
	}
}

// TestUpdateInProgress: a caller that stops waiting gets ErrUpdateInProgress;
// the decision goes on, and the same request gets its verdict.
func TestUpdateInProgress(t *testing.T) {
	e := newEnv(t)
	ann := e.enroll(t, "ann", testGroup)
	rec := e.open(t, callSpec{quorum: 2})
	d := e.sign(t, ann, rec.ApprovalRef, tasks.DecisionApprove)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.engine.Decide(done, rec.TaskID, d); !errors.Is(err, tasks.ErrUpdateInProgress) {
		t.Fatalf("Decide on a done context: %v, want ErrUpdateInProgress", err)
	}
	want := approvals.Verdict{Accepted: true, Status: tasks.ApprovalPending, Approved: 1, Needed: 2}
	if v, err := e.svc.Decide(context.Background(), rec.ApprovalRef, d); err != nil || v != want {
		t.Errorf("the same request: %+v, %v; want %+v", v, err, want)
	}
	got := e.waitFor(t, rec.TaskID, "one approval", func(r tasks.Record) bool { return r.Approved() == 1 })
	if count(got, tasks.EventApproval) != 1 {
		t.Errorf("timeline %+v", got.Timeline)
	}
}

func TestExpiry(t *testing.T) {
	e := newEnv(t)
	rec := e.open(t, callSpec{quorum: 1, ttl: 50 * time.Millisecond})
	final := e.await(t, rec)
	if final.Disposition != tasks.DeniedNotExecuted || final.ApprovalState != tasks.ApprovalExpired || count(final, tasks.EventExpired) != 1 {
		t.Errorf("final %s %s %s", final.Status, final.Disposition, final.ApprovalState)
	}
	e.waitGone(t, rec.TaskID)
}

func TestInputRequests(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rec := e.open(t, callSpec{tool: "echo_inputs", args: `{}`, ttl: 10 * time.Millisecond,
		inputs: map[string]json.RawMessage{"a": json.RawMessage(`{"q":1}`), "b": json.RawMessage(`{"q":2}`)}})
	if rec.Status != tasks.StatusInputRequired {
		t.Fatalf("status %s", rec.Status)
	}
	if err := e.svc.ProvideInput(ctx, rec.Owner, rec.TaskID, map[string]json.RawMessage{"a": json.RawMessage(`"yes"`), "zz": json.RawMessage(`1`)}); err != nil {
		t.Fatal(err)
	}
	got, err := e.svc.Get(ctx, rec.Owner, rec.TaskID)
	if err != nil || got.Status != tasks.StatusInputRequired || len(got.InputRequests) != 1 || got.InputRequests["b"] == nil {
		t.Fatalf("after one answer: %s %v (%v)", got.Status, got.InputRequests, err)
	}
	if err := e.svc.ProvideInput(ctx, rec.Owner, rec.TaskID, map[string]json.RawMessage{"b": json.RawMessage(`"no"`)}); err != nil {
		t.Fatal(err)
	}
	final := e.await(t, rec)
	var res tasks.CallToolResult
	if err := json.Unmarshal(final.Result, &res); err != nil || len(res.Content) == 0 {
		t.Fatalf("result %s: %v", final.Result, err)
	}
	var text tasks.Content
	_ = json.Unmarshal(res.Content[0], &text)
	if text.Text != `{"a":"yes","b":"no"}` {
		t.Errorf("the tool got inputs %s", text.Text)
	}
	if _, err := e.engine.ProvideInput(ctx, rec.TaskID, tasks.InputUpdate{}); !isRejected(err, tasks.ErrTypeNotWaitingForInput) && !errors.Is(err, tasks.ErrWorkflowGone) {
		t.Errorf("input after the end: %v", err)
	}
}

func isRejected(err error, reason string) bool {
	var rej *tasks.UpdateRejected
	return errors.As(err, &rej) && rej.Reason == reason
}

func TestRecordRejectionIsBounded(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rec := e.open(t, callSpec{quorum: 1})
	r := tasks.RejectedDecision{ChallengeID: "ch", Decision: tasks.DecisionApprove, Reason: passkey.ReasonSignatureVerificationFailed}
	if err := e.engine.RecordRejection(ctx, rec.TaskID, tasks.RejectedDecision{Decision: tasks.DecisionApprove}); !isRejected(err, tasks.ErrTypeMalformedDecision) {
		t.Errorf("rejection without a reason: %v", err)
	}
	for i := range tasks.MaxRecordedRejections {
		if err := e.engine.RecordRejection(ctx, rec.TaskID, r); err != nil {
			t.Fatalf("rejection %d: %v", i, err)
		}
	}
	if err := e.engine.RecordRejection(ctx, rec.TaskID, r); !isRejected(err, tasks.ErrTypeTooManyDecisions) {
		t.Errorf("one rejection too many: %v", err)
	}
	got, _ := e.store.Get(ctx, rec.TaskID)
	if n := count(got, tasks.EventRejectedDecision); n != tasks.MaxRecordedRejections {
		t.Errorf("%d rejections recorded, want %d", n, tasks.MaxRecordedRejections)
	}
}

func TestDenyUnsigned(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rec := e.open(t, callSpec{quorum: 1})
	if _, err := e.engine.DenyUnsigned(ctx, rec.TaskID, tasks.UnsignedDenial{ApproverID: "ap", ApproverName: "Ann"}); !isRejected(err, tasks.ErrTypeMalformedDecision) {
		t.Errorf("deny without a channel: %v", err)
	}
	res, err := e.engine.DenyUnsigned(ctx, rec.TaskID, tasks.UnsignedDenial{ApproverID: "ap", ApproverName: "Ann", Via: "slack:U1", Comment: "no"})
	if want := (tasks.DecisionResult{Accepted: true, Status: tasks.ApprovalDenied, Needed: 1}); err != nil || res != want {
		t.Fatalf("deny: %+v, %v; want %+v", res, err, want)
	}
	got, _ := e.store.Get(ctx, rec.TaskID)
	if got.Disposition != tasks.DeniedNotExecuted || got.StatusMessage != "Denied by Ann via slack:U1 (without a passkey): no" {
		t.Errorf("record %s %q", got.Disposition, got.StatusMessage)
	}
	if _, err := e.engine.DenyUnsigned(ctx, rec.TaskID, tasks.UnsignedDenial{ApproverID: "ap", ApproverName: "Ann", Via: "slack:U1"}); !isRejected(err, tasks.ErrTypeTaskNotPending) && !errors.Is(err, tasks.ErrWorkflowGone) {
		t.Errorf("second deny: %v", err)
	}
}

// TestClose: a closed engine leaves its tasks as they are and answers
// nothing.
func TestClose(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rec := e.open(t, callSpec{quorum: 1})
	before := e.waitFor(t, rec.TaskID, "the requested step", func(r tasks.Record) bool { return count(r, tasks.EventRequested) == 1 })
	e.engine.Close()
	e.engine.Close()
	if _, err := e.engine.Cancel(ctx, rec.TaskID); !errors.Is(err, approvalstest.ErrClosed) {
		t.Errorf("cancel after Close: %v", err)
	}
	in := tasks.ApprovalInput{Version: tasks.ApprovalInputVersion, Envelope: tasks.Envelope{Version: tasks.EnvelopeVersion, TaskID: tasks.NewID("tsk_")}}
	if err := e.engine.Start(ctx, in); !errors.Is(err, approvalstest.ErrClosed) {
		t.Errorf("start after Close: %v", err)
	}
	after, err := e.store.Get(ctx, rec.TaskID)
	if err != nil || after.Status.Terminal() || after.ApprovalState != tasks.ApprovalPending || len(after.Timeline) < len(before.Timeline) {
		t.Errorf("after Close: %s %s (%v)", after.Status, after.ApprovalState, err)
	}
}
