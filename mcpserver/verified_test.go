package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/descope/virtualwebauthn"
	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

// The relying party of the in-band tests: the MCP client's page.
const (
	testRPID   = "localhost"
	testOrigin = "http://localhost:5173"
)

var testRP = virtualwebauthn.RelyingParty{ID: testRPID, Name: "Countersign", Origin: testOrigin}

// testClock is a settable clock for challenge expiry.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// vharness is an endpoint with in-band verified approval: its own passkey
// service (own NATS connection, a settable clock) over the shared NATS.
type vharness struct {
	*harness
	pk    *passkey.Service
	clock *testClock
}

func newVerifiedHarness(tb testing.TB, tweaks ...func(*Options)) *vharness {
	tb.Helper()
	return newVerifiedHarnessWith(tb, passkey.Options{}, tweaks...)
}

// newVerifiedHarnessWith is newVerifiedHarness with the passkey service's
// options pk (RPID, origins and clock are set here).
func newVerifiedHarnessWith(tb testing.TB, pk passkey.Options, tweaks ...func(*Options)) *vharness {
	tb.Helper()
	e := sharedEnv(tb)
	nc, err := nats.Connect(e.nats.URL())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	clk := &testClock{t: time.Now()}
	pk.RPID, pk.RPOrigins, pk.Now = testRPID, []string{testOrigin}, clk.Now
	svc, err := passkey.New(context.Background(), js, pk)
	if err != nil {
		tb.Fatal(err)
	}
	h := newHarness(tb, func(o *Options) {
		o.Passkeys = svc
		for _, f := range tweaks {
			f(o)
		}
	})
	return &vharness{harness: h, pk: svc, clock: clk}
}

// vkit is a principal's virtual authenticator with one passkey.
type vkit struct {
	principal string
	credID    string
	auth      virtualwebauthn.Authenticator
	cred      virtualwebauthn.Credential
}

// beginOptions runs approval/enroll/begin and returns the options.
func (h *vharness) beginOptions(tb testing.TB, p string) (map[string]any, *virtualwebauthn.AttestationOptions) {
	tb.Helper()
	var res struct {
		Options map[string]any `json:"options"`
	}
	h.do(tb, call{token: tok(p), method: methodEnrollBegin, params: map[string]any{"ignored": true}}).ok(tb, &res)
	raw, _ := json.Marshal(res.Options)
	opts, err := virtualwebauthn.ParseAttestationOptions(string(raw))
	if err != nil {
		tb.Fatalf("ParseAttestationOptions: %v", err)
	}
	return res.Options, opts
}

// attest builds the registration response for opts, with transports.
func attest(tb testing.TB, rp virtualwebauthn.RelyingParty, auth virtualwebauthn.Authenticator, cred virtualwebauthn.Credential,
	opts virtualwebauthn.AttestationOptions, transports ...string) map[string]any {
	tb.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(virtualwebauthn.CreateAttestationResponse(rp, auth, cred, opts)), &m); err != nil {
		tb.Fatal(err)
	}
	if transports != nil {
		m["response"].(map[string]any)["transports"] = transports
	}
	return m
}

// enroll enrolls a passkey for p in-band.
func (h *vharness) enroll(tb testing.TB, p string, transports ...string) *vkit {
	tb.Helper()
	_, opts := h.beginOptions(tb, p)
	auth := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(opts.UserID)})
	cred := testpasskey.NewEC2Credential()
	var res struct {
		Success      bool   `json:"success"`
		CredentialID string `json:"credentialId"`
		CreatedAt    string `json:"createdAt"`
	}
	h.do(tb, call{token: tok(p), method: methodEnrollFinish, params: map[string]any{"response": attest(tb, testRP, auth, cred, *opts, transports...)}}).ok(tb, &res)
	if !res.Success || res.CredentialID == "" || res.CreatedAt == "" {
		tb.Fatalf("enroll/finish = %+v", res)
	}
	auth.AddCredential(cred)
	return &vkit{principal: p, credID: res.CredentialID, auth: auth, cred: cred}
}

// challengeEnv is an approval/challenge/create result.
type challengeEnv struct {
	ChallengeID    string `json:"challengeId"`
	DisplayText    string `json:"displayText"`
	ExpiresAt      string `json:"expiresAt"`
	RequestOptions struct {
		Challenge        string `json:"challenge"`
		RPID             string `json:"rpId"`
		Timeout          int    `json:"timeout"`
		UserVerification string `json:"userVerification"`
		AllowCredentials []struct {
			ID         string   `json:"id"`
			Type       string   `json:"type"`
			Transports []string `json:"transports"`
		} `json:"allowCredentials"`
	} `json:"requestOptions"`
}

func (h *vharness) challengeRPC(tb testing.TB, p, tool string, args any) rpc {
	tb.Helper()
	return h.do(tb, call{token: tok(p), method: methodChallengeCreate, params: map[string]any{"toolName": tool, "arguments": args}})
}

func (h *vharness) challenge(tb testing.TB, p string, args any) challengeEnv {
	tb.Helper()
	var env challengeEnv
	h.challengeRPC(tb, p, "place_trade", args).ok(tb, &env)
	return env
}

// sign answers the challengeEnv with k's passkey, bumping its counter.
func (k *vkit) sign(tb testing.TB, env challengeEnv) map[string]any {
	tb.Helper()
	k.cred.Counter++
	return k.signWith(tb, env, k.cred)
}

func (k *vkit) signWith(tb testing.TB, env challengeEnv, cred virtualwebauthn.Credential) map[string]any {
	tb.Helper()
	challenge, err := base64.RawURLEncoding.DecodeString(env.RequestOptions.Challenge)
	if err != nil {
		tb.Fatal(err)
	}
	resp := virtualwebauthn.CreateAssertionResponse(testRP, k.auth, cred, virtualwebauthn.AssertionOptions{Challenge: challenge, RelyingPartyID: testRPID})
	var m map[string]any
	if err := json.Unmarshal([]byte(resp), &m); err != nil {
		tb.Fatal(err)
	}
	return m
}

func evidenceOf(env challengeEnv, response any) map[string]any {
	return map[string]any{"method": "webauthn", "challengeId": env.ChallengeID, "response": response}
}

// tradeCall is a tools/call of place_trade with meta as params._meta.
func (h *vharness) tradeCall(tb testing.TB, p string, args any, meta map[string]any) rpc {
	tb.Helper()
	r, err := h.tradeTry(p, args, meta)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// tradeTry is tradeCall for a goroutine: it does not fail the test.
func (h *vharness) tradeTry(p string, args any, meta map[string]any) (rpc, error) {
	params := map[string]any{"name": "place_trade", "arguments": args}
	if meta != nil {
		params["_meta"] = meta
	}
	return h.try(call{token: tok(p), method: "tools/call", params: params})
}

func (h *vharness) callWith(tb testing.TB, p string, args, evidence any) rpc {
	tb.Helper()
	return h.tradeCall(tb, p, args, map[string]any{MetaVerifiedApproval: evidence})
}

// wantReason asserts a -32001 error with data.reason.
func wantReason(tb testing.TB, r rpc, reason string) {
	tb.Helper()
	if r.Error == nil || r.Error.Code != CodeApproval {
		tb.Fatalf("want -32001 %s, got HTTP %d: %s", reason, r.Status, r.Body)
	}
	var data struct {
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal(r.Error.Data, &data); err != nil || data.Reason != reason {
		tb.Fatalf("want reason %s, got %s", reason, r.Body)
	}
	if r.Error.Message == "" || strings.Contains(r.Error.Message, "passkey:") {
		tb.Fatalf("message %q is not the fixed client message", r.Error.Message)
	}
}

// trades counts the trades executed for principal p.
func (h *vharness) trades(tb testing.TB, p string) int {
	tb.Helper()
	es, err := h.env.ledger.Entries(context.Background(), "trade")
	if err != nil {
		tb.Fatal(err)
	}
	n := 0
	for _, e := range es {
		if e.Principal == p {
			n++
		}
	}
	return n
}

func trade(qty float64) map[string]any {
	return map[string]any{"symbol": "AAPL", "side": "buy", "quantity": qty, "limit": 150}
}

// The reference's tests, ported: each names the reference test it matches.

// Reference: capability declared (extensions.verifiedApproval = {}), in
// initialize and in server/discover; and absent without a passkey service.
func TestVerifiedCapability(t *testing.T) {
	h := newVerifiedHarness(t)
	p := freshPrincipal(t, "a")
	var init struct {
		Capabilities struct {
			Extensions map[string]json.RawMessage `json:"extensions"`
		} `json:"capabilities"`
	}
	h.do(t, call{token: tok(p), method: "initialize", params: map[string]any{
		"protocolVersion": "2025-11-25", "capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "raw", "version": "1"},
	}, headers: map[string]string{"Mcp-Protocol-Version": ""}}).ok(t, &init)
	if got := string(init.Capabilities.Extensions[ExtVerifiedApproval]); got != "{}" {
		t.Errorf("initialize extensions.verifiedApproval = %q, want {}", got)
	}
	var disc struct {
		Capabilities struct {
			Extensions map[string]json.RawMessage `json:"extensions"`
		} `json:"capabilities"`
	}
	h.do(t, call{token: tok(p), era: tasks.Era2026, method: "server/discover"}).ok(t, &disc)
	if got := string(disc.Capabilities.Extensions[ExtVerifiedApproval]); got != "{}" {
		t.Errorf("server/discover extensions.verifiedApproval = %q, want {}", got)
	}

	// Without passkeys: no capability, and the methods are -32601.
	plain := newHarness(t, nil)
	for _, m := range []string{methodEnrollBegin, methodEnrollFinish, methodChallengeCreate} {
		plain.do(t, call{token: tok(p), method: m, params: map[string]any{}}).fails(t, http.StatusOK, codeMethodNotFound)
	}
	// And a verify decision there is a denial that never runs.
	var res toolCallResult
	plain.do(t, call{token: tok(p), method: "tools/call", params: map[string]any{"name": "place_trade", "arguments": trade(1)}}).ok(t, &res)
	if !res.IsError || !strings.Contains(res.text(), "verified approval") {
		t.Errorf("place_trade without passkeys = %+v", res)
	}
}

// The annotation is policy's: place_trade carries it (cross-platform), a
// tool policy allows does not, in both eras.
func TestVerifiedToolAnnotation(t *testing.T) {
	h := newVerifiedHarness(t)
	p := freshPrincipal(t, "a")
	for _, era := range []tasks.Era{tasks.Era2025, tasks.Era2026} {
		var list struct {
			Tools []struct {
				Name      string                     `json:"name"`
				Meta      map[string]json.RawMessage `json:"_meta"`
				Execution struct {
					TaskSupport string `json:"taskSupport"`
				} `json:"execution"`
			} `json:"tools"`
		}
		h.do(t, call{token: tok(p), era: era, method: "tools/list"}).ok(t, &list)
		seen := 0
		for _, tl := range list.Tools {
			ann, has := tl.Meta[MetaVerifiedApproval]
			switch tl.Name {
			case "place_trade":
				seen++
				if string(ann) != `{"authenticatorClass":"cross-platform","required":"verified"}` {
					t.Errorf("%s: place_trade annotation = %s", era, ann)
				}
				if era == tasks.Era2025 && tl.Execution.TaskSupport != "forbidden" {
					t.Errorf("place_trade taskSupport = %q, want forbidden: the call answers at once", tl.Execution.TaskSupport)
				}
			default:
				if has {
					t.Errorf("%s: %s annotated %s", era, tl.Name, ann)
				}
			}
		}
		if seen != 1 {
			t.Errorf("%s: place_trade listed %d times", era, seen)
		}
	}
}

// A tools/list that policy annotates per caller is not for shared caches:
// cacheScope "private" (2026-07-28, SEP-2549); without verified approval
// the list is the same for everyone and stays "public".
func TestVerifiedToolListIsPrivate(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    *harness
		want string
	}{
		{"verified approval", newVerifiedHarness(t).harness, "private"},
		{"none", newHarness(t, nil), "public"},
	} {
		var list struct {
			CacheScope string `json:"cacheScope"`
		}
		tc.h.do(t, call{token: tok(freshPrincipal(t, "a")), era: tasks.Era2026, method: "tools/list"}).ok(t, &list)
		if list.CacheScope != tc.want {
			t.Errorf("%s: cacheScope %q, want %q", tc.name, list.CacheScope, tc.want)
		}
	}
}

// Reference: enrollment stores a credential; the options require user
// verification and list excludeCredentials (empty at first, then the
// enrolled passkey).
func TestVerifiedEnrollment(t *testing.T) {
	h := newVerifiedHarness(t)
	p := freshPrincipal(t, "a")
	raw, _ := h.beginOptions(t, p)
	sel, _ := raw["authenticatorSelection"].(map[string]any)
	if sel["userVerification"] != "required" {
		t.Errorf("authenticatorSelection = %v", sel)
	}
	if ex, ok := raw["excludeCredentials"].([]any); !ok || len(ex) != 0 {
		t.Errorf("excludeCredentials = %v, want []", raw["excludeCredentials"])
	}
	k := h.enroll(t, p, "usb")
	// An approver credential like any other: on an approver mapped to the
	// principal, where admins see it.
	as, err := h.pk.Approvers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, a := range as {
		if a.MappedTo(p) {
			found = len(a.CredentialIDs) == 1 && a.CredentialIDs[0] == k.credID
		}
	}
	if !found {
		t.Errorf("no approver mapped to %s holds %s: %+v", p, k.credID, as)
	}
	raw, _ = h.beginOptions(t, p)
	if ex, _ := raw["excludeCredentials"].([]any); len(ex) != 1 {
		t.Errorf("excludeCredentials after enrollment = %v", raw["excludeCredentials"])
	}
}

// Reference: re-enrolling an enrolled credential is
// credential_already_enrolled; a mutated clientDataJSON.challenge and a
// foreign origin are verification_failed, nothing stored; beyond it: finish
// without begin, and after its registration expired, is
// no_pending_enrollment.
func TestVerifiedEnrollmentRejections(t *testing.T) {
	h := newVerifiedHarness(t)
	p := freshPrincipal(t, "a")
	finish := func(resp any) rpc {
		return h.do(t, call{token: tok(p), method: methodEnrollFinish, params: map[string]any{"response": resp}})
	}
	wantReason(t, finish(map[string]any{}), passkey.ReasonNoPendingEnrollment)

	k := h.enroll(t, p, "usb")
	_, opts := h.beginOptions(t, p)
	opts.ExcludeCredentials = nil // a client that ignores excludeCredentials
	wantReason(t, finish(attest(t, testRP, k.auth, k.cred, *opts, "usb")), passkey.ReasonCredentialAlreadyEnrolled)

	fresh := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(opts.UserID)})
	cred := testpasskey.NewEC2Credential()
	bad := *opts
	bad.Challenge = append([]byte(nil), opts.Challenge...)
	bad.Challenge[0] ^= 1
	wantReason(t, finish(attest(t, testRP, fresh, cred, bad, "usb")), passkey.ReasonVerificationFailed)
	foreign := testRP
	foreign.Origin = "https://evil.example"
	wantReason(t, finish(attest(t, foreign, fresh, cred, *opts, "usb")), passkey.ReasonVerificationFailed)
	wantReason(t, finish("not an object"), passkey.ReasonVerificationFailed)
	if ids := h.credentialsOf(t, p); len(ids) != 1 {
		t.Errorf("credentials after rejections = %v, want only the first", ids)
	}
	// The registration is still pending after failures; it expires.
	h.clock.Advance(6 * time.Minute)
	wantReason(t, finish(attest(t, testRP, fresh, cred, *opts, "usb")), passkey.ReasonNoPendingEnrollment)
}

func (h *vharness) credentialsOf(tb testing.TB, p string) []string {
	tb.Helper()
	as, err := h.pk.Approvers(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	var ids []string
	for _, a := range as {
		if a.MappedTo(p) {
			ids = append(ids, a.CredentialIDs...)
		}
	}
	return ids
}

// Reference: happy path; wire challenge is 86 base64url characters
// (nonce ‖ action hash) with userVerification "required" and non-empty
// allowCredentials; argument tampering is argument_hash_mismatch; replay is
// challenge_consumed. Both eras.
func TestVerifiedHappyTamperReplay(t *testing.T) {
	h := newVerifiedHarness(t)
	for _, era := range []tasks.Era{tasks.Era2025, tasks.Era2026} {
		t.Run(string(era), func(t *testing.T) {
			p := freshPrincipal(t, "a")
			k := h.enroll(t, p, "hybrid", "internal")
			env := h.challenge(t, p, trade(100))
			ro := env.RequestOptions
			if len(ro.Challenge) != 86 || ro.UserVerification != "required" || len(ro.AllowCredentials) != 1 || ro.AllowCredentials[0].ID != k.credID {
				t.Fatalf("requestOptions = %+v", ro)
			}
			if ro.RPID != testRPID || ro.Timeout != 60000 || env.DisplayText != "Buy 100 AAPL at $150" {
				t.Errorf("rpId %q timeout %d displayText %q", ro.RPID, ro.Timeout, env.DisplayText)
			}
			exp, err := time.Parse(time.RFC3339Nano, env.ExpiresAt)
			if err != nil || exp.Sub(h.clock.Now()) != passkey.DefaultInBandChallengeTTL {
				t.Errorf("expiresAt %q (%v)", env.ExpiresAt, err)
			}
			wire, _ := base64.RawURLEncoding.DecodeString(ro.Challenge)
			hash, _ := canon.Hash("place_trade", mustJSON(t, trade(100)), "countersign-test")
			if string(wire[32:]) != string(hash[:]) {
				t.Errorf("wire challenge does not end with the action hash")
			}

			resp := k.sign(t, env)
			params := map[string]any{"name": "place_trade", "arguments": trade(1000), "_meta": map[string]any{MetaVerifiedApproval: evidenceOf(env, resp)}}
			wantReason(t, h.do(t, call{token: tok(p), era: era, method: "tools/call", params: params}), passkey.ReasonArgumentHashMismatch)
			if n := h.trades(t, p); n != 0 {
				t.Fatalf("tampered call executed %d trades", n)
			}

			params["arguments"] = trade(100)
			var res toolCallResult
			h.do(t, call{token: tok(p), era: era, method: "tools/call", params: params}).ok(t, &res)
			if res.IsError || !strings.Contains(res.text(), "Placed buy 100 AAPL @ 150 (id ") || res.Meta[tasks.MetaDisposition] != string(tasks.ApprovedExecuted) {
				t.Fatalf("result = %+v", res)
			}
			var sc struct {
				Success bool   `json:"success"`
				TradeID string `json:"tradeId"`
			}
			if err := json.Unmarshal(res.StructuredContent, &sc); err != nil || !sc.Success || sc.TradeID == "" {
				t.Errorf("structuredContent = %s", res.StructuredContent)
			}
			if era == tasks.Era2026 && res.ResultType != "complete" {
				t.Errorf("resultType = %q", res.ResultType)
			}
			if n := h.trades(t, p); n != 1 {
				t.Fatalf("trades = %d, want 1", n)
			}

			wantReason(t, h.do(t, call{token: tok(p), era: era, method: "tools/call", params: params}), passkey.ReasonChallengeConsumed)
			if n := h.trades(t, p); n != 1 {
				t.Fatalf("replay executed: trades = %d", n)
			}
		})
	}
}

// TestVerifiedChallengeRate: one principal's in-band challenges are
// bounded (ChallengesPerMinute, ChallengeBurst), new arguments or not;
// over the bound approval/challenge/create answers CodeTooManyRequests (a
// refusal for load: SEP-2672's -32001 has no reason for it) and creates
// nothing, while another principal is not slowed. A call policy does not
// gate spends nothing.
func TestVerifiedChallengeRate(t *testing.T) {
	h := newVerifiedHarness(t, func(o *Options) { o.ChallengesPerMinute, o.ChallengeBurst = 1, 3 })
	p, q := freshPrincipal(t, "a"), freshPrincipal(t, "b")
	h.enroll(t, p, "usb")
	h.enroll(t, q, "usb")
	wantReason(t, h.challengeRPC(t, p, "list_transfers", map[string]any{}), passkey.ReasonToolNotApprovalRequired)
	for i := range 3 {
		h.challenge(t, p, trade(float64(100+i)))
	}
	r := h.challengeRPC(t, p, "place_trade", trade(200))
	r.fails(t, http.StatusOK, CodeTooManyRequests)
	if r.Error.Message != msgChallengeRate || r.Error.Data != nil {
		t.Errorf("message %q, data %s", r.Error.Message, r.Error.Data)
	}
	h.challenge(t, q, trade(200))
}

// An assertion over quantity 100 binds the action hash of 100; a quantity
// that JCS rounds to 100 would have carried the same hash. Neither a
// challenge nor a verified call accepts it, and the challenge stays
// unconsumed.
func TestVerifiedInexactNumber(t *testing.T) {
	h := newVerifiedHarness(t)
	p := freshPrincipal(t, "a")
	k := h.enroll(t, p, "hybrid", "internal")
	inexact := json.RawMessage(`{"symbol":"AAPL","side":"buy","quantity":100.00000000000000001,"limit":150}`)
	h.challengeRPC(t, p, "place_trade", inexact).fails(t, http.StatusOK, codeInvalidParams)

	env := h.challenge(t, p, trade(100))
	evidence := evidenceOf(env, k.sign(t, env))
	r := h.callWith(t, p, inexact, evidence)
	r.fails(t, http.StatusOK, codeInvalidParams)
	if !strings.Contains(r.Error.Message, `number 100.00000000000000001 at "/quantity"`) {
		t.Errorf("message %q", r.Error.Message)
	}
	if n := h.trades(t, p); n != 0 {
		t.Fatalf("the refused call executed %d trades", n)
	}
	// The challenge was not consumed: the signed call runs, once.
	var res toolCallResult
	h.callWith(t, p, trade(100), evidence).ok(t, &res)
	if res.IsError || h.trades(t, p) != 1 {
		t.Fatalf("signed call after the refusal: %+v", res)
	}
}

func mustJSON(tb testing.TB, v any) json.RawMessage {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// Reference: an internal-only credential is excluded for a cross-platform
// tool (no_eligible_credential at issuance).
func TestVerifiedAuthenticatorClass(t *testing.T) {
	h := newVerifiedHarness(t)
	p := freshPrincipal(t, "a")
	h.enroll(t, p, "internal")
	wantReason(t, h.challengeRPC(t, p, "place_trade", trade(1)), passkey.ReasonNoEligibleCredential)
	// A cross-platform passkey enrolled too: only it is allowed.
	k := h.enroll(t, p, "usb")
	env := h.challenge(t, p, trade(1))
	if len(env.RequestOptions.AllowCredentials) != 1 || env.RequestOptions.AllowCredentials[0].ID != k.credID {
		t.Errorf("allowCredentials = %+v, want only %s", env.RequestOptions.AllowCredentials, k.credID)
	}
}

// At verification too: an internal-only passkey answering a cross-platform
// tool's challenge (issued to the principal's cross-platform passkey) is
// authenticator_class_mismatch, and the challenge stays usable.
func TestVerifiedAuthenticatorClassAtVerification(t *testing.T) {
	h := newVerifiedHarness(t)
	p := freshPrincipal(t, "a")
	internalOnly := h.enroll(t, p, "internal")
	k := h.enroll(t, p, "usb")
	env := h.challenge(t, p, trade(1))
	wantReason(t, h.callWith(t, p, trade(1), evidenceOf(env, internalOnly.sign(t, env))), passkey.ReasonAuthenticatorClassMismatch)
	h.callWith(t, p, trade(1), evidenceOf(env, k.sign(t, env))).ok(t, nil)
	if n := h.trades(t, p); n != 1 {
		t.Errorf("trades = %d", n)
	}
}

// §4.7 defines the cross-platform class by what it admits: a passkey whose
// transports include hybrid, usb, nfc or ble. One enrolled without
// transports (a client that does not report getTransports()) is not
// admitted, as in the reference: no_eligible_credential at issuance, and
// authenticator_class_mismatch when it answers a challenge issued to an
// eligible passkey; the challenge stays usable.
func TestVerifiedCrossPlatformNeedsARoamingTransport(t *testing.T) {
	h := newVerifiedHarness(t)
	p := freshPrincipal(t, "a")
	bare := h.enroll(t, p)
	wantReason(t, h.challengeRPC(t, p, "place_trade", trade(1)), passkey.ReasonNoEligibleCredential)
	k := h.enroll(t, p, "nfc")
	env := h.challenge(t, p, trade(1))
	if len(env.RequestOptions.AllowCredentials) != 1 || env.RequestOptions.AllowCredentials[0].ID != k.credID {
		t.Errorf("allowCredentials = %+v, want only %s", env.RequestOptions.AllowCredentials, k.credID)
	}
	wantReason(t, h.callWith(t, p, trade(1), evidenceOf(env, bare.sign(t, env))), passkey.ReasonAuthenticatorClassMismatch)
	h.callWith(t, p, trade(1), evidenceOf(env, k.sign(t, env))).ok(t, nil)
	if n := h.trades(t, p); n != 1 {
		t.Errorf("trades = %d, want 1", n)
	}
}

// Reference: a rewound signature counter is signature_counter_regression.
func TestVerifiedCounterRegression(t *testing.T) {
	h := newVerifiedHarness(t)
	p := freshPrincipal(t, "a")
	k := h.enroll(t, p, "usb")
	k.cred.Counter = 5
	env := h.challenge(t, p, trade(1))
	h.callWith(t, p, trade(1), evidenceOf(env, k.signWith(t, env, k.cred))).ok(t, nil)
	env = h.challenge(t, p, trade(1))
	rewound := k.cred
	rewound.Counter = 5
	wantReason(t, h.callWith(t, p, trade(1), evidenceOf(env, k.signWith(t, env, rewound))), passkey.ReasonSignatureCounterRegression)
	if n := h.trades(t, p); n != 1 {
		t.Errorf("trades = %d, want 1", n)
	}
}

// Reference: evidence method "totp" is unsupported_method; a challenge for
// a tool policy does not put under verification is
// tool_not_approved_required.
func TestVerifiedUnsupportedMethodAndUnannotatedTool(t *testing.T) {
	h := newVerifiedHarness(t)
	p := freshPrincipal(t, "a")
	k := h.enroll(t, p, "usb")
	env := h.challenge(t, p, trade(1))
	ev := evidenceOf(env, k.sign(t, env))
	ev["method"] = "totp"
	wantReason(t, h.callWith(t, p, trade(1), ev), passkey.ReasonUnsupportedMethod)
	ev["response"] = "123456" // a TOTP code: its shape is the method's
	wantReason(t, h.callWith(t, p, trade(1), ev), passkey.ReasonUnsupportedMethod)

	wantReason(t, h.challengeRPC(t, p, "transfer_funds", map[string]any{"to": "x", "amount": 1, "currency": "EUR"}), passkey.ReasonToolNotApprovalRequired)
	wantReason(t, h.challengeRPC(t, p, "no_such_tool", map[string]any{}), passkey.ReasonToolNotApprovalRequired)
	wantReason(t, h.challengeRPC(t, p, "countersign_await", map[string]any{}), passkey.ReasonToolNotApprovalRequired)
	// Bad challenge requests are protocol errors, not approval ones.
	h.challengeRPC(t, p, "place_trade", "not an object").fails(t, http.StatusOK, codeInvalidParams)
	h.challengeRPC(t, p, "place_trade", map[string]any{"symbol": "AAPL"}).fails(t, http.StatusOK, codeInvalidParams)
	h.do(t, call{token: tok(p), method: methodChallengeCreate, params: map[string]any{}}).fails(t, http.StatusOK, codeInvalidParams)
}

// Beyond the reference: every reason it leaves untested, each with nothing
// executed and the challenge still usable afterwards.
func TestVerifiedUntestedReasons(t *testing.T) {
	h := newVerifiedHarness(t)
	p := freshPrincipal(t, "a")
	k := h.enroll(t, p, "usb")
	ctx := context.Background()

	t.Run("missing_evidence", func(t *testing.T) {
		wantReason(t, h.tradeCall(t, p, trade(1), nil), passkey.ReasonMissingEvidence)
		wantReason(t, h.tradeCall(t, p, trade(1), map[string]any{"other": 1}), passkey.ReasonMissingEvidence)
	})
	t.Run("challenge_unknown", func(t *testing.T) {
		env := h.challenge(t, p, trade(1))
		resp := k.sign(t, env)
		for _, id := range []string{strings.Repeat("0", 32), "not-hex", strings.Repeat("z", 5000)} {
			wantReason(t, h.callWith(t, p, trade(1), map[string]any{"method": "webauthn", "challengeId": id, "response": resp}), passkey.ReasonChallengeUnknown)
		}
		// A challenge issued to another principal is not this one's.
		other := freshPrincipal(t, "b")
		ko := h.enroll(t, other, "usb")
		envO := h.challenge(t, other, trade(1))
		wantReason(t, h.callWith(t, p, trade(1), evidenceOf(envO, ko.sign(t, envO))), passkey.ReasonChallengeUnknown)
	})
	t.Run("challenge_expired", func(t *testing.T) {
		env := h.challenge(t, p, trade(1))
		resp := k.sign(t, env)
		h.clock.Advance(passkey.DefaultInBandChallengeTTL)
		wantReason(t, h.callWith(t, p, trade(1), evidenceOf(env, resp)), passkey.ReasonChallengeExpired)
	})
	t.Run("challenge_wrong_tool", func(t *testing.T) {
		hash, _ := canon.Hash("other_tool", json.RawMessage(`{}`), "countersign-test")
		ch, err := h.pk.IssueChallenge(ctx, passkey.ChallengeRequest{Tool: "other_tool", ActionHash: hash, Principal: p, DisplayText: "Other"})
		if err != nil {
			t.Fatal(err)
		}
		env := challengeEnv{ChallengeID: ch.ID}
		env.RequestOptions.Challenge = base64.RawURLEncoding.EncodeToString(ch.RequestOptions.Challenge)
		wantReason(t, h.callWith(t, p, trade(1), evidenceOf(env, k.sign(t, env))), passkey.ReasonChallengeWrongTool)
	})
	t.Run("unknown_credential", func(t *testing.T) {
		env := h.challenge(t, p, trade(1))
		stranger := &vkit{auth: virtualwebauthn.NewAuthenticator(), cred: testpasskey.NewEC2Credential()}
		stranger.auth.AddCredential(stranger.cred)
		wantReason(t, h.callWith(t, p, trade(1), evidenceOf(env, stranger.sign(t, env))), passkey.ReasonUnknownCredential)
		h.callWith(t, p, trade(1), evidenceOf(env, k.sign(t, env))).ok(t, nil)
	})
	t.Run("signature_verification_failed", func(t *testing.T) {
		env := h.challenge(t, p, trade(2))
		resp := k.sign(t, env)
		flipped := testpasskey.FlipSignature(t, mustJSON(t, resp))
		wantReason(t, h.callWith(t, p, trade(2), evidenceOf(env, json.RawMessage(flipped))), passkey.ReasonSignatureVerificationFailed)
		// Signed for another relying party.
		foreign := testRP
		foreign.ID = "evil.example"
		challenge, _ := base64.RawURLEncoding.DecodeString(env.RequestOptions.Challenge)
		k.cred.Counter++
		var m map[string]any
		_ = json.Unmarshal([]byte(virtualwebauthn.CreateAssertionResponse(foreign, k.auth, k.cred, virtualwebauthn.AssertionOptions{Challenge: challenge, RelyingPartyID: "evil.example"})), &m)
		wantReason(t, h.callWith(t, p, trade(2), evidenceOf(env, m)), passkey.ReasonSignatureVerificationFailed)
		// Verify before consume: the legitimate call still runs.
		h.callWith(t, p, trade(2), evidenceOf(env, resp)).ok(t, nil)
	})
	if n := h.trades(t, p); n != 2 {
		t.Errorf("trades = %d, want 2 (the two legitimate calls)", n)
	}
}

// The client data the passkey signed is checked too (WebAuthn §7.2 steps
// 10-13): an assertion whose signature verifies but whose clientDataJSON
// is of a registration, names another challenge or origin, or comes from
// a cross-origin frame is signature_verification_failed, and the challenge
// stays usable. Members a browser adds on its own are no reason to refuse.
func TestVerifiedClientData(t *testing.T) {
	h := newVerifiedHarness(t)
	p := freshPrincipal(t, "a")
	k := h.enroll(t, p, "usb")
	env := h.challenge(t, p, trade(1))
	other := h.challenge(t, p, trade(1))
	resign := func(edit func(cd map[string]any)) json.RawMessage {
		return testpasskey.ResignClientData(t, mustJSON(t, k.sign(t, env)), k.cred, edit)
	}
	for name, edit := range map[string]func(cd map[string]any){
		"type webauthn.create": func(cd map[string]any) { cd["type"] = "webauthn.create" },
		"no type":              func(cd map[string]any) { delete(cd, "type") },
		"another challenge":    func(cd map[string]any) { cd["challenge"] = other.RequestOptions.Challenge },
		"padded challenge":     func(cd map[string]any) { cd["challenge"] = cd["challenge"].(string) + "==" },
		"another origin":       func(cd map[string]any) { cd["origin"] = "https://evil.example" },
		"cross-origin frame": func(cd map[string]any) {
			cd["crossOrigin"] = true
			cd["topOrigin"] = "https://evil.example"
		},
		"topOrigin without crossOrigin": func(cd map[string]any) { cd["topOrigin"] = testOrigin },
	} {
		t.Run(name, func(t *testing.T) {
			wantReason(t, h.callWith(t, p, trade(1), evidenceOf(env, resign(edit))), passkey.ReasonSignatureVerificationFailed)
		})
	}
	if n := h.trades(t, p); n != 0 {
		t.Fatalf("refused client data executed %d trades", n)
	}
	extra := resign(func(cd map[string]any) {
		cd["other_keys_can_be_added_here"] = "do not compare clientDataJSON against a template. See https://goo.gl/yabPex"
		cd["crossOrigin"] = false
	})
	h.callWith(t, p, trade(1), evidenceOf(env, extra)).ok(t, nil)
	if n := h.trades(t, p); n != 1 {
		t.Errorf("trades = %d, want 1", n)
	}
}

// §4.8 step 10 with user verification required: an assertion whose
// authenticator data does not assert UV (or user presence) is
// signature_verification_failed, and the challenge stays usable.
func TestVerifiedUserVerification(t *testing.T) {
	h := newVerifiedHarness(t)
	p := freshPrincipal(t, "a")
	k := h.enroll(t, p, "usb")
	env := h.challenge(t, p, trade(1))
	for name, opts := range map[string]virtualwebauthn.AuthenticatorOptions{
		"no user verification": {UserNotVerified: true},
		"no user presence":     {UserNotPresent: true},
	} {
		t.Run(name, func(t *testing.T) {
			weak := *k
			opts.UserHandle = k.auth.Options.UserHandle
			weak.auth.Options = opts
			wantReason(t, h.callWith(t, p, trade(1), evidenceOf(env, weak.sign(t, env))), passkey.ReasonSignatureVerificationFailed)
		})
	}
	h.callWith(t, p, trade(1), evidenceOf(env, k.sign(t, env))).ok(t, nil)
	if n := h.trades(t, p); n != 1 {
		t.Errorf("trades = %d, want 1", n)
	}
}

// Every malformed evidence shape is missing_evidence (oversize
// clientDataJSON too), nothing runs, and the challenge stays usable.
func TestVerifiedMalformedEvidence(t *testing.T) {
	h := newVerifiedHarness(t)
	p := freshPrincipal(t, "a")
	k := h.enroll(t, p, "usb")
	env := h.challenge(t, p, trade(1))
	resp := k.sign(t, env)
	withResp := func(mut func(r map[string]any)) map[string]any {
		var c map[string]any
		_ = json.Unmarshal(mustJSON(t, resp), &c)
		mut(c["response"].(map[string]any))
		return c
	}
	big := base64.RawURLEncoding.EncodeToString([]byte(`{"type":"webauthn.get","challenge":"` + strings.Repeat("A", 70<<10) + `"}`))
	for name, ev := range map[string]any{
		"null":                nil,
		"string":              "webauthn",
		"array":               []any{"webauthn"},
		"number":              1,
		"empty":               map[string]any{},
		"no method":           map[string]any{"challengeId": env.ChallengeID, "response": resp},
		"method not string":   map[string]any{"method": 1, "challengeId": env.ChallengeID, "response": resp},
		"no challengeId":      map[string]any{"method": "webauthn", "response": resp},
		"empty challengeId":   map[string]any{"method": "webauthn", "challengeId": "", "response": resp},
		"challengeId number":  map[string]any{"method": "webauthn", "challengeId": 7, "response": resp},
		"no response":         map[string]any{"method": "webauthn", "challengeId": env.ChallengeID},
		"null response":       map[string]any{"method": "webauthn", "challengeId": env.ChallengeID, "response": nil},
		"response string":     map[string]any{"method": "webauthn", "challengeId": env.ChallengeID, "response": "x"},
		"response empty":      map[string]any{"method": "webauthn", "challengeId": env.ChallengeID, "response": map[string]any{}},
		"no clientDataJSON":   evidenceOf(env, withResp(func(r map[string]any) { delete(r, "clientDataJSON") })),
		"bad base64":          evidenceOf(env, withResp(func(r map[string]any) { r["authenticatorData"] = "%%%" })),
		"oversize clientData": evidenceOf(env, withResp(func(r map[string]any) { r["clientDataJSON"] = big })),
	} {
		t.Run(name, func(t *testing.T) {
			wantReason(t, h.callWith(t, p, trade(1), ev), passkey.ReasonMissingEvidence)
		})
	}
	if n := h.trades(t, p); n != 0 {
		t.Fatalf("malformed evidence executed %d trades", n)
	}
	h.callWith(t, p, trade(1), evidenceOf(env, resp)).ok(t, nil)
}

// Where several checks fail at once, the SEP's order decides the reason.
func TestVerifiedCheckOrder(t *testing.T) {
	h := newVerifiedHarness(t)
	p := freshPrincipal(t, "a")
	k := h.enroll(t, p, "usb")
	internalOnly := h.enroll(t, p, "internal")
	stranger := &vkit{auth: virtualwebauthn.NewAuthenticator(), cred: testpasskey.NewEC2Credential()}
	stranger.auth.AddCredential(stranger.cred)

	// A consumed challenge, for the consumed cases.
	used := h.challenge(t, p, trade(1))
	h.callWith(t, p, trade(1), evidenceOf(used, k.sign(t, used))).ok(t, nil)

	fresh := func() challengeEnv { return h.challenge(t, p, trade(1)) }
	flip := func(m map[string]any) json.RawMessage { return testpasskey.FlipSignature(t, mustJSON(t, m)) }

	e1 := fresh()
	ev := evidenceOf(e1, k.sign(t, e1))
	ev["method"] = "totp"
	ev["challengeId"] = strings.Repeat("0", 32)
	wantReason(t, h.callWith(t, p, trade(1), ev), passkey.ReasonUnsupportedMethod) // 3 before 4

	wantReason(t, h.callWith(t, p, trade(2), evidenceOf(used, flip(k.sign(t, used)))), passkey.ReasonChallengeConsumed) // 5 before 10, 12

	e2 := fresh()
	r2 := stranger.sign(t, e2)
	h.clock.Advance(passkey.DefaultInBandChallengeTTL)
	wantReason(t, h.callWith(t, p, trade(2), evidenceOf(e2, r2)), passkey.ReasonChallengeExpired) // 6 before 8, 12

	e3 := fresh()
	wantReason(t, h.callWith(t, p, trade(2), evidenceOf(e3, stranger.sign(t, e3))), passkey.ReasonUnknownCredential) // 8 before 12
	wantReason(t, h.callWith(t, p, trade(2), evidenceOf(e3, flip(internalOnly.sign(t, e3)))), passkey.ReasonAuthenticatorClassMismatch)
	wantReason(t, h.callWith(t, p, trade(2), evidenceOf(e3, flip(k.sign(t, e3)))), passkey.ReasonSignatureVerificationFailed) // 10 before 12
	rewound := k.cred
	rewound.Counter = 0
	wantReason(t, h.callWith(t, p, trade(2), evidenceOf(e3, k.signWith(t, e3, rewound))), passkey.ReasonSignatureCounterRegression) // 11 before 12
	// Verify before consume: none of these consumed e3.
	h.callWith(t, p, trade(1), evidenceOf(e3, k.sign(t, e3))).ok(t, nil)
	if n := h.trades(t, p); n != 2 {
		t.Errorf("trades = %d, want 2", n)
	}
}

// Two endpoints (each its own passkey service and NATS connection, as two
// replicas) receive the same signed call at once: exactly one runs it, the
// other answers challenge_consumed.
func TestVerifiedConcurrentConsume(t *testing.T) {
	a := newVerifiedHarness(t)
	b := newVerifiedHarness(t)
	p := freshPrincipal(t, "a")
	k := a.enroll(t, p, "usb")
	for round := range 5 {
		env := a.challenge(t, p, trade(float64(round+1)))
		ev := evidenceOf(env, k.sign(t, env))
		var wg sync.WaitGroup
		results := make([]rpc, 8)
		errs := make([]error, len(results))
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				h := a
				if i%2 == 1 {
					h = b
				}
				results[i], errs[i] = h.tradeTry(p, trade(float64(round+1)), map[string]any{MetaVerifiedApproval: ev})
			}()
		}
		wg.Wait()
		wins := 0
		for i, r := range results {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if r.Error == nil {
				wins++
				continue
			}
			wantReason(t, r, passkey.ReasonChallengeConsumed)
		}
		if wins != 1 {
			t.Fatalf("round %d: %d calls ran, want 1", round, wins)
		}
	}
	if n := a.trades(t, p); n != 5 {
		t.Errorf("trades = %d, want 5", n)
	}
}

// A passkey enrolled on the approver site works in-band once an admin maps
// its approver to the principal.
func TestVerifiedApproverSitePasskey(t *testing.T) {
	h := newVerifiedHarness(t)
	p := freshPrincipal(t, "a")
	ctx := context.Background()
	wantReason(t, h.challengeRPC(t, p, "place_trade", trade(1)), passkey.ReasonNoEligibleCredential)
	a, token, err := h.pk.AddApprover(ctx, "Site Approver", []string{"approvers"}, passkey.WithPrincipals(p))
	if err != nil {
		t.Fatal(err)
	}
	creation, err := h.pk.BeginEnrollment(ctx, token)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := virtualwebauthn.ParseAttestationOptions(string(mustJSON(t, creation)))
	if err != nil {
		t.Fatal(err)
	}
	k := &vkit{auth: virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(a.ID)}), cred: testpasskey.NewEC2Credential()}
	if _, err := h.pk.FinishEnrollment(ctx, token, mustJSON(t, attest(t, testRP, k.auth, k.cred, *opts, "usb"))); err != nil {
		t.Fatal(err)
	}
	k.auth.AddCredential(k.cred)
	env := h.challenge(t, p, trade(3))
	h.callWith(t, p, trade(3), evidenceOf(env, k.sign(t, env))).ok(t, nil)
	// In-band enrollment by the same principal goes onto the principal's
	// own in-band approver, never onto the admin's (whose groups decide
	// other principals' tasks): both passkeys then serve the principal.
	h.enroll(t, p, "usb")
	if ids := h.credentialsOf(t, p); len(ids) != 2 {
		t.Errorf("credentials = %v", ids)
	}
	var got passkey.Approver
	for _, ap := range mustApprovers(t, h.pk) {
		if ap.ID == a.ID {
			got = ap
		}
	}
	if diff := cmp.Diff(1, len(got.CredentialIDs)); diff != "" {
		t.Errorf("site approver credentials: %s", diff)
	}
}

func mustApprovers(tb testing.TB, pk *passkey.Service) []passkey.Approver {
	tb.Helper()
	as, err := pk.Approvers(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	return as
}

// A call whose first attempt died after the consume (and before its task)
// is recovered by the client's retry of the same signed call, and runs
// once; any other evidence for that challenge is challenge_consumed.
func TestVerifiedRetryAfterLostConsume(t *testing.T) {
	h := newVerifiedHarness(t)
	p := freshPrincipal(t, "a")
	k := h.enroll(t, p, "usb")
	env := h.challenge(t, p, trade(4))
	resp := k.sign(t, env)
	ev, err := parseEvidence(mcp.Meta{MetaVerifiedApproval: mustAny(t, evidenceOf(env, resp))})
	if err != nil {
		t.Fatal(err)
	}
	hash, _ := canon.Hash("place_trade", mustJSON(t, trade(4)), "countersign-test")
	// The first attempt: consumed, then the process died.
	if _, err := h.pk.Verify(context.Background(), passkey.VerifyRequest{ChallengeID: env.ChallengeID, Tool: "place_trade",
		ActionHash: hash, Principal: p, ConsumerKey: verifiedConsumerKey(ev), Method: "webauthn", Response: ev.response}); err != nil {
		t.Fatal(err)
	}
	// Someone else's evidence for the challenge: consumed.
	wantReason(t, h.callWith(t, p, trade(4), evidenceOf(env, json.RawMessage(testpasskey.FlipSignature(t, mustJSON(t, resp))))), passkey.ReasonChallengeConsumed)
	if n := h.trades(t, p); n != 0 {
		t.Fatalf("trades = %d", n)
	}
	// The client's retry of the same call: it runs, once.
	h.callWith(t, p, trade(4), evidenceOf(env, resp)).ok(t, nil)
	wantReason(t, h.callWith(t, p, trade(4), evidenceOf(env, resp)), passkey.ReasonChallengeConsumed)
	if n := h.trades(t, p); n != 1 {
		t.Fatalf("trades = %d, want 1", n)
	}
}

// The client's retry of a signed call whose first attempt consumed the
// challenge is held to what that call could still do: within the
// challenge's lifetime counted from the consume, and only while the passkey
// is usable. Once its task exists, the answer names it, whenever it comes.
func TestVerifiedRetryHeldToItsWindow(t *testing.T) {
	h := newVerifiedHarness(t)
	ctx := context.Background()
	p := freshPrincipal(t, "a")
	k := h.enroll(t, p, "usb")
	consume := func(args any) (challengeEnv, map[string]any) {
		t.Helper()
		env := h.challenge(t, p, args)
		resp := k.sign(t, env)
		ev, err := parseEvidence(mcp.Meta{MetaVerifiedApproval: mustAny(t, evidenceOf(env, resp))})
		if err != nil {
			t.Fatal(err)
		}
		hash, _ := canon.Hash("place_trade", mustJSON(t, args), "countersign-test")
		// The first attempt consumed the challenge, then died (or was
		// refused) before its task.
		if _, err := h.pk.Verify(ctx, passkey.VerifyRequest{ChallengeID: env.ChallengeID, Tool: "place_trade",
			ActionHash: hash, Principal: p, ConsumerKey: verifiedConsumerKey(ev), Method: "webauthn", Response: ev.response}); err != nil {
			t.Fatal(err)
		}
		return env, resp
	}

	// Past the window: consumed, and nothing runs.
	env, resp := consume(trade(5))
	h.clock.Advance(passkey.DefaultInBandChallengeTTL)
	late := h.callWith(t, p, trade(5), evidenceOf(env, resp))
	wantReason(t, late, passkey.ReasonChallengeConsumed)
	if strings.Contains(string(late.Error.Data), "taskId") {
		t.Errorf("no task was opened, yet the answer names one: %s", late.Error.Data)
	}

	// Once its task exists, a late retry is told which task it is.
	env, resp = consume(trade(6))
	h.callWith(t, p, trade(6), evidenceOf(env, resp)).ok(t, nil)
	h.clock.Advance(passkey.DefaultInBandChallengeTTL)
	named := h.callWith(t, p, trade(6), evidenceOf(env, resp))
	wantReason(t, named, passkey.ReasonChallengeConsumed)
	if want := verifiedTaskID(env.ChallengeID); !strings.Contains(string(named.Error.Data), want) {
		t.Errorf("data = %s, want taskId %s", named.Error.Data, want)
	}

	// Within the window, after an admin revoked the passkey: refused (as
	// a passkey not enrolled, SEP-2672's reason), and nothing runs.
	env, resp = consume(trade(7))
	var approverID string
	for _, a := range mustApprovers(t, h.pk) {
		if a.MappedTo(p) {
			approverID = a.ID
		}
	}
	if _, _, err := h.pk.SetPasskeyStatus(ctx, approverID, k.credID, passkey.ActionRevoke); err != nil {
		t.Fatal(err)
	}
	wantReason(t, h.callWith(t, p, trade(7), evidenceOf(env, resp)), passkey.ReasonUnknownCredential)
	if n := h.trades(t, p); n != 1 {
		t.Fatalf("trades = %d, want 1 (the one whose task was opened)", n)
	}
}

// mustAny round-trips v through JSON, as the SDK hands _meta to the server.
func mustAny(tb testing.TB, v any) any {
	tb.Helper()
	var out any
	if err := json.Unmarshal(mustJSON(tb, v), &out); err != nil {
		tb.Fatal(err)
	}
	return out
}

var principalSeq atomic.Int64

// freshPrincipal is principal(tb, suffix) made unique per run: passkeys
// and trades outlive a test in the shared environment (go test -count=N).
func freshPrincipal(tb testing.TB, suffix string) string {
	return principal(tb, suffix) + "-" + strconv.FormatInt(principalSeq.Add(1), 10)
}

// TestDisplayTextCutsAtACharacter: a description over the passkey
// service's bound is cut at a character boundary, never inside one.
func TestDisplayTextCutsAtACharacter(t *testing.T) {
	long := strings.Repeat("€", 2000) // 6000 bytes; 4000 falls inside a "€"
	r, err := gateway.NewRegistry(gateway.Tool{
		Name: "wordy", InputSchema: json.RawMessage(`{"type":"object"}`),
		Describe: func(json.RawMessage) string { return long },
		Run: func(context.Context, gateway.Call) (tasks.CallToolResult, error) {
			return tasks.CallToolResult{}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := displayText(r, "wordy", json.RawMessage(`{}`))
	if !utf8.ValidString(got) || strings.ContainsRune(got, utf8.RuneError) || !strings.HasSuffix(got, "…") ||
		len(got) > 4000+len("…") || !strings.HasPrefix(long, strings.TrimSuffix(got, "…")) {
		t.Fatalf("display text of %d bytes: %q…", len(got), got[len(got)-12:])
	}
}

// TestVerifiedRetryAfterCrashBeforeRecord: a process that died after the
// first attempt of a signed call reserved its task's pending slot and before
// it wrote the task's record left the reservation behind (the task ID is
// derived from the challenge). The same signed call sent again runs, once,
// and the reservation is given back when it ends. (internal/e2e
// TestCrashVerified found this: the retry was answered challenge_consumed
// and no task existed.)
func TestVerifiedRetryAfterCrashBeforeRecord(t *testing.T) {
	h := newVerifiedHarness(t)
	ctx := context.Background()
	p := freshPrincipal(t, "a")
	k := h.enroll(t, p, "hybrid", "internal")
	env := h.challenge(t, p, trade(100))
	ev := evidenceOf(env, k.sign(t, env))
	taskID := verifiedTaskID(env.ChallengeID)
	if err := h.env.store.ReservePending(ctx, p, taskID, 100); err != nil {
		t.Fatal(err)
	}
	var res toolCallResult
	h.callWith(t, p, trade(100), ev).ok(t, &res)
	if res.IsError || res.Meta[tasks.MetaDisposition] != string(tasks.ApprovedExecuted) {
		t.Fatalf("retry after the crash: %+v", res)
	}
	if n := h.trades(t, p); n != 1 {
		t.Fatalf("trades = %d, want 1", n)
	}
	wantReason(t, h.callWith(t, p, trade(100), ev), passkey.ReasonChallengeConsumed)
	if n := h.trades(t, p); n != 1 {
		t.Fatalf("trades after a replay = %d, want 1", n)
	}
	if n, err := h.env.store.PendingReserved(ctx, p); err != nil || n != 0 {
		t.Errorf("pending reservations after the task ended: %d, %v; want 0", n, err)
	}
}

// TestVerifiedSameSignedCallAtOnce: the same signed call sent 10 times at
// once, 10 rounds: it runs once per round, every other answer is
// challenge_consumed naming the task, and no reservation is left behind.
func TestVerifiedSameSignedCallAtOnce(t *testing.T) {
	h := newVerifiedHarness(t)
	ctx := context.Background()
	p := freshPrincipal(t, "a")
	k := h.enroll(t, p, "hybrid", "internal")
	for round := range 10 {
		args := trade(float64(200 + round))
		env := h.challenge(t, p, args)
		ev := evidenceOf(env, k.sign(t, env))
		answers := make([]rpc, 10)
		errs := make([]error, 10)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range answers {
			wg.Go(func() {
				<-start
				answers[i], errs[i] = h.tradeTry(p, args, map[string]any{MetaVerifiedApproval: ev})
			})
		}
		close(start)
		wg.Wait()
		ran := 0
		for i, a := range answers {
			switch {
			case errs[i] != nil:
				t.Fatalf("round %d: %v", round, errs[i])
			case a.Error == nil:
				ran++
			default:
				wantReason(t, a, passkey.ReasonChallengeConsumed)
			}
		}
		if ran != 1 {
			t.Errorf("round %d: %d answers said the call ran", round, ran)
		}
		if n := h.trades(t, p); n != round+1 {
			t.Fatalf("round %d: trades = %d, want %d", round, n, round+1)
		}
	}
	if n, err := h.env.store.PendingReserved(ctx, p); err != nil || n != 0 {
		t.Errorf("pending reservations after the tasks ended: %d, %v; want 0", n, err)
	}
}

// A verified call's task ID is derived from its challenge, and the same
// signed call sent again re-opens the task when its record is missing: the
// retention sweep must not delete the record while the challenges bucket
// still remembers the consume (the replay is challenge_unknown after).
func TestRetentionGraceOutlivesChallenges(t *testing.T) {
	if tasks.RetentionGrace <= passkey.ChallengeRetention {
		t.Fatalf("tasks.RetentionGrace %s must outlive passkey.ChallengeRetention %s", tasks.RetentionGrace, passkey.ChallengeRetention)
	}
}

// TestVerifiedResultsServerInfo: on the 2026-07-28 wire the results of
// approval/enroll/begin, approval/enroll/finish and
// approval/challenge/create identify the server in _meta
// (io.modelcontextprotocol/serverInfo: servers SHOULD set it on each
// result, SEP-2575), as every other result of the endpoint does, besides
// resultType "complete"; on 2025-11-25 they carry neither.
func TestVerifiedResultsServerInfo(t *testing.T) {
	h := newVerifiedHarness(t)
	for _, era := range []tasks.Era{tasks.Era2026, tasks.Era2025} {
		t.Run(string(era), func(t *testing.T) {
			p := "serverinfo-" + string(era)
			check := func(name string, r rpc) {
				t.Helper()
				var res struct {
					Meta       map[string]json.RawMessage `json:"_meta"`
					ResultType *string                    `json:"resultType"`
				}
				r.ok(t, &res)
				_, hasInfo := res.Meta["io.modelcontextprotocol/serverInfo"]
				if era == tasks.Era2026 && (!hasInfo || res.ResultType == nil || *res.ResultType != "complete") {
					t.Errorf("%s: want _meta serverInfo and resultType complete, got %s", name, r.Result)
				}
				if era == tasks.Era2025 && (res.Meta != nil || res.ResultType != nil) {
					t.Errorf("%s: want neither _meta nor resultType, got %s", name, r.Result)
				}
			}
			begin := h.do(t, call{token: tok(p), era: era, method: methodEnrollBegin})
			check("enroll/begin", begin)
			var b struct {
				Options json.RawMessage `json:"options"`
			}
			begin.ok(t, &b)
			opts, err := virtualwebauthn.ParseAttestationOptions(string(b.Options))
			if err != nil {
				t.Fatal(err)
			}
			auth := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(opts.UserID)})
			cred := testpasskey.NewEC2Credential()
			check("enroll/finish", h.do(t, call{token: tok(p), era: era, method: methodEnrollFinish,
				params: map[string]any{"response": attest(t, testRP, auth, cred, *opts, "usb")}}))
			check("challenge/create", h.do(t, call{token: tok(p), era: era, method: methodChallengeCreate,
				params: map[string]any{"toolName": "place_trade", "arguments": trade(100)}}))
		})
	}
}

// An endpoint whose passkey service enrolls only a first passkey in-band,
// or none: approval/enroll/begin answers -32602 saying so, and nothing is
// stored.
func TestVerifiedEnrollmentPolicy(t *testing.T) {
	for _, policy := range []string{passkey.EnrollFirst, passkey.EnrollClosed} {
		t.Run(policy, func(t *testing.T) {
			h := newVerifiedHarnessWith(t, passkey.Options{InBandEnrollment: policy})
			p := freshPrincipal(t, "a")
			want := msgEnrollmentClosed
			if policy == passkey.EnrollFirst {
				h.enroll(t, p, "usb")
				want = msgNotFirstPasskey
			}
			for _, era := range []tasks.Era{tasks.Era2025, tasks.Era2026} {
				r := h.do(t, call{token: tok(p), era: era, method: methodEnrollBegin, params: map[string]any{}})
				if r.Error == nil || r.Error.Code != codeInvalidParams || r.Error.Message != want {
					t.Errorf("%s: begin answered HTTP %d %s, want %d %q", era, r.Status, r.Body, codeInvalidParams, want)
				}
			}
			stored := 0
			if policy == passkey.EnrollFirst {
				stored = 1 // the first, and only it
			}
			if n := len(h.credentialsOf(t, p)); n != stored {
				t.Errorf("%d passkeys stored, want %d", n, stored)
			}
		})
	}
}
