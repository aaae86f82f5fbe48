package web

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/approverapi"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

type actionWire struct {
	Action      string          `json:"action"`
	Changed     bool            `json:"changed"`
	Status      string          `json:"status"`
	AuditChain  string          `json:"auditChain"`
	AuditRecord string          `json:"auditRecord"`
	Agent       *agentView      `json:"agent"`
	Approver    *approverView   `json:"approver"`
	Passkey     json.RawMessage `json:"passkey"`
}

// adminChain reads a chain's admin records.
func adminChain(t *testing.T, l *audit.Log, chain string) []audit.AdminAction {
	t.Helper()
	lines, err := l.Chain(context.Background(), chain)
	if err != nil {
		t.Fatalf("chain %s: %v", chain, err)
	}
	var out []audit.AdminAction
	for _, line := range lines {
		var r audit.Record
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatal(err)
		}
		var a audit.AdminAction
		if err := json.Unmarshal(r.Body, &a); err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}

func TestAdminAgents(t *testing.T) {
	var log *audit.Log
	e := newEnv(t, withAudit(t, &log, &syncBuffer{}))
	mcpAuth := func() error { _, err := e.tokens.Agent(context.Background(), e.agent); return err }

	r := e.do(t, "GET", "/admin/v1/agents", nil, e.adminAuth()...)
	wantStatus(t, r, http.StatusOK)
	list := decodeAs[[]agentView](t, r)
	if len(list) != 1 || list[0].Name != testRequester || list[0].Status != "active" || !strings.HasPrefix(list[0].AuditChain, "admin-agent-") {
		t.Fatalf("list = %+v", list)
	}

	steps := []struct {
		action, status string
		changed, works bool
	}{
		{"disable", "disabled", true, false},
		{"disable", "disabled", false, false},
		{"enable", "active", true, true},
		{"revoke", "revoked", true, false},
		{"revoke", "revoked", false, false},
	}
	for _, s := range steps {
		r := e.do(t, "POST", "/admin/v1/agents/"+testRequester+"/"+s.action, nil, e.adminAuth()...)
		wantStatus(t, r, http.StatusOK)
		got := decodeAs[actionWire](t, r)
		if got.Changed != s.changed || got.Status != s.status || got.Agent == nil || got.Agent.Status != s.status || got.AuditChain != list[0].AuditChain {
			t.Fatalf("%s: %+v", s.action, got)
		}
		if err := mcpAuth(); (err == nil) != s.works {
			t.Fatalf("after %s: agent token error %v", s.action, err)
		}
	}
	// A second disable and a second revoke wrote nothing new.
	recs := adminChain(t, log, list[0].AuditChain)
	if len(recs) != 3 || recs[0].Action != "disable" || recs[1].Action != "enable" || recs[2].Action != "revoke" || recs[2].By != "admin:root" {
		t.Fatalf("audit chain = %+v", recs)
	}

	wantError(t, e.do(t, "POST", "/admin/v1/agents/"+testRequester+"/enable", nil, e.adminAuth()...), http.StatusConflict, codeRevoked)
	b := wantError(t, e.do(t, "POST", "/admin/v1/agents/nobody/revoke", nil, e.adminAuth()...), http.StatusNotFound, codeNotFound)
	if !strings.Contains(b.Message, `"nobody"`) {
		t.Fatalf("404 message %q", b.Message)
	}
	wantError(t, e.do(t, "POST", "/admin/v1/agents/nobody/delete", nil, e.adminAuth()...), http.StatusNotFound, codeNotFound)
	wantError(t, e.do(t, "POST", "/admin/v1/agents/x/revoke", nil), http.StatusUnauthorized, codeUnauthorized)
	wantError(t, e.do(t, "POST", "/admin/v1/agents/x/revoke", nil, "Authorization", "Bearer "+e.agent), http.StatusUnauthorized, codeUnauthorized)
	wantError(t, e.do(t, "POST", "/admin/v1/agents/x/revoke", `{"why":1}`, e.adminAuth()...), http.StatusBadRequest, codeInvalidRequest)
}

// Without audit signing keys nothing changes: 503.
func TestAdminActionsNeedAudit(t *testing.T) {
	e := newEnv(t)
	id, _ := e.addApprover(t, "Ann", "approvers")
	e = newEnv(t, withoutAudit())
	wantError(t, e.do(t, "POST", "/admin/v1/approvers", map[string]any{"name": "Bo", "groups": []string{"approvers"}}, e.adminAuth()...),
		http.StatusServiceUnavailable, "audit_unavailable")
	wantError(t, e.do(t, "POST", "/admin/v1/agents", map[string]any{"name": "bot-2"}, e.adminAuth()...),
		http.StatusServiceUnavailable, "audit_unavailable")
	if as, err := e.passkeys.Approvers(context.Background()); err != nil || len(as) != 0 {
		t.Fatalf("approvers added without audit: %v %v", as, err)
	}
	for _, p := range []string{"/admin/v1/agents/" + testRequester + "/revoke", "/admin/v1/approvers/" + id + "/disable"} {
		wantError(t, e.do(t, "POST", p, nil, e.adminAuth()...), http.StatusServiceUnavailable, "audit_unavailable")
	}
	if _, err := e.tokens.Agent(context.Background(), e.agent); err != nil {
		t.Fatalf("agent changed: %v", err)
	}
}

// An approver's passkey revoked between the challenge and the decision:
// the decision is refused with credential_revoked and the task stays
// pending; the approver's other passkey still approves. A disabled
// approver is refused the same way, and their inbox too.
func TestAdminRevokePasskeyInFlight(t *testing.T) {
	var log *audit.Log
	e := newFlowEnv(t, withAudit(t, &log, &syncBuffer{}))
	ann := e.enroll(t, "Ann", "approvers")
	rec := e.startTask(t, taskSpec{tool: "delete_records", args: `{"table":"customers","filter":"id = 42"}`,
		display: "Delete records from customers where id = 42", group: "approvers", quorum: 1})
	body := e.sign(t, ann, rec.ApprovalRef, "approve")

	r := e.do(t, "GET", "/admin/v1/approvers", nil, e.adminAuth()...)
	wantStatus(t, r, http.StatusOK)
	views := decodeAs[[]approverView](t, r)
	if len(views) != 1 || len(views[0].Passkeys) != 1 || views[0].Status != "active" || views[0].Passkeys[0].Status != "active" {
		t.Fatalf("approvers = %+v", views)
	}
	cred := views[0].Passkeys[0].CredentialID
	r = e.do(t, "POST", "/admin/v1/approvers/"+ann.id+"/passkeys/"+cred+"/revoke", nil, e.adminAuth()...)
	wantStatus(t, r, http.StatusOK)
	got := decodeAs[actionWire](t, r)
	if !got.Changed || got.Status != "revoked" || got.AuditChain != "admin-approver-"+ann.id {
		t.Fatalf("revoke = %+v", got)
	}

	r, d := e.decide(t, rec.ApprovalRef, body)
	wantStatus(t, r, http.StatusUnprocessableEntity)
	if want := (approverapi.Decision{Reason: passkey.ReasonCredentialRevoked, Status: tasks.ApprovalPending, Needed: 1}); d != want {
		t.Fatalf("decision = %+v, want %+v", d, want)
	}
	cur, err := e.store.Get(context.Background(), rec.TaskID)
	if err != nil || cur.ApprovalState != tasks.ApprovalPending {
		t.Fatalf("task = %+v, %v", cur.ApprovalState, err)
	}
	// Not offered any more: no eligible passkey in the group.
	r = e.do(t, "POST", "/approver/v1/approvals/"+rec.ApprovalRef+"/challenge", map[string]string{"decision": "approve"}, "Origin", testPublicURL)
	wantError(t, r, http.StatusConflict, passkey.ReasonNoEligibleCredential)

	// A second passkey; then the approver is disabled while holding a challenge.
	token, err := e.passkeys.NewInvite(context.Background(), ann.id)
	if err != nil {
		t.Fatal(err)
	}
	ann2 := e.enrollDevice(t, ann.id, token)
	body = e.sign(t, ann2, rec.ApprovalRef, "approve")
	r = e.do(t, "POST", "/admin/v1/approvers/"+ann.id+"/disable", nil, e.adminAuth()...)
	wantStatus(t, r, http.StatusOK)
	if got := decodeAs[actionWire](t, r); got.Approver == nil || got.Approver.Status != "disabled" || len(got.Approver.Passkeys) != 2 {
		t.Fatalf("disable = %+v", got)
	}
	r, d = e.decide(t, rec.ApprovalRef, body)
	wantStatus(t, r, http.StatusUnprocessableEntity)
	if d.Reason != passkey.ReasonApproverDisabled {
		t.Fatalf("decision = %+v", d)
	}
	wantError(t, e.do(t, "POST", "/approver/v1/inbox/"+ann.id+"/challenge", nil, "Origin", testPublicURL), http.StatusForbidden, passkey.ReasonApproverDisabled)
	if err := e.svc.DenyUnsigned(context.Background(), rec.ApprovalRef, ann.id, "slack", rec.CreatedAt); err != approvals.ErrNotEligible {
		t.Fatalf("unsigned deny by a disabled approver: %v", err)
	}

	// Enabled again, the same signed decision (its challenge unconsumed) counts.
	wantStatus(t, e.do(t, "POST", "/admin/v1/approvers/"+ann.id+"/enable", nil, e.adminAuth()...), http.StatusOK)
	r, d = e.decide(t, rec.ApprovalRef, body)
	wantStatus(t, r, http.StatusOK)
	if !d.Accepted {
		t.Fatalf("decision after enable = %+v", d)
	}
	var recs []audit.AdminAction
	for _, a := range adminChain(t, log, "admin-approver-"+ann.id) {
		if a.Action != audit.AdminCreate && a.Action != audit.AdminInvite && a.Action != audit.AdminEnroll {
			recs = append(recs, a) // the admin's changes, not the additions
		}
	}
	if len(recs) != 3 || recs[0].Target.Type != audit.TargetPasskey || recs[0].Target.ID != cred || recs[1].Action != "disable" || recs[2].Action != "enable" {
		t.Fatalf("audit = %+v", recs)
	}

	// Errors: unknown approver and passkey, double revoke, enabling a revoked passkey.
	wantError(t, e.do(t, "POST", "/admin/v1/approvers/0123456789abcdef0123456789abcdef/revoke", nil, e.adminAuth()...), http.StatusNotFound, codeNotFound)
	wantError(t, e.do(t, "POST", "/admin/v1/approvers/"+ann.id+"/passkeys/AAAA/revoke", nil, e.adminAuth()...), http.StatusNotFound, codeNotFound)
	r = e.do(t, "POST", "/admin/v1/approvers/"+ann.id+"/passkeys/"+cred+"/revoke", nil, e.adminAuth()...)
	wantStatus(t, r, http.StatusOK)
	if got := decodeAs[actionWire](t, r); got.Changed {
		t.Fatalf("second revoke = %+v", got)
	}
	wantError(t, e.do(t, "POST", "/admin/v1/approvers/"+ann.id+"/passkeys/"+cred+"/enable", nil, e.adminAuth()...), http.StatusConflict, codeRevoked)
}
