package web

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/approverapi"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

func TestNewValidatesOptions(t *testing.T) {
	e := newEnv(t)
	good := Options{PublicURL: testPublicURL, Approvals: e.svc, Passkeys: e.passkeys, Tokens: e.tokens}
	tests := []struct {
		name   string
		change func(*Options)
	}{
		{"no approvals", func(o *Options) { o.Approvals = nil }},
		{"no passkeys", func(o *Options) { o.Passkeys = nil }},
		{"no tokens", func(o *Options) { o.Tokens = nil }},
		{"negative body cap", func(o *Options) { o.MaxBodyBytes = -1 }},
		{"empty url", func(o *Options) { o.PublicURL = "" }},
		{"no scheme", func(o *Options) { o.PublicURL = "localhost:8080" }},
		{"ftp", func(o *Options) { o.PublicURL = "ftp://localhost" }},
		{"path", func(o *Options) { o.PublicURL = "https://example.com/approvals" }},
		{"query", func(o *Options) { o.PublicURL = "https://example.com?x=1" }},
		{"userinfo", func(o *Options) { o.PublicURL = "https://u:p@example.com" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := good
			tt.change(&o)
			if _, err := New(o); err == nil {
				t.Fatal("New succeeded, want error")
			}
		})
	}
	o := good
	o.PublicURL = "HTTPS://Approvals.Example.com:443/"
	h, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if h.origin != "https://approvals.example.com" || h.enrollURL("x") != "https://approvals.example.com/enroll/x" {
		t.Errorf("origin %q, enroll url %q", h.origin, h.enrollURL("x"))
	}
}

func TestAdminAuth(t *testing.T) {
	e := newEnv(t)
	endpoints := []struct{ method, target, body string }{
		{"POST", "/admin/v1/approvers", `{"name":"Ann","groups":["finance"]}`},
		{"POST", "/admin/v1/approvers/0123456789abcdef0123456789abcdef/invites", `{}`},
		{"POST", "/admin/v1/agents", `{"name":"bot"}`},
		{"GET", "/admin/v1/approvals?status=pending", ""},
		{"GET", "/admin/v1/approvers", ""},
	}
	creds := []struct{ name, header string }{
		{"no token", ""},
		{"not bearer", "Basic " + e.admin},
		{"unknown token", "Bearer csad_" + strings.Repeat("A", 43)},
		{"agent token", "Bearer " + e.agent},
	}
	for _, ep := range endpoints {
		for _, c := range creds {
			t.Run(ep.method+" "+ep.target+"/"+c.name, func(t *testing.T) {
				var body any
				if ep.body != "" {
					body = ep.body
				}
				var hdr []string
				if c.header != "" {
					hdr = []string{"Authorization", c.header}
				}
				r := e.do(t, ep.method, ep.target, body, hdr...)
				wantError(t, r, http.StatusUnauthorized, codeUnauthorized)
				if r.hdr.Get("WWW-Authenticate") == "" {
					t.Error("no WWW-Authenticate header")
				}
			})
		}
	}
	t.Run("admin token", func(t *testing.T) {
		wantStatus(t, e.do(t, "GET", "/admin/v1/approvals", nil, e.adminAuth()...), http.StatusOK)
		// The scheme is case-insensitive (RFC 9110).
		wantStatus(t, e.do(t, "GET", "/admin/v1/approvals", nil, "Authorization", "bearer "+e.admin), http.StatusOK)
	})
}

func TestAddApprover(t *testing.T) {
	e := newEnv(t)
	id, token := e.addApprover(t, "Ann Approver", "finance", "ops")
	a, err := e.passkeys.Approver(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"finance", "ops"}, a.Groups); diff != "" || a.Name != "Ann Approver" {
		t.Errorf("approver %+v (-want +got groups):\n%s", a, diff)
	}
	if !approverapi.ValidKey(token, maxTokenLen) {
		t.Errorf("enroll token %q has an unexpected shape", token)
	}

	bad := []struct{ name, body string }{
		{"no groups", `{"name":"Bob","groups":[]}`},
		{"bad group", `{"name":"Bob","groups":["fin ance"]}`},
		{"no name", `{"groups":["finance"]}`},
		{"markup in name", `{"name":"<b>Bob</b>","groups":["finance"]}`},
		// Look-alikes of "alice" with a Cyrillic "а".
		{"mixed-script name", `{"name":"\u0430lice","groups":["finance"]}`},
		{"mixed-script principal", `{"name":"Alice","groups":["finance"],"principals":["\u0430lice"]}`},
		{"principal with a space", `{"name":"Alice","groups":["finance"],"principals":["al ice"]}`},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			wantError(t, e.do(t, "POST", "/admin/v1/approvers", tt.body, e.adminAuth()...), http.StatusBadRequest, codeInvalidRequest)
		})
	}

	t.Run("principals", func(t *testing.T) {
		r := e.do(t, "POST", "/admin/v1/approvers", `{"name":"Carol","groups":["finance"],"principals":["deploy-bot","carol"]}`, e.adminAuth()...)
		wantStatus(t, r, http.StatusCreated)
		a, err := e.passkeys.Approver(context.Background(), decodeAs[addApproverResponse](t, r).ApproverID)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"carol", "deploy-bot"}, a.Principals); diff != "" {
			t.Errorf("principals (-want +got):\n%s", diff)
		}
		if !a.ActsAs("deploy-bot") || a.ActsAs("Carol") {
			t.Errorf("acts as deploy-bot %v, as Carol %v", a.ActsAs("deploy-bot"), a.ActsAs("Carol"))
		}
	})
}

func TestInvites(t *testing.T) {
	e := newEnv(t)
	id, first := e.addApprover(t, "Ann", "finance")
	r := e.do(t, "POST", "/admin/v1/approvers/"+id+"/invites", nil, e.adminAuth()...)
	wantStatus(t, r, http.StatusCreated)
	second := path.Base(decodeAs[inviteResponse](t, r).EnrollURL)
	if second == first {
		t.Fatal("second invite reuses the first token")
	}
	// Both invites enroll a device of the same approver.
	e.enrollDevice(t, id, first)
	e.enrollDevice(t, id, second)
	a, err := e.passkeys.Approver(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.CredentialIDs) != 2 {
		t.Errorf("approver has %d credentials, want 2", len(a.CredentialIDs))
	}

	wantError(t, e.do(t, "POST", "/admin/v1/approvers/0123456789abcdef0123456789abcdef/invites", nil, e.adminAuth()...),
		http.StatusNotFound, codeNotFound)
	wantError(t, e.do(t, "POST", "/admin/v1/approvers/..%2f..%2fx/invites", nil, e.adminAuth()...),
		http.StatusNotFound, codeNotFound)
}

func TestAddAgent(t *testing.T) {
	e := newEnv(t)
	r := e.do(t, "POST", "/admin/v1/agents", `{"name":"deploy-bot"}`, e.adminAuth()...)
	wantStatus(t, r, http.StatusCreated)
	out := decodeAs[addAgentResponse](t, r)
	if out.Name != "deploy-bot" {
		t.Errorf("name = %q", out.Name)
	}
	name, err := e.tokens.Agent(context.Background(), out.Token)
	if err != nil || name != "deploy-bot" {
		t.Fatalf("issued token resolves to %q, %v", name, err)
	}
	// An agent token is not an admin token.
	wantError(t, e.do(t, "POST", "/admin/v1/agents", `{"name":"x"}`, "Authorization", "Bearer "+out.Token),
		http.StatusUnauthorized, codeUnauthorized)
	wantError(t, e.do(t, "POST", "/admin/v1/agents", `{"name":"deploy-bot"}`, e.adminAuth()...),
		http.StatusConflict, codeNameTaken)
	wantError(t, e.do(t, "POST", "/admin/v1/agents", `{"name":"no spaces please"}`, e.adminAuth()...),
		http.StatusBadRequest, codeInvalidRequest)

	// The creation is recorded, once, in the agent's admin chain, by the
	// admin who made it; refused requests record nothing.
	chain := audit.AdminChainID(audit.AdminTarget{Type: audit.TargetAgent, ID: "deploy-bot"})
	if out.AuditChain != chain || out.AuditRecord != chain+"/0" {
		t.Errorf("audit %q %q, want %s/0", out.AuditChain, out.AuditRecord, chain)
	}
	if recs := adminChain(t, e.audit, chain); len(recs) != 1 || recs[0].Action != audit.AdminCreate || recs[0].By != "admin:root" || recs[0].Status != "active" {
		t.Fatalf("agent chain %+v", recs)
	}
	if _, err := e.audit.Chain(context.Background(), audit.AdminChainID(audit.AdminTarget{Type: audit.TargetAgent, ID: "no spaces please"})); !errors.Is(err, audit.ErrNotFound) {
		t.Errorf("a refused name has a chain: %v", err)
	}
}

// Adding an approver and inviting them are recorded in their admin chain;
// a revoked approver gets no invite.
func TestApproverAdditionsRecorded(t *testing.T) {
	e := newEnv(t)
	id, _ := e.addApprover(t, "Ann", "approvers")
	wantStatus(t, e.do(t, "POST", "/admin/v1/approvers/"+id+"/invites", nil, e.adminAuth()...), http.StatusCreated)
	wantStatus(t, e.do(t, "POST", "/admin/v1/approvers/"+id+"/revoke", nil, e.adminAuth()...), http.StatusOK)
	wantError(t, e.do(t, "POST", "/admin/v1/approvers/"+id+"/invites", nil, e.adminAuth()...), http.StatusConflict, codeRevoked)
	var got []string
	for _, a := range adminChain(t, e.audit, audit.AdminChainID(audit.AdminTarget{Type: audit.TargetApprover, ID: id})) {
		got = append(got, a.Action+" by "+a.By)
	}
	want := []string{"create by admin:root", "invite by admin:root", "invite by admin:root", "revoke by admin:root"}
	if !slices.Equal(got, want) {
		t.Fatalf("approver chain %q, want %q", got, want)
	}
}

func TestListApprovals(t *testing.T) {
	e := newEnv(t)
	r := e.do(t, "GET", "/admin/v1/approvals?status=pending", nil, e.adminAuth()...)
	wantStatus(t, r, http.StatusOK)
	if got := strings.TrimSpace(string(r.body)); got != "[]" {
		t.Fatalf("empty list = %s, want []", got)
	}

	rec := e.newTask(t, taskSpec{quorum: 2})
	done := e.newTask(t, taskSpec{})
	if _, err := e.store.Update(context.Background(), done.TaskID, func(r *tasks.Record) error {
		r.ApprovalState = tasks.ApprovalDenied
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	r = e.do(t, "GET", "/admin/v1/approvals", nil, e.adminAuth()...)
	wantStatus(t, r, http.StatusOK)
	got := decodeAs[[]pendingApproval](t, r)
	want := []pendingApproval{{
		Ref:         rec.ApprovalRef,
		TaskID:      rec.TaskID,
		Tool:        "transfer_funds",
		Status:      tasks.ApprovalPending,
		ApproveURL:  testPublicURL + "/approve/" + rec.ApprovalRef,
		DisplayText: rec.DisplayText,
		Requester:   testRequester,
		ExpiresAt:   rec.ExpiresAt,
		Approved:    0,
		Needed:      2,
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("pending approvals (-want +got):\n%s", diff)
	}

	for _, q := range []string{"?status=done", "?status=", "?status=pending&status=pending", "?limit=5"} {
		wantError(t, e.do(t, "GET", "/admin/v1/approvals"+q, nil, e.adminAuth()...), http.StatusBadRequest, codeInvalidRequest)
	}
}

func TestEnrollmentCeremony(t *testing.T) {
	e := newEnv(t)
	id, token := e.addApprover(t, "Ann", "finance")

	e.enrollDevice(t, id, token)
	a, err := e.passkeys.Approver(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.CredentialIDs) != 1 {
		t.Fatalf("credentials after enrollment = %v", a.CredentialIDs)
	}

	t.Run("invite is single-use", func(t *testing.T) {
		wantError(t, e.do(t, "POST", "/approver/v1/enrollments/"+token+"/begin", nil),
			http.StatusGone, passkey.ReasonNoPendingEnrollment)
		wantError(t, e.do(t, "POST", "/approver/v1/enrollments/"+token+"/finish", `{"response":{"id":"x"}}`),
			http.StatusGone, passkey.ReasonNoPendingEnrollment)
	})
	t.Run("unknown token", func(t *testing.T) {
		wantError(t, e.do(t, "POST", "/approver/v1/enrollments/"+strings.Repeat("A", 43)+"/begin", nil),
			http.StatusGone, passkey.ReasonNoPendingEnrollment)
	})
	t.Run("malformed token", func(t *testing.T) {
		for _, tok := range []string{"a.b", "%3Cscript%3E", strings.Repeat("A", 200)} {
			wantError(t, e.do(t, "POST", "/approver/v1/enrollments/"+tok+"/begin", nil),
				http.StatusNotFound, passkey.ReasonNoPendingEnrollment)
		}
	})
	t.Run("bad attestation keeps the invite", func(t *testing.T) {
		_, tok := e.addApprover(t, "Bob", "finance")
		wantStatus(t, e.do(t, "POST", "/approver/v1/enrollments/"+tok+"/begin", nil), http.StatusOK)
		wantError(t, e.do(t, "POST", "/approver/v1/enrollments/"+tok+"/finish", `{"response":{"id":"x","type":"public-key"}}`),
			http.StatusBadRequest, passkey.ReasonVerificationFailed)
		wantError(t, e.do(t, "POST", "/approver/v1/enrollments/"+tok+"/finish", `{"response":"not an object"}`),
			http.StatusBadRequest, codeInvalidRequest)
		wantStatus(t, e.do(t, "POST", "/approver/v1/enrollments/"+tok+"/begin", nil), http.StatusOK)
	})
	t.Run("begin options require user verification", func(t *testing.T) {
		_, tok := e.addApprover(t, "Cy", "finance")
		r := e.do(t, "POST", "/approver/v1/enrollments/"+tok+"/begin", `{}`)
		wantStatus(t, r, http.StatusOK)
		var got struct {
			Options struct {
				PublicKey struct {
					RP   struct{ ID string }
					User struct{ Name string }
					Sel  struct {
						UserVerification string `json:"userVerification"`
					} `json:"authenticatorSelection"`
				} `json:"publicKey"`
			} `json:"options"`
		}
		if err := json.Unmarshal(r.body, &got); err != nil {
			t.Fatal(err)
		}
		pk := got.Options.PublicKey
		if pk.RP.ID != "localhost" || pk.User.Name != "Cy" || pk.Sel.UserVerification != "required" {
			t.Errorf("creation options = %+v", pk)
		}
	})
}

func TestGetApproval(t *testing.T) {
	e := newEnv(t)
	rec := e.newTask(t, taskSpec{quorum: 2})
	now := time.Now().UTC().Truncate(time.Second)
	rec, err := e.store.Update(context.Background(), rec.TaskID, func(r *tasks.Record) error {
		r.Approvals = append(r.Approvals, tasks.ApprovalEntry{ApproverID: "a1", ApproverName: "Ann", CredentialID: "c1", Decision: "approve", At: now})
		r.Timeline = append(r.Timeline, tasks.Event{At: now, Kind: "approval", Detail: "Ann approved " + r.TaskID})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	r := e.do(t, "GET", "/approver/v1/approvals/"+rec.ApprovalRef, nil)
	wantStatus(t, r, http.StatusOK)
	if strings.Contains(string(r.body), rec.TaskID) {
		t.Fatalf("approver view exposes the task ID: %s", r.body)
	}
	got := decodeAs[approverapi.Approval](t, r)
	want := approverapi.Approval{
		Ref:         rec.ApprovalRef,
		Tool:        "transfer_funds",
		Arguments:   json.RawMessage(`{"amount":100,"currency":"EUR","to":"acct-42"}`),
		DisplayText: "Transfer 100 EUR to acct-42",
		Requester:   testRequester,
		Reason:      "Transfers need a human",
		Status:      tasks.ApprovalPending,
		ExpiresAt:   rec.ExpiresAt,
		Approved:    1,
		Needed:      2,
		ActionHash:  rec.ActionHash,
		Approvals:   []approverapi.ApprovalEntry{{ApproverName: "Ann", Decision: "approve", At: now}},
		Timeline: []approverapi.TimelineEvent{
			{At: rec.Timeline[0].At, Kind: "requested", Detail: "held for approval"},
			{At: now, Kind: "approval", Detail: "Ann approved [task]"},
		},
		IdenticalCalls: approverapi.IdenticalCalls{Checked: true, Calls: []approverapi.IdenticalCall{}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("approval (-want +got):\n%s", diff)
	}

	t.Run("task id is not a ref", func(t *testing.T) {
		wantError(t, e.do(t, "GET", "/approver/v1/approvals/"+rec.TaskID, nil), http.StatusNotFound, codeNotFound)
	})
	t.Run("unknown ref", func(t *testing.T) {
		wantError(t, e.do(t, "GET", "/approver/v1/approvals/"+tasks.NewID("apr_"), nil), http.StatusNotFound, codeNotFound)
	})
}

// TestMalformedRefNeverReachesStore cuts the store's NATS connection: a
// well-formed unknown reference then fails inside the store (500), while
// malformed ones are still a clean 404, so they were refused before any
// store access.
func TestMalformedRefNeverReachesStore(t *testing.T) {
	e := newEnv(t)
	e.nc.Close()
	malformed := []string{"x", "apr_short", "APR_" + strings.Repeat("a", 32), "apr_" + strings.Repeat("1", 32), "apr_" + strings.Repeat("a", 33), "apr_%2e%2e", "%00"}
	for _, ref := range malformed {
		for _, req := range []struct{ method, suffix string }{{"GET", ""}, {"POST", "/challenge"}, {"POST", "/decision"}} {
			r := e.do(t, req.method, "/approver/v1/approvals/"+ref+req.suffix, nil)
			wantError(t, r, http.StatusNotFound, codeNotFound)
		}
		wantStatus(t, e.do(t, "GET", "/approve/"+ref, nil), http.StatusNotFound)
	}
	r := e.do(t, "GET", "/approver/v1/approvals/"+tasks.NewID("apr_"), nil)
	b := wantError(t, r, http.StatusInternalServerError, codeInternal)
	if b.Message != msgInternal {
		t.Errorf("500 message = %q, want the fixed %q", b.Message, msgInternal)
	}
}

func TestChallengeWithoutEligiblePasskey(t *testing.T) {
	e := newEnv(t)
	e.enroll(t, "Ann", "finance")
	rec := e.newTask(t, taskSpec{group: "ops"})
	wantError(t, e.do(t, "POST", "/approver/v1/approvals/"+rec.ApprovalRef+"/challenge", `{"decision":"approve"}`, "Origin", testPublicURL),
		http.StatusConflict, passkey.ReasonNoEligibleCredential)
	for _, body := range []string{"", `{}`, `{"decision":"abstain"}`} {
		wantError(t, e.do(t, "POST", "/approver/v1/approvals/"+rec.ApprovalRef+"/challenge", body), http.StatusBadRequest, codeInvalidRequest)
	}
}

func TestChallengeOnlyWhilePending(t *testing.T) {
	e := newEnv(t)
	e.enroll(t, "Ann", "finance")
	expired := e.newTask(t, taskSpec{})
	denied := e.newTask(t, taskSpec{})
	ctx := context.Background()
	if _, err := e.store.Update(ctx, expired.TaskID, func(r *tasks.Record) error {
		r.ExpiresAt = time.Now().Add(-time.Second) // the workflow has not caught up yet
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Update(ctx, denied.TaskID, func(r *tasks.Record) error {
		r.ApprovalState = tasks.ApprovalDenied
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, rec := range []tasks.Record{expired, denied} {
		wantError(t, e.do(t, "POST", "/approver/v1/approvals/"+rec.ApprovalRef+"/challenge", `{"decision":"deny"}`),
			http.StatusConflict, codeTaskNotPending)
		r := e.do(t, "POST", "/approver/v1/approvals/"+rec.ApprovalRef+"/decision",
			`{"challengeId":"0123456789abcdef0123456789abcdef","decision":"approve","response":{"id":"x"}}`)
		wantStatus(t, r, http.StatusConflict)
		if got := decodeAs[approverapi.Decision](t, r); got.Accepted || got.Reason != codeTaskNotPending {
			t.Errorf("decision on a closed approval = %+v", got)
		}
	}
}

func TestRequestValidation(t *testing.T) {
	e := newEnv(t, withMaxBody(2048))
	rec := e.newTask(t, taskSpec{})
	decision := "/approver/v1/approvals/" + rec.ApprovalRef + "/decision"
	tests := []struct {
		name    string
		body    any
		hdr     []string
		code    int
		errCode string
		msg     string // substring of the message
	}{
		{"oversize body", `{"challengeId":"` + strings.Repeat("a", 4096) + `"}`, nil, http.StatusRequestEntityTooLarge, codeBodyTooLarge, "2048 bytes"},
		{"empty body", "", nil, http.StatusBadRequest, codeInvalidRequest, "empty"},
		{"malformed JSON", `{"challengeId": x}`, nil, http.StatusBadRequest, codeInvalidRequest, "malformed JSON at byte"},
		{"truncated JSON", `{"challengeId": "abc"`, nil, http.StatusBadRequest, codeInvalidRequest, "unexpected end"},
		{"unknown field", `{"challengeId":"abc","decision":"approve","response":{},"taskId":"x"}`, nil, http.StatusBadRequest, codeInvalidRequest, `unknown field "taskId"`},
		{"wrong type", `{"challengeId":12}`, nil, http.StatusBadRequest, codeInvalidRequest, `"challengeId"`},
		{"not an object", `[1,2]`, nil, http.StatusBadRequest, codeInvalidRequest, "JSON object"},
		{"trailing data", `{"challengeId":"abc"} {}`, nil, http.StatusBadRequest, codeInvalidRequest, "single JSON object"},
		{"form content type", `{"challengeId":"abc"}`, []string{"Content-Type", "application/x-www-form-urlencoded"}, http.StatusUnsupportedMediaType, codeUnsupportedMediaType, "application/json"},
		{"missing challenge", `{"decision":"approve","response":{}}`, nil, http.StatusBadRequest, codeInvalidRequest, "challengeId is required"},
		{"bad decision", `{"challengeId":"abc","decision":"maybe","response":{}}`, nil, http.StatusBadRequest, codeInvalidRequest, "decision must be"},
		{"response not object", `{"challengeId":"abc","decision":"deny","response":"sig"}`, nil, http.StatusBadRequest, codeInvalidRequest, "PublicKeyCredential"},
		{"control chars in comment", `{"challengeId":"abc","decision":"deny","comment":"a\u0007b","response":{}}`, nil, http.StatusBadRequest, codeInvalidRequest, "control"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := wantError(t, e.do(t, "POST", decision, tt.body, tt.hdr...), tt.code, tt.errCode)
			if !strings.Contains(b.Message, tt.msg) {
				t.Errorf("message %q does not mention %q", b.Message, tt.msg)
			}
		})
	}
	t.Run("admin oversize", func(t *testing.T) {
		body := `{"name":"` + strings.Repeat("n", 4096) + `","groups":["g"]}`
		wantError(t, e.do(t, "POST", "/admin/v1/approvers", body, e.adminAuth()...), http.StatusRequestEntityTooLarge, codeBodyTooLarge)
	})
}

func TestCrossOriginRejected(t *testing.T) {
	e := newEnv(t)
	_, token := e.addApprover(t, "Ann", "finance")
	rec := e.newTask(t, taskSpec{})
	posts := []string{
		"/approver/v1/enrollments/" + token + "/begin",
		"/approver/v1/approvals/" + rec.ApprovalRef + "/challenge",
		"/approver/v1/approvals/" + rec.ApprovalRef + "/decision",
		"/admin/v1/agents",
	}
	bad := [][]string{
		{"Origin", "https://evil.example"},
		{"Origin", "http://localhost:8081"},
		{"Origin", "https://localhost:8080"},
		{"Origin", "null"},
		{"Sec-Fetch-Site", "cross-site"},
		{"Sec-Fetch-Site", "same-site"},
	}
	for _, p := range posts {
		for _, h := range bad {
			t.Run(p+"/"+h[1], func(t *testing.T) {
				hdr := append([]string{}, h...)
				hdr = append(hdr, e.adminAuth()...)
				wantError(t, e.do(t, "POST", p, `{}`, hdr...), http.StatusForbidden, codeCrossOrigin)
			})
		}
	}
	// The invite was not touched by the refused requests; same-origin works.
	wantStatus(t, e.do(t, "POST", posts[0], nil, "Origin", "http://LOCALHOST:8080", "Sec-Fetch-Site", "same-origin"), http.StatusOK)
	// Reads are not state changes.
	wantStatus(t, e.do(t, "GET", "/approver/v1/approvals/"+rec.ApprovalRef, nil, "Origin", "https://evil.example"), http.StatusOK)
}

func TestAPIFallbacks(t *testing.T) {
	e := newEnv(t)
	rec := e.newTask(t, taskSpec{})
	r := e.do(t, "GET", "/approver/v1/approvals/"+rec.ApprovalRef+"/decision", nil)
	wantError(t, r, http.StatusMethodNotAllowed, codeMethodNotAllowed)
	if r.hdr.Get("Allow") != "POST" {
		t.Errorf("Allow = %q", r.hdr.Get("Allow"))
	}
	r = e.do(t, "DELETE", "/admin/v1/approvals", nil, e.adminAuth()...)
	wantError(t, r, http.StatusMethodNotAllowed, codeMethodNotAllowed)
	wantError(t, e.do(t, "GET", "/approver/v2/whatever", nil), http.StatusNotFound, codeNotFound)
	wantError(t, e.do(t, "GET", "/admin/", nil), http.StatusNotFound, codeNotFound)
}

func TestPanicIsAFixed500(t *testing.T) {
	e := newEnv(t)
	e.h.mux.HandleFunc("GET /approver/v1/boom", func(http.ResponseWriter, *http.Request) { panic("secret detail") })
	e.h.mux.HandleFunc("GET /boom", func(http.ResponseWriter, *http.Request) { panic("secret detail") })
	r := e.do(t, "GET", "/approver/v1/boom", nil)
	b := wantError(t, r, http.StatusInternalServerError, codeInternal)
	if b.Message != msgInternal || strings.Contains(string(r.body), "secret") {
		t.Errorf("panic response leaks: %s", r.body)
	}
	r = e.do(t, "GET", "/boom", nil)
	wantStatus(t, r, http.StatusInternalServerError)
	if strings.Contains(string(r.body), "secret") || r.hdr.Get("Content-Security-Policy") == "" {
		t.Errorf("page panic response: %v %s", r.hdr, r.body)
	}
}

// approvalChallengeBurst is the approvals service's challenge burst per
// approval.
const approvalChallengeBurst = 30

func TestChallengesAreRateLimitedPerApproval(t *testing.T) {
	e := newEnv(t)
	e.enroll(t, "Ann", "finance")
	rec := e.newTask(t, taskSpec{})
	other := e.newTask(t, taskSpec{})
	for range approvalChallengeBurst {
		r := e.do(t, "POST", "/approver/v1/approvals/"+rec.ApprovalRef+"/challenge", `{"decision":"approve"}`, "Origin", testPublicURL)
		wantStatus(t, r, http.StatusOK)
	}
	wantError(t, e.do(t, "POST", "/approver/v1/approvals/"+rec.ApprovalRef+"/challenge", `{"decision":"approve"}`, "Origin", testPublicURL),
		http.StatusTooManyRequests, "rate_limited")
	// The limit is per approval: another one is unaffected.
	wantStatus(t, e.do(t, "POST", "/approver/v1/approvals/"+other.ApprovalRef+"/challenge", `{"decision":"approve"}`, "Origin", testPublicURL), http.StatusOK)
}

// TestListApprovers: admins see every approver and their passkeys,
// including one an agent enrolled in-band (SEP-2672) for its principal.
func TestListApprovers(t *testing.T) {
	e := newEnv(t)
	d := e.enroll(t, "Ann Approver", "finance")
	if _, err := e.passkeys.BeginPrincipalEnrollment(context.Background(), "trading-bot"); err != nil {
		t.Fatal(err)
	}
	r := e.do(t, "GET", "/admin/v1/approvers", nil, e.adminAuth()...)
	wantStatus(t, r, http.StatusOK)
	got := decodeAs[[]approverView](t, r)
	byName := map[string]approverView{}
	for _, a := range got {
		byName[a.Name] = a
	}
	ann := byName["Ann Approver"]
	if ann.ID != d.id || len(ann.Passkeys) != 1 || ann.Passkeys[0].CredentialID == "" || ann.Passkeys[0].CreatedAt.IsZero() {
		t.Errorf("Ann = %+v", ann)
	}
	bot := byName["trading-bot"]
	if len(bot.Principals) != 1 || bot.Principals[0] != "trading-bot" || len(bot.Groups) != 1 || bot.Groups[0] != passkey.InBandGroup {
		t.Errorf("in-band approver = %+v", bot)
	}
	if strings.Contains(string(r.body), "publicKey") {
		t.Error("the listing shows public keys")
	}
}
