package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
	"github.com/countersign/countersign/txtoken"
)

// tokenPolicy puts transfer_funds and deploy_service in the token mode,
// lets every principal but one obtain tokens for them, and allows
// list_transfers.
const tokenPolicy = `package countersign.authz

token_tools := {"transfer_funds", "deploy_service"}

decision := {"effect": "token", "reason": "this tool needs a transaction token"} if {
	input.action.name == "tools/call"
	input.resource.id in token_tools
}

decision := {"effect": "allow", "reason": "listing is allowed"} if {
	input.action.name == "tools/call"
	input.resource.id == "list_transfers"
}

decision := {"effect": "allow", "reason": "agents may ask for tokens"} if {
	input.action.name == "transaction-token/issue"
	input.resource.id in token_tools
	not contains(input.subject.id, "mallory")
}
`

// tokenHarness serves an endpoint with the token policy and a
// txtoken.Service of its own (a replica) over the shared environment's NATS.
func tokenHarness(t *testing.T, tweak func(*Options)) (*harness, *txtoken.Service, *audit.Log, *audit.Keyring) {
	t.Helper()
	e := sharedEnv(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "authz.rego"), []byte(tokenPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	engine, err := pdp.New(ctx, pdp.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := audit.OpenKeyring(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l, err := audit.Open(ctx, js, audit.Options{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := txtoken.Open(ctx, js, txtoken.Options{ServerID: "countersign-test", Audit: l})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *Options) {
		o.PDP = engine
		o.Tokens = svc
		if tweak != nil {
			tweak(o)
		}
	})
	return h, svc, l, keys
}

// requestToken asks for a token over MCP.
func (h *harness) requestToken(t *testing.T, era tasks.Era, who, tool string, args any) rpc {
	t.Helper()
	return h.do(t, call{token: "tok:" + who, era: era, method: MethodTransactionToken, params: map[string]any{"name": tool, "arguments": args}})
}

func (h *harness) mustToken(t *testing.T, era tasks.Era, who, tool string, args any) tokenResult {
	t.Helper()
	var out tokenResult
	h.requestToken(t, era, who, tool, args).ok(t, &out)
	if out.Token == "" || out.MetaKey != txtoken.MetaKey || out.Principal != who || out.Tool != tool {
		t.Fatalf("token result %+v", out)
	}
	return out
}

// callWithToken makes a tools/call carrying token ("" for none).
func (h *harness) callWithToken(t *testing.T, era tasks.Era, who, tool string, args any, token any) toolCallResult {
	t.Helper()
	params := map[string]any{"name": tool, "arguments": args}
	if token != nil {
		params["_meta"] = map[string]any{txtoken.MetaKey: token}
	}
	var out toolCallResult
	h.do(t, call{token: "tok:" + who, era: era, method: "tools/call", params: params}).ok(t, &out)
	return out
}

// tryWithToken is callWithToken for a goroutine: the raw answer, and no
// failing of the test.
func (h *harness) tryWithToken(era tasks.Era, who, tool string, args any, token any) (rpc, error) {
	return h.try(call{token: "tok:" + who, era: era, method: "tools/call",
		params: map[string]any{"name": tool, "arguments": args, "_meta": map[string]any{txtoken.MetaKey: token}}})
}

// tokenError reads the RFC error object of a rejected call.
func tokenError(t *testing.T, r toolCallResult) txtoken.Error {
	t.Helper()
	if !r.IsError || r.Meta[tasks.MetaDisposition] != string(tasks.DeniedNotExecuted) {
		t.Fatalf("want a denial, got %+v", r)
	}
	b, _ := json.Marshal(r.Meta[MetaTokenError])
	var e txtoken.Error
	if err := json.Unmarshal(b, &e); err != nil || e.ErrorType == "" {
		t.Fatalf("no token error in %+v", r.Meta)
	}
	return e
}

func TestTokenCallRunsOnceBothEras(t *testing.T) {
	h, _, l, keys := tokenHarness(t, nil)
	for _, era := range []tasks.Era{tasks.Era2025, tasks.Era2026} {
		t.Run(string(era), func(t *testing.T) {
			who := principal(t, "a")
			to := principal(t, "acct")
			args := transferArgs(to, 5000)
			// Without a token: refused, nothing runs.
			if e := tokenError(t, h.callWithToken(t, era, who, "transfer_funds", args, nil)); e.Reason != reasonMissingToken || e.ErrorType != txtoken.TypePermissionDenied {
				t.Fatalf("no token: %+v", e)
			}
			tok := h.mustToken(t, era, who, "transfer_funds", args)
			res := h.callWithToken(t, era, who, "transfer_funds", args, tok.Token)
			if res.IsError {
				t.Fatalf("token call: %s", res.text())
			}
			if era == tasks.Era2026 && res.ResultType != "complete" {
				t.Fatalf("resultType %q", res.ResultType)
			}
			if n := h.transfersTo(t, to); n != 1 {
				t.Fatalf("%d transfers after the token call, want 1", n)
			}
			// Replay: rejected, nothing runs again.
			e := tokenError(t, h.callWithToken(t, era, who, "transfer_funds", args, tok.Token))
			if e.ErrorType != txtoken.TypeTokenConsumed || e.Reason != txtoken.ReasonAlreadyUsed || e.StatusCode != 409 || e.JTI != tok.JTI {
				t.Fatalf("replay: %+v", e)
			}
			if n := h.transfersTo(t, to); n != 1 {
				t.Fatalf("%d transfers after the replay, want 1", n)
			}
			// Issuance, use, result and the replay's rejection are audited.
			lines, err := l.Chain(context.Background(), tok.JTI)
			if err != nil {
				t.Fatal(err)
			}
			v, recs, err := audit.CheckChain(tok.JTI, lines, audit.CheckOptions{Keys: keys.PublicKeys()})
			if err != nil || !v.OK || len(recs) != 4 || recs[0].Kind != audit.KindTokenIssued || recs[2].Kind != audit.KindTokenResult || recs[3].Kind != audit.KindTokenRejected {
				t.Fatalf("chain: %v %+v %d", err, v, len(recs))
			}
			var issued audit.TokenIssued
			if json.Unmarshal(recs[0].Body, &issued) != nil || issued.IssuedBy != "agent:"+who || issued.Envelope.Principal != who {
				t.Fatalf("issued body %s", recs[0].Body)
			}
		})
	}
}

func TestTokenRejectionsChangeNothing(t *testing.T) {
	h, _, _, _ := tokenHarness(t, nil)
	era := tasks.Era2026
	who := principal(t, "a")
	to := principal(t, "acct")
	args := transferArgs(to, 5000)
	tok := h.mustToken(t, era, who, "transfer_funds", args)
	for _, tc := range []struct {
		name        string
		who, tool   string
		args        any
		token       any
		typ, reason string
	}{
		{"changed parameters", who, "transfer_funds", transferArgs(to, 50000), tok.Token, txtoken.TypeParameterMismatch, txtoken.ReasonParameterChanged},
		{"another principal", principal(t, "b"), "transfer_funds", args, tok.Token, txtoken.TypePermissionDenied, txtoken.ReasonWrongSubject},
		{"another tool", who, "deploy_service", map[string]any{"service": "api", "environment": "staging", "version": "1.0.0"}, tok.Token, txtoken.TypePermissionDenied, txtoken.ReasonWrongTool},
		{"malformed", who, "transfer_funds", args, "abc.def", txtoken.TypePermissionDenied, txtoken.ReasonMalformed},
		{"not a string", who, "transfer_funds", args, 42, txtoken.TypePermissionDenied, txtoken.ReasonMalformed},
		{"tampered signature", who, "transfer_funds", args, tok.Token[:len(tok.Token)-4] + "AAAA", txtoken.TypePermissionDenied, txtoken.ReasonBadSignature},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := tokenError(t, h.callWithToken(t, era, tc.who, tc.tool, tc.args, tc.token))
			if e.ErrorType != tc.typ || e.Reason != tc.reason {
				t.Fatalf("got %s/%s, want %s/%s", e.ErrorType, e.Reason, tc.typ, tc.reason)
			}
			if n := h.transfersTo(t, to); n != 0 {
				t.Fatalf("%d transfers after a rejection", n)
			}
		})
	}
	// No state changed: the token still runs its own call, once.
	if res := h.callWithToken(t, era, who, "transfer_funds", args, tok.Token); res.IsError {
		t.Fatalf("rightful call after the rejections: %s", res.text())
	}
	if n := h.transfersTo(t, to); n != 1 {
		t.Fatalf("%d transfers, want 1", n)
	}
}

// A token counts only for a call policy puts in the token mode: a call
// policy allows runs and ignores the token it carries, a call policy denies
// is denied whatever it carries, and neither consumes it (the token still
// runs its own call afterwards).
func TestTokenIgnoredOutsideTokenMode(t *testing.T) {
	h, _, _, _ := tokenHarness(t, nil)
	era := tasks.Era2025
	who := principal(t, "a")
	to := principal(t, "acct")
	args := transferArgs(to, 5000)
	tok := h.mustToken(t, era, who, "transfer_funds", args)
	if res := h.callWithToken(t, era, who, "list_transfers", map[string]any{}, tok.Token); res.IsError {
		t.Fatalf("allowed call carrying a token: %s", res.text())
	}
	res := h.callWithToken(t, era, who, "delete_records", map[string]any{"table": "customers", "filter": "inactive > 5y"}, tok.Token)
	if !res.IsError || res.Meta[tasks.MetaDisposition] != string(tasks.DeniedNotExecuted) || res.Meta[MetaTokenError] != nil {
		t.Fatalf("denied call carrying a token: %+v", res)
	}
	if res := h.callWithToken(t, era, who, "transfer_funds", args, tok.Token); res.IsError {
		t.Fatalf("the token's own call after the others: %s", res.text())
	}
	if n := h.transfersTo(t, to); n != 1 {
		t.Fatalf("%d transfers, want 1", n)
	}
}

// A token issued for 5000 binds the action hash of 5000; a call with a
// number that JCS rounds to 5000 would have carried the same hash. It is
// refused as invalid arguments, the token stays unspent and no audit record
// is written; nor is a token issued for such a number.
func TestTokenInexactNumber(t *testing.T) {
	h, _, l, keys := tokenHarness(t, nil)
	for _, era := range []tasks.Era{tasks.Era2025, tasks.Era2026} {
		t.Run(string(era), func(t *testing.T) {
			bad := map[tasks.Era]int{tasks.Era2026: http.StatusBadRequest, tasks.Era2025: http.StatusOK}[era]
			who, to := principal(t, "a"), principal(t, "acct")
			inexact := json.RawMessage(`{"to":"` + to + `","amount":5000.000000000000000001,"currency":"EUR"}`)
			h.requestToken(t, era, who, "transfer_funds", inexact).fails(t, bad, codeInvalidParams)

			args := transferArgs(to, 5000)
			tok := h.mustToken(t, era, who, "transfer_funds", args)
			r := h.do(t, call{token: "tok:" + who, era: era, method: "tools/call", params: map[string]any{
				"name": "transfer_funds", "arguments": inexact, "_meta": map[string]any{txtoken.MetaKey: tok.Token}}})
			r.fails(t, bad, codeInvalidParams)
			if n := h.transfersTo(t, to); n != 0 {
				t.Fatalf("%d transfers after the refused call", n)
			}
			lines, err := l.Chain(context.Background(), tok.JTI)
			if err != nil {
				t.Fatal(err)
			}
			if _, recs, err := audit.CheckChain(tok.JTI, lines, audit.CheckOptions{Keys: keys.PublicKeys()}); err != nil || len(recs) != 1 || recs[0].Kind != audit.KindTokenIssued {
				t.Fatalf("the refused call left audit records: %v, %d records", err, len(recs))
			}
			// The token is unspent: it runs its own call, once.
			if res := h.callWithToken(t, era, who, "transfer_funds", args, tok.Token); res.IsError {
				t.Fatalf("rightful call after the refusal: %s", res.text())
			}
			if n := h.transfersTo(t, to); n != 1 {
				t.Fatalf("%d transfers, want 1", n)
			}
		})
	}
}

func TestTokenIssuanceRefusals(t *testing.T) {
	h, _, _, _ := tokenHarness(t, nil)
	for _, era := range []tasks.Era{tasks.Era2025, tasks.Era2026} {
		bad := http.StatusOK // 2026-07-28 answers -32602 with HTTP 400
		if era == tasks.Era2026 {
			bad = http.StatusBadRequest
		}
		r := h.requestToken(t, era, principal(t, "mallory"), "transfer_funds", transferArgs("x", 5))
		r.fails(t, http.StatusOK, CodeTokenRefused)
		var e txtoken.Error
		if json.Unmarshal(r.Error.Data, &e) != nil || e.ErrorType != txtoken.TypePermissionDenied || e.Reason != "policy" {
			t.Fatalf("refusal data %s", r.Error.Data)
		}
		h.requestToken(t, era, principal(t, "a"), "no_such_tool", map[string]any{}).fails(t, bad, codeInvalidParams)
		h.requestToken(t, era, principal(t, "a"), "transfer_funds", map[string]any{"amount": "lots"}).fails(t, bad, codeInvalidParams)
		h.requestToken(t, era, principal(t, "a"), "countersign_await", map[string]any{}).fails(t, bad, codeInvalidParams)
		// A tool policy does not let agents self-issue for.
		h.requestToken(t, era, principal(t, "a"), "list_transfers", map[string]any{}).fails(t, http.StatusOK, CodeTokenRefused)
	}
}

func TestTokenModeWithoutTokens(t *testing.T) {
	h, _, _, _ := tokenHarness(t, func(o *Options) { o.Tokens = nil })
	who := principal(t, "a")
	res := h.callWithToken(t, tasks.Era2026, who, "transfer_funds", transferArgs(principal(t, "acct"), 5), "x.y.z")
	if !res.IsError || res.Meta[tasks.MetaDisposition] != string(tasks.DeniedNotExecuted) {
		t.Fatalf("got %+v", res)
	}
	h.requestToken(t, tasks.Era2026, who, "transfer_funds", transferArgs("x", 5)).fails(t, http.StatusNotFound, codeMethodNotFound)
}

// TestTokenRaceAcrossReplicas: two endpoints, each with its own txtoken
// Service over one NATS, race one token with twenty calls: exactly one
// runs, every other answer is token_consumed.
func TestTokenRaceAcrossReplicas(t *testing.T) {
	a, _, _, _ := tokenHarness(t, nil)
	b, _, _, _ := tokenHarness(t, nil)
	who := principal(t, "a")
	to := principal(t, "acct")
	args := transferArgs(to, 5000)
	tok := a.mustToken(t, tasks.Era2026, who, "transfer_funds", args)
	var wg sync.WaitGroup
	answers := make([]rpc, 20)
	errs := make([]error, len(answers))
	for i := range answers {
		h := a
		if i%2 == 1 {
			h = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i], errs[i] = h.tryWithToken(tasks.Era2026, who, "transfer_funds", args, tok.Token)
		}()
	}
	wg.Wait()
	results := make([]toolCallResult, len(answers))
	for i, ans := range answers {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		ans.ok(t, &results[i])
	}
	ran, consumed := 0, 0
	for _, r := range results {
		if !r.IsError {
			ran++
			continue
		}
		if e := tokenError(t, r); e.ErrorType == txtoken.TypeTokenConsumed {
			consumed++
		} else {
			t.Errorf("unexpected rejection %+v", e)
		}
	}
	if ran != 1 || consumed != 19 {
		t.Fatalf("%d ran, %d consumed", ran, consumed)
	}
	if n := a.transfersTo(t, to); n != 1 {
		t.Fatalf("%d transfers, want 1", n)
	}
	_ = fmt.Sprint()
}

// TestTokenCallAsLegacyTask: a 2025-11-25 client that sent params.task gets
// a completed task (as for any call decided at once), and the token call
// ran once inside it.
func TestTokenCallAsLegacyTask(t *testing.T) {
	h, _, _, _ := tokenHarness(t, nil)
	who := principal(t, "a")
	to := principal(t, "acct")
	args := transferArgs(to, 5000)
	tok := h.mustToken(t, tasks.Era2025, who, "transfer_funds", args)
	var out struct {
		Task legacyTask `json:"task"`
	}
	h.do(t, call{token: "tok:" + who, era: tasks.Era2025, method: "tools/call", params: map[string]any{
		"name": "transfer_funds", "arguments": args, "task": map[string]any{},
		"_meta": map[string]any{txtoken.MetaKey: tok.Token},
	}}).ok(t, &out)
	if out.Task.TaskID == "" || out.Task.Status != string(tasks.StatusCompleted) {
		t.Fatalf("task %+v", out.Task)
	}
	if n := h.transfersTo(t, to); n != 1 {
		t.Fatalf("%d transfers, want 1", n)
	}
}

// TestTokenCapability: the extension is advertised only when tokens are
// served, naming the method and the _meta key.
func TestTokenCapability(t *testing.T) {
	for _, on := range []bool{true, false} {
		h, _, _, _ := tokenHarness(t, func(o *Options) {
			if !on {
				o.Tokens = nil
			}
		})
		var res struct {
			Capabilities struct {
				Extensions map[string]map[string]any `json:"extensions"`
			} `json:"capabilities"`
		}
		h.do(t, call{token: "tok:" + principal(t, "a"), era: tasks.Era2026, method: "server/discover"}).ok(t, &res)
		ext, ok := res.Capabilities.Extensions[ExtTransactionTokens]
		if ok != on || (on && (ext["method"] != MethodTransactionToken || ext["metaKey"] != txtoken.MetaKey)) {
			t.Fatalf("tokens %v: extension %v %v", on, ok, ext)
		}
	}
}

// deployTool replaces deploy_service (a token-mode tool of tokenPolicy)
// with run, in a registry of its own.
func deployTool(t *testing.T, run func(ctx context.Context, call gateway.Call) (tasks.CallToolResult, error)) func(*Options) {
	t.Helper()
	reg, err := gateway.NewRegistry(gateway.Tool{
		Name:        "deploy_service",
		Description: "Deploys a service (test double).",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"service":{"type":"string"}},"required":["service"],"additionalProperties":false}`),
		Describe:    func(json.RawMessage) string { return "Deploy a service" },
		Run:         run,
	})
	if err != nil {
		t.Fatal(err)
	}
	return func(o *Options) { o.Tools = reg }
}

// tokenChainKinds reads a token's chain, checked, as its record kinds, and
// the last record's disposition.
func tokenChainKinds(t *testing.T, l *audit.Log, keys *audit.Keyring, jti string) ([]string, string) {
	t.Helper()
	lines, err := l.Chain(context.Background(), jti)
	if err != nil {
		t.Fatal(err)
	}
	v, recs, err := audit.CheckChain(jti, lines, audit.CheckOptions{Keys: keys.PublicKeys()})
	if err != nil || !v.OK {
		t.Fatalf("chain %s: %v %+v", jti, err, v)
	}
	var kinds []string
	for _, r := range recs {
		kinds = append(kinds, r.Kind)
	}
	return kinds, v.Disposition
}

// TestTokenCallOutlivesCancel: the request's context is cancelled (the
// go-sdk cancels it for notifications/cancelled) while its token call
// runs. The token is spent, so the call runs to its end, uncancelled, and
// its result is recorded: the chain is issued, consumed, result.
func TestTokenCallOutlivesCancel(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	ranOut := make(chan error, 1)
	h, _, l, keys := tokenHarness(t, deployTool(t, func(ctx context.Context, _ gateway.Call) (tasks.CallToolResult, error) {
		close(started)
		<-release
		ranOut <- ctx.Err()
		return tasks.CallToolResult{Content: []json.RawMessage{tasks.TextContent("deployed")}}, nil
	}))
	who := principal(t, "a")
	tok := h.mustToken(t, tasks.Era2026, who, "deploy_service", map[string]any{"service": "api"})
	info := &callInfo{principal: who, era: tasks.Era2026}
	c, _, err := h.srv.decide(context.Background(), info, &mcp.CallToolParamsRaw{Name: "deploy_service",
		Arguments: json.RawMessage(`{"service":"api"}`), Meta: mcp.Meta{txtoken.MetaKey: tok.Token}})
	if err != nil || c.decision.Effect != pdp.EffectToken {
		t.Fatalf("decide: %+v %v", c, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-started
		cancel()
		close(release)
	}()
	res, err := h.srv.runWithToken(ctx, c)
	if err != nil || res.IsError {
		t.Fatalf("run: %+v %v", res, err)
	}
	if err := <-ranOut; err != nil {
		t.Fatalf("the tool's context was cancelled: %v", err)
	}
	kinds, disposition := tokenChainKinds(t, l, keys, tok.JTI)
	if got := strings.Join(kinds, ","); got != "token-issued,token-consumed,token-result" || disposition != "executed" {
		t.Fatalf("chain %s (%s)", got, disposition)
	}
}

// TestTokenCallToolUnreachable: a token call whose tool cannot be reached
// did not run, and its answer says the token is spent (a retry with it is
// token_consumed), not merely "try again later".
func TestTokenCallToolUnreachable(t *testing.T) {
	h, _, _, _ := tokenHarness(t, deployTool(t, func(context.Context, gateway.Call) (tasks.CallToolResult, error) {
		return tasks.CallToolResult{}, fmt.Errorf("%w: dial tcp: connection refused", gateway.ErrNotSent)
	}))
	who := principal(t, "a")
	args := map[string]any{"service": "api"}
	tok := h.mustToken(t, tasks.Era2026, who, "deploy_service", args)
	res := h.callWithToken(t, tasks.Era2026, who, "deploy_service", args, tok.Token)
	if !res.IsError || res.Meta[tasks.MetaDisposition] != string(tasks.DeniedNotExecuted) ||
		!strings.Contains(res.text(), "nothing was sent. The transaction token is spent: to try again later, request a new token for this call.") {
		t.Fatalf("got %+v: %s", res, res.text())
	}
	if e := tokenError(t, h.callWithToken(t, tasks.Era2026, who, "deploy_service", args, tok.Token)); e.ErrorType != txtoken.TypeTokenConsumed {
		t.Fatalf("retry with the spent token: %+v", e)
	}
}
