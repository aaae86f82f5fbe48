package passkey_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-webauthn/webauthn/protocol"
	"github.com/google/go-cmp/cmp"

	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/passkey"
)

// world is a set of approvers used by the verification tests:
//
//	alice: finance, hybrid+internal (a synced phone passkey)
//	bob:   ops, usb (a security key)
//	dave:  finance, internal only (a laptop's platform authenticator)
type world struct {
	*env
	alice, bob, dave *kit
}

func newWorld(t *testing.T) *world { return newWorldTB(t) }

func newWorldTB(tb testing.TB) *world {
	tb.Helper()
	e := newEnv(tb)
	return &world{
		env:   e,
		alice: e.enroll(tb, "alice", []string{"finance"}, "hybrid", "internal"),
		bob:   e.enroll(tb, "bob", []string{"ops"}, "usb"),
		dave:  e.enroll(tb, "dave", []string{"finance"}, "internal"),
	}
}

func TestIssueChallengeShape(t *testing.T) {
	w := newWorld(t)
	c := w.issue(t, "task-1", "finance", passkey.ClassCrossPlatform)
	ro := c.Ch.RequestOptions

	wire := base64.RawURLEncoding.EncodeToString(ro.Challenge)
	if len(wire) != 86 {
		t.Errorf("wire challenge is %d chars, want 86", len(wire))
	}
	if !bytes.Equal(ro.Challenge[32:], c.Req.ActionHash[:]) {
		t.Errorf("challenge suffix is not the action hash")
	}
	if ro.UserVerification != protocol.VerificationRequired {
		t.Errorf("userVerification = %q, want required", ro.UserVerification)
	}
	if ro.RelyingPartyID != testRPID {
		t.Errorf("rpId = %q", ro.RelyingPartyID)
	}
	// Cross-platform: alice's hybrid passkey, not dave's internal-only one,
	// nor bob's (other group).
	if len(ro.AllowedCredentials) != 1 || base64.RawURLEncoding.EncodeToString(ro.AllowedCredentials[0].CredentialID) != w.alice.CredID {
		t.Errorf("allowCredentials = %+v, want only alice's", ro.AllowedCredentials)
	}
	if want := w.clock.Now().Add(passkey.DefaultChallengeTTL); !c.Ch.ExpiresAt.Equal(want) {
		t.Errorf("expiresAt = %v, want %v", c.Ch.ExpiresAt, want)
	}
	if c.Ch.DisplayText != c.Req.DisplayText || len(c.Ch.ID) != 32 {
		t.Errorf("display text %q, id %q", c.Ch.DisplayText, c.Ch.ID)
	}

	// On the wire, as the browser sees it.
	raw, err := json.Marshal(ro)
	if err != nil {
		t.Fatal(err)
	}
	var js struct {
		Challenge        string `json:"challenge"`
		UserVerification string `json:"userVerification"`
		AllowCredentials []struct {
			ID         string   `json:"id"`
			Transports []string `json:"transports"`
		} `json:"allowCredentials"`
	}
	if err := json.Unmarshal(raw, &js); err != nil {
		t.Fatal(err)
	}
	if js.Challenge != wire || js.UserVerification != "required" || len(js.AllowCredentials) != 1 {
		t.Errorf("JSON options = %s", raw)
	}
	if diff := cmp.Diff([]string{"hybrid", "internal"}, js.AllowCredentials[0].Transports); diff != "" {
		t.Errorf("transports (-want +got):\n%s", diff)
	}

	// Platform class admits dave's passkey too; every nonce is fresh.
	p := w.issue(t, "task-1", "finance", passkey.ClassPlatform)
	if n := len(p.Ch.RequestOptions.AllowedCredentials); n != 2 {
		t.Errorf("platform allowCredentials = %d, want 2", n)
	}
	if bytes.Equal(p.Ch.RequestOptions.Challenge[:32], ro.Challenge[:32]) || p.Ch.ID == c.Ch.ID {
		t.Error("nonce or id reused across challenges")
	}
}

func TestIssueChallengeRejects(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	good := passkey.ChallengeRequest{
		TaskID: "t", Tool: "delete_resource", ActionHash: hashOf(t, "delete_resource", `{}`),
		Group: "finance", DisplayText: "Delete",
	}
	invalid := []struct {
		name string
		mut  func(*passkey.ChallengeRequest)
	}{
		{"no task", func(r *passkey.ChallengeRequest) { r.TaskID = "" }},
		{"no tool", func(r *passkey.ChallengeRequest) { r.Tool = "" }},
		{"zero hash", func(r *passkey.ChallengeRequest) { r.ActionHash = canon.ActionHash{} }},
		{"no group", func(r *passkey.ChallengeRequest) { r.Group = "" }},
		{"bad group", func(r *passkey.ChallengeRequest) { r.Group = "fin ance" }},
		{"unknown class", func(r *passkey.ChallengeRequest) { r.AuthenticatorClass = "roaming" }},
		{"no display text", func(r *passkey.ChallengeRequest) { r.DisplayText = "" }},
	}
	for _, tt := range invalid {
		t.Run(tt.name, func(t *testing.T) {
			r := good
			tt.mut(&r)
			if _, err := w.svc.IssueChallenge(ctx, r); !errors.Is(err, passkey.ErrInvalidArgument) {
				t.Fatalf("IssueChallenge = %v, want ErrInvalidArgument", err)
			}
		})
	}

	// No approver with a passkey in the group.
	r := good
	r.Group = "legal"
	_, err := w.svc.IssueChallenge(ctx, r)
	wantReason(t, err, passkey.ReasonNoEligibleCredential)

	// Only an internal-only passkey in the group.
	w.enroll(t, "erin", []string{"laptops"}, "internal")
	r.Group = "laptops"
	_, err = w.svc.IssueChallenge(ctx, r)
	wantReason(t, err, passkey.ReasonNoEligibleCredential)
	r.AuthenticatorClass = passkey.ClassPlatform
	if _, err := w.svc.IssueChallenge(ctx, r); err != nil {
		t.Fatalf("platform class: %v", err)
	}
}

func TestVerifyHappyPath(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	c := w.issue(t, "task-1", "finance", "")
	resp := w.alice.sign(t, w.rp, c.Ch)
	v, err := w.svc.Verify(ctx, c.verifyReq(resp))
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	want := passkey.Verified{
		ApproverID:   w.alice.A.ID,
		ApproverName: "alice",
		CredentialID: w.alice.CredID,
		SignCount:    w.alice.Cred.Counter,
		ChallengeID:  c.Ch.ID,
	}
	got := v
	got.PublicKey, got.AuthenticatorData, got.ClientDataJSON, got.Signature = nil, nil, nil, nil
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Verified (-want +got):\n%s", diff)
	}
	if len(v.PublicKey) == 0 || len(v.AuthenticatorData) < 37 || len(v.Signature) == 0 {
		t.Errorf("raw assertion parts missing: pk %d, authData %d, sig %d", len(v.PublicKey), len(v.AuthenticatorData), len(v.Signature))
	}
	var cd struct{ Challenge, Type string }
	if err := json.Unmarshal(v.ClientDataJSON, &cd); err != nil {
		t.Fatal(err)
	}
	if cd.Type != "webauthn.get" || cd.Challenge != base64.RawURLEncoding.EncodeToString(c.Ch.RequestOptions.Challenge) {
		t.Errorf("clientDataJSON = %s", v.ClientDataJSON)
	}

	// A replay of the same assertion by anyone else is refused.
	replay := c.verifyReq(resp)
	replay.ConsumerKey = "someone-else"
	_, err = w.svc.Verify(ctx, replay)
	wantReason(t, err, passkey.ReasonChallengeConsumed)
	replay.ConsumerKey = ""
	_, err = w.svc.Verify(ctx, replay)
	wantReason(t, err, passkey.ReasonChallengeConsumed)
}

func TestVerifyMethodDefaultsToWebAuthn(t *testing.T) {
	w := newWorld(t)
	c := w.issue(t, "task-1", "finance", "")
	req := c.verifyReq(w.alice.sign(t, w.rp, c.Ch))
	req.Method = ""
	req.ConsumerKey = ""
	if _, err := w.svc.Verify(context.Background(), req); err != nil {
		t.Fatalf("Verify: %v", err)
	}
}

func TestVerifyWithoutUserHandle(t *testing.T) {
	w := newWorld(t)
	c := w.issue(t, "task-1", "finance", "")
	k := *w.alice
	k.Auth.Options.UserHandle = nil // non-discoverable credentials send none
	if _, err := w.svc.Verify(context.Background(), c.verifyReq(k.sign(t, w.rp, c.Ch))); err != nil {
		t.Fatalf("Verify: %v", err)
	}
}

// mangle edits the assertion JSON.
func mangle(t *testing.T, resp json.RawMessage, edit func(m map[string]any, r map[string]any)) json.RawMessage {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(resp, &m); err != nil {
		t.Fatal(err)
	}
	edit(m, m["response"].(map[string]any))
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestVerifyReasons covers every §4.8 rejection (and ours). Each case gets
// its own challenge; unless the challenge itself is unusable, a valid
// assertion from alice must still succeed afterwards: failures never consume.
func TestVerifyReasons(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()

	// Give alice a high stored counter so regressions are detectable.
	warm := w.issue(t, "warm-up", "finance", "")
	w.alice.Cred.Counter = 999
	if _, err := w.svc.Verify(ctx, warm.verifyReq(w.alice.sign(t, w.rp, warm.Ch))); err != nil {
		t.Fatal(err)
	}

	evil := w.rp
	evil.Origin = "https://evil.example"
	otherRP := w.rp
	otherRP.ID = "evil.example"
	stranger := testpasskey.NewEC2Credential()

	tests := []struct {
		name        string
		class       string // of the challenge
		build       func(t *testing.T, c *call) passkey.VerifyRequest
		want        string
		stillUsable bool
	}{
		{name: "empty response", want: passkey.ReasonMissingEvidence, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest { return c.verifyReq(nil) }},
		{name: "null response", want: passkey.ReasonMissingEvidence, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest { return c.verifyReq(json.RawMessage(`null`)) }},
		{name: "array response", want: passkey.ReasonMissingEvidence, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest { return c.verifyReq(json.RawMessage(`[]`)) }},
		{name: "truncated json", want: passkey.ReasonMissingEvidence, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest { return c.verifyReq(json.RawMessage(`{"id":`)) }},
		{name: "empty object", want: passkey.ReasonMissingEvidence, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest { return c.verifyReq(json.RawMessage(`{}`)) }},
		{name: "id not matching rawId", want: passkey.ReasonMissingEvidence, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				return c.verifyReq(mangle(t, w.alice.sign(t, w.rp, c.Ch), func(m, _ map[string]any) { m["rawId"] = "AAAA" }))
			}},
		{name: "authenticatorData not base64url", want: passkey.ReasonMissingEvidence, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				return c.verifyReq(mangle(t, w.alice.sign(t, w.rp, c.Ch), func(_, r map[string]any) { r["authenticatorData"] = "!!" }))
			}},
		{name: "no challenge id", want: passkey.ReasonMissingEvidence, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				r := c.verifyReq(w.alice.sign(t, w.rp, c.Ch))
				r.ChallengeID = ""
				return r
			}},
		{name: "unsupported method", want: passkey.ReasonUnsupportedMethod, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				r := c.verifyReq(w.alice.sign(t, w.rp, c.Ch))
				r.Method = "totp"
				return r
			}},
		{name: "unknown challenge", want: passkey.ReasonChallengeUnknown, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				r := c.verifyReq(w.alice.sign(t, w.rp, c.Ch))
				r.ChallengeID = "00000000000000000000000000000000"
				return r
			}},
		{name: "malformed challenge id", want: passkey.ReasonChallengeUnknown, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				r := c.verifyReq(w.alice.sign(t, w.rp, c.Ch))
				r.ChallengeID = "countersign_challenges.>"
				return r
			}},
		{name: "consumed", want: passkey.ReasonChallengeConsumed,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				if _, err := w.svc.Verify(ctx, c.verifyReq(w.alice.sign(t, w.rp, c.Ch))); err != nil {
					t.Fatal(err)
				}
				r := c.verifyReq(w.alice.sign(t, w.rp, c.Ch))
				r.ConsumerKey = "second"
				return r
			}},
		{name: "expired", want: passkey.ReasonChallengeExpired,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				w.clock.Advance(passkey.DefaultChallengeTTL)
				return c.verifyReq(w.alice.sign(t, w.rp, c.Ch))
			}},
		{name: "wrong task", want: passkey.ReasonChallengeWrongTask, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				r := c.verifyReq(w.alice.sign(t, w.rp, c.Ch))
				r.TaskID = "another-task"
				return r
			}},
		{name: "wrong tool", want: passkey.ReasonChallengeWrongTool, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				r := c.verifyReq(w.alice.sign(t, w.rp, c.Ch))
				r.Tool = "create_resource"
				return r
			}},
		{name: "wrong decision", want: passkey.ReasonChallengeWrongDecision, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				// The challenge was issued without a decision; an approval
				// must name the decision its challenge was issued for.
				r := c.verifyReq(w.alice.sign(t, w.rp, c.Ch))
				r.Decision = "approve"
				return r
			}},
		{name: "unknown credential", want: passkey.ReasonUnknownCredential, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				return c.verifyReq(w.alice.signRaw(t, w.rp, c.Ch.RequestOptions.Challenge, stranger))
			}},
		{name: "oversized credential id", want: passkey.ReasonUnknownCredential, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				id := base64.RawURLEncoding.EncodeToString(bytes.Repeat([]byte{7}, 3000))
				return c.verifyReq(mangle(t, w.alice.sign(t, w.rp, c.Ch), func(m, _ map[string]any) { m["id"], m["rawId"] = id, id }))
			}},
		{name: "oversized response", want: passkey.ReasonMissingEvidence, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				return c.verifyReq(mangle(t, w.alice.sign(t, w.rp, c.Ch), func(m, _ map[string]any) {
					m["clientExtensionResults"] = map[string]any{"pad": string(bytes.Repeat([]byte("a"), 70<<10))}
				}))
			}},
		{name: "internal-only passkey, cross-platform call", class: passkey.ClassPlatform,
			want: passkey.ReasonAuthenticatorClassMismatch, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				r := c.verifyReq(w.dave.sign(t, w.rp, c.Ch))
				r.AuthenticatorClass = passkey.ClassCrossPlatform
				return r
			}},
		{name: "internal-only passkey, cross-platform challenge", class: passkey.ClassCrossPlatform,
			want: passkey.ReasonAuthenticatorClassMismatch, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				r := c.verifyReq(w.dave.sign(t, w.rp, c.Ch))
				r.AuthenticatorClass = passkey.ClassPlatform
				return r
			}},
		{name: "wrong origin", want: passkey.ReasonSignatureVerificationFailed, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest { return c.verifyReq(w.alice.sign(t, evil, c.Ch)) }},
		{name: "wrong rp id", want: passkey.ReasonSignatureVerificationFailed, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest { return c.verifyReq(w.alice.sign(t, otherRP, c.Ch)) }},
		{name: "user not verified", want: passkey.ReasonSignatureVerificationFailed, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				k := *w.alice
				k.Auth.Options.UserNotVerified = true
				return c.verifyReq(k.sign(t, w.rp, c.Ch))
			}},
		{name: "user handle of another approver", want: passkey.ReasonSignatureVerificationFailed, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				k := *w.alice
				k.Auth.Options.UserHandle = []byte(w.bob.A.ID)
				return c.verifyReq(k.sign(t, w.rp, c.Ch))
			}},
		{name: "signed another challenge", want: passkey.ReasonSignatureVerificationFailed, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				other := w.issue(t, c.Req.TaskID, "finance", "")
				return c.verifyReq(w.alice.sign(t, w.rp, other.Ch))
			}},
		{name: "tampered signature", want: passkey.ReasonSignatureVerificationFailed, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				return c.verifyReq(mangle(t, w.alice.sign(t, w.rp, c.Ch), func(_, r map[string]any) {
					sig, _ := base64.RawURLEncoding.DecodeString(r["signature"].(string))
					sig[len(sig)-1] ^= 1
					r["signature"] = base64.RawURLEncoding.EncodeToString(sig)
				}))
			}},
		{name: "tampered clientDataJSON", want: passkey.ReasonSignatureVerificationFailed, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				return c.verifyReq(mangle(t, w.alice.sign(t, w.rp, c.Ch), func(_, r map[string]any) {
					cd, _ := base64.RawURLEncoding.DecodeString(r["clientDataJSON"].(string))
					cd = bytes.Replace(cd, []byte(`"type"`), []byte(` "type"`), 1)
					r["clientDataJSON"] = base64.RawURLEncoding.EncodeToString(cd)
				}))
			}},
		{name: "rewound counter", want: passkey.ReasonSignatureCounterRegression, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				cred := w.alice.Cred
				cred.Counter = 500
				return c.verifyReq(w.alice.signRaw(t, w.rp, c.Ch.RequestOptions.Challenge, cred))
			}},
		{name: "repeated counter", want: passkey.ReasonSignatureCounterRegression, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				cred := w.alice.Cred
				cred.Counter = 1000 // what the warm-up stored; later successes only raised it
				return c.verifyReq(w.alice.signRaw(t, w.rp, c.Ch.RequestOptions.Challenge, cred))
			}},
		{name: "argument hash mismatch", want: passkey.ReasonArgumentHashMismatch, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				r := c.verifyReq(w.alice.sign(t, w.rp, c.Ch))
				r.ActionHash = hashOf(t, "delete_resource", `{"resourceId":"something-else"}`)
				return r
			}},
		{name: "approver outside the group", want: passkey.ReasonApproverNotEligible, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest { return c.verifyReq(w.bob.sign(t, w.rp, c.Ch)) }},
		{name: "approver in the caller's group but not the challenge's", want: passkey.ReasonApproverNotEligible, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				r := c.verifyReq(w.bob.sign(t, w.rp, c.Ch))
				r.Group = "ops"
				return r
			}},
		{name: "self approval by name", want: passkey.ReasonSelfApproval, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				r := c.verifyReq(w.alice.sign(t, w.rp, c.Ch))
				r.Requester = "Alice"
				return r
			}},
		{name: "self approval by id", want: passkey.ReasonSelfApproval, stillUsable: true,
			build: func(t *testing.T, c *call) passkey.VerifyRequest {
				r := c.verifyReq(w.alice.sign(t, w.rp, c.Ch))
				r.Requester = w.alice.A.ID
				return r
			}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := w.issue(t, "task-"+string(rune('a'+i)), "finance", tt.class)
			_, err := w.svc.Verify(ctx, tt.build(t, c))
			wantReason(t, err, tt.want)
			var pe *passkey.Error
			if errors.As(err, &pe) && pe.Message == "" {
				t.Errorf("no client message for %s", tt.want)
			}
			if !tt.stillUsable {
				return
			}
			v, err := w.svc.Verify(ctx, c.verifyReq(w.alice.sign(t, w.rp, c.Ch)))
			if err != nil {
				t.Fatalf("valid assertion after a %s rejection: %v", tt.want, err)
			}
			if v.ApproverID != w.alice.A.ID {
				t.Errorf("approved by %s", v.ApproverID)
			}
		})
	}
}

// TestVerifyOrder pairs two faults and expects the earlier check's reason.
func TestVerifyOrder(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	evil := w.rp
	evil.Origin = "https://evil.example"
	stranger := testpasskey.NewEC2Credential()
	otherHash := hashOf(t, "delete_resource", `{"resourceId":"other"}`)

	// Stored counter 50 for alice.
	warm := w.issue(t, "warm", "finance", "")
	w.alice.Cred.Counter = 49
	if _, err := w.svc.Verify(ctx, warm.verifyReq(w.alice.sign(t, w.rp, warm.Ch))); err != nil {
		t.Fatal(err)
	}
	rewound := func(t *testing.T, c *call) json.RawMessage {
		cred := w.alice.Cred
		cred.Counter = 10
		return w.alice.signRaw(t, w.rp, c.Ch.RequestOptions.Challenge, cred)
	}

	tests := []struct {
		name  string
		class string
		build func(t *testing.T, c *call) passkey.VerifyRequest
		want  string
	}{
		{"missing evidence before unsupported method", "", func(t *testing.T, c *call) passkey.VerifyRequest {
			r := c.verifyReq(nil)
			r.Method = "totp"
			return r
		}, passkey.ReasonMissingEvidence},
		{"unsupported method before unknown challenge", "", func(t *testing.T, c *call) passkey.VerifyRequest {
			r := c.verifyReq(w.alice.sign(t, w.rp, c.Ch))
			r.Method, r.ChallengeID = "totp", "ffffffffffffffffffffffffffffffff"
			return r
		}, passkey.ReasonUnsupportedMethod},
		{"consumed before expired", "", func(t *testing.T, c *call) passkey.VerifyRequest {
			if _, err := w.svc.Verify(ctx, c.verifyReq(w.alice.sign(t, w.rp, c.Ch))); err != nil {
				t.Fatal(err)
			}
			w.clock.Advance(passkey.DefaultChallengeTTL)
			r := c.verifyReq(w.alice.sign(t, w.rp, c.Ch))
			r.ConsumerKey = "late"
			return r
		}, passkey.ReasonChallengeConsumed},
		{"expired before wrong task", "", func(t *testing.T, c *call) passkey.VerifyRequest {
			w.clock.Advance(passkey.DefaultChallengeTTL + time.Second)
			r := c.verifyReq(w.alice.sign(t, w.rp, c.Ch))
			r.TaskID = "other"
			return r
		}, passkey.ReasonChallengeExpired},
		{"wrong task before wrong tool", "", func(t *testing.T, c *call) passkey.VerifyRequest {
			r := c.verifyReq(w.alice.sign(t, w.rp, c.Ch))
			r.TaskID, r.Tool = "other", "other_tool"
			return r
		}, passkey.ReasonChallengeWrongTask},
		{"wrong tool before unknown credential", "", func(t *testing.T, c *call) passkey.VerifyRequest {
			r := c.verifyReq(w.alice.signRaw(t, w.rp, c.Ch.RequestOptions.Challenge, stranger))
			r.Tool = "other_tool"
			return r
		}, passkey.ReasonChallengeWrongTool},
		{"unknown credential before signature", "", func(t *testing.T, c *call) passkey.VerifyRequest {
			return c.verifyReq(w.alice.signRaw(t, evil, c.Ch.RequestOptions.Challenge, stranger))
		}, passkey.ReasonUnknownCredential},
		{"class mismatch before signature", passkey.ClassPlatform, func(t *testing.T, c *call) passkey.VerifyRequest {
			r := c.verifyReq(w.dave.sign(t, evil, c.Ch))
			r.AuthenticatorClass = passkey.ClassCrossPlatform
			return r
		}, passkey.ReasonAuthenticatorClassMismatch},
		{"signature before counter", "", func(t *testing.T, c *call) passkey.VerifyRequest {
			cred := w.alice.Cred
			cred.Counter = 10
			return c.verifyReq(w.alice.signRaw(t, evil, c.Ch.RequestOptions.Challenge, cred))
		}, passkey.ReasonSignatureVerificationFailed},
		{"counter before argument hash", "", func(t *testing.T, c *call) passkey.VerifyRequest {
			r := c.verifyReq(rewound(t, c))
			r.ActionHash = otherHash
			return r
		}, passkey.ReasonSignatureCounterRegression},
		{"argument hash before eligibility", "", func(t *testing.T, c *call) passkey.VerifyRequest {
			r := c.verifyReq(w.bob.sign(t, w.rp, c.Ch))
			r.ActionHash = otherHash
			return r
		}, passkey.ReasonArgumentHashMismatch},
		{"eligibility before self approval", "", func(t *testing.T, c *call) passkey.VerifyRequest {
			r := c.verifyReq(w.bob.sign(t, w.rp, c.Ch))
			r.Requester = "bob"
			return r
		}, passkey.ReasonApproverNotEligible},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := w.issue(t, "order-"+string(rune('a'+i)), "finance", tt.class)
			_, err := w.svc.Verify(ctx, tt.build(t, c))
			wantReason(t, err, tt.want)
		})
	}
}

func TestVerifyIdempotentRetry(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	c := w.issue(t, "task-1", "finance", "")
	req := c.verifyReq(w.alice.sign(t, w.rp, c.Ch))
	first, err := w.svc.Verify(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	// Even after expiry, the consumer that consumed it gets the same answer.
	w.clock.Advance(time.Hour)
	again, err := w.svc.Verify(ctx, req)
	if err != nil {
		t.Fatalf("retry with the same consumer key: %v", err)
	}
	if diff := cmp.Diff(first, again); diff != "" {
		t.Errorf("retry result differs (-first +retry):\n%s", diff)
	}
	// The same key cannot be stretched over another call or credential.
	other := req
	other.TaskID = "task-2"
	_, err = w.svc.Verify(ctx, other)
	wantReason(t, err, passkey.ReasonChallengeConsumed)
	other = req
	other.ActionHash = hashOf(t, "x", `{}`)
	_, err = w.svc.Verify(ctx, other)
	wantReason(t, err, passkey.ReasonChallengeConsumed)
	other = req
	other.Response = w.dave.sign(t, w.rp, c.Ch)
	_, err = w.svc.Verify(ctx, other)
	wantReason(t, err, passkey.ReasonChallengeConsumed)
}

func TestVerifyConcurrentConsume(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	const n = 8
	for round := range 3 {
		c := w.issue(t, "race", "finance", "")
		resp := w.alice.sign(t, w.rp, c.Ch)
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			wins     int
			reasons  = map[string]int{}
			start    = make(chan struct{})
			sameKey  = round == 2 // last round: every goroutine retries with one key
			verified []passkey.Verified
		)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := c.verifyReq(resp)
				if !sameKey {
					req.ConsumerKey = "worker-" + string(rune('a'+i))
				}
				<-start
				v, err := w.svc.Verify(ctx, req)
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					wins++
					verified = append(verified, v)
					return
				}
				reasons[passkey.ReasonOf(err)]++
				if passkey.ReasonOf(err) == "" {
					t.Errorf("infrastructure error: %v", err)
				}
			}()
		}
		close(start)
		wg.Wait()
		if sameKey {
			if wins != n {
				t.Errorf("same consumer key: %d of %d succeeded (%v)", wins, n, reasons)
			}
			for _, v := range verified[1:] {
				if diff := cmp.Diff(verified[0], v); diff != "" {
					t.Errorf("idempotent results differ:\n%s", diff)
				}
			}
			continue
		}
		if wins != 1 || reasons[passkey.ReasonChallengeConsumed] != n-1 {
			t.Errorf("round %d: %d wins, reasons %v; want exactly 1 win and %d challenge_consumed", round, wins, reasons, n-1)
		}
	}
}

func TestVerifyCounter(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	verify := func(k *kit, counter uint32) error {
		c := w.issue(t, "counter", "finance", "")
		cred := k.Cred
		cred.Counter = counter
		_, err := w.svc.Verify(ctx, c.verifyReq(k.signRaw(t, w.rp, c.Ch.RequestOptions.Challenge, cred)))
		return err
	}
	// A synced passkey reporting 0 forever is fine.
	for range 2 {
		if err := verify(w.alice, 0); err != nil {
			t.Fatalf("zero counter: %v", err)
		}
	}
	// Once a counter is seen it must strictly increase, and it is stored.
	if err := verify(w.alice, 7); err != nil {
		t.Fatal(err)
	}
	wantReason(t, verify(w.alice, 7), passkey.ReasonSignatureCounterRegression)
	wantReason(t, verify(w.alice, 6), passkey.ReasonSignatureCounterRegression)
	wantReason(t, verify(w.alice, 0), passkey.ReasonSignatureCounterRegression)
	if err := verify(w.alice, 8); err != nil {
		t.Fatal(err)
	}
	wantReason(t, verify(w.alice, 8), passkey.ReasonSignatureCounterRegression)
}

// TestVerifyCounterClaim has a cloned authenticator answer many challenges
// at once, every assertion with the same signature counter, on two replicas:
// exactly one is accepted, and the others are signature_counter_regression
// and leave their challenges usable for the legitimate approver. Counters
// that are all zero (synced passkeys) are all accepted.
func TestVerifyCounterClaim(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	const n = 20
	// replicas returns two Services on w's buckets; with a gate, the n
	// verifications all read the credential before any writes it.
	replicas := func(g *gate) [2]*passkey.Service {
		var svcs [2]*passkey.Service
		for i := range svcs {
			js := w.js
			if g != nil {
				js = gatedJS{JetStream: w.js, gate: g}
			}
			svc, err := passkey.New(ctx, js, passkey.Options{RPID: testRPID, RPOrigins: []string{testOrigin}, Now: w.clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			svcs[i] = svc
		}
		return svcs
	}
	signed := func(c *call, counter uint32) passkey.VerifyRequest {
		cred := w.alice.Cred
		cred.Counter = counter
		return c.verifyReq(w.alice.signRaw(t, w.rp, c.Ch.RequestOptions.Challenge, cred))
	}
	// race verifies n assertions with counter, each over its own challenge,
	// released together, half on each replica.
	race := func(svcs [2]*passkey.Service, round string, counter uint32) ([]*call, []error) {
		calls := make([]*call, n)
		reqs := make([]passkey.VerifyRequest, n)
		for i := range n {
			calls[i] = w.issue(t, fmt.Sprintf("%s-%d", round, i), "finance", "")
			reqs[i] = signed(calls[i], counter)
		}
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, errs[i] = svcs[i%2].Verify(ctx, reqs[i])
			}()
		}
		close(start)
		wg.Wait()
		return calls, errs
	}

	_, errs := race(replicas(nil), "synced", 0)
	for i, err := range errs {
		if err != nil {
			t.Errorf("zero counter, assertion %d: %v", i, err)
		}
	}

	calls, errs := race(replicas(newGate(n)), "clone", 5)
	var wins int
	var losers []*call
	for i, err := range errs {
		switch passkey.ReasonOf(err) {
		case "":
			if err != nil {
				t.Fatalf("assertion %d: infrastructure error: %v", i, err)
			}
			wins++
		case passkey.ReasonSignatureCounterRegression:
			losers = append(losers, calls[i])
		default:
			t.Errorf("assertion %d: %v, want success or %s", i, err, passkey.ReasonSignatureCounterRegression)
		}
	}
	if wins != 1 || len(losers) != n-1 {
		t.Fatalf("same counter on %d challenges: %d accepted, %d counter regressions; want 1 and %d", n, wins, len(losers), n-1)
	}
	// The rejected assertions consumed nothing: each challenge is still
	// there for the approver's next, higher counter.
	counter := uint32(5)
	for _, c := range losers {
		counter++
		if _, err := w.svc.Verify(ctx, signed(c, counter)); err != nil {
			t.Fatalf("challenge %s after a rejected assertion, counter %d: %v", c.Ch.ID, counter, err)
		}
	}
	pks, err := w.svc.Passkeys(ctx, w.alice.A.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(pks) != 1 || pks[0].SignCount != counter {
		t.Errorf("stored passkeys %+v, want one with sign count %d", pks, counter)
	}
}

// TestVerifyCounterClaimedRetry retries an assertion whose counter claim was
// stored but whose consume was not (a store failure, a crash between the
// two), for a task decision and in-band: the retry succeeds with the same
// result, and so does a retry after the consume, while the same counter over
// another challenge is still a regression.
func TestVerifyCounterClaimedRetry(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	kv, err := w.js.KeyValue(ctx, passkey.BucketChallenges)
	if err != nil {
		t.Fatal(err)
	}
	agent := w.enrollInBand(t, "agent-a", "usb")
	tests := []struct {
		name  string
		k     *kit
		issue func(taskID string) *call
		req   func(c *call, resp json.RawMessage) passkey.VerifyRequest
	}{
		{
			name:  "task decision",
			k:     w.alice,
			issue: func(taskID string) *call { return w.issue(t, taskID, "finance", "") },
			req:   (*call).verifyReq,
		},
		{
			name: "in-band",
			k:    agent,
			issue: func(string) *call {
				c, err := w.issueInBand(t, "agent-a", "")
				if err != nil {
					t.Fatal(err)
				}
				return c
			},
			req: func(c *call, resp json.RawMessage) passkey.VerifyRequest {
				r := inBandReq(c, "agent-a", resp)
				r.ConsumerKey = "inband-" + c.Ch.ID // mcpserver derives it from the evidence
				return r
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.issue("task-1")
			unconsumed, err := kv.Get(ctx, c.Ch.ID)
			if err != nil {
				t.Fatal(err)
			}
			req := tt.req(c, tt.k.sign(t, w.rp, c.Ch))
			first, err := w.svc.Verify(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			again, err := w.svc.Verify(ctx, req)
			if err != nil {
				t.Fatalf("retry after the consume: %v", err)
			}
			if diff := cmp.Diff(first, again); diff != "" {
				t.Errorf("retry result differs (-first +retry):\n%s", diff)
			}
			// Undo the consume: the counter stays claimed, the challenge is not.
			if _, err := kv.Put(ctx, c.Ch.ID, unconsumed.Value()); err != nil {
				t.Fatal(err)
			}
			again, err = w.svc.Verify(ctx, req)
			if err != nil {
				t.Fatalf("retry after a claimed counter and a lost consume: %v", err)
			}
			if diff := cmp.Diff(first, again); diff != "" {
				t.Errorf("retry result differs (-first +retry):\n%s", diff)
			}
			other := tt.issue("task-2")
			cred := tt.k.Cred // the counter the retried assertion carried
			_, err = w.svc.Verify(ctx, tt.req(other, tt.k.signRaw(t, w.rp, other.Ch.RequestOptions.Challenge, cred)))
			wantReason(t, err, passkey.ReasonSignatureCounterRegression)
		})
	}
}

func TestVerifyRejectsBadCallerInput(t *testing.T) {
	w := newWorld(t)
	c := w.issue(t, "task-1", "finance", "")
	req := c.verifyReq(w.alice.sign(t, w.rp, c.Ch))
	req.AuthenticatorClass = "roaming"
	if _, err := w.svc.Verify(context.Background(), req); !errors.Is(err, passkey.ErrInvalidArgument) {
		t.Fatalf("unknown class: %v, want ErrInvalidArgument", err)
	}
	req.AuthenticatorClass = ""
	req.ConsumerKey = string(make([]byte, 300))
	if _, err := w.svc.Verify(context.Background(), req); !errors.Is(err, passkey.ErrInvalidArgument) {
		t.Fatalf("huge consumer key: %v, want ErrInvalidArgument", err)
	}
}

// TestSharedBuckets runs two Services (two replicas) on one NATS: a challenge
// issued by one is verified by the other, exactly once.
func TestSharedBuckets(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	replica, err := passkey.New(ctx, w.js, passkey.Options{RPID: testRPID, RPOrigins: []string{testOrigin}, Now: w.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	c := w.issue(t, "task-1", "finance", "")
	req := c.verifyReq(w.alice.sign(t, w.rp, c.Ch))
	if _, err := replica.Verify(ctx, req); err != nil {
		t.Fatalf("replica Verify: %v", err)
	}
	req.ConsumerKey = "other"
	_, err = w.svc.Verify(ctx, req)
	wantReason(t, err, passkey.ReasonChallengeConsumed)
}

func TestErrorIs(t *testing.T) {
	err := error(&passkey.Error{Reason: passkey.ReasonChallengeConsumed, Message: "x"})
	if !errors.Is(err, &passkey.Error{Reason: passkey.ReasonChallengeConsumed}) {
		t.Error("Is by reason failed")
	}
	if errors.Is(err, &passkey.Error{Reason: passkey.ReasonChallengeExpired}) {
		t.Error("Is matched another reason")
	}
	if passkey.ReasonOf(errors.New("nats down")) != "" {
		t.Error("ReasonOf invented a reason")
	}
}

// TestChallengeNonceShowsDecision: a challenge issued for a decision
// (approve or deny) has its nonce bound to that decision
// (canon.DecisionNonce), so the assertion over it shows offline which
// decision the approver signed; one that decides nothing (the inbox's)
// and an in-band one (SEP-2672 §4.4.3: a CSPRNG nonce; it only approves)
// have a random nonce. A decision other than approve or
// deny, or an in-band challenge naming one, is refused.
func TestChallengeNonceShowsDecision(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.enroll(t, "alice", []string{"finance"})
	e.enrollInBand(t, "agent-a", "usb")
	hash := hashOf(t, "delete_resource", "{}")
	group := passkey.ChallengeRequest{TaskID: "task-1", Tool: "delete_resource", ActionHash: hash, Group: "finance",
		DisplayText: "Delete", Asker: passkey.AskerApprover}
	for _, tc := range []struct {
		name     string
		req      passkey.ChallengeRequest
		decision string
	}{
		{"approve", withDecision(group, "approve"), "approve"},
		{"deny", withDecision(group, "deny"), "deny"},
		{"no decision", group, ""},
		{"in-band", passkey.ChallengeRequest{Tool: "place_trade", ActionHash: hash, Principal: "agent-a", DisplayText: "Buy"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 20 { // a random nonce matches a tag once in 2^128
				ch, err := e.svc.IssueChallenge(ctx, tc.req)
				if err != nil {
					t.Fatal(err)
				}
				if got := canon.NonceDecision(ch.RequestOptions.Challenge[:canon.NonceSize], "approve", "deny"); got != tc.decision {
					t.Fatalf("the nonce shows %q, want %q", got, tc.decision)
				}
			}
		})
	}
	for _, req := range []passkey.ChallengeRequest{
		withDecision(group, "maybe"),
		withDecision(passkey.ChallengeRequest{Tool: "place_trade", ActionHash: hash, Principal: "agent-a", DisplayText: "Buy"}, "deny"),
	} {
		if _, err := e.svc.IssueChallenge(ctx, req); !errors.Is(err, passkey.ErrInvalidArgument) {
			t.Errorf("decision %q (principal %q): %v", req.Decision, req.Principal, err)
		}
	}
}

func withDecision(req passkey.ChallengeRequest, decision string) passkey.ChallengeRequest {
	req.Decision = decision
	return req
}
