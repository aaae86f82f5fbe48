package e2e

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/tasks"
)

// oidcProvider is the certified oidc-provider (npm, scripts/oidc/provider.mjs)
// as a child process: a real OpenID provider issuing client-credentials JWT
// access tokens for the resource a client names (RFC 8707).
type oidcProvider struct {
	t        *testing.T
	node     string
	modules  string
	port     int
	resource string
	cmd      *exec.Cmd
}

func (p *oidcProvider) issuer() string { return fmt.Sprintf("http://127.0.0.1:%d", p.port) }

// start runs the provider signing with a new ES256 key named kid.
func (p *oidcProvider) start(kid string) {
	p.t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		p.t.Fatal(err)
	}
	jwk := jose.JSONWebKey{Key: priv, KeyID: kid, Algorithm: "ES256", Use: "sig"}
	b, err := json.Marshal(map[string]any{"keys": []jose.JSONWebKey{jwk}})
	if err != nil {
		p.t.Fatal(err)
	}
	keyFile := filepath.Join(p.t.TempDir(), kid+".json")
	if err := os.WriteFile(keyFile, b, 0o600); err != nil {
		p.t.Fatal(err)
	}
	cmd := exec.Command(p.node, "../../scripts/oidc/provider.mjs", p.modules, fmt.Sprint(p.port), p.resource, keyFile)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		p.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "ready" {
				ready <- true
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		p.t.Fatal("oidc-provider did not start")
	}
	p.cmd = cmd
}

func (p *oidcProvider) stop() {
	if p.cmd != nil {
		p.cmd.Process.Kill()
		p.cmd.Wait()
		p.cmd = nil
	}
}

// token runs a real client-credentials grant (client_secret_basic) for
// resource and scope.
func (p *oidcProvider) token(client, secret, resource, scope string) string {
	p.t.Helper()
	form := url.Values{"grant_type": {"client_credentials"}, "scope": {scope}, "resource": {resource}}
	req, _ := http.NewRequest("POST", p.issuer()+"/token", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(client, secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		AccessToken string `json:"access_token"`
		Error       string `json:"error"`
		Description string `json:"error_description"`
	}
	json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode != 200 || body.AccessToken == "" {
		p.t.Fatalf("token for %s: HTTP %d %s: %s", client, resp.StatusCode, body.Error, body.Description)
	}
	return body.AccessToken
}

// tokenExpiry is a JWT's exp, read without verifying it.
func tokenExpiry(t *testing.T, token string) time.Time {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %q", token)
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	var c struct {
		Exp int64 `json:"exp"`
	}
	if err != nil || json.Unmarshal(b, &c) != nil || c.Exp == 0 {
		t.Fatalf("no exp in the token's claims (%v)", err)
	}
	return time.Unix(c.Exp, 0)
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestOAuthAgentsWithARealProvider: /mcp as an OAuth 2.1 resource server in
// front of a real OpenID provider: a client-credentials token creates a
// task owned by "oauth:<client>", the static agent token still works, the
// protected-resource metadata names the provider, a token for another
// resource is 401 invalid_token, one without the scope 403
// insufficient_scope, a real token past its expiry (and the skew, set to
// 1 s) 401 invalid_token saying it expired, and after the provider rotates
// its signing key the new tokens validate (the key set is fetched again for
// the unknown kid).
func TestOAuthAgentsWithARealProvider(t *testing.T) {
	node, modules := upstreamServers(t)
	port := freePort(t)
	resource := fmt.Sprintf("http://localhost:%d/mcp", port)
	p := &oidcProvider{t: t, node: node, modules: modules, port: freePort(t), resource: resource}
	p.start("key-1")
	t.Cleanup(p.stop)

	s := startStackConfig(t, app.Config{
		OAuthIssuer:         p.issuer(),
		OAuthPrincipalClaim: "client_id",
		OAuthRequiredScopes: []string{"mcp:tools"},
		OAuthClockSkew:      time.Second,
	}, port)
	// agent-short's tokens live 2 s (scripts/oidc/provider.mjs); taken
	// now, checked once past its exp and the skew, below.
	short := p.token("agent-short", "secret-s", resource, "mcp:tools")

	// The protected-resource metadata (RFC 9728).
	var prm struct {
		Resource             string   `json:"resource"`
		AuthorizationServers []string `json:"authorization_servers"`
		ScopesSupported      []string `json:"scopes_supported"`
	}
	if code := s.HTTPJSON("GET", "/.well-known/oauth-protected-resource/mcp", "", nil, &prm); code != 200 ||
		prm.Resource != resource || len(prm.AuthorizationServers) != 1 || prm.AuthorizationServers[0] != p.issuer() {
		t.Fatalf("metadata: HTTP %d %+v", code, prm)
	}

	// No token: 401 naming the metadata.
	code, www := s.MCPAuth("")
	if code != 401 || !strings.Contains(www, `resource_metadata="http://localhost:`) || strings.Contains(www, "error=") {
		t.Fatalf("no token: %d %q", code, www)
	}

	// A real client-credentials token creates a task owned by the client.
	tok := p.token("agent-a", "secret-a", resource, "mcp:tools")
	task := s.CreateTask(tok, "transfer_funds", transferArgs)
	if task.Status != tasks.StatusWorking {
		t.Fatalf("task %+v", task)
	}
	rec, err := s.App.Store.Get(t.Context(), task.TaskID)
	if err != nil || rec.Owner != "oauth:agent-a" {
		t.Fatalf("task owner %q (%v)", rec.Owner, err)
	}
	// The static agent token still works, and cannot read the OAuth
	// agent's task.
	if code, _ := s.MCPAuth(s.AgentToken); code != 200 {
		t.Fatalf("static token: HTTP %d", code)
	}

	// An admin disables the OAuth principal: its valid token is refused at
	// the next request (the identity provider would go on issuing and its
	// tokens would live to their expiry), the listing shows it, the
	// change is audited, and enabling it lets the same token in again.
	type agentRow struct {
		Name, Kind, Status, AuditChain string
	}
	var res struct {
		Changed     bool
		Status      string
		AuditRecord string
		Agent       agentRow
	}
	if code := s.HTTPJSON("POST", "/admin/v1/agents/"+url.PathEscape("oauth:agent-a")+"/disable", s.AdminToken, struct{}{}, &res); code != 200 ||
		!res.Changed || res.Status != "disabled" || res.AuditRecord == "" || res.Agent.Kind != "oauth" {
		t.Fatalf("disable oauth:agent-a: HTTP %d %+v", code, res)
	}
	if code, www := s.MCPAuth(tok); code != 401 || !strings.Contains(www, `error="invalid_token"`) ||
		!strings.Contains(www, `error_description="this principal is disabled at Countersign"`) {
		t.Fatalf("disabled principal: %d %q", code, www)
	}
	if code, _ := s.MCPAuth(s.AgentToken); code != 200 {
		t.Fatalf("static token after disabling an OAuth principal: HTTP %d", code)
	}
	var rows []agentRow
	if code := s.HTTPJSON("GET", "/admin/v1/agents", s.AdminToken, nil, &rows); code != 200 ||
		!slices.ContainsFunc(rows, func(r agentRow) bool { return r.Name == "oauth:agent-a" && r.Kind == "oauth" && r.Status == "disabled" }) {
		t.Fatalf("agents: HTTP %d %+v", code, rows)
	}
	if code := s.HTTPJSON("POST", "/admin/v1/agents/"+url.PathEscape("oauth:\x01")+"/disable", s.AdminToken, struct{}{}, nil); code != 404 {
		t.Fatalf("disable an impossible principal: HTTP %d", code)
	}
	if code := s.HTTPJSON("POST", "/admin/v1/agents/"+url.PathEscape("oauth:agent-a")+"/enable", s.AdminToken, struct{}{}, &res); code != 200 || !res.Changed || res.Status != "active" {
		t.Fatalf("enable oauth:agent-a: HTTP %d %+v", code, res)
	}
	if code, _ := s.MCPAuth(tok); code != 200 {
		t.Fatalf("enabled principal: HTTP %d", code)
	}

	// A token for another resource: 401 invalid_token.
	other := p.token("agent-a", "secret-a", "https://other.example.com/mcp", "mcp:tools")
	if code, www := s.MCPAuth(other); code != 401 || !strings.Contains(www, `error="invalid_token"`) {
		t.Fatalf("other audience: %d %q", code, www)
	}
	// Without the required scope: 403 insufficient_scope.
	noScope := p.token("agent-noscope", "secret-n", resource, "other")
	if code, www := s.MCPAuth(noScope); code != 403 || !strings.Contains(www, `error="insufficient_scope"`) || !strings.Contains(www, `scope="mcp:tools"`) {
		t.Fatalf("no scope: %d %q", code, www)
	}
	// A forged token (the real one with its signature cut): 401.
	if code, _ := s.MCPAuth(tok[:strings.LastIndexByte(tok, '.')+1] + "AAAA"); code != 401 {
		t.Fatalf("forged: HTTP %d", code)
	}

	// The expired token: a real one, refused for its expiry.
	if wait := time.Until(tokenExpiry(t, short).Add(2 * time.Second)); wait > 0 {
		time.Sleep(wait)
	}
	if code, www := s.MCPAuth(short); code != 401 || !strings.Contains(www, `error="invalid_token"`) ||
		!strings.Contains(www, `error_description="the access token expired"`) {
		t.Fatalf("expired token: %d %q", code, www)
	}

	// Key rotation: the provider restarts with a new key. Its tokens name
	// a kid the server has not seen; the server fetches the key set again
	// (at most once per 10 s) and accepts them.
	p.stop()
	p.start("key-2")
	rotated := p.token("agent-a", "secret-a", resource, "mcp:tools")
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, www := s.MCPAuth(rotated)
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("token of the rotated key still refused: %d %q", code, www)
		}
		time.Sleep(500 * time.Millisecond)
	}
	// The old key is gone from the provider's set: a token it signed fails
	// once the set has been fetched again.
	if code, _ := s.MCPAuth(tok); code != 401 {
		t.Fatalf("token of the retired key: HTTP %d", code)
	}
}

// readmePolicyWith returns a policy directory holding the README's worked
// rego block that contains marker, with the approvals helper it imports.
func readmePolicyWith(t *testing.T, marker string) string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var policy string
	for _, block := range strings.Split(string(readme), "```rego\n")[1:] {
		if body, _, _ := strings.Cut(block, "```"); strings.Contains(body, marker) {
			policy = body
		}
	}
	if policy == "" {
		t.Fatalf("README: no rego block with %q", marker)
	}
	helper, err := os.ReadFile("../../pdp/policy/approvals.rego")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, content := range map[string]string{"authz.rego": policy, "approvals.rego": string(helper)} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestOAuthScopesInPolicy: the README's policy on an OAuth agent's scopes
// and claims, with tokens of a real provider. A token with the payments
// scope gets a task that, approved, runs (so the re-evaluation after
// approval saw the scope too: the workflow input carries it); one without
// is denied by policy (a tool result, not the 403 of
// --oauth-required-scopes); the provider's tenant claim, passed with
// --oauth-claims, lets agent-a list transfers and no one else; a static
// token has no scopes.
func TestOAuthScopesInPolicy(t *testing.T) {
	node, modules := upstreamServers(t)
	port := freePort(t)
	resource := fmt.Sprintf("http://localhost:%d/mcp", port)
	p := &oidcProvider{t: t, node: node, modules: modules, port: freePort(t), resource: resource}
	p.start("key-1")
	t.Cleanup(p.stop)
	s := startStackConfig(t, app.Config{
		OAuthIssuer:         p.issuer(),
		OAuthPrincipalClaim: "client_id",
		OAuthClaims:         []string{"tenant"},
		PolicyDir:           readmePolicyWith(t, `"payments" in scopes`),
	}, port)
	ann := s.Enroll("ann", "approvers")

	paying := p.token("agent-a", "secret-a", resource, "mcp:tools payments")
	task := s.CreateTask(paying, "transfer_funds", transferArgs)
	if r := s.Approve(ann, s.RefOf(task.TaskID), "approve"); !r.Accepted {
		t.Fatalf("approve: %+v", r)
	}
	if d := s.WaitTerminal(paying, task.TaskID); disposition(d) != tasks.ApprovedExecuted {
		t.Fatalf("approved transfer with the payments scope: %s %s", disposition(d), resultText(t, d.Result))
	}

	denied := func(who, token, tool, reason string) {
		t.Helper()
		args := map[string]any{}
		if tool == "transfer_funds" {
			args = transferArgs
		}
		r := s.Call2026(token, "tools/call", tool, map[string]any{"name": tool, "arguments": args}, true)
		if r.Error != nil || !strings.Contains(resultText(t, r.Result), "Denied by policy: "+reason) {
			t.Fatalf("%s %s: want a denial by policy (%s), got %s %+v", who, tool, reason, r.Result, r.Error)
		}
	}
	mcpOnly := p.token("agent-a", "secret-a", resource, "mcp:tools")
	denied("agent-a without payments", mcpOnly, "transfer_funds", "transfers need the payments scope")
	denied("static agent", s.AgentToken, "transfer_funds", "transfers need the payments scope")

	// The tenant claim: agent-a's tokens carry tenant "acme", agent-short's
	// none.
	r := s.Call2026(mcpOnly, "tools/call", "list_transfers", map[string]any{"name": "list_transfers", "arguments": map[string]any{}}, true)
	if r.Error != nil || strings.Contains(resultText(t, r.Result), "Denied") {
		t.Fatalf("agent-a (tenant acme) list_transfers: %s %+v", r.Result, r.Error)
	}
	denied("agent-short (no tenant)", p.token("agent-short", "secret-s", resource, "mcp:tools"), "list_transfers", "not allowed")
}
