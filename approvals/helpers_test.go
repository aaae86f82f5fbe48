package approvals_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/descope/virtualwebauthn"
	"github.com/nats-io/nats.go/jetstream"

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

const (
	testOrigin   = "http://localhost:8080"
	testServerID = "countersign-test"
	// gatedService is the deploy_service service name whose deploys wait
	// for fixture.release: a claimed call that is still running.
	gatedService = "gated"
)

// fixture is the approval service over real NATS stores (tasks, passkeys,
// the demo ledger), the default policy and the demo tools, with one of the
// engines: the Temporal workflow (contract_test.go) or the in-memory one.
type fixture struct {
	js       jetstream.JetStream
	store    *tasks.Store
	passkeys *passkey.Service
	ledger   *gateway.Ledger
	pdp      *pdp.Engine
	tools    *gateway.Registry
	act      *activities.Activities
	engine   approvals.Engine
	mem      *approvalstest.Engine // nil over Temporal
	svc      *approvals.Service
	rp       virtualwebauthn.RelyingParty
	// release lets the gated deploy run.
	release func()
}

// newFixture builds the stores, policy and tools; start wires the engine
// (nil: the in-memory one).
func newFixture(t *testing.T, start func(t *testing.T, act *activities.Activities) approvals.Engine) *fixture {
	t.Helper()
	ctx := context.Background()
	js, _ := testnats.Start(t)
	f := &fixture{js: js, rp: virtualwebauthn.RelyingParty{ID: "localhost", Name: "Countersign", Origin: testOrigin}}
	var err error
	if f.store, err = tasks.NewStore(ctx, js, tasks.StoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if f.passkeys, err = passkey.New(ctx, js, passkey.Options{RPID: "localhost", RPOrigins: []string{testOrigin}}); err != nil {
		t.Fatal(err)
	}
	if f.ledger, err = gateway.NewLedger(ctx, js, gateway.LedgerOptions{}); err != nil {
		t.Fatal(err)
	}
	if f.pdp, err = pdp.New(ctx, pdp.Options{}); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	var once sync.Once
	f.release = func() { once.Do(func() { close(gate) }) }
	tools := gateway.DemoTools(f.ledger)
	for i := range tools {
		if tools[i].Name != "deploy_service" {
			continue
		}
		run := tools[i].Run
		tools[i].Run = func(ctx context.Context, c gateway.Call) (tasks.CallToolResult, error) {
			var a struct{ Service string }
			if json.Unmarshal(c.Arguments, &a) == nil && a.Service == gatedService {
				select {
				case <-gate:
				case <-ctx.Done():
					return tasks.CallToolResult{}, ctx.Err()
				}
			}
			return run(ctx, c)
		}
	}
	if f.tools, err = gateway.NewRegistry(tools...); err != nil {
		t.Fatal(err)
	}
	f.act = &activities.Activities{Tasks: f.store, PDP: f.pdp, Passkeys: f.passkeys, Tools: f.tools, PublicURL: testOrigin}
	if start != nil {
		f.engine = start(t, f.act)
	} else {
		f.mem = approvalstest.New(approvalstest.Options{Activities: f.act})
		t.Cleanup(f.mem.Close)
		f.engine = f.mem
	}
	t.Cleanup(f.release) // before the engine stops (cleanups run in reverse)
	f.svc = f.service(t, nil)
	return f
}

// service is another approval service over the fixture's stores and
// engine; tweak adjusts its options.
func (f *fixture) service(t *testing.T, tweak func(*approvals.Options)) *approvals.Service {
	t.Helper()
	opts := approvals.Options{Store: f.store, Engine: f.engine, Passkeys: f.passkeys}
	if tweak != nil {
		tweak(&opts)
	}
	svc, err := approvals.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// call is a tools/call as the MCP endpoint turns it into a task: policy
// decides it, and a requestable call becomes an approval, an allowed one an
// unattended task that runs after delay.
func (f *fixture) call(t *testing.T, principal, tool, args string, delay time.Duration) approvals.Call {
	t.Helper()
	raw := json.RawMessage(args)
	hash, err := canon.Hash(tool, raw, testServerID)
	if err != nil {
		t.Fatal(err)
	}
	d, err := f.pdp.Evaluate(context.Background(), pdp.Input{
		Subject:  pdp.Entity{Type: "agent", ID: principal},
		Action:   pdp.Action{Name: "tools/call"},
		Resource: pdp.Resource{Type: "tool", ID: tool},
		Context:  pdp.Context{Arguments: raw, ActionHash: hash.String()},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := approvals.Call{Principal: principal, Era: tasks.Era2026, Tool: tool, Arguments: raw, ActionHash: hash.String(),
		ServerID: testServerID, DisplayText: f.tools.Describe(tool, raw), Policy: d, At: time.Now()}
	switch d.Effect {
	case pdp.EffectRequestable:
		c.Mode = tasks.ModeApproval
	case pdp.EffectAllow:
		c.Mode, c.Delay = tasks.ModeUnattended, delay
	default:
		t.Fatalf("policy denies %s %s: %s", tool, args, d.Reason)
	}
	return c
}

func (f *fixture) open(t *testing.T, c approvals.Call) tasks.Record {
	t.Helper()
	o, err := f.svc.Open(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if o.Joined {
		t.Fatalf("call joined task %s", o.Task.TaskID)
	}
	return o.Task
}

// transfer is a transfer_funds call of amount (over 1,000 it needs one
// approver); memo keeps calls apart.
func transfer(amount int, memo string) string {
	return fmt.Sprintf(`{"to":"acct-42","amount":%d,"currency":"EUR","memo":%q}`, amount, memo)
}

func (f *fixture) await(t *testing.T, rec tasks.Record) tasks.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	final, err := f.svc.Await(ctx, rec.Owner, rec.TaskID)
	if err != nil {
		t.Fatalf("await %s: %v", rec.TaskID, err)
	}
	return final
}

// waitFor polls the task until ok holds.
func (f *fixture) waitFor(t *testing.T, rec tasks.Record, what string, ok func(tasks.Record) bool) tasks.Record {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := f.svc.Get(context.Background(), rec.Owner, rec.TaskID)
		if err == nil && ok(got) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s: timed out waiting for %s: %+v (%v)", rec.TaskID, what, got, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// effects counts the ledger entries the task's execution wrote.
func (f *fixture) effects(t *testing.T, taskID string) int {
	t.Helper()
	entries, err := f.ledger.Entries(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if e.Key == taskID {
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

// approver is a virtual phone holding one enrolled passkey.
type approver struct {
	id   string
	auth virtualwebauthn.Authenticator
	cred virtualwebauthn.Credential
}

// enroll adds an approver and enrolls a passkey for them.
func (f *fixture) enroll(t *testing.T, name string, groups ...string) approver {
	t.Helper()
	ctx := context.Background()
	ap, token, err := f.passkeys.AddApprover(ctx, name, groups)
	if err != nil {
		t.Fatal(err)
	}
	creation, err := f.passkeys.BeginEnrollment(ctx, token)
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
	att := virtualwebauthn.CreateAttestationResponse(f.rp, a.auth, a.cred, *opts)
	if _, err := f.passkeys.FinishEnrollment(ctx, token, []byte(att)); err != nil {
		t.Fatal(err)
	}
	a.auth.AddCredential(a.cred)
	return a
}

// sign is the approver's side of one decision: a challenge from the
// service, answered the way navigator.credentials.get would.
func (f *fixture) sign(t *testing.T, a approver, ref, decision string) tasks.DecisionUpdate {
	t.Helper()
	ch, err := f.svc.Challenge(context.Background(), ref, decision)
	if err != nil {
		t.Fatalf("challenge: %v", err)
	}
	b, _ := json.Marshal(ch.RequestOptions)
	opts, err := virtualwebauthn.ParseAssertionOptions(string(b))
	if err != nil {
		t.Fatal(err)
	}
	// The parallel contract cases share approvers, and virtualwebauthn's
	// Key re-imports its signing key into itself on every signature: each
	// signature gets its own copy of the key.
	cred, key := a.cred, *a.cred.Key
	cred.Key = &key
	resp := virtualwebauthn.CreateAssertionResponse(f.rp, a.auth, cred, *opts)
	return tasks.DecisionUpdate{ChallengeID: ch.ID, Decision: decision, Response: json.RawMessage(resp)}
}

// errName names the service's errors for comparison: the sentinel an error
// is, else its text.
func errName(err error) string {
	var refused *approvals.Refused
	for _, s := range []error{approvals.ErrNotFound, approvals.ErrExpired, approvals.ErrNotPending, approvals.ErrInvalidDecision,
		approvals.ErrNotEligible, approvals.ErrUnknownApprover, approvals.ErrInProgress, approvals.ErrUnknownCursor} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	switch {
	case err == nil:
		return ""
	case errors.As(err, &refused):
		return "refused"
	}
	return err.Error()
}
