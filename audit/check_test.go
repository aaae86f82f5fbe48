package audit

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// CheckChain with the keys is Verify for one task: the same verdict.
func TestCheckChainIsVerify(t *testing.T) {
	k := testKeys(t)
	keys := k.PublicKeys()
	honest := executedChain(t, k, "tsk_same")
	afterClaim := approvedChain(t, k, "tsk_same2", 1, "alice")
	afterClaim.claim()
	afterClaim.decide(newPasskey(t, "cred-bob"), "bob", "approve")
	for _, tc := range []struct {
		name  string
		lines [][]byte
		opts  VerifyOptions
	}{
		{"honest", honest.lines, VerifyOptions{}},
		{"dropped record", slices.Delete(slices.Clone(honest.lines), 3, 4), VerifyOptions{}},
		{"bad line", append(slices.Clone(honest.lines[:2]), []byte(`{"taskId":"tsk_same","v":1}`)), VerifyOptions{}},
		{"decision after claim", afterClaim.lines, VerifyOptions{AllowIncomplete: true}},
		{"not sealed", afterClaim.lines[:2], VerifyOptions{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := Verify(tc.lines, keys, tc.opts)
			got, _, err := CheckChain(rep.Tasks[0].TaskID, tc.lines, CheckOptions{Keys: keys, AllowIncomplete: tc.opts.AllowIncomplete})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(rep.Tasks[0], got); diff != "" {
				t.Errorf("CheckChain verdict differs from Verify's (-verify +check):\n%s", diff)
			}
		})
	}
}

// Without keys every rule but the signatures is checked.
func TestCheckChainWithoutKeys(t *testing.T) {
	k := testKeys(t)
	skip := CheckOptions{SkipSignatures: true}
	check := func(t *testing.T, taskID string, lines [][]byte, opts CheckOptions) TaskVerdict {
		t.Helper()
		v, recs, err := CheckChain(taskID, lines, opts)
		if err != nil {
			t.Fatal(err)
		}
		if v.OK && len(recs) != len(lines) {
			t.Errorf("%d records for %d lines", len(recs), len(lines))
		}
		return v
	}

	t.Run("signatures not checked", func(t *testing.T) {
		c := executedChain(t, k, "tsk_k1")
		// The outcome's signature replaced: no record links to it, so only
		// the signature could tell.
		var r Record
		if err := json.Unmarshal(c.lines[len(c.lines)-1], &r); err != nil {
			t.Fatal(err)
		}
		sig := make([]byte, ed25519.SignatureSize)
		rand.Read(sig)
		r.Sig = base64.RawURLEncoding.EncodeToString(sig)
		forged, err := canonical(r)
		if err != nil {
			t.Fatal(err)
		}
		lines := append(slices.Clone(c.lines[:len(c.lines)-1]), forged)

		if v := check(t, "tsk_k1", lines, skip); !v.OK || !v.Complete || v.Disposition != "approved-executed" ||
			!slices.Contains(v.Notes, "signatures not checked: no public keys") {
			t.Errorf("keyless verdict of a chain with a bad signature = %+v, want OK with a note", v)
		}
		if v := check(t, "tsk_k1", lines, CheckOptions{Keys: k.PublicKeys()}); v.OK || !slices.Equal(v.Rules(), []string{RuleRecordIntegrity, RuleNotSealed}) {
			t.Errorf("verdict with keys = %+v, want record-integrity and not-sealed", v)
		}
		other := testKeys(t)
		if v := check(t, "tsk_k1", c.lines, CheckOptions{Keys: other.PublicKeys()}); v.OK {
			t.Errorf("a chain signed by another key checks with keys: %+v", v)
		}
	})

	for _, tc := range []struct {
		name  string
		lines func(t *testing.T) [][]byte
		opts  CheckOptions
		rule  string
	}{
		{"broken link", func(t *testing.T) [][]byte {
			c := executedChain(t, k, "tsk_k2")
			return slices.Delete(slices.Clone(c.lines), 2, 3)
		}, skip, RuleChainLinks},
		{"record body changed and signed again", func(t *testing.T) [][]byte {
			c := executedChain(t, k, "tsk_k3")
			r := c.recs[5] // reevaluated
			r.Body = json.RawMessage(`{"allow":true,"effect":"allow","policyVersion":"pv9"}`)
			line, _, err := seal(r, testKeys(t))
			if err != nil {
				t.Fatal(err)
			}
			lines := slices.Clone(c.lines)
			lines[5] = line
			return lines
		}, skip, RuleChainLinks},
		{"unsigned record", func(t *testing.T) [][]byte {
			c := executedChain(t, k, "tsk_k4")
			r := c.recs[2]
			r.Sig = ""
			line, err := canonical(r)
			if err != nil {
				t.Fatal(err)
			}
			lines := slices.Clone(c.lines)
			lines[2] = line
			return lines
		}, skip, RuleRecordIntegrity},
		{"record of another task", func(t *testing.T) [][]byte {
			return append(executedChain(t, k, "tsk_k5").lines, executedChain(t, k, "tsk_other").lines[0])
		}, skip, RuleRecordIntegrity},
		{"decision after the claim", func(t *testing.T) [][]byte {
			c := approvedChain(t, k, "tsk_k5", 1, "alice")
			c.claim()
			c.decide(newPasskey(t, "cred-bob"), "bob", "approve")
			return c.lines
		}, CheckOptions{SkipSignatures: true, AllowIncomplete: true}, RuleDecisionAfterClaim},
		{"claimed then cancelled", func(t *testing.T) [][]byte {
			c := approvedChain(t, k, "tsk_k5", 1, "alice")
			c.claim()
			c.seal(KindCancelled, "cancelled", "")
			return c.lines
		}, skip, RuleStoppedAfterClaim},
		{"assertion over another call", func(t *testing.T) [][]byte {
			c := newMemChain(t, k, "tsk_k5", 1)
			other := c.hash
			other[0] ^= 1
			a := newPasskey(t, "c1").approve(t, "alice", "approve", other, c.at)
			c.add("d", KindDecision, Decision{Decision: "approve", Accepted: true, Approval: &a})
			return c.lines
		}, CheckOptions{SkipSignatures: true, AllowIncomplete: true}, RuleApprovalEvidence},
		{"outcome that lies", func(t *testing.T) [][]byte {
			c := newMemChain(t, k, "tsk_k5", 1)
			c.add(StepEnd, KindExpired, Ended{Status: "completed", Disposition: "denied-not-executed"})
			o, _ := BuildOutcome(c.recs, c.hashes)
			o.PolicyVersionAtExecution = "pv-forged"
			c.add(StepOutcome, KindOutcome, o)
			return c.lines
		}, skip, RuleOutcome},
		{"pending without AllowIncomplete", func(t *testing.T) [][]byte {
			return approvedChain(t, k, "tsk_k5", 1, "alice").lines
		}, skip, RuleNotSealed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := tc.lines(t)
			var r Record
			if err := json.Unmarshal(lines[0], &r); err != nil {
				t.Fatal(err)
			}
			v := check(t, r.TaskID, lines, tc.opts)
			if v.OK || !slices.Contains(v.Rules(), tc.rule) {
				t.Errorf("keyless verdict = %+v, want rule %s broken", v, tc.rule)
			}
		})
	}

	t.Run("pending with AllowIncomplete", func(t *testing.T) {
		c := approvedChain(t, k, "tsk_k6", 1, "alice")
		if v := check(t, "tsk_k6", c.lines, CheckOptions{SkipSignatures: true, AllowIncomplete: true}); !v.OK || v.Complete || v.Approvals != 1 {
			t.Errorf("pending chain = %+v, want OK and incomplete", v)
		}
	})
}

// Signatures are skipped only on request: no keys and no SkipSignatures
// (the zero value) is refused, and so are both.
func TestCheckChainOptions(t *testing.T) {
	k := testKeys(t)
	c := executedChain(t, k, "tsk_opt")
	for _, tc := range []struct {
		name string
		opts CheckOptions
		want error
	}{
		{"zero value", CheckOptions{}, ErrCheckOptions},
		{"empty keys", CheckOptions{Keys: []ed25519.PublicKey{}}, ErrCheckOptions},
		{"keys and skip", CheckOptions{Keys: k.PublicKeys(), SkipSignatures: true}, ErrCheckOptions},
		{"keys", CheckOptions{Keys: k.PublicKeys()}, nil},
		{"skip", CheckOptions{SkipSignatures: true}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, _, err := CheckChain("tsk_opt", c.lines, tc.opts)
			if !errors.Is(err, tc.want) {
				t.Fatalf("error = %v, want %v", err, tc.want)
			}
			if err == nil && !v.OK {
				t.Errorf("honest chain: %+v", v)
			}
		})
	}
	if _, _, err := CheckChain("TSK bad", c.lines, CheckOptions{SkipSignatures: true}); !errors.Is(err, ErrInvalidTaskID) {
		t.Errorf("invalid task id: error = %v", err)
	}
	if v, _, err := CheckChain("tsk_opt", nil, CheckOptions{SkipSignatures: true}); err != nil || v.OK || !strings.Contains(strings.Join(v.Problems, " "), "no valid records") {
		t.Errorf("empty chain: %+v, %v", v, err)
	}
}
