package activities_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/descope/virtualwebauthn"
	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/internal/testnats"
	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
)

const (
	testRPID     = "example.com"
	testOrigin   = "https://approvals.example.com"
	testServerID = "countersign-test"
)

// world is the real outside world of the activities: embedded NATS with
// JetStream, the task store, the passkey service, the default policy and a
// tool registry whose one tool records its calls.
type world struct {
	nc       *nats.Conn
	store    *tasks.Store
	passkeys *passkey.Service
	acts     *activities.Activities
	env      *testsuite.TestActivityEnvironment
	console  *bytes.Buffer

	mu    sync.Mutex
	calls []gateway.Call
}

func newWorld(t *testing.T) *world {
	t.Helper()
	ctx := context.Background()
	js, nc := testnats.Start(t)
	store, err := tasks.NewStore(ctx, js, tasks.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pk, err := passkey.New(ctx, js, passkey.Options{RPID: testRPID, RPOrigins: []string{testOrigin}})
	if err != nil {
		t.Fatal(err)
	}
	engine, err := pdp.New(ctx, pdp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{nc: nc, store: store, passkeys: pk, console: &bytes.Buffer{}}
	tools, err := gateway.NewRegistry(
		gateway.Tool{
			Name:        "transfer_funds",
			InputSchema: json.RawMessage(`{"type":"object"}`),
			Run: func(_ context.Context, c gateway.Call) (tasks.CallToolResult, error) {
				w.mu.Lock()
				defer w.mu.Unlock()
				w.calls = append(w.calls, c)
				var args struct{ Fail, Unreachable bool }
				_ = json.Unmarshal(c.Arguments, &args)
				if args.Unreachable {
					return tasks.CallToolResult{}, errors.New("upstream connection reset")
				}
				return tasks.CallToolResult{Content: []json.RawMessage{tasks.TextContent("done")}, IsError: args.Fail}, nil
			},
		},
	)
	if err != nil {
		t.Fatal(err)
	}
	w.acts = &activities.Activities{
		Tasks:     store,
		PDP:       engine,
		Passkeys:  pk,
		Tools:     tools,
		Notifier:  activities.ConsoleNotifier{W: w.console},
		PublicURL: "https://approvals.example.com/",
	}
	var suite testsuite.WorkflowTestSuite
	// SDK logs (expected activity errors) go to the test log.
	suite.SetLogger(tlog.NewStructuredLogger(slog.New(slog.NewTextHandler(testLog{t}, nil))))
	w.env = suite.NewTestActivityEnvironment()
	w.env.RegisterActivity(w.acts)
	return w
}

// testLog writes log lines to t.Log.
type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func (w *world) toolCalls() []gateway.Call {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]gateway.Call(nil), w.calls...)
}

// envelope builds a bound envelope for the transfer_funds tool.
func envelope(t *testing.T, principal, args string) tasks.Envelope {
	t.Helper()
	h, err := canon.Hash("transfer_funds", []byte(args), testServerID)
	if err != nil {
		t.Fatal(err)
	}
	return tasks.Envelope{
		Version:    tasks.EnvelopeVersion,
		TaskID:     tasks.NewID("tsk_"),
		Tool:       "transfer_funds",
		Arguments:  json.RawMessage(args),
		ActionHash: h.String(),
		Principal:  principal,
		Resource:   "tool:transfer_funds",
		ServerID:   testServerID,
		CreatedAt:  time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC),
	}
}

// appErrType returns the type of the application error in err's chain, or
// "" if there is none, and whether it is non-retryable.
func appErrType(err error) (typ string, nonRetryable bool) {
	var appErr *temporal.ApplicationError
	if !errors.As(err, &appErr) {
		return "", false
	}
	return appErr.Type(), appErr.NonRetryable()
}

func TestExecuteToolChecksActionHash(t *testing.T) {
	w := newWorld(t)
	tests := []struct {
		name      string
		mutate    func(*tasks.Envelope)
		wantErr   string // application error type; "" = success
		wantRetry bool   // error is retryable (the workflow still gives ExecuteTool one attempt)
		wantRun   bool
		wantIsErr bool
		record    func(*testing.T, tasks.Record) // changes the task's record before the run
	}{
		{name: "bound call runs", wantRun: true},
		{name: "tool-level failure is a result", mutate: func(e *tasks.Envelope) { rebind(t, e, `{"amount":5000,"fail":true}`) },
			wantRun: true, wantIsErr: true},
		{name: "tampered arguments", mutate: func(e *tasks.Envelope) { e.Arguments = json.RawMessage(`{"amount":5000000}`) },
			wantErr: activities.ErrTypeEnvelopeMismatch},
		{name: "other server", mutate: func(e *tasks.Envelope) { e.ServerID = "elsewhere" },
			wantErr: activities.ErrTypeEnvelopeMismatch},
		{name: "other tool", mutate: func(e *tasks.Envelope) { e.Tool = "delete_records" },
			wantErr: activities.ErrTypeEnvelopeMismatch},
		{name: "malformed hash", mutate: func(e *tasks.Envelope) { e.ActionHash = "not-hex" },
			wantErr: activities.ErrTypeEnvelopeMismatch},
		{name: "unknown tool", mutate: func(e *tasks.Envelope) {
			e.Tool = "launch_rocket"
			rebind(t, e, string(e.Arguments))
		}, wantErr: activities.ErrTypeUnknownTool},
		{name: "unreachable backend", mutate: func(e *tasks.Envelope) { rebind(t, e, `{"amount":5000,"unreachable":true}`) },
			wantRun: true, wantRetry: true},
		// The execution fence (tasks.Store.ClaimExecution).
		{name: "task already failed", record: func(t *testing.T, r tasks.Record) {
			if _, err := w.store.Update(context.Background(), r.TaskID, func(cur *tasks.Record) error {
				tasks.FailUnstarted(cur, time.Now(), "workflow start failed")
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}, wantErr: activities.ErrTypeExecutionNotClaimed},
		{name: "record gone", record: func(t *testing.T, r tasks.Record) {
			if err := w.store.Delete(context.Background(), r); err != nil {
				t.Fatal(err)
			}
		}, wantErr: activities.ErrTypeExecutionNotClaimed},
		{name: "execution claimed before", record: func(t *testing.T, r tasks.Record) {
			if err := w.store.ClaimExecution(context.Background(), r.TaskID, "exe_other"); err != nil {
				t.Fatal(err)
			}
		}, wantErr: activities.ErrTypeExecutionNotClaimed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := envelope(t, "agent-1", `{"amount":5000,"to":"acme"}`)
			if tt.mutate != nil {
				tt.mutate(&env)
			}
			rec := w.createTask(t, env)
			if tt.record != nil {
				tt.record(t, rec)
			}
			before := len(w.toolCalls())
			val, err := w.env.ExecuteActivity(w.acts.ExecuteTool, activities.ExecuteToolInput{Version: activities.Version, Envelope: env})
			calls := w.toolCalls()[before:]

			if ran := len(calls) > 0; ran != tt.wantRun {
				t.Fatalf("tool ran = %v, want %v (err %v)", ran, tt.wantRun, err)
			}
			if len(calls) > 1 {
				t.Fatalf("tool ran %d times", len(calls))
			}
			if tt.wantRun {
				want := gateway.Call{IdempotencyKey: env.TaskID, Principal: "agent-1", Arguments: env.Arguments}
				if diff := cmp.Diff(want, calls[0]); diff != "" {
					t.Errorf("call (-want +got):\n%s", diff)
				}
			}
			switch {
			case tt.wantRetry:
				if err == nil {
					t.Fatal("want an error")
				}
				if _, nonRetryable := appErrType(err); nonRetryable {
					t.Errorf("error %v is non-retryable; an unknown outcome is an ordinary error", err)
				}
			case tt.wantErr != "":
				typ, nonRetryable := appErrType(err)
				if typ != tt.wantErr || !nonRetryable {
					t.Fatalf("err = %v (type %q, non-retryable %v), want non-retryable %q", err, typ, nonRetryable, tt.wantErr)
				}
			default:
				if err != nil {
					t.Fatal(err)
				}
				var out activities.ExecuteToolOutput
				if err := val.Get(&out); err != nil {
					t.Fatal(err)
				}
				if out.Version != activities.Version || out.Result.IsError != tt.wantIsErr {
					t.Errorf("output = %+v, want version %d, isError %v", out, activities.Version, tt.wantIsErr)
				}
			}
			if !tt.wantRun {
				return
			}
			// The tool ran (or may have): its execution is claimed in the
			// record, and a second attempt does not run it again.
			got, err := w.store.Get(context.Background(), env.TaskID)
			if err != nil || got.ExecutionClaimedAt.IsZero() {
				t.Fatalf("record after the run: claimed at %v (%v), want it claimed", got.ExecutionClaimedAt, err)
			}
			_, err = w.env.ExecuteActivity(w.acts.ExecuteTool, activities.ExecuteToolInput{Version: activities.Version, Envelope: env})
			if typ, _ := appErrType(err); typ != activities.ErrTypeExecutionNotClaimed || len(w.toolCalls()) != before+1 {
				t.Fatalf("second run: err %v, tool calls %d; want %s and no second call", err, len(w.toolCalls())-before, activities.ErrTypeExecutionNotClaimed)
			}
		})
	}
}

// rebind sets the envelope's arguments and a matching action hash.
func rebind(t *testing.T, e *tasks.Envelope, args string) {
	t.Helper()
	h, err := canon.Hash(e.Tool, []byte(args), e.ServerID)
	if err != nil {
		t.Fatal(err)
	}
	e.Arguments, e.ActionHash = json.RawMessage(args), h.String()
}

// approver is an enrolled approver with a virtual authenticator.
type approver struct {
	passkey.Approver
	auth   virtualwebauthn.Authenticator
	cred   virtualwebauthn.Credential
	credID string // base64url, as stored
}

var rp = virtualwebauthn.RelyingParty{ID: testRPID, Name: "Countersign", Origin: testOrigin}

func (w *world) enroll(t *testing.T, name string, groups ...string) *approver {
	t.Helper()
	ctx := context.Background()
	a, token, err := w.passkeys.AddApprover(ctx, name, groups)
	if err != nil {
		t.Fatal(err)
	}
	creation, err := w.passkeys.BeginEnrollment(ctx, token)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(creation)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := virtualwebauthn.ParseAttestationOptions(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	auth := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(a.ID)})
	cred := testpasskey.NewEC2Credential()
	resp := virtualwebauthn.CreateAttestationResponse(rp, auth, cred, *opts)
	credID, err := w.passkeys.FinishEnrollment(ctx, token, []byte(resp))
	if err != nil {
		t.Fatal(err)
	}
	auth.AddCredential(cred)
	return &approver{Approver: a, auth: auth, cred: cred, credID: credID}
}

// challenge issues a challenge for env and returns it.
func (w *world) challenge(t *testing.T, env tasks.Envelope, req tasks.Requirement) passkey.Challenge {
	t.Helper()
	h, err := canon.ParseActionHash(env.ActionHash)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := w.passkeys.IssueChallenge(context.Background(), passkey.ChallengeRequest{
		TaskID: env.TaskID, Tool: env.Tool, ActionHash: h, Group: req.Group,
		AuthenticatorClass: req.AuthenticatorClass, DisplayText: "Transfer 5,000 to acme",
	})
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func (a *approver) sign(ch passkey.Challenge) json.RawMessage {
	a.cred.Counter++
	opts := virtualwebauthn.AssertionOptions{Challenge: ch.RequestOptions.Challenge, RelyingPartyID: rp.ID}
	return json.RawMessage(virtualwebauthn.CreateAssertionResponse(rp, a.auth, a.cred, opts))
}

func (w *world) verify(t *testing.T, in activities.VerifyDecisionInput) (activities.VerifyDecisionOutput, error) {
	t.Helper()
	in.Version = activities.Version
	val, err := w.env.ExecuteActivity(w.acts.VerifyDecision, in)
	if err != nil {
		return activities.VerifyDecisionOutput{}, err
	}
	var out activities.VerifyDecisionOutput
	if err := val.Get(&out); err != nil {
		t.Fatal(err)
	}
	return out, nil
}

func TestVerifyDecisionMapsPasskeyVerdicts(t *testing.T) {
	w := newWorld(t)
	alice := w.enroll(t, "alice", "approvers")
	req := tasks.Requirement{Group: "approvers", Quorum: 1, AuthenticatorClass: "platform"}
	env := envelope(t, "agent-1", `{"amount":5000,"to":"acme"}`)

	ch := w.challenge(t, env, req)
	good := activities.VerifyDecisionInput{Envelope: env, Requirement: req, ChallengeID: ch.ID,
		Response: alice.sign(ch), ConsumerKey: "update-1"}
	want := activities.VerifyDecisionOutput{Version: activities.Version, Accepted: true,
		ApproverID: alice.ID, ApproverName: "alice"}
	ignoreCred := cmp.FilterPath(func(p cmp.Path) bool { return p.String() == "CredentialID" || p.String() == "Assertion" }, cmp.Ignore())

	t.Run("valid assertion", func(t *testing.T) {
		out, err := w.verify(t, good)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, out, ignoreCred); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
		if out.CredentialID == "" {
			t.Error("no credential id")
		}
		if a := out.Assertion; a == nil || a.CredentialID != out.CredentialID || len(a.PublicKey) == 0 ||
			len(a.AuthenticatorData) < 37 || len(a.ClientDataJSON) == 0 || len(a.Signature) == 0 || a.ChallengeID != ch.ID {
			t.Errorf("assertion for the audit record: %+v", out.Assertion)
		}
	})
	t.Run("retried activity, same consumer key", func(t *testing.T) {
		out, err := w.verify(t, good)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, out, ignoreCred); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
	})

	other := envelope(t, "agent-1", `{"amount":7000,"to":"acme"}`)
	otherCh := w.challenge(t, other, req)
	selfEnv := envelope(t, "alice", `{"amount":5000,"to":"acme"}`)
	selfCh := w.challenge(t, selfEnv, req)
	rejections := []struct {
		name string
		in   activities.VerifyDecisionInput
		want string
	}{
		{"replayed challenge", activities.VerifyDecisionInput{Envelope: env, Requirement: req, ChallengeID: ch.ID,
			Response: alice.sign(ch), ConsumerKey: "update-2"}, passkey.ReasonChallengeConsumed},
		{"unknown challenge", activities.VerifyDecisionInput{Envelope: env, Requirement: req,
			ChallengeID: strings.Repeat("0", 32), Response: alice.sign(ch), ConsumerKey: "update-3"}, passkey.ReasonChallengeUnknown},
		{"no evidence", activities.VerifyDecisionInput{Envelope: env, Requirement: req, ChallengeID: otherCh.ID,
			Response: json.RawMessage(`null`), ConsumerKey: "update-4"}, passkey.ReasonMissingEvidence},
		{"challenge of another task", activities.VerifyDecisionInput{Envelope: env, Requirement: req, ChallengeID: otherCh.ID,
			Response: alice.sign(otherCh), ConsumerKey: "update-5"}, passkey.ReasonChallengeWrongTask},
		{"requester approving own call", activities.VerifyDecisionInput{Envelope: selfEnv, Requirement: req, ChallengeID: selfCh.ID,
			Response: alice.sign(selfCh), ConsumerKey: "update-6"}, passkey.ReasonSelfApproval},
	}
	for _, tt := range rejections {
		t.Run(tt.name, func(t *testing.T) {
			out, err := w.verify(t, tt.in)
			if err != nil {
				t.Fatalf("a rejection must be an output, not an error: %v", err)
			}
			want := activities.VerifyDecisionOutput{Version: activities.Version, Reason: tt.want}
			if diff := cmp.Diff(want, out); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}

	t.Run("malformed envelope hash", func(t *testing.T) {
		bad := good
		bad.Envelope.ActionHash = "xyz"
		_, err := w.verify(t, bad)
		if typ, nonRetryable := appErrType(err); typ != activities.ErrTypeEnvelopeMismatch || !nonRetryable {
			t.Fatalf("err = %v, want non-retryable %s", err, activities.ErrTypeEnvelopeMismatch)
		}
	})
	t.Run("invalid request", func(t *testing.T) {
		bad := good
		bad.Requirement.AuthenticatorClass = "telepathic"
		_, err := w.verify(t, bad)
		if typ, nonRetryable := appErrType(err); typ != activities.ErrTypeInvalidVerification || !nonRetryable {
			t.Fatalf("err = %v, want non-retryable %s", err, activities.ErrTypeInvalidVerification)
		}
	})
	t.Run("infrastructure failure is a retryable error", func(t *testing.T) {
		ch := w.challenge(t, env, req)
		in := activities.VerifyDecisionInput{Envelope: env, Requirement: req, ChallengeID: ch.ID,
			Response: alice.sign(ch), ConsumerKey: "update-7"}
		w.nc.Close()
		_, err := w.verify(t, in)
		if err == nil {
			t.Fatal("want an error with NATS gone")
		}
		if _, nonRetryable := appErrType(err); nonRetryable {
			t.Errorf("err = %v is non-retryable", err)
		}
	})
}

func TestReevaluateUsesCurrentPolicyAndGroups(t *testing.T) {
	w := newWorld(t)
	alice := w.enroll(t, "alice", "approvers")
	bob := w.enroll(t, "bob", "finance")
	carol := w.enroll(t, "carol", "approvers") // her passkey revoked since approving
	if _, _, err := w.passkeys.SetPasskeyStatus(context.Background(), carol.ID, carol.credID, passkey.ActionRevoke); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 3, 2, 15, 0, 0, 0, time.UTC)
	approval := func(a *approver, decision string) tasks.ApprovalEntry {
		return tasks.ApprovalEntry{ApproverID: a.ID, ApproverName: a.Name, CredentialID: a.credID, Decision: decision, At: at}
	}
	withCred := func(e tasks.ApprovalEntry, credID string) tasks.ApprovalEntry {
		e.CredentialID = credID
		return e
	}
	tests := []struct {
		name      string
		args      string
		approvals []tasks.ApprovalEntry
		allow     bool
		effect    string
	}{
		{"approved by the group", `{"amount":5000,"to":"acme"}`, []tasks.ApprovalEntry{approval(alice, tasks.DecisionApprove)}, true, "allow"},
		{"no approvals", `{"amount":5000,"to":"acme"}`, nil, false, "requestable"},
		{"approver outside the group", `{"amount":5000,"to":"acme"}`, []tasks.ApprovalEntry{approval(bob, tasks.DecisionApprove)}, false, "requestable"},
		{"unknown approver", `{"amount":5000,"to":"acme"}`, []tasks.ApprovalEntry{{ApproverID: "gone", ApproverName: "ghost",
			Decision: tasks.DecisionApprove, At: at}}, false, "requestable"},
		{"passkey revoked since approving", `{"amount":5000,"to":"acme"}`, []tasks.ApprovalEntry{approval(carol, tasks.DecisionApprove)}, false, "requestable"},
		{"another approver's passkey", `{"amount":5000,"to":"acme"}`, []tasks.ApprovalEntry{withCred(approval(alice, tasks.DecisionApprove), bob.credID)}, false, "requestable"},
		{"unknown passkey", `{"amount":5000,"to":"acme"}`, []tasks.ApprovalEntry{withCred(approval(alice, tasks.DecisionApprove), "bm9uZQ")}, false, "requestable"},
		{"deny entries do not count", `{"amount":5000,"to":"acme"}`, []tasks.ApprovalEntry{approval(alice, tasks.DecisionDeny)}, false, "requestable"},
		{"hard deny stays deny", `{"amount":5000000,"to":"acme"}`, []tasks.ApprovalEntry{approval(alice, tasks.DecisionApprove)}, false, "deny"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			val, err := w.env.ExecuteActivity(w.acts.Reevaluate, activities.ReevaluateInput{
				Version: activities.Version, Envelope: envelope(t, "agent-1", tt.args), Approvals: tt.approvals, At: at})
			if err != nil {
				t.Fatal(err)
			}
			var out activities.ReevaluateOutput
			if err := val.Get(&out); err != nil {
				t.Fatal(err)
			}
			if out.Allow != tt.allow || out.Effect != tt.effect || out.Reason == "" || !strings.HasPrefix(out.PolicyVersion, "sha256:") {
				t.Errorf("got %+v, want allow %v effect %s with a reason and policy version", out, tt.allow, tt.effect)
			}
		})
	}
	t.Run("arguments the policy cannot take", func(t *testing.T) {
		env := envelope(t, "agent-1", `[1,2]`)
		_, err := w.env.ExecuteActivity(w.acts.Reevaluate, activities.ReevaluateInput{Version: activities.Version, Envelope: env, At: at})
		if typ, nonRetryable := appErrType(err); typ != activities.ErrTypePolicyInput || !nonRetryable {
			t.Fatalf("err = %v, want non-retryable %s", err, activities.ErrTypePolicyInput)
		}
	})
}

// createTask stores a fresh working record as the MCP endpoint would.
func (w *world) createTask(t *testing.T, env tasks.Envelope) tasks.Record {
	t.Helper()
	r := tasks.Record{
		TaskID: env.TaskID, Owner: env.Principal, Era: tasks.Era2026, Status: tasks.StatusWorking,
		CreatedAt: env.CreatedAt, LastUpdatedAt: env.CreatedAt, TTL: 24 * time.Hour, PollInterval: 5 * time.Second,
		Tool: env.Tool, Arguments: env.Arguments, ActionHash: env.ActionHash,
		DisplayText: "Transfer 5,000 to acme", ApprovalRef: tasks.NewID("apr_"),
		Requirement: tasks.Requirement{Group: "approvers", Quorum: 1, Reason: "Transfers over 1,000 require approval"},
		ExpiresAt:   env.CreatedAt.Add(24 * time.Hour), ApprovalState: tasks.ApprovalPending,
		DedupKey: tasks.DedupKey(env.Principal, env.ActionHash),
	}
	ctx := context.Background()
	if existing, err := w.store.ClaimDedup(ctx, r.DedupKey, r.TaskID); err != nil || existing != "" {
		t.Fatalf("ClaimDedup = %q, %v", existing, err)
	}
	if err := w.store.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	return r
}

func (w *world) run(t *testing.T, activity any, in any) error {
	t.Helper()
	_, err := w.env.ExecuteActivity(activity, in)
	return err
}

func TestRecordStateAndCompleteAreIdempotent(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	env := envelope(t, "agent-1", `{"amount":5000,"to":"acme"}`)
	rec := w.createTask(t, env)
	at := env.CreatedAt.Add(6 * time.Hour)
	approvals := []tasks.ApprovalEntry{{ApproverID: "a1", ApproverName: "alice", CredentialID: "c1", Decision: tasks.DecisionApprove, At: at}}

	state := activities.RecordStateInput{Version: activities.Version, TaskID: env.TaskID,
		StatusMessage: "Approved; re-checking policy", ApprovalState: tasks.ApprovalApproved, Approvals: approvals,
		Event: tasks.Event{At: at, Kind: "approval", Detail: "approved by alice (1 of 1)"}}
	for range 2 { // a retried activity
		if err := w.run(t, w.acts.RecordState, state); err != nil {
			t.Fatal(err)
		}
	}
	got, err := w.store.Get(ctx, env.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != tasks.StatusWorking || got.StatusMessage != state.StatusMessage || got.ApprovalState != tasks.ApprovalApproved {
		t.Errorf("record after RecordState: %+v", got)
	}
	if diff := cmp.Diff([]tasks.Event{state.Event}, got.Timeline, cmp.Comparer(func(a, b time.Time) bool { return a.Equal(b) })); diff != "" {
		t.Errorf("timeline (-want +got):\n%s", diff)
	}

	end := at.Add(time.Minute)
	done := activities.CompleteInput{Version: activities.Version, TaskID: env.TaskID, Tool: env.Tool,
		Status: tasks.StatusCompleted, Disposition: tasks.ApprovedExecuted,
		ToolResult:    &tasks.CallToolResult{Content: []json.RawMessage{tasks.TextContent("transferred")}},
		StatusMessage: "Approved; transfer_funds ran once", ApprovalState: tasks.ApprovalExecuted, Approvals: approvals,
		Event: tasks.Event{At: end, Kind: "executed", Detail: "Approved; transfer_funds ran once"}}
	for range 2 {
		if err := w.run(t, w.acts.Complete, done); err != nil {
			t.Fatal(err)
		}
	}
	got, err = w.store.Get(ctx, env.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != tasks.StatusCompleted || got.Disposition != tasks.ApprovedExecuted || tasks.DispositionOf(got.Result) != tasks.ApprovedExecuted {
		t.Errorf("terminal record: status %s disposition %s result %s", got.Status, got.Disposition, got.Result)
	}
	if !strings.Contains(string(got.Result), "transferred") {
		t.Errorf("result lacks the tool's content: %s", got.Result)
	}
	if len(got.Timeline) != 2 {
		t.Errorf("timeline has %d events, want 2: %+v", len(got.Timeline), got.Timeline)
	}
	if wantTTL := end.Sub(rec.CreatedAt) + tasks.DefaultResultRetention; got.TTL != wantTTL {
		t.Errorf("TTL = %s, want %s", got.TTL, wantTTL)
	}
	if got.Expired(end.Add(tasks.DefaultResultRetention - time.Second)) {
		t.Error("the result must stay readable for the retention period")
	}
	// The store released the dedup slot: an identical call may start anew.
	if existing, err := w.store.ClaimDedup(ctx, rec.DedupKey, tasks.NewID("tsk_")); err != nil || existing != "" {
		t.Errorf("dedup slot not released: existing %q, err %v", existing, err)
	}

	// A late intermediate write leaves the end alone.
	late := state
	late.Event = tasks.Event{At: end.Add(time.Second), Kind: "notified"}
	if err := w.run(t, w.acts.RecordState, late); err != nil {
		t.Fatal(err)
	}
	after, err := w.store.Get(ctx, env.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if after.ApprovalState != tasks.ApprovalExecuted || len(after.Timeline) != 2 {
		t.Errorf("late RecordState changed a terminal record: %+v", after)
	}

	// Another end is refused for good.
	other := done
	other.Status, other.Disposition = tasks.StatusCancelled, ""
	err = w.run(t, w.acts.Complete, other)
	if typ, nonRetryable := appErrType(err); typ != activities.ErrTypeTaskTerminal || !nonRetryable {
		t.Errorf("second end: err = %v, want non-retryable %s", err, activities.ErrTypeTaskTerminal)
	}
}

// TestCompleteHonoursResultRetention: a configured retention, not the
// default, is what Complete extends the TTL by.
func TestCompleteHonoursResultRetention(t *testing.T) {
	w := newWorld(t)
	w.acts.ResultRetention = 36 * time.Hour
	env := envelope(t, "agent-1", `{"amount":5000,"to":"acme"}`)
	rec := w.createTask(t, env)
	end := env.CreatedAt.Add(2 * time.Hour)
	done := activities.CompleteInput{Version: activities.Version, TaskID: env.TaskID, Tool: env.Tool,
		Status: tasks.StatusCompleted, Disposition: tasks.ApprovedExecuted,
		ToolResult:    &tasks.CallToolResult{Content: []json.RawMessage{tasks.TextContent("transferred")}},
		StatusMessage: "Approved; transfer_funds ran once", ApprovalState: tasks.ApprovalExecuted,
		Event: tasks.Event{At: end, Kind: "executed", Detail: "Approved; transfer_funds ran once"}}
	if err := w.run(t, w.acts.Complete, done); err != nil {
		t.Fatal(err)
	}
	got, err := w.store.Get(context.Background(), env.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	// The approval window (24h) is shorter than the end plus retention.
	if want := end.Sub(rec.CreatedAt) + w.acts.ResultRetention; got.TTL != want {
		t.Errorf("TTL = %s, want %s (the end plus the configured retention)", got.TTL, want)
	}
}

func TestCompleteShapes(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	tests := []struct {
		name      string
		status    tasks.Status
		disp      tasks.Disposition
		wantError bool
	}{
		{"denied", tasks.StatusCompleted, tasks.DeniedNotExecuted, false},
		{"cancelled", tasks.StatusCancelled, "", false},
		{"failed", tasks.StatusFailed, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := envelope(t, "agent-1", `{"amount":5000,"to":"acme"}`)
			w.createTask(t, env)
			err := w.run(t, w.acts.Complete, activities.CompleteInput{Version: activities.Version, TaskID: env.TaskID,
				Tool: env.Tool, Status: tt.status, Disposition: tt.disp, Detail: "Approval expired.",
				Event: tasks.Event{At: env.CreatedAt.Add(time.Hour), Kind: tasks.EventKind(tt.name)}})
			if err != nil {
				t.Fatal(err)
			}
			got, err := w.store.Get(ctx, env.TaskID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != tt.status || tasks.DispositionOf(got.Result) != tt.disp || (got.Error != nil) != tt.wantError {
				t.Errorf("got status %s result %s error %+v", got.Status, got.Result, got.Error)
			}
			if tt.disp == tasks.DeniedNotExecuted && !strings.Contains(string(got.Result), "did NOT run") {
				t.Errorf("denied result must say the call did not run: %s", got.Result)
			}
		})
	}
	t.Run("missing task", func(t *testing.T) {
		err := w.run(t, w.acts.Complete, activities.CompleteInput{Version: activities.Version, TaskID: tasks.NewID("tsk_"),
			Status: tasks.StatusCancelled})
		if typ, nonRetryable := appErrType(err); typ != activities.ErrTypeTaskNotFound || !nonRetryable {
			t.Errorf("err = %v, want non-retryable %s", err, activities.ErrTypeTaskNotFound)
		}
	})
	t.Run("non-terminal status", func(t *testing.T) {
		err := w.run(t, w.acts.Complete, activities.CompleteInput{Version: activities.Version, TaskID: tasks.NewID("tsk_"),
			Status: tasks.StatusWorking})
		if typ, _ := appErrType(err); typ != activities.ErrTypeInvalidInput {
			t.Errorf("err = %v, want %s", err, activities.ErrTypeInvalidInput)
		}
	})
	t.Run("other version", func(t *testing.T) {
		err := w.run(t, w.acts.RecordState, activities.RecordStateInput{Version: activities.Version + 1, TaskID: tasks.NewID("tsk_")})
		if typ, nonRetryable := appErrType(err); typ != activities.ErrTypeUnsupportedVersion || !nonRetryable {
			t.Errorf("err = %v, want non-retryable %s", err, activities.ErrTypeUnsupportedVersion)
		}
	})
}

func TestNotifyPrintsTheApprovalLink(t *testing.T) {
	w := newWorld(t)
	env := envelope(t, "agent-1", `{"amount":5000,"to":"acct-SECRET-991"}`)
	rec := w.createTask(t, env)
	if err := w.run(t, w.acts.Notify, activities.NotifyInput{Version: activities.Version, TaskID: env.TaskID}); err != nil {
		t.Fatal(err)
	}
	line := w.console.String()
	if !strings.Contains(line, "https://approvals.example.com/approve/"+rec.ApprovalRef+"\n") {
		t.Errorf("no approval link in %q", line)
	}
	if !strings.Contains(line, rec.DisplayText) || strings.Contains(line, "acct-SECRET-991") {
		t.Errorf("the line must show the display text and not the raw arguments: %q", line)
	}
	if strings.Count(line, "\n") != 1 {
		t.Errorf("want one line, got %q", line)
	}

	t.Run("no notifier", func(t *testing.T) {
		quiet := *w.acts
		quiet.Notifier = nil
		if err := quiet.Notify(context.Background(), activities.NotifyInput{Version: activities.Version, TaskID: env.TaskID}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("missing task", func(t *testing.T) {
		err := w.run(t, w.acts.Notify, activities.NotifyInput{Version: activities.Version, TaskID: tasks.NewID("tsk_")})
		if typ, nonRetryable := appErrType(err); typ != activities.ErrTypeTaskNotFound || !nonRetryable {
			t.Errorf("err = %v, want non-retryable %s", err, activities.ErrTypeTaskNotFound)
		}
	})
}

func TestConsoleNotifierQuotesDisplayText(t *testing.T) {
	var buf bytes.Buffer
	n := activities.ConsoleNotifier{W: &buf}
	r := tasks.Record{Tool: "deploy_service", DisplayText: "Deploy \x1b[2Jevil\nsecond line",
		Requirement: tasks.Requirement{Group: "approvers", Quorum: 2}}
	if err := n.ApprovalRequested(context.Background(), r, "https://x/approve/apr_1", tasks.IdenticalCalls{}); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if strings.ContainsAny(strings.TrimSuffix(out, "\n"), "\x1b\n") {
		t.Errorf("control characters reached the console: %q", out)
	}
}

// TestNotifyWarnsWhenNobodyCanApprove: a task whose group has fewer
// approvers able to approve it than its quorum (none enrolled, a group the
// policy misspelt, a quorum of two with one approver) is notified as ever,
// with a warning in the log; a group that can reach its quorum gets none.
func TestNotifyWarnsWhenNobodyCanApprove(t *testing.T) {
	w := newWorld(t)
	logs := &bytes.Buffer{} // Notify logs only while it runs, on this goroutine
	acts := *w.acts
	acts.Logger = slog.New(slog.NewTextHandler(logs, nil))
	notify := func(group string, quorum int) string {
		t.Helper()
		env := envelope(t, "agent-1", `{"amount":5000}`)
		w.createTask(t, env)
		if _, err := w.store.Update(context.Background(), env.TaskID, func(r *tasks.Record) error {
			r.Requirement.Group, r.Requirement.Quorum = group, quorum
			r.Requirement.AuthenticatorClass = passkey.ClassPlatform // as policy sets it
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		logs.Reset()
		if err := acts.Notify(context.Background(), activities.NotifyInput{Version: activities.Version, TaskID: env.TaskID}); err != nil {
			t.Fatal(err)
		}
		return logs.String()
	}
	const warning = "the task cannot be approved yet"
	if got := notify("approvers", 1); !strings.Contains(got, warning) || !strings.Contains(got, "able=0") {
		t.Errorf("no approver enrolled: log %q, want the warning with able=0", got)
	}
	w.enroll(t, "ann", "approvers")
	if got := notify("approvers", 1); strings.Contains(got, warning) {
		t.Errorf("one approver for a quorum of one: log %q, want no warning", got)
	}
	if got := notify("approvers", 2); !strings.Contains(got, warning) || !strings.Contains(got, "able=1") {
		t.Errorf("one approver for a quorum of two: log %q, want the warning with able=1", got)
	}
	if got := notify("aprovers", 1); !strings.Contains(got, warning) || !strings.Contains(got, "group=aprovers") {
		t.Errorf("a misspelt group: log %q, want the warning naming it", got)
	}
	if !strings.Contains(w.console.String(), "https://approvals.example.com/approve/") {
		t.Errorf("the tasks were not notified: %q", w.console.String())
	}
}

// A tool result too large for one NATS message (an upstream's result under
// its own cap, on a NATS server whose max_payload is the default 1 MiB, or
// a larger one here) still ends the task: the record keeps the outcome
// without the tool's content, saying so. Before, Complete failed on every
// attempt, and tasks/get said "working" for good of a call that had run.
func TestCompleteResultTooLargeToStore(t *testing.T) {
	w := newWorld(t)
	env := envelope(t, "agent-1", `{"amount":5000,"to":"acme"}`)
	w.createTask(t, env)
	big := tasks.TextContent(strings.Repeat("x", int(w.nc.MaxPayload())+1))
	done := activities.CompleteInput{Version: activities.Version, TaskID: env.TaskID, Tool: env.Tool,
		Status: tasks.StatusCompleted, Disposition: tasks.ApprovedExecuted,
		ToolResult:    &tasks.CallToolResult{Content: []json.RawMessage{big}},
		StatusMessage: "Approved; transfer_funds ran once", ApprovalState: tasks.ApprovalExecuted,
		Event: tasks.Event{At: env.CreatedAt.Add(time.Hour), Kind: "executed", Detail: "Approved; transfer_funds ran once"}}
	if err := w.run(t, w.acts.Complete, done); err != nil {
		t.Fatal(err)
	}
	got, err := w.store.Get(context.Background(), env.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != tasks.StatusCompleted || tasks.DispositionOf(got.Result) != tasks.ApprovedExecuted ||
		!strings.Contains(string(got.Result), "too large to store") {
		t.Fatalf("record: status %s, result %.300s", got.Status, got.Result)
	}
}
