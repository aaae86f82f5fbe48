package notify_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/countersign/countersign/internal/authn"
	"github.com/countersign/countersign/notify"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
	"github.com/countersign/countersign/web"
)

// decisionEnv is the real approver API (web.Handler over NATS KV stores and
// the passkey service) behind the NATS decision service.
type decisionEnv struct {
	nc       *nats.Conn
	store    *tasks.Store
	passkeys *passkey.Service
	site     *web.Handler
}

func newDecisionEnv(t *testing.T) *decisionEnv {
	t.Helper()
	js, nc := startNATS(t)
	ctx := testCtx(t)
	store, err := tasks.NewStore(ctx, js, tasks.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pk, err := passkey.New(ctx, js, passkey.Options{RPID: "localhost", RPOrigins: []string{"http://localhost:8080"}})
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := authn.Open(ctx, js, authn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// No Temporal here: every request below is answered before a decision
	// would reach a workflow. A nil-client orchestrator would panic (and
	// the API answer 500) if one did.
	site, err := web.New(web.Options{PublicURL: "http://localhost:8080", Store: store,
		Orchestrator: tasks.NewOrchestrator(nil), Passkeys: pk, Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := notify.NewDecisionService(nc, notify.DecisionOptions{API: site})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	return &decisionEnv{nc: nc, store: store, passkeys: pk, site: site}
}

func (e *decisionEnv) request(t *testing.T, subject string, body []byte) (int, map[string]any) {
	t.Helper()
	m, err := e.nc.Request(subject, body, 10*time.Second)
	if err != nil {
		t.Fatalf("request %s: %v", subject, err)
	}
	status, err := strconv.Atoi(m.Header.Get(notify.StatusHeader))
	if err != nil {
		t.Fatalf("reply without a status header: %v (%s)", err, m.Data)
	}
	var out map[string]any
	if err := json.Unmarshal(m.Data, &out); err != nil {
		t.Fatalf("reply is not a JSON object: %v: %s", err, m.Data)
	}
	return status, out
}

// overHTTP sends the same request to the site over HTTP.
func (e *decisionEnv) overHTTP(t *testing.T, method, path string, body []byte) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req := httptest.NewRequest(method, path, rd)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	w := httptest.NewRecorder()
	e.site.ServeHTTP(w, req)
	var out map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		t.Fatalf("HTTP answer is not JSON: %s", w.Body)
	}
	return w.Code, out
}

func (e *decisionEnv) addTask(t *testing.T, edit func(*tasks.Record)) tasks.Record {
	t.Helper()
	r := pendingRecord()
	r.ExpiresAt = time.Now().Add(time.Hour)
	r.ActionHash = "5d41402abc4b2a76b9719d911017c5925d41402abc4b2a76b9719d911017c592"
	if edit != nil {
		edit(&r)
	}
	if err := e.store.Create(testCtx(t), r); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestDecisionServiceMalformedRequests(t *testing.T) {
	e := newDecisionEnv(t)
	rec := e.addTask(t, nil)
	for _, tc := range []struct {
		name, subject, body string
		status              int
		code                string
	}{
		{"not JSON", notify.SubjectChallenge, `{"ref":`, 400, "invalid_request"},
		{"array", notify.SubjectChallenge, `[1,2]`, 400, "invalid_request"},
		{"two objects", notify.SubjectChallenge, `{"ref":"` + rec.ApprovalRef + `"} {}`, 400, "invalid_request"},
		{"no ref", notify.SubjectChallenge, `{"decision":"approve"}`, 400, "invalid_request"},
		{"ref not a string", notify.SubjectDecision, `{"ref":42}`, 400, "invalid_request"},
		{"ref not an id", notify.SubjectDecision, `{"ref":"../admin/v1/agents"}`, 404, "not_found"},
		{"unknown ref", notify.SubjectChallenge, `{"ref":"` + tasks.NewID("apr_") + `","decision":"approve"}`, 404, "not_found"},
		{"unknown ref, decision", notify.SubjectDecision, `{"ref":"` + tasks.NewID("apr_") + `","challengeId":"x","decision":"deny","response":{}}`, 404, "not_found"},
		{"bad decision value", notify.SubjectChallenge, `{"ref":"` + rec.ApprovalRef + `","decision":"maybe"}`, 400, "invalid_request"},
		{"unknown field", notify.SubjectChallenge, `{"ref":"` + rec.ApprovalRef + `","decision":"approve","admin":true}`, 400, "invalid_request"},
		{"decision without assertion", notify.SubjectDecision, `{"ref":"` + rec.ApprovalRef + `","challengeId":"abc","decision":"approve"}`, 400, "invalid_request"},
		{"approval view with extra fields", notify.SubjectApproval, `{"ref":"` + rec.ApprovalRef + `","x":1}`, 400, "invalid_request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := e.request(t, tc.subject, []byte(tc.body))
			if status != tc.status || body["error"] != tc.code {
				t.Errorf("got %d %v, want %d %s", status, body, tc.status, tc.code)
			}
			if msg, _ := body["message"].(string); msg == "" {
				t.Errorf("no message: %v", body)
			}
		})
	}
	// Nothing changed.
	got, err := e.store.Get(testCtx(t), rec.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ApprovalState != tasks.ApprovalPending || len(got.Approvals) != 0 || got.Status != tasks.StatusWorking {
		t.Errorf("record changed: %+v", got)
	}
}

// The NATS service answers exactly what the HTTP API answers.
func TestDecisionServiceMirrorsHTTP(t *testing.T) {
	e := newDecisionEnv(t)
	rec := e.addTask(t, nil)
	if _, _, err := e.passkeys.AddApprover(testCtx(t), "alice", []string{"approvers"}); err != nil {
		t.Fatal(err)
	}

	st, view := e.request(t, notify.SubjectApproval, []byte(`{"ref":"`+rec.ApprovalRef+`"}`))
	hst, hview := e.overHTTP(t, http.MethodGet, "/approver/v1/approvals/"+rec.ApprovalRef, nil)
	if st != 200 || st != hst || view["displayText"] != hview["displayText"] || view["ref"] != rec.ApprovalRef {
		t.Errorf("approval view: NATS %d %v, HTTP %d %v", st, view, hst, hview)
	}
	if _, ok := view["taskId"]; ok {
		t.Errorf("the view leaks the task ID")
	}

	// A challenge: the passkey service answers no_eligible_credential (alice
	// has no passkey yet), identically on both.
	body := []byte(`{"ref":"` + rec.ApprovalRef + `","decision":"approve"}`)
	st, ch := e.request(t, notify.SubjectChallenge, body)
	hst, hch := e.overHTTP(t, http.MethodPost, "/approver/v1/approvals/"+rec.ApprovalRef+"/challenge", []byte(`{"decision":"approve"}`))
	if st != hst || ch["error"] != hch["error"] {
		t.Errorf("challenge: NATS %d %v, HTTP %d %v", st, ch, hst, hch)
	}
	if st == http.StatusInternalServerError {
		t.Errorf("challenge answered 500: %v", ch)
	}
}

// A decision for a finished task is refused with task_not_pending and
// reaches no workflow.
func TestDecisionServiceFinishedTask(t *testing.T) {
	e := newDecisionEnv(t)
	rec := e.addTask(t, func(r *tasks.Record) {
		r.Status, r.Disposition, r.ApprovalState = tasks.StatusCompleted, tasks.DeniedNotExecuted, tasks.ApprovalDenied
	})
	st, out := e.request(t, notify.SubjectDecision,
		[]byte(`{"ref":"`+rec.ApprovalRef+`","challengeId":"abc","decision":"approve","response":{"id":"x"}}`))
	if st != http.StatusConflict || out["reason"] != "task_not_pending" || out["accepted"] != false {
		t.Errorf("got %d %v, want 409 task_not_pending", st, out)
	}
	st, out = e.request(t, notify.SubjectChallenge, []byte(`{"ref":"`+rec.ApprovalRef+`","decision":"deny"}`))
	if st != http.StatusConflict || out["error"] != "task_not_pending" {
		t.Errorf("challenge: got %d %v, want 409 task_not_pending", st, out)
	}
}
