package notify_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/approvals/approvalstest"
	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/authn"
	"github.com/countersign/countersign/notify"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

const signingSecret = "8f742231b10e8888abcd99yyyzzz85a5"

// recordingEngine is the in-memory approval workflow with the unsigned
// denials it is given recorded; err, when set, is returned instead (the
// workflow's own side of the deny is tested in workflows, TestUnsignedDeny*).
type recordingEngine struct {
	*approvalstest.Engine
	mu     sync.Mutex
	denies []tasks.UnsignedDenial
	ids    []string
	err    error
}

func (e *recordingEngine) DenyUnsigned(ctx context.Context, taskID string, u tasks.UnsignedDenial) (tasks.DecisionResult, error) {
	e.mu.Lock()
	if e.err != nil {
		defer e.mu.Unlock()
		return tasks.DecisionResult{}, e.err
	}
	e.denies = append(e.denies, u)
	e.ids = append(e.ids, taskID)
	e.mu.Unlock()
	return e.Engine.DenyUnsigned(ctx, taskID, u)
}

func (e *recordingEngine) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.denies)
}

func (e *recordingEngine) fail(err error) {
	e.mu.Lock()
	e.err = err
	e.mu.Unlock()
}

// denyCall is one call of a fakeDenier.
type denyCall struct {
	ref, approverID, via string
	at                   time.Time
}

// fakeDenier stands in for the approvals service: it records the calls and
// returns err.
type fakeDenier struct {
	mu    sync.Mutex
	calls []denyCall
	err   error
}

func (f *fakeDenier) DenyUnsigned(_ context.Context, ref, approverID, via string, at time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, denyCall{ref, approverID, via, at})
	return f.err
}

type interactEnv struct {
	js       jetstream.JetStream
	slack    *fakeSlack
	h        *notify.Interactions
	users    *notify.SlackUsers
	store    *tasks.Store
	passkeys *passkey.Service
	engine   *recordingEngine
	rec      tasks.Record
	alice    passkey.Approver
}

// newInteractEnv is the Slack endpoint over the real approvals service, task
// store and passkeys, with the in-memory workflow engine running one pending
// approval (group "approvers") and approver alice in that group.
func newInteractEnv(t *testing.T) *interactEnv {
	return buildInteractEnv(t, nil, nil)
}

// newInteractEnvWith is the Slack endpoint over d instead of the approvals
// service (no engine: e.engine is nil), with the clock now.
func newInteractEnvWith(t testing.TB, d notify.UnsignedDenier, now func() time.Time) *interactEnv {
	return buildInteractEnv(t, d, now)
}

func buildInteractEnv(t testing.TB, d notify.UnsignedDenier, now func() time.Time) *interactEnv {
	t.Helper()
	js, _ := startNATS(t)
	ctx := testCtx(t)
	f := newFakeSlack(t)
	s, err := notify.NewSlack(ctx, js, notify.SlackOptions{Token: "xoxb-test", DefaultChannel: "#approvals", DenyButton: true, APIURL: f.URL()})
	if err != nil {
		t.Fatal(err)
	}
	store, err := tasks.NewStore(ctx, js, tasks.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pk, err := passkey.New(ctx, js, passkey.Options{RPID: "localhost", RPOrigins: []string{"http://localhost:8080"}})
	if err != nil {
		t.Fatal(err)
	}
	users, err := notify.NewSlackUsers(ctx, js, notify.SlackUsersOptions{Passkeys: pk})
	if err != nil {
		t.Fatal(err)
	}
	var re *recordingEngine
	if d == nil {
		eng := approvalstest.New(approvalstest.Options{Activities: &activities.Activities{Tasks: store, Passkeys: pk}})
		t.Cleanup(eng.Close)
		re = &recordingEngine{Engine: eng}
		svc, err := approvals.New(approvals.Options{Store: store, Engine: re, Passkeys: pk})
		if err != nil {
			t.Fatal(err)
		}
		d = svc
	}
	h, err := notify.NewInteractions(ctx, js, notify.InteractionsOptions{
		SigningSecret: signingSecret, Slack: s, Users: users, Approvals: d, Now: now,
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := pendingRecord()
	at := time.Now().UTC().Truncate(time.Millisecond)
	rec.CreatedAt, rec.LastUpdatedAt, rec.ExpiresAt = at, at, at.Add(rec.Requirement.TTL)
	if err := store.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if re != nil {
		if err := re.Start(ctx, approvalInput(rec)); err != nil {
			t.Fatal(err)
		}
	}
	alice, _, err := pk.AddApprover(ctx, "alice", []string{"approvers"})
	if err != nil {
		t.Fatal(err)
	}
	return &interactEnv{js: js, slack: f, h: h, users: users, store: store, passkeys: pk, engine: re, rec: rec, alice: alice}
}

// approvalInput is the workflow input of a pending approval's record, as
// approvals.Service.Open starts it.
func approvalInput(rec tasks.Record) tasks.ApprovalInput {
	return tasks.ApprovalInput{
		Version: tasks.ApprovalInputVersion,
		Envelope: tasks.Envelope{
			Version:    tasks.EnvelopeVersion,
			TaskID:     rec.TaskID,
			Tool:       rec.Tool,
			Arguments:  rec.Arguments,
			ActionHash: rec.ActionHash,
			Principal:  rec.Owner,
			Resource:   "tool:" + rec.Tool,
			CreatedAt:  rec.CreatedAt,
		},
		Requirement: rec.Requirement,
		ApprovalRef: rec.ApprovalRef,
		DisplayText: rec.DisplayText,
		ExpiresAt:   rec.ExpiresAt,
		Mode:        tasks.ModeApproval,
	}
}

// state returns the approval state the read model shows once it is want, or
// after a few seconds without it.
func (e *interactEnv) state(t *testing.T, want tasks.ApprovalState) tasks.ApprovalState {
	t.Helper()
	var got tasks.Record
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; {
		got, err = e.store.Get(testCtx(t), e.rec.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		if got.ApprovalState == want || time.Now().After(deadline) {
			return got.ApprovalState
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func denyPayload(user, ref string) []byte {
	p, _ := json.Marshal(map[string]any{
		"type":    "block_actions",
		"user":    map[string]string{"id": user},
		"channel": map[string]string{"id": "CAPPROVALS"},
		"actions": []map[string]string{{"action_id": notify.ActionDeny, "value": ref, "type": "button", "block_id": "actions"}},
	})
	return []byte("payload=" + url.QueryEscape(string(p)))
}

func sign(secret string, ts int64, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte("v0:" + strconv.FormatInt(ts, 10) + ":"))
	mac.Write(body)
	return "v0=" + hex.EncodeToString(mac.Sum(nil))
}

func (e *interactEnv) post(t testing.TB, body []byte, ts int64, sig string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/slack/interactivity", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Slack-Request-Timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("X-Slack-Signature", sig)
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, req)
	return w
}

func (e *interactEnv) ephemerals() []string {
	var out []string
	for _, c := range e.slack.Calls() {
		if c.Method == "chat.postEphemeral" {
			out = append(out, c.Form.Get("user")+": "+c.Form.Get("text"))
		}
	}
	return out
}

func TestSlackDenyFromLinkedApprover(t *testing.T) {
	e := newInteractEnv(t)
	if _, err := e.users.Link(testCtx(t), e.alice.ID, "U0ALICE"); err != nil {
		t.Fatal(err)
	}
	body := denyPayload("U0ALICE", e.rec.ApprovalRef)
	now := time.Now().Unix()
	if w := e.post(t, body, now, sign(signingSecret, now, body)); w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if e.engine.count() != 1 {
		t.Fatalf("%d denials delivered, want 1", e.engine.count())
	}
	d := e.engine.denies[0]
	if e.engine.ids[0] != e.rec.TaskID || d.ApproverID != e.alice.ID || d.ApproverName != "alice" || d.Via != "slack" || d.At.IsZero() {
		t.Errorf("denial = %+v to %s", d, e.engine.ids[0])
	}
	if eph := e.ephemerals(); len(eph) != 1 || !strings.Contains(eph[0], "U0ALICE: Denied") {
		t.Errorf("ephemeral replies = %q", eph)
	}
	if got := e.state(t, tasks.ApprovalDenied); got != tasks.ApprovalDenied {
		t.Errorf("approval state after the deny = %s, want denied", got)
	}

	// The very same signed request again is a replay.
	if w := e.post(t, body, now, sign(signingSecret, now, body)); w.Code != http.StatusConflict {
		t.Errorf("replay: status %d, want 409", w.Code)
	}
	if e.engine.count() != 1 {
		t.Errorf("replay delivered another denial")
	}
}

func TestSlackInteractionsRejected(t *testing.T) {
	e := newInteractEnv(t)
	if _, err := e.users.Link(testCtx(t), e.alice.ID, "U0ALICE"); err != nil {
		t.Fatal(err)
	}
	body := denyPayload("U0ALICE", e.rec.ApprovalRef)
	now := time.Now().Unix()
	for _, tc := range []struct {
		name string
		ts   int64
		sig  string
		body []byte
	}{
		{"no signature", now, "", body},
		{"wrong secret", now, sign("another-secret", now, body), body},
		{"tampered body", now, sign(signingSecret, now, body), denyPayload("U0ALICE", tasks.NewID("apr_"))},
		{"stale timestamp", now - 600, sign(signingSecret, now-600, body), body},
		{"future timestamp", now + 600, sign(signingSecret, now+600, body), body},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if w := e.post(t, tc.body, tc.ts, tc.sig); w.Code != http.StatusUnauthorized {
				t.Errorf("status %d, want 401", w.Code)
			}
		})
	}
	if e.engine.count() != 0 || len(e.slack.Calls()) != 0 {
		t.Errorf("a forged callback had an effect: %d denials, %d Slack calls", e.engine.count(), len(e.slack.Calls()))
	}
}

func TestSlackDenyRefusedWithEphemeralError(t *testing.T) {
	e := newInteractEnv(t)
	ctx := testCtx(t)
	bob, _, err := e.passkeys.AddApprover(ctx, "bob", []string{"deployers"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.users.Link(ctx, bob.ID, "U0BOB"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.users.Link(ctx, e.alice.ID, "U0ALICE"); err != nil {
		t.Fatal(err)
	}
	// A link to an approver that no longer exists (links are only made to
	// existing approvers: write it behind the handler's back).
	kv, err := e.js.KeyValue(ctx, notify.SlackUsersBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "U0GONE", []byte(`{"approverId":"0123456789abcdef0123456789abcdef"}`)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, user, ref, want string
	}{
		{"unknown Slack user", "U0MALLORY", e.rec.ApprovalRef, "does not know your Slack account"},
		{"approver gone", "U0GONE", e.rec.ApprovalRef, "approver that no longer exists"},
		{"not in the group", "U0BOB", e.rec.ApprovalRef, "not in the approver group"},
		{"unknown approval", "U0ALICE", tasks.NewID("apr_"), "unknown"},
		{"malformed ref", "U0ALICE", "../../x", "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(e.ephemerals())
			body := denyPayload(tc.user, tc.ref)
			now := time.Now().Unix()
			if w := e.post(t, body, now, sign(signingSecret, now, body)); w.Code != http.StatusOK {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			eph := e.ephemerals()
			if len(eph) != before+1 || !strings.Contains(eph[len(eph)-1], tc.want) || !strings.Contains(eph[len(eph)-1], "nothing changed") {
				t.Errorf("ephemeral replies = %q, want one saying %q and nothing changed", eph, tc.want)
			}
		})
	}
	if e.engine.count() != 0 {
		t.Errorf("%d denials delivered, want none", e.engine.count())
	}
	got, err := e.store.Get(ctx, e.rec.TaskID)
	if err != nil || got.ApprovalState != tasks.ApprovalPending {
		t.Errorf("record changed: %+v %v", got.ApprovalState, err)
	}
	if running, err := e.engine.Running(ctx, e.rec.TaskID); err != nil || !running {
		t.Errorf("workflow running = %v, %v; want still waiting", running, err)
	}
}

func TestSlackDenyOnFinishedTask(t *testing.T) {
	t.Run("refused by the workflow", func(t *testing.T) {
		e := newInteractEnv(t)
		if _, err := e.users.Link(testCtx(t), e.alice.ID, "U0ALICE"); err != nil {
			t.Fatal(err)
		}
		e.engine.fail(&tasks.UpdateRejected{Reason: "task_not_pending", Message: "task is no longer pending"})
		body := denyPayload("U0ALICE", e.rec.ApprovalRef)
		now := time.Now().Unix()
		if w := e.post(t, body, now, sign(signingSecret, now, body)); w.Code != http.StatusOK {
			t.Fatalf("status %d", w.Code)
		}
		if eph := e.ephemerals(); len(eph) != 1 || !strings.Contains(eph[0], "no longer pending") {
			t.Errorf("ephemeral replies = %q", eph)
		}
	})
	t.Run("already denied", func(t *testing.T) {
		e := newInteractEnv(t)
		if _, err := e.users.Link(testCtx(t), e.alice.ID, "U0ALICE"); err != nil {
			t.Fatal(err)
		}
		body := denyPayload("U0ALICE", e.rec.ApprovalRef)
		now := time.Now().Unix()
		if w := e.post(t, body, now, sign(signingSecret, now, body)); w.Code != http.StatusOK {
			t.Fatalf("first deny: status %d", w.Code)
		}
		if got := e.state(t, tasks.ApprovalDenied); got != tasks.ApprovalDenied {
			t.Fatalf("approval state after the first deny = %s, want denied", got)
		}
		// Pressed again: another signed request (not a replay).
		if w := e.post(t, body, now+1, sign(signingSecret, now+1, body)); w.Code != http.StatusOK {
			t.Fatalf("second deny: status %d", w.Code)
		}
		if eph := e.ephemerals(); len(eph) != 2 || !strings.Contains(eph[0], "Denied") || !strings.Contains(eph[1], "no longer pending") || !strings.Contains(eph[1], "nothing changed") {
			t.Errorf("ephemeral replies = %q", eph)
		}
	})
}

// TestSlackDenyErrorMapping: every answer of the approvals service has its
// ephemeral reply, and the service is asked with the approver, "slack" and
// the endpoint's clock.
func TestSlackDenyErrorMapping(t *testing.T) {
	at := time.Date(2026, 11, 2, 9, 30, 0, 0, time.UTC)
	f := &fakeDenier{}
	e := newInteractEnvWith(t, f, func() time.Time { return at })
	if _, err := e.users.Link(testCtx(t), e.alice.ID, "U0ALICE"); err != nil {
		t.Fatal(err)
	}
	ref := e.rec.ApprovalRef
	// Each case a request of its own: a timestamp of its own, taken from
	// one clock reading (read per case, two cases a second apart could
	// share one, and the second is then a replay).
	base := time.Now().Unix()
	for i, tc := range []struct {
		name string
		ref  string
		err  error
		want string
	}{
		{"denied", ref, nil, "Denied. The call will not run; the denial is recorded under your name."},
		{"unknown approver", ref, approvals.ErrUnknownApprover, "Your Slack account is linked to an approver that no longer exists; nothing changed."},
		{"unknown approval", ref, approvals.ErrNotFound, "This approval is unknown or no longer kept; nothing changed."},
		{"malformed ref", "../../x", approvals.ErrNotFound, "This approval is unknown; nothing changed."},
		{"not eligible", ref, approvals.ErrNotEligible, "You are not in the approver group for this call; nothing changed."},
		{"not pending", ref, approvals.ErrNotPending, "This approval is no longer pending; nothing changed."},
		{"in progress", ref, fmt.Errorf("%w: %w", approvals.ErrInProgress, tasks.ErrUpdateInProgress), "The denial could not be delivered right now; try again, or deny on the approval page."},
		{"internal", ref, errors.New("approvals: deny: temporal unavailable"), "The denial could not be delivered right now; try again, or deny on the approval page."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.mu.Lock()
			f.err, f.calls = tc.err, nil
			f.mu.Unlock()
			before := len(e.ephemerals())
			body := denyPayload("U0ALICE", tc.ref)
			now := base - int64(i) // a new request, not a replay
			if w := e.post(t, body, now, sign(signingSecret, now, body)); w.Code != http.StatusOK {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			f.mu.Lock()
			calls := f.calls
			f.mu.Unlock()
			if want := (denyCall{tc.ref, e.alice.ID, "slack", at}); len(calls) != 1 || calls[0] != want {
				t.Errorf("calls = %+v, want one %+v", calls, want)
			}
			if eph := e.ephemerals(); len(eph) != before+1 || eph[len(eph)-1] != "U0ALICE: "+tc.want {
				t.Errorf("ephemeral replies = %q, want a last one %q", eph, tc.want)
			}
		})
	}

	// A Slack user linked to no approver never reaches the service.
	f.mu.Lock()
	f.err, f.calls = nil, nil
	f.mu.Unlock()
	body := denyPayload("U0MALLORY", ref)
	now := time.Now().Unix()
	if w := e.post(t, body, now, sign(signingSecret, now, body)); w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if len(f.calls) != 0 {
		t.Errorf("an unmapped Slack user reached the service: %+v", f.calls)
	}
}

func TestSlackInteractionsMalformed(t *testing.T) {
	e := newInteractEnv(t)
	now := time.Now().Unix()
	for _, tc := range []struct {
		name   string
		body   string
		status int
	}{
		{"no payload", "foo=bar", http.StatusBadRequest},
		{"payload not JSON", "payload=%7Bnope", http.StatusBadRequest},
		{"other interaction type", "payload=" + url.QueryEscape(`{"type":"view_submission"}`), http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := []byte(tc.body)
			if w := e.post(t, b, now, sign(signingSecret, now, b)); w.Code != tc.status {
				t.Errorf("status %d, want %d: %s", w.Code, tc.status, w.Body)
			}
		})
	}
	req := httptest.NewRequest(http.MethodGet, "/slack/interactivity", nil)
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, req)
	if w.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d", w.Code)
	}
	if e.engine.count() != 0 {
		t.Errorf("denials delivered")
	}
}

func TestSlackUserLinkHandler(t *testing.T) {
	e := newInteractEnv(t)
	ctx := testCtx(t)
	tokens, err := authn.Open(ctx, e.js, authn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := tokens.Issue(ctx, "ops@example.com", authn.KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	agent, err := tokens.Issue(ctx, "billing-bot", authn.KindAgent)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := audit.OpenKeyring(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	auditLog, err := audit.Open(ctx, e.js, audit.Options{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	readOnly, err := audit.Open(ctx, e.js, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	storeDown := "Bearer " + authn.NewToken(authn.KindAdmin)
	handler := func(l *audit.Log) http.Handler {
		users, err := notify.NewSlackUsers(ctx, e.js, notify.SlackUsersOptions{Passkeys: e.passkeys, Audit: l})
		if err != nil {
			t.Fatal(err)
		}
		authorize := func(r *http.Request) (authn.Principal, error) {
			if r.Header.Get("Authorization") == storeDown {
				// The token store failing, as (*authn.Tokens).Admin
				// reports it.
				return authn.Principal{}, fmt.Errorf("authn: lookup: %w", jetstream.ErrNoHeartbeat)
			}
			return tokens.Admin(r)
		}
		mux := http.NewServeMux()
		mux.Handle("POST /admin/v1/approvers/{id}/slack", users.LinkHandler(authorize))
		mux.Handle("DELETE /admin/v1/approvers/{id}/slack/{slackUserId}", users.UnlinkHandler(authorize))
		return mux
	}
	audited := handler(auditLog)
	// send makes one admin request; a body is sent as JSON.
	send := func(h http.Handler, method, path, auth, body string) (int, map[string]any) {
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req := httptest.NewRequest(method, path, rd)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		var out map[string]any
		_ = json.Unmarshal(w.Body.Bytes(), &out)
		return w.Code, out
	}
	do := func(h http.Handler, id, auth, body string) (int, map[string]any) {
		return send(h, http.MethodPost, "/admin/v1/approvers/"+id+"/slack", auth, body)
	}
	bearer := "Bearer " + admin
	for _, tc := range []struct {
		name, id, auth, body string
		h                    http.Handler
		status               int
		code                 string
	}{
		{"no token", e.alice.ID, "", `{"slackUserId":"U0ALICE"}`, audited, 401, "unauthorized"},
		{"unknown token", e.alice.ID, bearer + "x", `{"slackUserId":"U0ALICE"}`, audited, 401, "unauthorized"},
		{"agent token", e.alice.ID, "Bearer " + agent, `{"slackUserId":"U0ALICE"}`, audited, 401, "unauthorized"},
		{"token store down", e.alice.ID, storeDown, `{"slackUserId":"U0ALICE"}`, audited, 500, "internal"},
		{"bad user id", e.alice.ID, bearer, `{"slackUserId":"alice"}`, audited, 400, "invalid_request"},
		{"unknown field", e.alice.ID, bearer, `{"slackUserId":"U0ALICE","admin":true}`, audited, 400, "invalid_request"},
		{"not JSON", e.alice.ID, bearer, `{`, audited, 400, "invalid_request"},
		{"unknown approver", "0123456789abcdef0123456789abcdef", bearer, `{"slackUserId":"U0ALICE"}`, audited, 404, "not_found"},
		{"malformed approver", "nope", bearer, `{"slackUserId":"U0ALICE"}`, audited, 404, "not_found"},
		{"no audit log", e.alice.ID, bearer, `{"slackUserId":"U0ALICE"}`, handler(nil), 503, "audit_unavailable"},
		{"no audit signing keys", e.alice.ID, bearer, `{"slackUserId":"U0ALICE"}`, handler(readOnly), 503, "audit_unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, out := do(tc.h, tc.id, tc.auth, tc.body)
			if status != tc.status || out["error"] != tc.code || out["message"] == "" {
				t.Errorf("got %d %v, want %d %s", status, out, tc.status, tc.code)
			}
			if tc.code == "internal" && out["message"] != "internal error" {
				t.Errorf("message %q, want %q", out["message"], "internal error")
			}
		})
	}
	if _, err := e.users.Approver(testCtx(t), "U0ALICE"); err != notify.ErrUnknownSlackUser {
		t.Fatalf("a refused link was stored: %v", err)
	}
	aliceChain := audit.AdminChainID(audit.AdminTarget{Type: audit.TargetApprover, ID: e.alice.ID})
	if _, err := auditLog.Chain(ctx, aliceChain); !errors.Is(err, audit.ErrNotFound) {
		t.Fatalf("a refused link was recorded: %v", err)
	}

	status, out := do(audited, e.alice.ID, bearer, `{"slackUserId":"U0ALICE"}`)
	if status != 200 || out["approverId"] != e.alice.ID || out["slackUserId"] != "U0ALICE" || out["changed"] != true ||
		out["auditChain"] != aliceChain || out["auditRecord"] != aliceChain+"/0" {
		t.Fatalf("link: %d %v", status, out)
	}
	if got, err := e.users.Approver(testCtx(t), "U0ALICE"); err != nil || got != e.alice.ID {
		t.Errorf("lookup after link = %q, %v", got, err)
	}
	// The same link again changes nothing and records nothing new.
	if status, again := do(audited, e.alice.ID, bearer, `{"slackUserId":"U0ALICE"}`); status != 200 || again["changed"] != false || again["auditRecord"] != out["auditRecord"] {
		t.Fatalf("link again: %d %v", status, again)
	}
	// Linking the Slack user to another approver unlinks it from Alice,
	// in Alice's chain, and links it in Bob's.
	bob, _, err := e.passkeys.AddApprover(ctx, "bob", []string{"approvers"})
	if err != nil {
		t.Fatal(err)
	}
	bobChain := audit.AdminChainID(audit.AdminTarget{Type: audit.TargetApprover, ID: bob.ID})
	if status, out := do(audited, bob.ID, bearer, `{"slackUserId":"U0ALICE"}`); status != 200 || out["changed"] != true || out["replaced"] != e.alice.ID || out["auditRecord"] != bobChain+"/0" {
		t.Fatalf("relink: %d %v", status, out)
	}

	actions := func(chain string) []audit.AdminAction {
		lines, err := auditLog.Chain(ctx, chain)
		if err != nil {
			t.Fatal(err)
		}
		var out []audit.AdminAction
		for _, line := range lines {
			var rec audit.Record
			var a audit.AdminAction
			if err := json.Unmarshal(line, &rec); err != nil || rec.Kind != audit.KindAdmin || json.Unmarshal(rec.Body, &a) != nil {
				t.Fatalf("record %s: %v", line, err)
			}
			a.At = time.Time{}
			out = append(out, a)
		}
		return out
	}
	// Unlinking: the Slack user can no longer deny for Bob; only Bob's
	// link can be removed from Bob; a second unlink changes nothing and
	// records nothing new; refused requests change nothing.
	unlink := func(h http.Handler, id, user, auth string) (int, map[string]any) {
		return send(h, http.MethodDelete, "/admin/v1/approvers/"+id+"/slack/"+user, auth, "")
	}
	for _, tc := range []struct {
		name, id, user, auth string
		h                    http.Handler
		status               int
		code                 string
	}{
		{"no token", bob.ID, "U0ALICE", "", audited, 401, "unauthorized"},
		{"agent token", bob.ID, "U0ALICE", "Bearer " + agent, audited, 401, "unauthorized"},
		{"no audit signing keys", bob.ID, "U0ALICE", bearer, handler(readOnly), 503, "audit_unavailable"},
		{"bad user id", bob.ID, "alice", bearer, audited, 400, "invalid_request"},
		{"linked to another approver", e.alice.ID, "U0ALICE", bearer, audited, 404, "not_linked"},
		{"never linked", bob.ID, "U0NOBODY", bearer, audited, 404, "not_linked"},
	} {
		if status, out := unlink(tc.h, tc.id, tc.user, tc.auth); status != tc.status || out["error"] != tc.code {
			t.Errorf("unlink, %s: got %d %v, want %d %s", tc.name, status, out, tc.status, tc.code)
		}
	}
	if got, err := e.users.Approver(ctx, "U0ALICE"); err != nil || got != bob.ID {
		t.Fatalf("after refused unlinks: %q, %v", got, err)
	}
	status, out = unlink(audited, bob.ID, "U0ALICE", bearer)
	if status != 200 || out["changed"] != true || out["auditRecord"] != bobChain+"/1" {
		t.Fatalf("unlink: %d %v", status, out)
	}
	if _, err := e.users.Approver(ctx, "U0ALICE"); err != notify.ErrUnknownSlackUser {
		t.Fatalf("an unlinked Slack user still maps to an approver: %v", err)
	}
	if status, again := unlink(audited, bob.ID, "U0ALICE", bearer); status != 200 || again["changed"] != false || again["auditRecord"] != out["auditRecord"] {
		t.Fatalf("unlink again: %d %v", status, again)
	}
	if status, out := unlink(audited, e.alice.ID, "U0ALICE", bearer); status != 404 || out["error"] != "not_linked" {
		t.Fatalf("unlink from an approver it was not unlinked from: %d %v", status, out)
	}
	// Linked again after the unlinking: to Alice, replacing no one.
	if status, out := do(audited, e.alice.ID, bearer, `{"slackUserId":"U0ALICE"}`); status != 200 || out["changed"] != true || out["replaced"] != nil {
		t.Fatalf("link after unlink: %d %v", status, out)
	}
	if got, err := e.users.Approver(ctx, "U0ALICE"); err != nil || got != e.alice.ID {
		t.Fatalf("after linking again: %q, %v", got, err)
	}

	by := "admin:ops@example.com"
	want := []audit.AdminAction{
		{Action: audit.AdminSlackLink, Target: audit.AdminTarget{Type: audit.TargetSlackUser, ID: "U0ALICE", Approver: e.alice.ID}, Status: "linked", By: by},
		{Action: audit.AdminSlackUnlink, Target: audit.AdminTarget{Type: audit.TargetSlackUser, ID: "U0ALICE", Approver: e.alice.ID}, Status: "unlinked", By: by},
		{Action: audit.AdminSlackLink, Target: audit.AdminTarget{Type: audit.TargetSlackUser, ID: "U0ALICE", Approver: e.alice.ID}, Status: "linked", By: by},
	}
	if diff := cmp.Diff(want, actions(aliceChain)); diff != "" {
		t.Errorf("Alice's admin chain (-want +got):\n%s", diff)
	}
	want = []audit.AdminAction{
		{Action: audit.AdminSlackLink, Target: audit.AdminTarget{Type: audit.TargetSlackUser, ID: "U0ALICE", Approver: bob.ID}, Status: "linked", By: by, Replaced: e.alice.ID},
		{Action: audit.AdminSlackUnlink, Target: audit.AdminTarget{Type: audit.TargetSlackUser, ID: "U0ALICE", Approver: bob.ID}, Status: "unlinked", By: by},
	}
	if diff := cmp.Diff(want, actions(bobChain)); diff != "" {
		t.Errorf("Bob's admin chain (-want +got):\n%s", diff)
	}
	var export [][]byte
	if err := auditLog.Export(ctx, time.Time{}, func(line []byte) error { export = append(export, bytes.Clone(line)); return nil }); err != nil {
		t.Fatal(err)
	}
	if rep := audit.Verify(export, keys.PublicKeys(), audit.VerifyOptions{}); !rep.OK || len(rep.Tasks) != 2 {
		t.Errorf("audit verify: %+v", rep)
	}
}
