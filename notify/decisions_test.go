package notify_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/descope/virtualwebauthn"
	"github.com/nats-io/nats.go"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/approvals/approvalstest"
	"github.com/countersign/countersign/internal/authn"
	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/notify"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
	"github.com/countersign/countersign/web"
)

// decisionEnv is the NATS decision service and the approver site (its HTTP
// mirror) over one real approvals service: NATS KV stores, the passkey
// service and the in-memory engine, running the real activities.
type decisionEnv struct {
	nc       *nats.Conn
	store    *tasks.Store
	passkeys *passkey.Service
	engine   *approvalstest.Engine
	site     *web.Handler
}

func newDecisionEnv(t testing.TB) *decisionEnv {
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
	engine := approvalstest.New(approvalstest.Options{Activities: &activities.Activities{
		Tasks: store, Passkeys: pk, PublicURL: "http://localhost:8080"}})
	t.Cleanup(engine.Close)
	approvalsSvc, err := approvals.New(approvals.Options{Store: store, Engine: engine, Passkeys: pk})
	if err != nil {
		t.Fatal(err)
	}
	site, err := web.New(web.Options{PublicURL: "http://localhost:8080", Approvals: approvalsSvc, Passkeys: pk, Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := notify.NewDecisionService(nc, notify.DecisionOptions{Approvals: approvalsSvc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	return &decisionEnv{nc: nc, store: store, passkeys: pk, engine: engine, site: site}
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

func (e *decisionEnv) addTask(t testing.TB, edit func(*tasks.Record)) tasks.Record {
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

// The NATS service answers exactly what the HTTP API answers: the same
// status and the same body, request by request, over the same approvals
// service.
func TestDecisionServiceMirrorsHTTP(t *testing.T) {
	e := newDecisionEnv(t)
	rec := e.addTask(t, nil)
	closed := e.addTask(t, func(r *tasks.Record) {
		r.Status, r.Disposition, r.ApprovalState = tasks.StatusCompleted, tasks.DeniedNotExecuted, tasks.ApprovalDenied
	})
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

	// Request by request, the whole answer.
	unknown := tasks.NewID("apr_")
	for _, tc := range []struct {
		name    string
		subject string
		ref     string
		fields  string // the body's members but "ref"
		status  int
	}{
		{"approval view", notify.SubjectApproval, rec.ApprovalRef, "", 200},
		{"unknown approval", notify.SubjectApproval, unknown, "", 404},
		{"challenge without an eligible passkey", notify.SubjectChallenge, rec.ApprovalRef, `"decision":"deny"`, 409},
		{"challenge for no decision", notify.SubjectChallenge, rec.ApprovalRef, ``, 400},
		{"challenge for a bad decision", notify.SubjectChallenge, rec.ApprovalRef, `"decision":"maybe"`, 400},
		{"challenge with an unknown field", notify.SubjectChallenge, rec.ApprovalRef, `"decision":"approve","admin":true`, 400},
		{"challenge of the wrong type", notify.SubjectChallenge, rec.ApprovalRef, `"decision":7`, 400},
		{"challenge on a closed approval", notify.SubjectChallenge, closed.ApprovalRef, `"decision":"deny"`, 409},
		{"challenge on an unknown approval", notify.SubjectChallenge, unknown, `"decision":"deny"`, 404},
		{"decision with rejected evidence", notify.SubjectDecision, rec.ApprovalRef,
			`"challengeId":"abc","decision":"approve","comment":"ok","response":{"id":"x"}`, 422},
		{"decision with a malformed challenge ID", notify.SubjectDecision, rec.ApprovalRef,
			`"challengeId":"a/b","decision":"approve","response":{}`, 400},
		{"decision with control characters", notify.SubjectDecision, rec.ApprovalRef,
			`"challengeId":"abc","decision":"deny","comment":"a\u0007b","response":{}`, 400},
		{"decision without assertion", notify.SubjectDecision, rec.ApprovalRef, `"challengeId":"abc","decision":"approve"`, 400},
		{"decision on a closed approval", notify.SubjectDecision, closed.ApprovalRef,
			`"challengeId":"abc","decision":"approve","response":{"id":"x"}`, 409},
		{"decision on an unknown approval", notify.SubjectDecision, unknown,
			`"challengeId":"abc","decision":"approve","response":{"id":"x"}`, 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := `{"ref":"` + tc.ref + `"`
			if tc.fields != "" {
				msg += "," + tc.fields
			}
			st, got := e.request(t, tc.subject, []byte(msg+"}"))
			method, path, body := http.MethodPost, "/approver/v1/approvals/"+tc.ref, []byte("{"+tc.fields+"}")
			switch tc.subject {
			case notify.SubjectApproval:
				method, body = http.MethodGet, nil
			case notify.SubjectChallenge:
				path += "/challenge"
			case notify.SubjectDecision:
				path += "/decision"
			}
			hst, want := e.overHTTP(t, method, path, body)
			if st != hst || !reflect.DeepEqual(got, want) {
				t.Errorf("NATS %d %v\nHTTP %d %v", st, got, hst, want)
			}
			if st != tc.status {
				t.Errorf("status %d, want %d: %v", st, tc.status, got)
			}
		})
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

// enroll adds an approver with one software passkey, enrolled through the
// passkey service as the site's enrollment page would.
func (e *decisionEnv) enroll(t testing.TB, name string) (virtualwebauthn.Authenticator, virtualwebauthn.Credential) {
	t.Helper()
	ctx := testCtx(t)
	a, token, err := e.passkeys.AddApprover(ctx, name, []string{"approvers"})
	if err != nil {
		t.Fatal(err)
	}
	creation, err := e.passkeys.BeginEnrollment(ctx, token)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(creation)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := virtualwebauthn.ParseAttestationOptions(string(b))
	if err != nil {
		t.Fatal(err)
	}
	auth := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(a.ID)})
	cred := testpasskey.NewEC2Credential()
	if _, err := e.passkeys.FinishEnrollment(ctx, token, []byte(virtualwebauthn.CreateAttestationResponse(testRP, auth, cred, *opts))); err != nil {
		t.Fatal(err)
	}
	auth.AddCredential(cred)
	return auth, cred
}

var testRP = virtualwebauthn.RelyingParty{ID: "localhost", Name: "Countersign", Origin: "http://localhost:8080"}

// A whole decision over NATS, and the same request again over HTTP: one
// decision, one answer, whichever edge it comes through.
func TestDecisionServiceDecides(t *testing.T) {
	e := newDecisionEnv(t)
	rec := e.addTask(t, nil)
	if err := e.engine.Start(testCtx(t), tasks.ApprovalInput{
		Version: tasks.ApprovalInputVersion,
		Envelope: tasks.Envelope{Version: tasks.EnvelopeVersion, TaskID: rec.TaskID, Tool: rec.Tool, Arguments: rec.Arguments,
			ActionHash: rec.ActionHash, Principal: rec.Owner, Resource: "tool:" + rec.Tool, ServerID: "countersign-test", CreatedAt: rec.CreatedAt},
		Requirement: rec.Requirement, ApprovalRef: rec.ApprovalRef, DisplayText: rec.DisplayText, ExpiresAt: rec.ExpiresAt,
	}); err != nil {
		t.Fatal(err)
	}
	auth, cred := e.enroll(t, "alice")

	st, ch := e.request(t, notify.SubjectChallenge, []byte(`{"ref":"`+rec.ApprovalRef+`","decision":"approve"}`))
	if st != http.StatusOK || ch["decision"] != "approve" || ch["displayText"] != rec.DisplayText {
		t.Fatalf("challenge: %d %v", st, ch)
	}
	ro, err := json.Marshal(ch["requestOptions"])
	if err != nil {
		t.Fatal(err)
	}
	opts, err := virtualwebauthn.ParseAssertionOptions(string(ro))
	if err != nil {
		t.Fatal(err)
	}
	assertion := virtualwebauthn.CreateAssertionResponse(testRP, auth, cred, *opts)
	fields := `"challengeId":"` + ch["challengeId"].(string) + `","decision":"approve","comment":"fine","response":` + assertion

	st, got := e.request(t, notify.SubjectDecision, []byte(`{"ref":"`+rec.ApprovalRef+`",`+fields+`}`))
	want := map[string]any{"accepted": true, "status": "pending", "approved": 1.0, "needed": 2.0}
	if st != http.StatusOK || !reflect.DeepEqual(got, want) {
		t.Fatalf("decision over NATS: %d %v, want 200 %v", st, got, want)
	}
	hst, hgot := e.overHTTP(t, http.MethodPost, "/approver/v1/approvals/"+rec.ApprovalRef+"/decision", []byte("{"+fields+"}"))
	if hst != st || !reflect.DeepEqual(hgot, got) {
		t.Errorf("the same decision over HTTP: %d %v, want NATS's %d %v", hst, hgot, st, got)
	}
	st, view := e.request(t, notify.SubjectApproval, []byte(`{"ref":"`+rec.ApprovalRef+`"}`))
	if st != http.StatusOK || view["approved"] != 1.0 {
		t.Errorf("view after the decision: %d %v", st, view)
	}
}
