package e2e

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/devtest"
	"github.com/countersign/countersign/internal/testnats"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

// TestAdminRevocationTwoProcesses: two app instances on one NATS, as two
// replicas. A passkey revoked through one, between the challenge and the
// decision, refuses the decision taken on the other, with a clear reason,
// and the task stays pending; an agent token revoked through one is 401
// invalid_token on the other at once (no retry, no wait).
func TestAdminRevocationTwoProcesses(t *testing.T) {
	_, nc := testnats.Start(t)
	a := startStackConfig(t, app.Config{NATSURL: nc.ConnectedUrl()}, 0)
	bDir := t.TempDir()
	for _, f := range []string{app.AgentTokenFile, app.AdminTokenFile} {
		if err := os.WriteFile(filepath.Join(bDir, f), []byte(readFile(t, filepath.Join(a.Dir, f))), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b := startStackConfig(t, app.Config{DataDir: bDir, NATSURL: nc.ConnectedUrl()}, 0)

	ann := a.Enroll("ann", "approvers")
	task := a.CreateTask(a.AgentToken, "transfer_funds", map[string]any{"to": "acct-lost-phone", "amount": 4200, "currency": "EUR"})
	ref := a.RefOf(task.TaskID)
	ch := a.Challenge(ref, "approve")
	signed := ann.Sign(t, ch)

	// The phone is lost: the admin revokes its passkey through b.
	var approvers []struct {
		ID       string `json:"id"`
		Passkeys []struct {
			CredentialID string `json:"credentialId"`
		} `json:"passkeys"`
	}
	if code := b.HTTPJSON("GET", "/admin/v1/approvers", b.AdminToken, nil, &approvers); code != 200 || len(approvers) != 1 || len(approvers[0].Passkeys) != 1 {
		t.Fatalf("approvers: HTTP %d %+v", code, approvers)
	}
	var revoked struct {
		Changed bool   `json:"changed"`
		Status  string `json:"status"`
	}
	path := "/admin/v1/approvers/" + ann.ID + "/passkeys/" + approvers[0].Passkeys[0].CredentialID + "/revoke"
	if code := b.HTTPJSON("POST", path, b.AdminToken, struct{}{}, &revoked); code != 200 || !revoked.Changed || revoked.Status != "revoked" {
		t.Fatalf("revoke: HTTP %d %+v", code, revoked)
	}

	// The decision signed before, posted to a: refused, the task pending.
	res := a.Decide(ref, ch, "approve", signed)
	if res.Accepted || res.Reason != passkey.ReasonCredentialRevoked || res.Status != "pending" {
		t.Fatalf("decision with a revoked passkey: %+v", res)
	}
	if d, _ := b.GetTask(b.AgentToken, task.TaskID); d.Status != tasks.StatusWorking {
		t.Fatalf("task after the refused decision: %s", d.Status)
	}
	// Nor is it offered again on a: the approvers a lists (its
	// watch-fed directory) already carry the revocation made on b.
	var refusal struct {
		Error string `json:"error"`
	}
	if code := a.HTTPJSON("POST", "/approver/v1/approvals/"+ref+"/challenge", "", map[string]any{"decision": "approve"}, &refusal); code != 409 || refusal.Error != passkey.ReasonNoEligibleCredential {
		t.Fatalf("challenge after the revocation: HTTP %d %+v", code, refusal)
	}
	// The refusal is in the task's audit chain, with its reason.
	var chain struct {
		Records []struct {
			Kind string `json:"kind"`
			Body struct {
				Accepted bool   `json:"accepted"`
				Reason   string `json:"reason"`
			} `json:"body"`
		} `json:"records"`
	}
	if code := a.HTTPJSON("GET", "/admin/v1/audit/"+task.TaskID, a.AdminToken, nil, &chain); code != 200 {
		t.Fatalf("audit: HTTP %d", code)
	}
	found := false
	for _, r := range chain.Records {
		found = found || (r.Kind == "decision" && !r.Body.Accepted && r.Body.Reason == passkey.ReasonCredentialRevoked)
	}
	if !found {
		t.Fatalf("no rejected decision with credential_revoked in %+v", chain.Records)
	}

	// The agent token, revoked through a, fails on b at once; the
	// notification stream it opened on b before ends.
	if code, _ := b.MCPAuth(b.AgentToken); code != 200 {
		t.Fatalf("agent before revocation: HTTP %d", code)
	}
	req, _ := http.NewRequest("GET", b.Base+"/mcp", nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	req.Header.Set("Authorization", "Bearer "+b.AgentToken)
	stream, err := http.DefaultClient.Do(req)
	if err != nil || stream.StatusCode != 200 {
		t.Fatalf("GET stream: %v %v", stream, err)
	}
	defer stream.Body.Close()
	ended := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stream.Body)
		close(ended)
	}()
	if code := a.HTTPJSON("POST", "/admin/v1/agents/"+app.DevAgentName+"/revoke", a.AdminToken, struct{}{}, &revoked); code != 200 || revoked.Status != "revoked" {
		t.Fatalf("revoke agent: HTTP %d %+v", code, revoked)
	}
	for _, s := range []*devtest.Stack{b.Stack, a.Stack} {
		if code, auth := s.MCPAuth(s.AgentToken); code != 401 || !strings.Contains(auth, `error="invalid_token"`) {
			t.Fatalf("revoked agent on %s: HTTP %d %q", s.Base, code, auth)
		}
	}
	select {
	case <-ended:
	case <-time.After(30 * time.Second): // a KV watch: milliseconds, unless the machine is loaded
		t.Fatal("the revoked agent's notification stream on the other instance is still open")
	}
}
