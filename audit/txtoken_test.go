package audit

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/canon"
)

const testJTI = "txt_0123456789abcdef0123456789abcdef"

// tokenChain is an honest token chain: issued, a rejection, consumed.
func tokenChain(t *testing.T, keys *Keyring) (*memChain, TokenIssued) {
	t.Helper()
	args := json.RawMessage(`{"to":"acct-1","amount":5000}`)
	h, err := canon.Hash("transfer_funds", args, "srv-test")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	env, err := NewEnvelope("transfer_funds", args, h.String(), "dev-agent", "transfer_funds", "srv-test", at, false)
	if err != nil {
		t.Fatal(err)
	}
	c := &memChain{t: t, keys: keys, taskID: testJTI, hash: h, at: at}
	iss := TokenIssued{JTI: testJTI, KeyID: "ed25519-" + "00", Envelope: env, IssuedBy: "agent:dev-agent", IssuedAt: at, ExpiresAt: at.Add(time.Minute)}
	c.add(StepTokenIssued, KindTokenIssued, iss)
	c.add("rejected-1", KindTokenRejected, TokenRejected{JTI: testJTI, ErrorType: "permission_denied", Reason: "wrong_subject", Principal: "other", Tool: "transfer_funds", ActionHash: h.String(), At: at})
	c.add(StepTokenConsumed, KindTokenConsumed, TokenConsumed{JTI: testJTI, Principal: "dev-agent", Tool: "transfer_funds", ActionHash: h.String(), At: at})
	return c, iss
}

func verdict(t *testing.T, keys *Keyring, c *memChain) TaskVerdict {
	t.Helper()
	v, _, err := CheckChain(c.taskID, c.lines, CheckOptions{Keys: keys.PublicKeys()})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestTokenChains(t *testing.T) {
	keys := testKeys(t)
	t.Run("honest", func(t *testing.T) {
		c, _ := tokenChain(t, keys)
		c.add(StepTokenResult, KindTokenResult, TokenResult{Disposition: "executed", ResultDigest: "ab", At: c.at})
		if v := verdict(t, keys, c); !v.OK || !v.Complete || v.Status != "consumed" || v.Disposition != "executed" {
			t.Fatalf("%+v", v)
		}
		// The whole export verifies too.
		if rep := Verify(c.lines, keys.PublicKeys(), VerifyOptions{}); !rep.OK {
			t.Fatalf("%+v", rep)
		}
	})
	t.Run("consumed without a result is noted, not broken", func(t *testing.T) {
		c, _ := tokenChain(t, keys)
		v := verdict(t, keys, c)
		if !v.OK || len(v.Notes) == 0 {
			t.Fatalf("%+v", v)
		}
	})
	for _, tc := range []struct {
		name string
		mut  func(c *memChain)
		rule string
	}{
		{"consumed twice", func(c *memChain) {
			c.add("consumed-2", KindTokenConsumed, TokenConsumed{JTI: testJTI, Principal: "dev-agent", Tool: "transfer_funds", ActionHash: c.hash.String()})
		}, RuleToken},
		{"two results", func(c *memChain) {
			c.add(StepTokenResult, KindTokenResult, TokenResult{Disposition: "executed"})
			c.add("result-2", KindTokenResult, TokenResult{Disposition: "executed"})
		}, RuleToken},
		{"task kind in a token chain", func(c *memChain) { c.add("claimed", KindClaimed, Policy{Allow: true}) }, RuleUnknownKind},
		{"rejection of another jti", func(c *memChain) {
			c.add("rejected-2", KindTokenRejected, TokenRejected{JTI: "txt_other", ErrorType: "x", Reason: "y"})
		}, RuleToken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := tokenChain(t, keys)
			tc.mut(c)
			if v := verdict(t, keys, c); v.OK || !slices.Contains(v.Rules(), tc.rule) {
				t.Fatalf("%+v", v)
			}
		})
	}
	t.Run("result without consumption", func(t *testing.T) {
		c, iss := tokenChain(t, keys)
		c2 := &memChain{t: t, keys: keys, taskID: testJTI, hash: c.hash, at: c.at}
		c2.add(StepTokenIssued, KindTokenIssued, iss)
		c2.add(StepTokenResult, KindTokenResult, TokenResult{Disposition: "executed"})
		if v := verdict(t, keys, c2); v.OK || !slices.Contains(v.Rules(), RuleToken) {
			t.Fatalf("%+v", v)
		}
	})
	t.Run("consumed for another call", func(t *testing.T) {
		c, iss := tokenChain(t, keys)
		c2 := &memChain{t: t, keys: keys, taskID: testJTI, hash: c.hash, at: c.at}
		c2.add(StepTokenIssued, KindTokenIssued, iss)
		c2.add(StepTokenConsumed, KindTokenConsumed, TokenConsumed{JTI: testJTI, Principal: "mallory", Tool: "transfer_funds", ActionHash: c.hash.String()})
		if v := verdict(t, keys, c2); v.OK || !slices.Contains(v.Rules(), RuleToken) {
			t.Fatalf("%+v", v)
		}
	})
	// A token runs only within its lifetime, give or take the largest
	// clock skew: a consumption outside it says an expired (or not yet
	// valid) token ran, and an issuance may not promise a longer life.
	for _, tc := range []struct {
		name     string
		life, at time.Duration // the issued lifetime; the consumption, after issuance
		ok       bool
	}{
		{"consumed at expiry plus the skew", time.Minute, time.Minute + TokenMaxSkew, true},
		{"consumed within the skew before issuance", time.Minute, -TokenMaxSkew, true},
		{"consumed after expiry", time.Minute, time.Minute + TokenMaxSkew + time.Second, false},
		{"consumed long before issuance", time.Minute, -TokenMaxSkew - time.Second, false},
		{"issued for longer than a token lives", TokenMaxLifetime + time.Second, time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, iss := tokenChain(t, keys)
			iss.ExpiresAt = iss.IssuedAt.Add(tc.life)
			c2 := &memChain{t: t, keys: keys, taskID: testJTI, hash: c.hash, at: c.at}
			c2.add(StepTokenIssued, KindTokenIssued, iss)
			c2.add(StepTokenConsumed, KindTokenConsumed, TokenConsumed{JTI: testJTI, Principal: "dev-agent", Tool: "transfer_funds",
				ActionHash: c.hash.String(), At: iss.IssuedAt.Add(tc.at)})
			v := verdict(t, keys, c2)
			if tc.ok != v.OK || (!tc.ok && !slices.Equal(v.Rules(), []string{RuleToken})) {
				t.Fatalf("ok %t, want %t: %+v", v.OK, tc.ok, v)
			}
		})
	}
	t.Run("issued with a tampered action hash", func(t *testing.T) {
		c, iss := tokenChain(t, keys)
		iss.Envelope.ActionHash = canon.ActionHash{1}.String()
		c2 := &memChain{t: t, keys: keys, taskID: testJTI, hash: c.hash, at: c.at}
		c2.add(StepTokenIssued, KindTokenIssued, iss)
		if v := verdict(t, keys, c2); v.OK || !slices.Contains(v.Rules(), RuleToken) {
			t.Fatalf("%+v", v)
		}
	})
	t.Run("a lone rejection is one record", func(t *testing.T) {
		c := &memChain{t: t, keys: keys, taskID: "txr_0123", at: time.Now().UTC()}
		c.add("rejected", KindTokenRejected, TokenRejected{ErrorType: "permission_denied", Reason: "malformed"})
		if v := verdict(t, keys, c); !v.OK || v.Disposition != "denied-not-executed" {
			t.Fatalf("%+v", v)
		}
		c.add("more", KindTokenRejected, TokenRejected{ErrorType: "permission_denied", Reason: "malformed"})
		if v := verdict(t, keys, c); v.OK {
			t.Fatalf("%+v", v)
		}
	})
}
