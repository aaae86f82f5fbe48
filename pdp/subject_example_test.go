package pdp_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/pdp"
)

// ReadmeScopePolicy is the worked policy of the README's "Agents with an
// OpenID provider (OAuth 2.1)" section, verbatim: it reads the OAuth
// subject's scopes and claims. internal/e2e runs the same policy against a
// real provider.
const readmeScopePolicy = `package countersign.authz

import data.countersign.approvals

decision := approvals.resolve(base)

# Static-token agents have no properties: no scopes, no claims.
scopes := object.get(input.subject, ["properties", "scopes"], [])

tenant := object.get(input.subject, ["properties", "claims", "tenant"], "")

# Transfers need the payments scope, and one approver.
base := {"effect": "requestable", "reason": "transfers need one approver",
	"approver_group": "approvers", "quorum": 1, "approval_ttl_seconds": 3600} if {
	input.resource.id == "transfer_funds"
	"payments" in scopes
} else := {"effect": "deny", "reason": "transfers need the payments scope"} if {
	input.resource.id == "transfer_funds"
}

# Listing transfers is for the acme tenant's agents.
base := {"effect": "allow", "reason": "acme agents may list transfers"} if {
	input.resource.id == "list_transfers"
	tenant == "acme"
}

default base := {"effect": "deny", "reason": "not allowed"}
`

// oauthSubject is an OAuth caller's subject as mcpserver builds it
// (internal/oauth Verifier.Properties, carried in tasks.Envelope).
func oauthSubject(scopes []any, claims map[string]any) pdp.Entity {
	p := map[string]any{"auth": "oauth", "issuer": "https://idp.example.com", "sub": "agent-a", "client_id": "agent-a", "scopes": scopes}
	if claims != nil {
		p["claims"] = claims
	}
	return pdp.Entity{Type: "agent", ID: "oauth:agent-a", Properties: p}
}

// TestReadmeScopePolicy: the README's policy compiles and decides on the
// subject's scopes and claims, on the first evaluation and on the
// re-evaluation after approval; a static-token subject (no properties) is
// denied.
func TestReadmeScopePolicy(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), readmeScopePolicy) {
		t.Fatal("the README's worked scope policy differs from this test's")
	}
	helper, err := os.ReadFile("policy/approvals.rego")
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, writePolicy(t, map[string]string{"authz.rego": readmeScopePolicy, "approvals.rego": string(helper)}))
	with := func(in pdp.Input, s pdp.Entity) pdp.Input { in.Subject = s; return in }
	transfer := call("transfer_funds", `{"amount": 5}`)
	approved := call("transfer_funds", `{"amount": 5}`, approval("ann"))
	need := pdp.Decision{Effect: pdp.EffectRequestable, Reason: "transfers need one approver", ApproverGroup: "approvers", Quorum: 1, ApprovalTTL: time.Hour, AuthenticatorClass: pdp.AuthenticatorPlatform}
	runCases(t, e, []evalCase{
		{"scope granted: requestable", with(transfer, oauthSubject([]any{"mcp:tools", "payments"}, nil)), need},
		{"scope granted and approved: allow", with(approved, oauthSubject([]any{"mcp:tools", "payments"}, nil)), allow("approved by quorum")},
		{"scope missing: denied by policy", with(transfer, oauthSubject([]any{"mcp:tools"}, nil)), deny("transfers need the payments scope")},
		{"scope missing, approved: still denied", with(approved, oauthSubject([]any{"mcp:tools"}, nil)), deny("transfers need the payments scope")},
		{"no scopes at all", with(transfer, oauthSubject([]any{}, nil)), deny("transfers need the payments scope")},
		{"static-token agent", transfer, deny("transfers need the payments scope")},
		{"claim matches", with(call("list_transfers", `{}`), oauthSubject([]any{}, map[string]any{"tenant": "acme"})), allow("acme agents may list transfers")},
		{"claim differs", with(call("list_transfers", `{}`), oauthSubject([]any{}, map[string]any{"tenant": "other"})), deny("not allowed")},
		{"claim absent", with(call("list_transfers", `{}`), oauthSubject([]any{}, nil)), deny("not allowed")},
	})
}
