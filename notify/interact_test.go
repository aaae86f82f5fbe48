package notify_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/notify"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

const signingSecret = "8f742231b10e8888abcd99yyyzzz85a5"

// recordingDenier records the unsigned denials it is given; the workflow's
// side of the deny is tested in workflows (TestUnsignedDeny*).
type recordingDenier struct {
	mu     sync.Mutex
	denies []tasks.UnsignedDenial
	ids    []string
	err    error
}

func (d *recordingDenier) DenyUnsigned(_ context.Context, taskID string, u tasks.UnsignedDenial) (tasks.DecisionResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err != nil {
		return tasks.DecisionResult{}, d.err
	}
	d.denies = append(d.denies, u)
	d.ids = append(d.ids, taskID)
	return tasks.DecisionResult{Accepted: true, Status: tasks.ApprovalDenied}, nil
}

func (d *recordingDenier) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.denies)
}

type interactEnv struct {
	slack    *fakeSlack
	h        *notify.Interactions
	users    *notify.SlackUsers
	store    *tasks.Store
	passkeys *passkey.Service
	denier   *recordingDenier
	rec      tasks.Record
	alice    passkey.Approver
}

func newInteractEnv(t *testing.T) *interactEnv {
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
	d := &recordingDenier{}
	h, err := notify.NewInteractions(ctx, js, notify.InteractionsOptions{
		SigningSecret: signingSecret, Slack: s, Users: users, Store: store, Passkeys: pk, Denier: d,
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := pendingRecord()
	if err := store.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	alice, _, err := pk.AddApprover(ctx, "alice", []string{"approvers"})
	if err != nil {
		t.Fatal(err)
	}
	return &interactEnv{slack: f, h: h, users: users, store: store, passkeys: pk, denier: d, rec: rec, alice: alice}
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

func (e *interactEnv) post(t *testing.T, body []byte, ts int64, sig string) *httptest.ResponseRecorder {
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
	if err := e.users.Link(testCtx(t), e.alice.ID, "U0ALICE"); err != nil {
		t.Fatal(err)
	}
	body := denyPayload("U0ALICE", e.rec.ApprovalRef)
	now := time.Now().Unix()
	if w := e.post(t, body, now, sign(signingSecret, now, body)); w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if e.denier.count() != 1 {
		t.Fatalf("%d denials delivered, want 1", e.denier.count())
	}
	d := e.denier.denies[0]
	if e.denier.ids[0] != e.rec.TaskID || d.ApproverID != e.alice.ID || d.ApproverName != "alice" || d.Via != "slack" || d.At.IsZero() {
		t.Errorf("denial = %+v to %s", d, e.denier.ids[0])
	}
	if eph := e.ephemerals(); len(eph) != 1 || !strings.Contains(eph[0], "U0ALICE: Denied") {
		t.Errorf("ephemeral replies = %q", eph)
	}

	// The very same signed request again is a replay.
	if w := e.post(t, body, now, sign(signingSecret, now, body)); w.Code != http.StatusConflict {
		t.Errorf("replay: status %d, want 409", w.Code)
	}
	if e.denier.count() != 1 {
		t.Errorf("replay delivered another denial")
	}
}

func TestSlackInteractionsRejected(t *testing.T) {
	e := newInteractEnv(t)
	if err := e.users.Link(testCtx(t), e.alice.ID, "U0ALICE"); err != nil {
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
	if e.denier.count() != 0 || len(e.slack.Calls()) != 0 {
		t.Errorf("a forged callback had an effect: %d denials, %d Slack calls", e.denier.count(), len(e.slack.Calls()))
	}
}

func TestSlackDenyRefusedWithEphemeralError(t *testing.T) {
	e := newInteractEnv(t)
	ctx := testCtx(t)
	bob, _, err := e.passkeys.AddApprover(ctx, "bob", []string{"deployers"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.users.Link(ctx, bob.ID, "U0BOB"); err != nil {
		t.Fatal(err)
	}
	if err := e.users.Link(ctx, e.alice.ID, "U0ALICE"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, user, ref, want string
	}{
		{"unknown Slack user", "U0MALLORY", e.rec.ApprovalRef, "does not know your Slack account"},
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
	if e.denier.count() != 0 {
		t.Errorf("%d denials delivered, want none", e.denier.count())
	}
	got, err := e.store.Get(ctx, e.rec.TaskID)
	if err != nil || got.ApprovalState != tasks.ApprovalPending {
		t.Errorf("record changed: %+v %v", got.ApprovalState, err)
	}
}

func TestSlackDenyOnFinishedTask(t *testing.T) {
	e := newInteractEnv(t)
	if err := e.users.Link(testCtx(t), e.alice.ID, "U0ALICE"); err != nil {
		t.Fatal(err)
	}
	e.denier.err = &tasks.UpdateRejected{Reason: "task_not_pending", Message: "task is no longer pending"}
	body := denyPayload("U0ALICE", e.rec.ApprovalRef)
	now := time.Now().Unix()
	if w := e.post(t, body, now, sign(signingSecret, now, body)); w.Code != http.StatusOK {
		t.Fatalf("status %d", w.Code)
	}
	if eph := e.ephemerals(); len(eph) != 1 || !strings.Contains(eph[0], "no longer pending") {
		t.Errorf("ephemeral replies = %q", eph)
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
	if e.denier.count() != 0 {
		t.Errorf("denials delivered")
	}
}

func TestSlackUserLinkHandler(t *testing.T) {
	e := newInteractEnv(t)
	mux := http.NewServeMux()
	mux.Handle("POST /admin/v1/approvers/{id}/slack", e.users.LinkHandler(func(r *http.Request) error {
		if r.Header.Get("Authorization") != "Bearer admin" {
			return notify.ErrUnknownSlackUser // any error: refused
		}
		return nil
	}))
	do := func(id, auth, body string) (int, map[string]string) {
		req := httptest.NewRequest(http.MethodPost, "/admin/v1/approvers/"+id+"/slack", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		var out map[string]string
		_ = json.Unmarshal(w.Body.Bytes(), &out)
		return w.Code, out
	}
	for _, tc := range []struct {
		name, id, auth, body string
		status               int
		code                 string
	}{
		{"no token", e.alice.ID, "", `{"slackUserId":"U0ALICE"}`, 401, "unauthorized"},
		{"bad user id", e.alice.ID, "Bearer admin", `{"slackUserId":"alice"}`, 400, "invalid_request"},
		{"unknown field", e.alice.ID, "Bearer admin", `{"slackUserId":"U0ALICE","admin":true}`, 400, "invalid_request"},
		{"not JSON", e.alice.ID, "Bearer admin", `{`, 400, "invalid_request"},
		{"unknown approver", "0123456789abcdef0123456789abcdef", "Bearer admin", `{"slackUserId":"U0ALICE"}`, 404, "not_found"},
		{"malformed approver", "nope", "Bearer admin", `{"slackUserId":"U0ALICE"}`, 404, "not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, out := do(tc.id, tc.auth, tc.body)
			if status != tc.status || out["error"] != tc.code || out["message"] == "" {
				t.Errorf("got %d %v, want %d %s", status, out, tc.status, tc.code)
			}
		})
	}
	if _, err := e.users.Approver(testCtx(t), "U0ALICE"); err != notify.ErrUnknownSlackUser {
		t.Fatalf("a refused link was stored: %v", err)
	}
	status, out := do(e.alice.ID, "Bearer admin", `{"slackUserId":"U0ALICE"}`)
	if status != 200 || out["approverId"] != e.alice.ID || out["slackUserId"] != "U0ALICE" {
		t.Fatalf("link: %d %v", status, out)
	}
	if got, err := e.users.Approver(testCtx(t), "U0ALICE"); err != nil || got != e.alice.ID {
		t.Errorf("lookup after link = %q, %v", got, err)
	}
}
