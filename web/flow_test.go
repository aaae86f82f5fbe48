package web

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/internal/approverapi"
	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
	"github.com/countersign/countersign/workflows"
)

// flowEnv runs tasks on the in-memory engine with the real activities
// (default policy, demo tools) behind the handler.
type flowEnv struct {
	*env
	ledger *gateway.Ledger
	// release lets delete_records run; until then the task sits in its
	// execution phase, past the point where it takes decisions.
	release func()
}

func newFlowEnv(t *testing.T, options ...envOption) *flowEnv {
	t.Helper()
	ctx := context.Background()
	fe := &flowEnv{}
	gate := make(chan struct{})
	var once sync.Once
	fe.release = func() { once.Do(func() { close(gate) }) }
	withTools := func(e *env, s *setup) {
		engine, err := pdp.New(ctx, pdp.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if fe.ledger, err = gateway.NewLedger(ctx, e.js, gateway.LedgerOptions{}); err != nil {
			t.Fatal(err)
		}
		tools := gateway.DemoTools(fe.ledger)
		for i := range tools {
			if tools[i].Name == "delete_records" {
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
		reg, err := gateway.NewRegistry(tools...)
		if err != nil {
			t.Fatal(err)
		}
		s.acts.PDP, s.acts.Tools = engine, reg
	}
	fe.env = newEnv(t, append([]envOption{withTools}, options...)...)
	t.Cleanup(fe.release) // before the engine closes (cleanups run in reverse)
	return fe
}

// startTask creates the task's read model and starts its workflow, as the
// MCP endpoint does for a requestable call.
func (e *flowEnv) startTask(t *testing.T, spec taskSpec) tasks.Record {
	t.Helper()
	rec := e.newTask(t, spec)
	err := e.engine.Start(context.Background(), tasks.ApprovalInput{
		Version: tasks.ApprovalInputVersion,
		Envelope: tasks.Envelope{
			Version:    tasks.EnvelopeVersion,
			TaskID:     rec.TaskID,
			Tool:       rec.Tool,
			Arguments:  rec.Arguments,
			ActionHash: rec.ActionHash,
			Principal:  rec.Owner,
			Resource:   "tool:" + rec.Tool,
			ServerID:   testServerID,
			CreatedAt:  rec.CreatedAt,
		},
		Requirement: rec.Requirement,
		ApprovalRef: rec.ApprovalRef,
		DisplayText: rec.DisplayText,
		ExpiresAt:   rec.ExpiresAt,
	})
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

type challengeWire struct {
	ChallengeID    string          `json:"challengeId"`
	Decision       string          `json:"decision"`
	DisplayText    string          `json:"displayText"`
	ExpiresAt      time.Time       `json:"expiresAt"`
	RequestOptions json.RawMessage `json:"requestOptions"`
}

// challenge fetches a challenge for one decision over HTTP.
func (e *env) challenge(t *testing.T, ref, decision string) challengeWire {
	t.Helper()
	r := e.do(t, "POST", "/approver/v1/approvals/"+ref+"/challenge", map[string]string{"decision": decision}, "Origin", testPublicURL)
	wantStatus(t, r, http.StatusOK)
	return decodeAs[challengeWire](t, r)
}

func (e *env) decide(t *testing.T, ref string, body map[string]any) (response, approverapi.Decision) {
	t.Helper()
	r := e.do(t, "POST", "/approver/v1/approvals/"+ref+"/decision", body, "Origin", testPublicURL)
	return r, decodeAs[approverapi.Decision](t, r)
}

// sign runs the approver side of one decision: challenge, passkey
// assertion, and the decision body to post.
func (e *env) sign(t *testing.T, d approverDevice, ref, decision string) map[string]any {
	t.Helper()
	ch := e.challenge(t, ref, decision)
	return map[string]any{"challengeId": ch.ChallengeID, "decision": decision,
		"response": json.RawMessage(e.assert(t, d, ch.RequestOptions))}
}

func TestDecisionFlow(t *testing.T) {
	e := newFlowEnv(t)
	ann := e.enroll(t, "Ann", "approvers")
	bob := e.enroll(t, "Bob", "approvers")
	rec := e.startTask(t, taskSpec{tool: "delete_records", args: `{"table":"customers","filter":"id = 42"}`,
		display: "Delete records from customers where id = 42", group: "approvers", quorum: 2})

	// Ann approves: challenge, passkey assertion, decision.
	ch := e.challenge(t, rec.ApprovalRef, "approve")
	if ch.DisplayText != rec.DisplayText || ch.Decision != "approve" || time.Until(ch.ExpiresAt) <= 0 {
		t.Errorf("challenge = %+v", ch)
	}
	var opts struct {
		UserVerification string `json:"userVerification"`
		RPID             string `json:"rpId"`
	}
	if err := json.Unmarshal(ch.RequestOptions, &opts); err != nil || opts.UserVerification != "required" || opts.RPID != "localhost" {
		t.Errorf("request options %s: %v", ch.RequestOptions, err)
	}
	body := map[string]any{"challengeId": ch.ChallengeID, "decision": "approve", "comment": "checked with support",
		"response": json.RawMessage(e.assert(t, ann, ch.RequestOptions))}
	r, got := e.decide(t, rec.ApprovalRef, body)
	wantStatus(t, r, http.StatusOK)
	if want := (approverapi.Decision{Accepted: true, Status: tasks.ApprovalPending, Approved: 1, Needed: 2}); got != want {
		t.Fatalf("first approval = %+v, want %+v", got, want)
	}

	var bobDeny map[string]any // signed, posted as approve and rejected: still unused
	rejections := []struct {
		name   string
		body   func(t *testing.T) map[string]any
		reason string
	}{
		{"replayed assertion in another request", func(*testing.T) map[string]any {
			replay := map[string]any{"challengeId": body["challengeId"], "decision": "approve", "response": body["response"]}
			return replay // no comment: another request, so another update
		}, passkey.ReasonChallengeConsumed},
		{"assertion over another challenge", func(t *testing.T) map[string]any {
			other := e.challenge(t, rec.ApprovalRef, "approve")
			return map[string]any{"challengeId": other.ChallengeID, "decision": "approve", "response": body["response"]}
		}, passkey.ReasonSignatureVerificationFailed},
		{"deny challenge posted as approve", func(t *testing.T) map[string]any {
			bobDeny = e.sign(t, bob, rec.ApprovalRef, "deny")
			b := maps.Clone(bobDeny)
			b["decision"] = "approve"
			return b
		}, passkey.ReasonChallengeWrongDecision},
		{"same approver twice", func(t *testing.T) map[string]any {
			return e.sign(t, ann, rec.ApprovalRef, "approve")
		}, "already_approved"},
		{"requester approving own call", func(t *testing.T) map[string]any {
			return e.sign(t, e.enroll(t, testRequester, "approvers"), rec.ApprovalRef, "approve")
		}, passkey.ReasonSelfApproval},
	}
	for _, tt := range rejections {
		t.Run(tt.name, func(t *testing.T) {
			r, got := e.decide(t, rec.ApprovalRef, tt.body(t))
			wantStatus(t, r, http.StatusUnprocessableEntity)
			if want := (approverapi.Decision{Reason: tt.reason, Status: tasks.ApprovalPending, Approved: 1, Needed: 2}); got != want {
				t.Errorf("decision = %+v, want %+v", got, want)
			}
		})
	}

	t.Run("the same request again is the same decision", func(t *testing.T) {
		// A retry (after a timeout, or after the server died right after
		// the post) gets the first answer; nothing is counted twice.
		r, got := e.decide(t, rec.ApprovalRef, body)
		wantStatus(t, r, http.StatusOK)
		if want := (approverapi.Decision{Accepted: true, Status: tasks.ApprovalPending, Approved: 1, Needed: 2}); got != want {
			t.Errorf("retried decision = %+v, want %+v", got, want)
		}
	})

	view := decodeAs[approverapi.Approval](t, e.do(t, "GET", "/approver/v1/approvals/"+rec.ApprovalRef, nil))
	if len(view.Approvals) != 1 || view.Approvals[0].ApproverName != "Ann" || view.Approved != 1 || view.Status != tasks.ApprovalPending {
		t.Errorf("after Ann: %+v", view)
	}

	// Bob completes the quorum; the tool is held at the gate.
	r, got = e.decide(t, rec.ApprovalRef, e.sign(t, bob, rec.ApprovalRef, "approve"))
	wantStatus(t, r, http.StatusOK)
	if want := (approverapi.Decision{Accepted: true, Status: tasks.ApprovalApproved, Approved: 2, Needed: 2}); got != want {
		t.Fatalf("quorum approval = %+v, want %+v", got, want)
	}

	t.Run("no challenge once approved", func(t *testing.T) {
		wantError(t, e.do(t, "POST", "/approver/v1/approvals/"+rec.ApprovalRef+"/challenge", `{"decision":"deny"}`),
			http.StatusConflict, codeTaskNotPending)
	})
	t.Run("workflow refuses when the read model lags", func(t *testing.T) {
		// Make the read model claim "pending" while the workflow executes:
		// the workflow's validator has the last word (*tasks.UpdateRejected).
		if _, err := e.store.Update(context.Background(), rec.TaskID, func(r *tasks.Record) error {
			r.ApprovalState = tasks.ApprovalPending
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		r, got := e.decide(t, rec.ApprovalRef, bobDeny)
		wantStatus(t, r, http.StatusConflict)
		if got.Accepted || got.Reason != "task_not_pending" {
			t.Errorf("decision during execution = %+v", got)
		}
	})

	e.release()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	final, err := e.store.WaitTerminal(ctx, rec.TaskID, testRequester)
	if err != nil {
		t.Fatal(err)
	}
	if final.Disposition != tasks.ApprovedExecuted {
		t.Fatalf("disposition = %q, want %q", final.Disposition, tasks.ApprovedExecuted)
	}
	if effects, err := e.ledger.Entries(ctx, ""); err != nil || len(effects) != 1 {
		t.Errorf("the tool had %d effects (%v), want exactly one", len(effects), err)
	}
	view = decodeAs[approverapi.Approval](t, e.do(t, "GET", "/approver/v1/approvals/"+rec.ApprovalRef, nil))
	if view.Status != tasks.ApprovalExecuted || view.Approved != 2 || strings.Contains(string(mustJSON(t, view)), rec.TaskID) {
		t.Errorf("final view: %+v", view)
	}
}

// TestDecisionWorkflowGone: the read model still says pending but no
// workflow runs (tasks.ErrWorkflowGone).
func TestDecisionWorkflowGone(t *testing.T) {
	e := newFlowEnv(t)
	ann := e.enroll(t, "Ann", "approvers")
	// No workflow runs either task. One had a workflow, which wrote to its
	// record; the other's never started and its start is long past (an
	// orphan of a crash). A record whose start may still be under way is
	// waited for instead (approvals TestOpenAnswersBeforeTheStart).
	for name, mark := range map[string]func(*tasks.Record){
		"ended":         func(r *tasks.Record) { r.Seq = 1 },
		"never started": func(r *tasks.Record) { r.CreatedAt = r.CreatedAt.Add(-time.Minute) },
	} {
		t.Run(name, func(t *testing.T) {
			rec := e.newTask(t, taskSpec{group: "approvers"})
			if _, err := e.store.Update(context.Background(), rec.TaskID, func(r *tasks.Record) error { mark(r); return nil }); err != nil {
				t.Fatal(err)
			}
			r, got := e.decide(t, rec.ApprovalRef, e.sign(t, ann, rec.ApprovalRef, "approve"))
			wantStatus(t, r, http.StatusConflict)
			if want := (approverapi.Decision{Reason: codeTaskNotPending, Status: tasks.ApprovalPending, Approved: 0, Needed: 1}); got != want {
				t.Errorf("decision without a workflow = %+v, want %+v", got, want)
			}
		})
	}
}

func TestDenyFlow(t *testing.T) {
	e := newFlowEnv(t)
	ann := e.enroll(t, "Ann", "approvers")
	rec := e.startTask(t, taskSpec{args: `{"amount":5000,"currency":"EUR","to":"acct-42"}`,
		display: "Transfer 5000 EUR to acct-42", group: "approvers", quorum: 1})
	body := e.sign(t, ann, rec.ApprovalRef, "deny")
	body["comment"] = "not this month"
	r, got := e.decide(t, rec.ApprovalRef, body)
	wantStatus(t, r, http.StatusOK)
	if want := (approverapi.Decision{Accepted: true, Status: tasks.ApprovalDenied, Approved: 0, Needed: 1}); got != want {
		t.Fatalf("deny = %+v, want %+v", got, want)
	}
	final, err := e.store.Get(context.Background(), rec.TaskID)
	if err != nil || final.Disposition != tasks.DeniedNotExecuted {
		t.Fatalf("after deny: disposition %q, %v", final.Disposition, err)
	}
	if transfers, err := e.ledger.Transfers(context.Background()); err != nil || len(transfers) != 0 {
		t.Errorf("transfers after a denial: %v, %v", transfers, err)
	}
	page := e.do(t, "GET", "/approve/"+rec.ApprovalRef, nil)
	wantStatus(t, page, http.StatusOK)
	html := checkPage(t, page)
	for _, s := range []string{"Denied", "Ann", "denied"} {
		if !strings.Contains(html, s) {
			t.Errorf("page after denial lacks %q", s)
		}
	}
	if strings.Contains(html, `id="approve"`) {
		t.Error("page after denial still offers the buttons")
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Anyone holding the approval link can post invalid decisions. They are
// turned away before the workflow, cost the real approver nothing, and the
// task records a bounded number of them.
func TestInvalidDecisionFloodLocksNobodyOut(t *testing.T) {
	e := newFlowEnv(t)
	ann := e.enroll(t, "Ann", "approvers")
	bob := e.enroll(t, "Bob", "approvers")
	rec := e.startTask(t, taskSpec{tool: "delete_records", args: `{"table":"orders","filter":"id = 7"}`,
		display: "Delete records from orders where id = 7", group: "approvers", quorum: 2})
	// The real approvers sign first; the flood comes before they post.
	annBody := e.sign(t, ann, rec.ApprovalRef, "approve")
	bobBody := e.sign(t, bob, rec.ApprovalRef, "approve")
	forged := map[string]any{"challengeId": annBody["challengeId"], "decision": "approve",
		"response": testpasskey.FlipSignature(t, annBody["response"].(json.RawMessage))}
	const flood = workflows.MaxDecisionAttempts + 20
	var wg sync.WaitGroup
	for i := range flood {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := forged
			if i%2 == 1 {
				body = map[string]any{"challengeId": strings.Repeat("ab", 16), "decision": "deny", "response": json.RawMessage(`{"id":"x"}`)}
			}
			r, got := e.decide(t, rec.ApprovalRef, body)
			if r.code != http.StatusUnprocessableEntity || got.Accepted {
				t.Errorf("invalid decision %d: status %d, %+v", i, r.code, got)
			}
		}()
	}
	wg.Wait()
	for _, b := range []map[string]any{annBody, bobBody} {
		r, got := e.decide(t, rec.ApprovalRef, b)
		wantStatus(t, r, http.StatusOK)
		if !got.Accepted {
			t.Fatalf("a valid approval after the flood = %+v", got)
		}
	}
	e.release()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	final, err := e.store.WaitTerminal(ctx, rec.TaskID, testRequester)
	if err != nil {
		t.Fatal(err)
	}
	if final.Disposition != tasks.ApprovedExecuted {
		t.Fatalf("disposition = %q", final.Disposition)
	}
	rejected := 0
	for _, ev := range final.Timeline {
		if ev.Kind == "rejected-decision" {
			rejected++
		}
	}
	if rejected == 0 || rejected > workflows.MaxRecordedRejections {
		t.Errorf("%d rejected decisions recorded, want 1..%d", rejected, workflows.MaxRecordedRejections)
	}
}
