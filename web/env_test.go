package web

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/descope/virtualwebauthn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/activities"
	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/approvals/approvalstest"
	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/authn"
	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/internal/ratelimit"
	"github.com/countersign/countersign/internal/testnats"
	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

const (
	testPublicURL = "http://localhost:8080"
	testRequester = "agent-1"
	testServerID  = "countersign-test"
)

// env is a real handler over the real approvals service, NATS-backed
// stores and passkeys. The service's engine is the in-memory one of package
// approvalstest, running the real activities: tasks whose workflow a test
// starts (see flow_test.go) take decisions; the others answer as a task
// without a workflow does.
type env struct {
	h        *Handler
	js       jetstream.JetStream
	nc       *nats.Conn
	store    *tasks.Store
	passkeys *passkey.Service
	tokens   *authn.Tokens
	engine   *approvalstest.Engine
	svc      *approvals.Service
	admin    string // admin bearer token
	agent    string // agent bearer token
	rp       virtualwebauthn.RelyingParty
	// audit is the log admin changes are recorded in (nil with
	// withoutAudit).
	audit *audit.Log
}

// setup is what an envOption may change before the env is built.
type setup struct {
	site Options
	svc  approvals.Options
	// acts are the activities the engine runs.
	acts *activities.Activities
	// engine, when set, wraps the engine the service uses.
	engine func(approvals.Engine) approvals.Engine
}

type envOption func(*env, *setup)

// withoutAudit builds the site without an audit log: admin changes are
// refused.
func withoutAudit() envOption {
	return func(e *env, s *setup) { e.audit, s.site.Audit = nil, nil }
}

func withMaxBody(n int64) envOption {
	return func(_ *env, s *setup) { s.site.MaxBodyBytes = n }
}

func newEnv(t *testing.T, options ...envOption) *env {
	t.Helper()
	ctx := context.Background()
	js, nc := testnats.Start(t)
	e := &env{js: js, nc: nc, rp: virtualwebauthn.RelyingParty{ID: "localhost", Name: "Countersign", Origin: testPublicURL}}
	var err error
	if e.store, err = tasks.NewStore(ctx, js, tasks.StoreOptions{}); err != nil {
		t.Fatal(err)
	}
	// Changes to approvers are recorded in e.audit, as the server wires it.
	record := func(ctx context.Context, ev passkey.Event) error { return RecordPasskeyEvent(ctx, e.audit, ev) }
	if e.passkeys, err = passkey.New(ctx, js, passkey.Options{RPID: "localhost", RPOrigins: []string{testPublicURL}, Record: record}); err != nil {
		t.Fatal(err)
	}
	if e.tokens, err = authn.Open(ctx, js, authn.Options{}); err != nil {
		t.Fatal(err)
	}
	if e.admin, err = e.tokens.Issue(ctx, "root", authn.KindAdmin); err != nil {
		t.Fatal(err)
	}
	if e.agent, err = e.tokens.Issue(ctx, testRequester, authn.KindAgent); err != nil {
		t.Fatal(err)
	}
	// The limits are counted in NATS, as in a deployment.
	rates, err := ratelimit.Open(ctx, js, ratelimit.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Admin changes are recorded, as on a server with its audit keys.
	keys, err := audit.OpenKeyring(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if e.audit, err = audit.Open(ctx, js, audit.Options{Keys: keys}); err != nil {
		t.Fatal(err)
	}
	s := setup{
		site: Options{PublicURL: testPublicURL, Passkeys: e.passkeys, Tokens: e.tokens, Rates: rates, Audit: e.audit},
		svc:  approvals.Options{Store: e.store, Passkeys: e.passkeys, Rates: rates},
		acts: &activities.Activities{Tasks: e.store, Passkeys: e.passkeys, PublicURL: testPublicURL},
	}
	for _, o := range options {
		o(e, &s)
	}
	e.engine = approvalstest.New(approvalstest.Options{Activities: s.acts})
	t.Cleanup(e.engine.Close)
	s.svc.Engine = e.engine
	if s.engine != nil {
		s.svc.Engine = s.engine(e.engine)
	}
	if e.svc, err = approvals.New(s.svc); err != nil {
		t.Fatal(err)
	}
	s.site.Approvals = e.svc
	if e.h, err = New(s.site); err != nil {
		t.Fatal(err)
	}
	return e
}

type response struct {
	code int
	hdr  http.Header
	body []byte
}

func (r response) String() string { return http.StatusText(r.code) + " " + string(r.body) }

// do sends a request through the handler. body: nil (none), string or
// []byte (raw), or any value (JSON). hdr: name, value pairs; a JSON
// Content-Type is set for any body unless given.
func (e *env) do(t *testing.T, method, target string, body any, hdr ...string) response {
	t.Helper()
	var rd *bytes.Reader
	switch b := body.(type) {
	case nil:
		rd = bytes.NewReader(nil)
	case string:
		rd = bytes.NewReader([]byte(b))
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req := httptest.NewRequest(method, target, rd)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	return response{code: rec.Code, hdr: rec.Header(), body: rec.Body.Bytes()}
}

func (e *env) adminAuth() []string { return []string{"Authorization", "Bearer " + e.admin} }

// decodeAs decodes a JSON response strictly.
func decodeAs[T any](t *testing.T, r response) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %T from %s: %v", v, r, err)
	}
	return v
}

func wantStatus(t *testing.T, r response, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("status = %d, want %d; body: %s", r.code, code, r.body)
	}
}

func wantError(t *testing.T, r response, code int, errCode string) errorBody {
	t.Helper()
	wantStatus(t, r, code)
	if ct := r.hdr.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("Content-Type = %q, want JSON", ct)
	}
	b := decodeAs[errorBody](t, r)
	if b.Error != errCode || b.Message == "" {
		t.Fatalf("error body = %+v, want error %q with a message", b, errCode)
	}
	return b
}

// approverDevice is a virtual phone holding one enrolled passkey.
type approverDevice struct {
	id   string
	auth virtualwebauthn.Authenticator
	cred virtualwebauthn.Credential
}

// addApprover creates an approver through the admin API and returns the
// approver id and the enrollment token from the enroll URL.
func (e *env) addApprover(t *testing.T, name string, groups ...string) (id, token string) {
	t.Helper()
	r := e.do(t, "POST", "/admin/v1/approvers", map[string]any{"name": name, "groups": groups}, e.adminAuth()...)
	wantStatus(t, r, http.StatusCreated)
	out := decodeAs[addApproverResponse](t, r)
	if !strings.HasPrefix(out.EnrollURL, testPublicURL+"/enroll/") {
		t.Fatalf("enrollUrl = %q", out.EnrollURL)
	}
	return out.ApproverID, path.Base(out.EnrollURL)
}

// enrollDevice runs the whole registration ceremony over HTTP.
func (e *env) enrollDevice(t *testing.T, approverID, token string) approverDevice {
	t.Helper()
	r := e.do(t, "POST", "/approver/v1/enrollments/"+token+"/begin", nil, "Origin", testPublicURL)
	wantStatus(t, r, http.StatusOK)
	var begin struct {
		Options json.RawMessage `json:"options"`
	}
	if err := json.Unmarshal(r.body, &begin); err != nil {
		t.Fatal(err)
	}
	opts, err := virtualwebauthn.ParseAttestationOptions(string(begin.Options))
	if err != nil {
		t.Fatalf("parse creation options %s: %v", begin.Options, err)
	}
	d := approverDevice{
		id:   approverID,
		auth: virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(approverID)}),
		cred: testpasskey.NewEC2Credential(), // virtualwebauthn.NewCredential fails 1 in 64 registrations
	}
	att := virtualwebauthn.CreateAttestationResponse(e.rp, d.auth, d.cred, *opts)
	r = e.do(t, "POST", "/approver/v1/enrollments/"+token+"/finish",
		`{"response":`+att+`}`, "Origin", testPublicURL)
	wantStatus(t, r, http.StatusCreated)
	d.auth.AddCredential(d.cred)
	return d
}

// enroll adds an approver and enrolls one device for them.
func (e *env) enroll(t *testing.T, name string, groups ...string) approverDevice {
	t.Helper()
	id, token := e.addApprover(t, name, groups...)
	return e.enrollDevice(t, id, token)
}

// assert answers requestOptions the way navigator.credentials.get would.
func (e *env) assert(t *testing.T, d approverDevice, requestOptions json.RawMessage) string {
	t.Helper()
	opts, err := virtualwebauthn.ParseAssertionOptions(string(requestOptions))
	if err != nil {
		t.Fatalf("parse request options %s: %v", requestOptions, err)
	}
	if !d.cred.IsAllowedForAssertion(*opts) {
		t.Fatalf("credential of %s not in allowCredentials", d.id)
	}
	return virtualwebauthn.CreateAssertionResponse(e.rp, d.auth, d.cred, *opts)
}

type taskSpec struct {
	tool    string // default transfer_funds
	args    string
	display string
	group   string // default finance
	quorum  int    // default 1
	owner   string // default testRequester
}

// newTask stores a pending task's read model, as the MCP endpoint does, and
// returns it. It does not start a workflow.
func (e *env) newTask(t *testing.T, spec taskSpec) tasks.Record {
	t.Helper()
	if spec.group == "" {
		spec.group = "finance"
	}
	if spec.quorum == 0 {
		spec.quorum = 1
	}
	if spec.tool == "" {
		spec.tool = "transfer_funds"
	}
	if spec.args == "" {
		spec.args = `{"amount":100,"currency":"EUR","to":"acct-42"}`
	}
	if spec.display == "" {
		spec.display = "Transfer 100 EUR to acct-42"
	}
	if spec.owner == "" {
		spec.owner = testRequester
	}
	args := json.RawMessage(spec.args)
	hash, err := canon.Hash(spec.tool, args, testServerID)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	rec := tasks.Record{
		TaskID:        tasks.NewID("tsk_"),
		Owner:         spec.owner,
		Era:           tasks.Era2026,
		Status:        tasks.StatusWorking,
		CreatedAt:     now,
		LastUpdatedAt: now,
		TTL:           2 * time.Hour,
		PollInterval:  2 * time.Second,
		Tool:          spec.tool,
		Arguments:     args,
		ActionHash:    hash.String(),
		DisplayText:   spec.display,
		ApprovalRef:   tasks.NewID("apr_"),
		Requirement: tasks.Requirement{Group: spec.group, Quorum: spec.quorum, TTL: time.Hour,
			AuthenticatorClass: passkey.ClassPlatform, Reason: "Transfers need a human"},
		ExpiresAt:     now.Add(time.Hour),
		ApprovalState: tasks.ApprovalPending,
		Timeline:      []tasks.Event{{At: now, Kind: "requested", Detail: "held for approval"}},
	}
	if err := e.store.Create(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	return rec
}
