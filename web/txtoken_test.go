package web

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/txtoken"
)

// schemaIssuer is the admin API's issuer over a real txtoken.Service, with
// the registry's checks reduced to one known tool and a required argument
// (internal/app's adapter uses the gateway registry; internal/e2e covers it).
type schemaIssuer struct{ svc *txtoken.Service }

func (s schemaIssuer) IssueFor(ctx context.Context, principal, tool string, args json.RawMessage, by string) (txtoken.Issued, error) {
	if tool != "transfer_funds" {
		return txtoken.Issued{}, fmt.Errorf("%w: unknown tool %q", txtoken.ErrInvalidRequest, tool)
	}
	var a struct {
		Amount *float64 `json:"amount"`
	}
	if json.Unmarshal(args, &a) != nil || a.Amount == nil {
		return txtoken.Issued{}, fmt.Errorf("%w: amount is required", txtoken.ErrInvalidRequest)
	}
	return s.svc.Issue(ctx, txtoken.Request{Principal: principal, Tool: tool, Arguments: args, IssuedBy: by})
}

func (s schemaIssuer) Rotate(ctx context.Context) (txtoken.Rotation, error) { return s.svc.Rotate(ctx) }

func withTokens(t *testing.T, out **txtoken.Service, log **audit.Log) envOption {
	return func(e *env, s *setup) {
		keys, err := audit.OpenKeyring(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		l, err := audit.Open(context.Background(), e.js, audit.Options{Keys: keys})
		if err != nil {
			t.Fatal(err)
		}
		svc, err := txtoken.Open(context.Background(), e.js, txtoken.Options{ServerID: testServerID, Audit: l})
		if err != nil {
			t.Fatal(err)
		}
		*out, *log = svc, l
		s.site.Transactions = schemaIssuer{svc}
		s.site.Audit = l
	}
}

func TestAdminIssuesTransactionToken(t *testing.T) {
	var svc *txtoken.Service
	var l *audit.Log
	e := newEnv(t, withTokens(t, &svc, &l))
	const path = "/admin/v1/transaction-tokens"
	args := json.RawMessage(`{"to":"acct","amount":5000,"currency":"EUR"}`)
	body := map[string]any{"principal": testRequester, "tool": "transfer_funds", "arguments": args}

	if r := e.do(t, http.MethodPost, path, body); r.code != http.StatusUnauthorized {
		t.Fatalf("no admin token: %v", r)
	}
	if r := e.do(t, http.MethodPost, path, body, "Authorization", "Bearer "+e.agent); r.code != http.StatusUnauthorized {
		t.Fatalf("agent token: %v", r)
	}
	for _, bad := range []any{
		map[string]any{"tool": "transfer_funds", "arguments": args},
		map[string]any{"principal": testRequester, "tool": "nope", "arguments": args},
		map[string]any{"principal": testRequester, "tool": "transfer_funds", "arguments": map[string]any{}},
		map[string]any{"principal": testRequester, "tool": "transfer_funds", "arguments": args, "admin": true},
		map[string]any{"principal": "two words", "tool": "transfer_funds", "arguments": args},
		map[string]any{"principal": strings.Repeat("a", 65), "tool": "transfer_funds", "arguments": args},
		map[string]any{"principal": "oauth:", "tool": "transfer_funds", "arguments": args},
		map[string]any{"principal": "oauth:" + strings.Repeat("a", 257), "tool": "transfer_funds", "arguments": args},
		map[string]any{"principal": "oauth:a\nb", "tool": "transfer_funds", "arguments": args},
		"{",
	} {
		if r := e.do(t, http.MethodPost, path, bad, e.adminAuth()...); r.code != http.StatusBadRequest {
			t.Fatalf("%v: %v", bad, r)
		}
	}
	// An OAuth principal is "oauth:" and up to 256 bytes of its claim: a
	// token can be issued for the longest of them.
	long := "oauth:" + strings.Repeat("é", 128)
	if r := e.do(t, http.MethodPost, path, map[string]any{"principal": long, "tool": "transfer_funds", "arguments": args},
		e.adminAuth()...); r.code != http.StatusCreated {
		t.Fatalf("issue for a %d-byte OAuth principal: %v", len(long), r)
	}
	r := e.do(t, http.MethodPost, path, body, e.adminAuth()...)
	if r.code != http.StatusCreated {
		t.Fatalf("issue: %v", r)
	}
	var got struct {
		txtoken.Issued
		MetaKey string `json:"metaKey"`
	}
	if err := json.Unmarshal(r.body, &got); err != nil || got.Token == "" || got.MetaKey != txtoken.MetaKey || got.Principal != testRequester {
		t.Fatalf("issued %s: %v", r.body, err)
	}
	// The token verifies for the agent's exact call, and is recorded as
	// the admin's.
	claims, err := txtoken.Parse(got.Token, func(string) (ed25519.PublicKey, error) { return nil, fmt.Errorf("unused") })
	if err == nil {
		t.Fatalf("parsed without the key: %+v", claims)
	}
	lines, err := l.Chain(context.Background(), got.JTI)
	if err != nil || len(lines) != 1 {
		t.Fatalf("chain: %v", err)
	}
	var rec audit.Record
	var iss audit.TokenIssued
	if json.Unmarshal(lines[0], &rec) != nil || json.Unmarshal(rec.Body, &iss) != nil || iss.IssuedBy != "admin:root" || iss.Envelope.Principal != testRequester {
		t.Fatalf("issued record %s", lines[0])
	}
	if _, err := svc.Redeem(context.Background(), got.Token, txtoken.Expect{Principal: testRequester, Tool: "transfer_funds", ActionHash: got.ParametersHash}); err != nil {
		t.Fatalf("redeem: %v", err)
	}
}

// A number JCS rounds would give the token the action hash of another
// value: the request is a 400 that names the number, and nothing is issued.
func TestAdminRefusesInexactNumber(t *testing.T) {
	var svc *txtoken.Service
	var l *audit.Log
	e := newEnv(t, withTokens(t, &svc, &l))
	args := json.RawMessage(`{"to":"acct","amount":5000.000000000000000001,"currency":"EUR"}`)
	body := map[string]any{"principal": testRequester, "tool": "transfer_funds", "arguments": args}
	r := e.do(t, http.MethodPost, "/admin/v1/transaction-tokens", body, e.adminAuth()...)
	want := `invalid arguments for tool transfer_funds: number 5000.000000000000000001 at \"/amount\" is not exactly representable as an IEEE-754 double (nearest: 5000)`
	if r.code != http.StatusBadRequest || !strings.Contains(string(r.body), want) {
		t.Fatalf("got %v, want 400 with %s", r, want)
	}
	n := 0
	if err := l.Export(context.Background(), time.Time{}, func([]byte) error { n++; return nil }); err != nil || n != 0 {
		t.Fatalf("%d audit records after the refusal (%v)", n, err)
	}
}

func TestAdminTransactionTokensOff(t *testing.T) {
	e := newEnv(t)
	r := e.do(t, http.MethodPost, "/admin/v1/transaction-tokens", map[string]any{"principal": "a", "tool": "t"}, e.adminAuth()...)
	if r.code != http.StatusNotFound {
		t.Fatalf("got %v", r)
	}
}

func TestAdminRotatesTransactionTokenKey(t *testing.T) {
	var svc *txtoken.Service
	var l *audit.Log
	e := newEnv(t, withTokens(t, &svc, &l))
	old := svc.CurrentKeyID()
	const path = "/admin/v1/transaction-tokens/keys"
	if r := e.do(t, http.MethodPost, path, nil); r.code != http.StatusUnauthorized {
		t.Fatalf("no admin token: %v", r)
	}
	r := e.do(t, http.MethodPost, path, nil, e.adminAuth()...)
	var got struct {
		KeyID       string `json:"kid"`
		Retired     string `json:"retired"`
		AuditChain  string `json:"auditChain"`
		AuditRecord string `json:"auditRecord"`
	}
	if r.code != http.StatusCreated || json.Unmarshal(r.body, &got) != nil || got.KeyID == old || got.KeyID != svc.CurrentKeyID() || got.Retired != old {
		t.Fatalf("rotate: %v (old %s)", r, old)
	}
	// The rotation is an admin record: who, the new key, the retired one.
	target := audit.AdminTarget{Type: audit.TargetTokenKey, ID: got.KeyID}
	if got.AuditChain != audit.AdminChainID(target) || got.AuditRecord != got.AuditChain+"/0" {
		t.Fatalf("audit %s %s", got.AuditChain, got.AuditRecord)
	}
	recs := adminChain(t, l, got.AuditChain)
	if len(recs) != 1 || recs[0].Action != audit.AdminKeyRotate || recs[0].Target != target || recs[0].By != "admin:root" ||
		recs[0].Replaced != old || recs[0].Status != "active" {
		t.Fatalf("admin records %+v", recs)
	}
}

// TestAuditShowUnknownChain: the audit API's 404 names the chain, and for an
// admin chain (which the agent and approver listings name from the start)
// says why an agent or approver may have none yet.
func TestAuditShowUnknownChain(t *testing.T) {
	var svc *txtoken.Service
	var l *audit.Log
	e := newEnv(t, withTokens(t, &svc, &l))
	b := wantError(t, e.do(t, "GET", "/admin/v1/audit/tsk_nosuchtask", nil, e.adminAuth()...), 404, "not_found")
	if b.Message != "no audit records for task tsk_nosuchtask" {
		t.Errorf("unknown task: %q", b.Message)
	}
	b = wantError(t, e.do(t, "GET", "/admin/v1/audit/admin-agent-0123456789abcdef0123456789abcdef", nil, e.adminAuth()...), 404, "not_found")
	if !strings.Contains(b.Message, "admin-agent-0123456789abcdef0123456789abcdef") || !strings.Contains(b.Message, "added before Countersign recorded additions") {
		t.Errorf("admin chain without records: %q", b.Message)
	}
}
