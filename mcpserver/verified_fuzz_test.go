package mcpserver

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/passkey"
)

// FuzzEvidence feeds arbitrary JSON as the tools/call evidence: the parser
// never panics; it accepts only a "webauthn" object with a challengeId and
// a response, and rejects everything else with -32001 missing_evidence or
// unsupported_method (SEP-2672 §4.8 steps 1–3).
func FuzzEvidence(f *testing.F) {
	for _, s := range []string{
		`null`, `1`, `"webauthn"`, `[]`, `{}`, `{"method":"webauthn"}`,
		`{"method":"webauthn","challengeId":"0123456789abcdef0123456789abcdef","response":{}}`,
		`{"method":"totp","challengeId":"x","response":"123456"}`,
		`{"method":"webauthn","challengeId":"","response":{}}`,
		`{"method":7,"challengeId":"x","response":{}}`,
		`{"method":"webauthn","challengeId":"x","response":null}`,
		`{"method":"webauthn","challengeId":"x","response":{"id":"a","rawId":"a","type":"public-key","response":{"clientDataJSON":"e30","authenticatorData":"AA","signature":"AA"}},"extra":[1,{"a":null}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var v any
		if json.Unmarshal(raw, &v) != nil {
			return
		}
		ev, err := parseEvidence(mcp.Meta{MetaVerifiedApproval: v})
		if err != nil {
			var re *rpcError
			if !errors.As(err, &re) || re.code != CodeApproval {
				t.Fatalf("error %v is not -32001", err)
			}
			var data struct{ Reason string }
			_ = json.Unmarshal(re.data, &data)
			if data.Reason != passkey.ReasonMissingEvidence && data.Reason != passkey.ReasonUnsupportedMethod {
				t.Fatalf("reason %q", data.Reason)
			}
			return
		}
		if ev.method != passkey.MethodWebAuthn || ev.challengeID == "" || !json.Valid(ev.response) {
			t.Fatalf("accepted %+v", ev)
		}
	})
}

// FuzzVerifiedCall sends arbitrary evidence for a real challenge through
// the endpoint: the answer is always HTTP 200 with -32001 and one of the
// §4.8 reasons, never another error, and nothing ever runs. The seeds are
// well-formed assertions over another challenge, so mutations reach the
// signature check.
func FuzzVerifiedCall(f *testing.F) {
	// The request budget is not under test: lift it.
	h := newVerifiedHarness(f, func(o *Options) { o.RequestsPerSecond, o.RequestBurst = 1e6, 1e6 })
	p := freshPrincipal(f, "a")
	k := h.enroll(f, p, "usb")
	env := h.challenge(f, p, trade(1))
	other := h.challenge(f, p, trade(1))
	f.Add([]byte(mustJSON(f, evidenceOf(env, k.sign(f, other)))))
	f.Add([]byte(mustJSON(f, evidenceOf(other, k.sign(f, env)))))
	f.Add([]byte(`{"method":"webauthn","challengeId":"` + env.ChallengeID + `","response":{"id":"AAAA","type":"public-key","response":{}}}`))
	reasons := []string{
		passkey.ReasonMissingEvidence, passkey.ReasonUnsupportedMethod, passkey.ReasonChallengeUnknown,
		passkey.ReasonChallengeConsumed, passkey.ReasonChallengeExpired, passkey.ReasonChallengeWrongTool,
		passkey.ReasonUnknownCredential, passkey.ReasonAuthenticatorClassMismatch,
		passkey.ReasonSignatureVerificationFailed, passkey.ReasonSignatureCounterRegression, passkey.ReasonArgumentHashMismatch,
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var v any
		if json.Unmarshal(raw, &v) != nil {
			return
		}
		r := h.callWith(t, p, trade(1), v)
		if r.Status != http.StatusOK || r.Error == nil || r.Error.Code != CodeApproval {
			t.Fatalf("HTTP %d: %s", r.Status, r.Body)
		}
		var data struct{ Reason string }
		_ = json.Unmarshal(r.Error.Data, &data)
		if !slices.Contains(reasons, data.Reason) {
			t.Fatalf("reason %q", data.Reason)
		}
		if n := h.trades(t, p); n != 0 {
			t.Fatalf("fuzzed evidence executed %d trades", n)
		}
	})
}
