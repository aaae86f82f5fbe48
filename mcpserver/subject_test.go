package mcpserver

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/approvals/approvalstest"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
)

// scopeRego holds transfer_funds for approval only for a subject granted
// the payments scope, and allows list_transfers only to the acme tenant's
// agents (a claim).
const scopeRego = `package countersign.authz

scopes := object.get(input.subject, ["properties", "scopes"], [])

decision := {"effect": "requestable", "reason": "needs one approver", "approver_group": "approvers",
	"quorum": 1, "approval_ttl_seconds": 3600} if {
	input.resource.id == "transfer_funds"
	"payments" in scopes
} else := {"effect": "allow", "reason": "acme may list"} if {
	input.resource.id == "list_transfers"
	input.subject.properties.claims.tenant == "acme"
} else := {"effect": "deny", "reason": "needs the payments scope"}
`

// fakeOAuth claims tokens "jwt:<principal>:<scope,scope>[:<tenant>]" and
// gives them the subject properties internal/oauth would.
type fakeOAuth struct{}

func (fakeOAuth) Claims(token string) bool { return strings.HasPrefix(token, "jwt:") }

func (fakeOAuth) Authenticate(_ context.Context, token string) (string, map[string]any, error) {
	parts := strings.Split(strings.TrimPrefix(token, "jwt:"), ":")
	if len(parts) < 2 || parts[0] == "" {
		return "", nil, errors.New("bad token")
	}
	scopes := []any{}
	for _, s := range strings.Split(parts[1], ",") {
		if s != "" {
			scopes = append(scopes, s)
		}
	}
	props := map[string]any{"auth": "oauth", "issuer": "https://idp.test", "sub": parts[0], "scopes": scopes}
	if len(parts) > 2 {
		props["claims"] = map[string]any{"tenant": parts[2]}
	}
	return "oauth:" + parts[0], props, nil
}

func (fakeOAuth) Challenge(error) (int, string) {
	return http.StatusUnauthorized, `Bearer error="invalid_token"`
}

// TestOAuthSubjectInPolicy: an OAuth caller's scopes and claims reach the
// policy's subject, and the workflow input (tasks.Envelope) carries them
// for the re-evaluation after approval; a static-token caller's subject
// has no properties.
func TestOAuthSubjectInPolicy(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "authz.rego"), []byte(scopeRego), 0o600); err != nil {
		t.Fatal(err)
	}
	engine, err := pdp.New(context.Background(), pdp.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	e := sharedEnv(t)
	rec := &approvalstest.Recording{Engine: e.workflow}
	h := e.serve(t, func(o *Options) {
		o.PublicURL = "http://countersign.test"
		o.Authenticate = testAuth
		o.OAuth = fakeOAuth{}
		o.PDP = engine
	}, func(ao *approvals.Options) { ao.Engine = rec })
	callAs := func(token, tool string, args map[string]any) rpc {
		return h.do(t, call{token: token, era: tasks.Era2026, tasks: true, method: "tools/call",
			params: map[string]any{"name": tool, "arguments": args}})
	}
	args := transferArgs("acct-scope", 5000)
	who := principal(t, "a")

	// With the scope: a task, whose envelope carries the subject.
	var task taskResult2026
	callAs("jwt:"+who+":mcp,payments", "transfer_funds", args).ok(t, &task)
	if task.ResultType != "task" || task.TaskID == "" {
		t.Fatalf("with the payments scope: want a task, got %+v", task)
	}
	// The workflow starts after the answer.
	if err := h.approvals.WaitStart(context.Background(), task.TaskID); err != nil {
		t.Fatal(err)
	}
	inputs := rec.Inputs()
	if len(inputs) != 1 {
		t.Fatalf("%d workflows started, want 1", len(inputs))
	}
	want := map[string]any{"auth": "oauth", "issuer": "https://idp.test", "sub": who, "scopes": []any{"mcp", "payments"}}
	if env := inputs[0].Envelope; env.Principal != "oauth:"+who || !cmp.Equal(env.Subject, want) {
		t.Fatalf("envelope principal %q subject %v, want %v", env.Principal, env.Subject, want)
	}

	// Without it: denied by policy (a tool result), no task.
	for _, token := range []string{"jwt:" + who + ":mcp", tok(who)} {
		var res toolCallResult
		callAs(token, "transfer_funds", transferArgs("acct-scope-2", 5000)).ok(t, &res)
		if res.ResultType == "task" || !strings.Contains(res.text(), "Denied by policy: needs the payments scope") {
			t.Fatalf("%s: want a denial by policy, got %+v", token, res)
		}
	}
	// A claim: allowed for the acme tenant only.
	for token, allowed := range map[string]bool{"jwt:" + who + "::acme": true, "jwt:" + who + "::other": false, tok(who): false} {
		var res toolCallResult
		callAs(token, "list_transfers", map[string]any{}).ok(t, &res)
		if denied := strings.Contains(res.text(), "Denied by policy"); denied == allowed {
			t.Fatalf("%s list_transfers: allowed %v, got %+v", token, allowed, res)
		}
	}
	if n := len(rec.Inputs()); n != 1 {
		t.Fatalf("%d workflows started, want 1", n)
	}

	// With OAuth on, a disabled agent's static token is still told that
	// its agent is disabled; an unknown one only that it is invalid.
	for token, disabled := range map[string]bool{"nope": false, disabledToken: true} {
		r := h.do(t, call{era: tasks.Era2026, method: "tools/list", headers: map[string]string{"Authorization": "Bearer " + token}})
		if r.Status != http.StatusUnauthorized || strings.Contains(string(r.Body), "this agent is disabled at Countersign") != disabled {
			t.Errorf("%s: HTTP %d, body %q", token, r.Status, r.Body)
		}
	}
}
