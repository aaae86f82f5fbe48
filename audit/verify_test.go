package audit

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/countersign/countersign/internal/canon"
)

func mustOK(t *testing.T, lines [][]byte, keys []ed25519.PublicKey) {
	t.Helper()
	rep := Verify(lines, keys, VerifyOptions{})
	if !rep.OK {
		b, _ := json.MarshalIndent(rep, "", "  ")
		t.Fatalf("honest export does not verify:\n%s", b)
	}
}

func mustFail(t *testing.T, name string, lines [][]byte, keys []ed25519.PublicKey, want string) {
	t.Helper()
	rep := Verify(lines, keys, VerifyOptions{})
	if rep.OK {
		t.Fatalf("%s: tampered export verifies", name)
	}
	if want != "" {
		b, _ := json.Marshal(rep)
		if !strings.Contains(string(b), want) {
			t.Errorf("%s: report does not mention %q: %s", name, want, b)
		}
	}
}

func TestVerifyHonestChains(t *testing.T) {
	k := testKeys(t)
	keys := k.PublicKeys()
	for _, tc := range []struct {
		name  string
		build func() *memChain
		want  string
	}{
		{"executed", func() *memChain { return executedChain(t, k, "tsk_a") }, "approved-executed"},
		{"denied by approver", func() *memChain {
			c := newMemChain(t, k, "tsk_b", 1)
			c.decide(newPasskey(t, "c1"), "alice", "deny")
			c.seal(KindDenied, "completed", "denied-not-executed")
			return c
		}, "denied-not-executed"},
		{"cancelled", func() *memChain {
			c := newMemChain(t, k, "tsk_c", 1)
			c.add("notify", KindNotified, struct{}{})
			c.seal(KindCancelled, "cancelled", "")
			return c
		}, "cancelled"},
		{"expired", func() *memChain {
			c := newMemChain(t, k, "tsk_d", 1)
			c.seal(KindExpired, "completed", "denied-not-executed")
			return c
		}, "denied-not-executed"},
		{"unattended", func() *memChain {
			c := newMemChain(t, k, "tsk_un", 0)
			c.recs, c.lines, c.hashes = nil, nil, nil
			args := json.RawMessage(`{}`)
			env, _ := NewEnvelope("deploy", args, mustHash(t, "deploy", args), "agent", "tool:deploy", "srv-test", c.at, false)
			c.add(StepRequested, KindRequested, Requested{Envelope: env, PolicyVersion: "pv"})
			c.add("reevaluated", KindReevaluated, Policy{Allow: true, PolicyVersion: "pv"})
			c.add("claimed", KindClaimed, Policy{Allow: true, PolicyVersion: "pv"})
			// What the workflow writes for an unattended task: nothing was
			// approved, so the end has no disposition.
			c.seal(KindExecuted, "completed", "")
			return c
		}, "completed"},
		{"unsigned deny", func() *memChain {
			c := newMemChain(t, k, "tsk_e", 1)
			c.add("decision/u", KindDecision, Decision{Decision: "deny", Accepted: true, Unsigned: &Unsigned{ApproverID: "a", ApproverName: "al", Via: "slack:U1"}})
			c.seal(KindDenied, "completed", "denied-not-executed")
			return c
		}, "denied-not-executed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.build()
			rep := Verify(c.lines, keys, VerifyOptions{})
			if !rep.OK || len(rep.Tasks) != 1 {
				b, _ := json.MarshalIndent(rep, "", "  ")
				t.Fatalf("does not verify:\n%s", b)
			}
			if got := rep.Tasks[0].Disposition + rep.Tasks[0].Status; !strings.Contains(got, tc.want) {
				t.Errorf("verdict %q, want %q", got, tc.want)
			}
		})
	}
}

// Every flip of every byte of every record is detected. Verify fails as
// soon as one line fails ParseRecord, so a line that fails it is a detected
// flip; every 13th flip, and any line that parses, also runs the whole Verify.
func TestVerifyDetectsEveryByteFlip(t *testing.T) {
	k := testKeys(t)
	c := executedChain(t, k, "tsk_flip")
	keys := k.PublicKeys()
	byID := map[string]ed25519.PublicKey{}
	for _, p := range keys {
		byID[KeyID(p)] = p
	}
	mustOK(t, c.lines, keys)
	n := 0
	for i, line := range c.lines {
		for j := range line {
			bit := []byte{0x01, 0x20, 0x80}[j%3]
			l := bytes.Clone(line)
			l[j] ^= bit
			n++
			_, _, err := ParseRecord(l, byID)
			if err == nil || n%13 == 0 {
				lines := slices.Clone(c.lines)
				lines[i] = l
				if Verify(lines, keys, VerifyOptions{}).OK {
					t.Fatalf("flip of bit %#x at byte %d of record %d verifies: %q", bit, j, i, l)
				}
			}
		}
	}
	t.Logf("%d flips, all detected", n)
}

func TestVerifyDetectsDropsReordersSplices(t *testing.T) {
	k := testKeys(t)
	a := executedChain(t, k, "tsk_one")
	b := executedChain(t, k, "tsk_two")
	keys := k.PublicKeys()
	mustOK(t, append(slices.Clone(a.lines), b.lines...), keys)

	for i := range a.lines {
		lines := slices.Delete(slices.Clone(a.lines), i, i+1)
		mustFail(t, "drop", lines, keys, "")
	}
	for i := 0; i+1 < len(a.lines); i++ {
		lines := slices.Clone(a.lines)
		lines[i], lines[i+1] = lines[i+1], lines[i]
		mustFail(t, "swap", lines, keys, "")
	}
	mustFail(t, "duplicate", append(slices.Clone(a.lines), a.lines[3]), keys, "")
	mustFail(t, "empty", nil, keys, "no records")

	// Splice: a's head with b's tail, and b's head with a's tail.
	mid := 4
	spliced := append(slices.Clone(a.lines[:mid]), b.lines[mid:]...)
	mustFail(t, "splice", spliced, keys, "")
	spliced = append(slices.Clone(b.lines[:mid]), a.lines[mid:]...)
	mustFail(t, "splice back", spliced, keys, "")

	// The same records re-signed by another key are not accepted.
	other := testKeys(t)
	mustFail(t, "unknown key", a.lines, other.PublicKeys(), "unknown key")
	// ... unless the auditor was given that key; rotation keeps old keys.
	if _, err := k.Rotate(); err != nil {
		t.Fatal(err)
	}
	c := executedChain(t, k, "tsk_three")
	mustOK(t, append(slices.Clone(a.lines), c.lines...), k.PublicKeys())
	mustFail(t, "old key only", append(slices.Clone(a.lines), c.lines...), keys, "unknown key")
}

// Records the key holder signed but that break the rules still fail: the
// verifier checks the story, not only the signatures.
func TestVerifyDetectsInconsistentSteps(t *testing.T) {
	k := testKeys(t)
	keys := k.PublicKeys()
	for _, tc := range []struct {
		name  string
		build func() *memChain
		want  string
	}{
		{"executed without quorum", func() *memChain {
			c := newMemChain(t, k, "tsk_q", 2)
			c.decide(newPasskey(t, "c1"), "alice", "approve")
			c.add("reevaluated", KindReevaluated, Policy{Allow: true, PolicyVersion: "p"})
			c.add("claimed", KindClaimed, Policy{Allow: true, PolicyVersion: "p"})
			c.seal(KindExecuted, "completed", "approved-executed")
			return c
		}, "quorum is 2"},
		{"same approver twice", func() *memChain {
			c := newMemChain(t, k, "tsk_q2", 2)
			p := newPasskey(t, "c1")
			c.decide(p, "alice", "approve")
			c.decide(p, "alice", "approve")
			c.add("reevaluated", KindReevaluated, Policy{Allow: true, PolicyVersion: "p"})
			c.add("claimed", KindClaimed, Policy{Allow: true, PolicyVersion: "p"})
			c.seal(KindExecuted, "completed", "approved-executed")
			return c
		}, "approved twice"},
		{"executed without claim", func() *memChain {
			c := newMemChain(t, k, "tsk_nc", 1)
			c.decide(newPasskey(t, "c1"), "alice", "approve")
			c.seal(KindExecuted, "completed", "approved-executed")
			return c
		}, "without an execution claim"},
		{"claim without re-evaluation", func() *memChain {
			c := newMemChain(t, k, "tsk_nr", 1)
			c.decide(newPasskey(t, "c1"), "alice", "approve")
			c.add("claimed", KindClaimed, Policy{Allow: true, PolicyVersion: "p"})
			c.seal(KindExecuted, "completed", "approved-executed")
			return c
		}, "without a re-evaluation"},
		{"step after cancel", func() *memChain {
			c := newMemChain(t, k, "tsk_ac", 1)
			c.add(StepEnd, KindCancelled, Ended{Status: "cancelled"})
			c.decide(newPasskey(t, "c1"), "alice", "approve")
			return c
		}, "after the terminal record"},
		{"claimed then cancelled", func() *memChain {
			c := newMemChain(t, k, "tsk_cc", 1)
			c.decide(newPasskey(t, "c1"), "alice", "approve")
			c.add("reevaluated", KindReevaluated, Policy{Allow: true, PolicyVersion: "p"})
			c.add("claimed", KindClaimed, Policy{Allow: true, PolicyVersion: "p"})
			c.seal(KindCancelled, "cancelled", "")
			return c
		}, "after the execution claim"},
		{"wrong disposition", func() *memChain {
			c := newMemChain(t, k, "tsk_wd", 1)
			c.seal(KindExpired, "completed", "approved-executed")
			return c
		}, "disposition"},
		{"approval over another call", func() *memChain {
			c := newMemChain(t, k, "tsk_ah", 1)
			other := c.hash
			other[0] ^= 1
			a := newPasskey(t, "c1").approve(t, "alice", "approve", other, c.at)
			c.add("d", KindDecision, Decision{Decision: "approve", Accepted: true, Approval: &a})
			c.seal(KindExpired, "completed", "denied-not-executed")
			return c
		}, "not bound to the task's action hash"},
		{"assertion by another key", func() *memChain {
			c := newMemChain(t, k, "tsk_ak", 1)
			a := newPasskey(t, "c1").approve(t, "alice", "approve", c.hash, c.at)
			a.PublicKey = newPasskey(t, "c2").cose
			c.add("d", KindDecision, Decision{Decision: "approve", Accepted: true, Approval: &a})
			c.seal(KindExpired, "completed", "denied-not-executed")
			return c
		}, "signature does not verify"},
		{"arguments changed after hashing", func() *memChain {
			c := newMemChain(t, k, "tsk_args", 1)
			var req Requested
			json.Unmarshal(c.recs[0].Body, &req)
			req.Envelope.Arguments = json.RawMessage(`{"amount":5000000,"currency":"USD","to":"acct-991"}`)
			c2 := &memChain{t: t, keys: k, taskID: "tsk_args", hash: c.hash, at: c.at}
			c2.add(StepRequested, KindRequested, req)
			c2.seal(KindExpired, "completed", "denied-not-executed")
			return c2
		}, "does not match"},
		{"outcome that lies", func() *memChain {
			c := newMemChain(t, k, "tsk_lie", 1)
			c.add(StepEnd, KindExpired, Ended{Status: "completed", Disposition: "denied-not-executed"})
			o, _ := BuildOutcome(c.recs, c.hashes)
			o.PolicyVersionAtExecution = "pv-forged"
			c.add(StepOutcome, KindOutcome, o)
			return c
		}, "does not match the chain"},
		{"notified with a body", func() *memChain {
			c := newMemChain(t, k, "tsk_nb", 1)
			c.add("notify", KindNotified, map[string]any{"approved": true, "approver": "mallory"})
			c.seal(KindExpired, "completed", "denied-not-executed")
			return c
		}, "notified body"},
		{"not sealed", func() *memChain {
			c := newMemChain(t, k, "tsk_ns", 1)
			c.add("notify", KindNotified, struct{}{})
			return c
		}, "not sealed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mustFail(t, tc.name, tc.build().lines, keys, tc.want)
		})
	}
}

// The rules of issue 8: an execution needs a quorum committed before the
// claim; no decision counts once the call is claimed or denied; nothing
// after the claim says the call was stopped; the outcome lists exactly the
// decisions the chain counted; an approver counts once. Every chain here is
// signed by the server's key, so only the rules can catch it. The report
// must name the rule (rule) and say what broke it (want).
func TestVerifyExecutionRules(t *testing.T) {
	k := testKeys(t)
	keys := k.PublicKeys()
	for _, tc := range []struct {
		name  string
		build func() *memChain
		rule  string
		want  string
	}{
		// (a) No execution without a committed quorum before the claim.
		{"claim below quorum", func() *memChain {
			c := approvedChain(t, k, "tsk_a1", 2, "alice")
			c.claim()
			c.seal(KindExecuted, "completed", "approved-executed")
			return c
		}, RuleQuorumBeforeClaim, "1 distinct approver(s) accepted before it, quorum is 2"},
		{"quorum completed only after the claim", func() *memChain {
			c := approvedChain(t, k, "tsk_a2", 2, "alice")
			c.claim()
			c.decide(newPasskey(t, "cred-bob"), "bob", "approve")
			c.seal(KindExecuted, "completed", "approved-executed")
			return c
		}, RuleQuorumBeforeClaim, "quorum is 2"},
		{"outcome-unknown without a claim", func() *memChain {
			c := approvedChain(t, k, "tsk_a3", 1, "alice")
			c.add("reevaluated", KindReevaluated, Policy{Allow: true, PolicyVersion: "p"})
			c.seal(KindOutcomeUnknown, "completed", "outcome-unknown")
			return c
		}, RuleExecutionWithoutClaim, "outcome-unknown without an execution claim"},
		{"claim under a policy that did not allow", func() *memChain {
			c := approvedChain(t, k, "tsk_a4", 1, "alice")
			c.add("reevaluated", KindReevaluated, Policy{Allow: true, PolicyVersion: "p"})
			c.add("claimed", KindClaimed, Policy{Allow: false, Effect: "deny", PolicyVersion: "p"})
			c.seal(KindExecuted, "completed", "approved-executed")
			return c
		}, RuleClaim, "policy that did not allow"},
		{"approval with no approver identity", func() *memChain {
			c := newMemChain(t, k, "tsk_a5", 1)
			a := newPasskey(t, "cred-x").approve(t, "", "approve", c.hash, c.at)
			c.add("decision/x", KindDecision, Decision{Decision: "approve", Accepted: true, ChallengeID: a.ChallengeID, Approval: &a})
			c.claim()
			c.seal(KindExecuted, "completed", "approved-executed")
			return c
		}, RuleApproverIdentity, "names no approver"},

		// (b) No accepted decision once the call is claimed.
		{"accepted approval after the claim", func() *memChain {
			c := approvedChain(t, k, "tsk_b1", 1, "alice")
			c.claim()
			c.decide(newPasskey(t, "cred-bob"), "bob", "approve")
			c.seal(KindExecuted, "completed", "approved-executed")
			return c
		}, RuleDecisionAfterClaim, "accepted approve after the execution claim"},
		{"accepted deny after the claim, ending denied", func() *memChain {
			c := approvedChain(t, k, "tsk_b2", 1, "alice")
			c.claim()
			c.decide(newPasskey(t, "cred-bob"), "bob", "deny")
			c.seal(KindDenied, "completed", "denied-not-executed")
			return c
		}, RuleDecisionAfterClaim, "accepted deny after the execution claim"},

		// (c) Nothing after the claim says the call was stopped; the
		// outcome lists exactly the decisions the chain counted.
		{"claimed then cancelled", func() *memChain {
			c := approvedChain(t, k, "tsk_c1", 1, "alice")
			c.claim()
			c.seal(KindCancelled, "cancelled", "")
			return c
		}, RuleStoppedAfterClaim, "cancelled after the execution claim"},
		{"claimed then expired", func() *memChain {
			c := approvedChain(t, k, "tsk_c2", 1, "alice")
			c.claim()
			c.seal(KindExpired, "completed", "denied-not-executed")
			return c
		}, RuleStoppedAfterClaim, "expired after the execution claim"},
		{"denied-not-executed after a claim whose tool ran", func() *memChain {
			c := approvedChain(t, k, "tsk_c3", 1, "alice")
			c.claim()
			c.add(StepEnd, KindDenied, Ended{Status: "completed", Disposition: "denied-not-executed", ResultDigest: "ab"})
			o, _ := BuildOutcome(c.recs, c.hashes)
			c.add(StepOutcome, KindOutcome, o)
			return c
		}, RuleStoppedAfterClaim, "records the tool's result"},
		{"outcome lists an approval the chain does not hold", func() *memChain {
			c := approvedChain(t, k, "tsk_c4", 1, "alice")
			c.claim()
			c.add(StepEnd, KindExecuted, Ended{Status: "completed", Disposition: "approved-executed", ResultDigest: "ab"})
			o, _ := BuildOutcome(c.recs, c.hashes)
			o.Approvals = append(o.Approvals, newPasskey(t, "cred-bob").approve(t, "bob", "approve", c.hash, c.at))
			c.add(StepOutcome, KindOutcome, o)
			return c
		}, RuleOutcomeApprovals, "outcome lists 2 approvals; the chain accepted 1"},
		{"outcome swaps an approval", func() *memChain {
			c := approvedChain(t, k, "tsk_c5", 1, "alice")
			c.claim()
			c.add(StepEnd, KindExecuted, Ended{Status: "completed", Disposition: "approved-executed", ResultDigest: "ab"})
			o, _ := BuildOutcome(c.recs, c.hashes)
			o.Approvals[0] = newPasskey(t, "cred-bob").approve(t, "bob", "approve", c.hash, c.at)
			c.add(StepOutcome, KindOutcome, o)
			return c
		}, RuleOutcomeApprovals, "outcome approval 0 (bob)"},
		{"approvals beyond the quorum", func() *memChain {
			c := approvedChain(t, k, "tsk_c6", 2, "alice", "bob", "carol")
			c.claim()
			c.seal(KindExecuted, "completed", "approved-executed")
			return c
		}, RuleApprovalBeyondQuorum, "carol"},

		// (d) One approver counts once; nothing is approved after a deny.
		{"same approver with two passkeys", func() *memChain {
			c := newMemChain(t, k, "tsk_d1", 2)
			c.decide(newPasskey(t, "cred-a1"), "alice", "approve")
			c.decide(newPasskey(t, "cred-a2"), "alice", "approve")
			c.claim()
			c.seal(KindExecuted, "completed", "approved-executed")
			return c
		}, RuleApproverCountedTwice, "approved twice"},
		{"one credential for two approvers", func() *memChain {
			c := newMemChain(t, k, "tsk_d2", 2)
			p := newPasskey(t, "cred-shared")
			c.decide(p, "alice", "approve")
			c.decide(p, "bob", "approve")
			c.claim()
			c.seal(KindExecuted, "completed", "approved-executed")
			return c
		}, RuleApproverCountedTwice, "credential cred-shared"},
		{"one key under two credentials", func() *memChain {
			c := newMemChain(t, k, "tsk_d3", 2)
			p := newPasskey(t, "cred-a")
			clone := *p
			clone.id = "cred-b"
			c.decide(p, "alice", "approve")
			c.decide(&clone, "bob", "approve")
			c.claim()
			c.seal(KindExecuted, "completed", "approved-executed")
			return c
		}, RuleApproverCountedTwice, "same public key"},
		{"approval after an accepted deny", func() *memChain {
			c := newMemChain(t, k, "tsk_d4", 1)
			c.decide(newPasskey(t, "cred-a"), "alice", "deny")
			c.decide(newPasskey(t, "cred-b"), "bob", "approve")
			c.seal(KindDenied, "completed", "denied-not-executed")
			return c
		}, RuleDecisionAfterDeny, "accepted approve after the accepted deny"},
		{"approval after an unsigned deny", func() *memChain {
			c := newMemChain(t, k, "tsk_d5", 1)
			c.add("decision/u", KindDecision, Decision{Decision: "deny", Accepted: true, Unsigned: &Unsigned{ApproverID: "a", ApproverName: "al", Via: "slack:U1"}})
			c.decide(newPasskey(t, "cred-b"), "bob", "approve")
			c.seal(KindDenied, "completed", "denied-not-executed")
			return c
		}, RuleDecisionAfterDeny, "accepted approve after the accepted deny"},

		// cancel-refused: a known kind, with an empty body, before the end.
		{"cancel-refused with a body", func() *memChain {
			c := approvedChain(t, k, "tsk_r1", 1, "alice")
			c.claim()
			c.add("cancel-refused", KindCancelRefused, map[string]any{"cancelled": true})
			c.seal(KindExecuted, "completed", "approved-executed")
			return c
		}, RuleRecordBody, "cancel-refused body"},
		{"cancel-refused after the end", func() *memChain {
			c := approvedChain(t, k, "tsk_r2", 1, "alice")
			c.claim()
			c.add(StepEnd, KindExecuted, Ended{Status: "completed", Disposition: "approved-executed", ResultDigest: "ab"})
			c.add("cancel-refused", KindCancelRefused, struct{}{})
			return c
		}, RuleAfterEnd, "after the terminal record"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := Verify(tc.build().lines, keys, VerifyOptions{})
			b, _ := json.Marshal(rep)
			if rep.OK {
				t.Fatalf("signed but inconsistent chain verifies: %s", b)
			}
			if !strings.Contains(string(b), "["+tc.rule+"]") || !strings.Contains(string(b), tc.want) {
				t.Errorf("report does not name rule %q with %q:\n%s", tc.rule, tc.want, b)
			}
		})
	}
}

// Honest chains the rules must keep accepting: rejected decisions are true
// statements wherever they fall before the end, a refused cancel is not a
// cancel, and a claimed call the tool refused (stale envelope, unknown
// tool) or failed with a protocol error ends without running.
func TestVerifyExecutionRulesHonest(t *testing.T) {
	k := testKeys(t)
	keys := k.PublicKeys()
	for _, tc := range []struct {
		name  string
		build func() *memChain
		want  string
	}{
		{"rejected decisions after the claim", func() *memChain {
			c := approvedChain(t, k, "tsk_h1", 1, "alice")
			c.claim()
			c.reject("late1", "approve", "task_not_pending")
			c.reject("late2", "deny", "task_not_pending")
			c.seal(KindExecuted, "completed", "approved-executed")
			return c
		}, "approved-executed"},
		{"rejected decisions after a deny", func() *memChain {
			c := newMemChain(t, k, "tsk_h2", 2)
			c.decide(newPasskey(t, "cred-a"), "alice", "deny")
			c.reject("late", "approve", "task_not_pending")
			c.seal(KindDenied, "completed", "denied-not-executed")
			return c
		}, "denied-not-executed"},
		{"rejected decisions after the quorum", func() *memChain {
			c := approvedChain(t, k, "tsk_h3", 2, "alice", "bob")
			c.reject("carol", "approve", "task_not_pending")
			c.claim()
			c.seal(KindExecuted, "completed", "approved-executed")
			return c
		}, "approved-executed"},
		{"cancel refused after the claim", func() *memChain {
			c := approvedChain(t, k, "tsk_h4", 1, "alice")
			c.claim()
			c.add("cancel-refused", KindCancelRefused, struct{}{})
			c.seal(KindExecuted, "completed", "approved-executed")
			return c
		}, "approved-executed"},
		{"cancel refused recorded before the claim", func() *memChain {
			c := approvedChain(t, k, "tsk_h5", 1, "alice")
			c.add("cancel-refused", KindCancelRefused, struct{}{})
			c.claim()
			c.seal(KindOutcomeUnknown, "completed", "outcome-unknown")
			return c
		}, "outcome-unknown"},
		{"claimed call refused by the tool", func() *memChain {
			c := approvedChain(t, k, "tsk_h6", 1, "alice")
			c.claim()
			c.seal(KindDenied, "completed", "denied-not-executed")
			return c
		}, "denied-not-executed"},
		{"claimed call failed with a protocol error", func() *memChain {
			c := approvedChain(t, k, "tsk_h7", 1, "alice")
			c.claim()
			c.seal(KindFailed, "failed", "")
			return c
		}, "failed"},
		// Unattended tasks (quorum 0, no group): nothing is approved, so an
		// executed end has no disposition, and a client that never answers
		// the task's input requests fails it as expired.
		{"unattended task executed", func() *memChain {
			c := newMemChainGroup(t, k, "tsk_u1", "", 0)
			c.claim()
			c.seal(KindExecuted, "completed", "")
			return c
		}, "completed"},
		{"unattended task whose input never came", func() *memChain {
			c := newMemChainGroup(t, k, "tsk_u2", "", 0)
			c.seal(KindExpired, "failed", "")
			return c
		}, "failed"},
		{"unattended task cancelled while it waited", func() *memChain {
			c := newMemChainGroup(t, k, "tsk_u3", "", 0)
			c.seal(KindCancelled, "cancelled", "")
			return c
		}, "cancelled"},
		{"deny after a lone approval", func() *memChain {
			c := approvedChain(t, k, "tsk_h8", 2, "alice")
			c.decide(newPasskey(t, "cred-bob"), "bob", "deny")
			c.seal(KindDenied, "completed", "denied-not-executed")
			return c
		}, "denied-not-executed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := Verify(tc.build().lines, keys, VerifyOptions{})
			if !rep.OK || len(rep.Tasks) != 1 {
				b, _ := json.MarshalIndent(rep, "", "  ")
				t.Fatalf("honest chain does not verify:\n%s", b)
			}
			if got := rep.Tasks[0].Disposition + rep.Tasks[0].Status; !strings.Contains(got, tc.want) {
				t.Errorf("verdict %q, want %q", got, tc.want)
			}
		})
	}
}

func TestVerifyAllowIncomplete(t *testing.T) {
	k := testKeys(t)
	c := newMemChain(t, k, "tsk_p", 1)
	c.add("notify", KindNotified, struct{}{})
	rep := Verify(c.lines, k.PublicKeys(), VerifyOptions{AllowIncomplete: true})
	if !rep.OK || rep.Tasks[0].Complete || rep.Tasks[0].Status != "" {
		t.Fatalf("pending chain with AllowIncomplete: %+v", rep)
	}
	// A claim without an end: the tool may have run (or the end was
	// dropped), and the verdict says so, not "pending".
	c.decide(newPasskey(t, "c1"), "alice", "approve")
	c.claim()
	for _, opts := range []VerifyOptions{{AllowIncomplete: true}, {}} {
		v := Verify(c.lines, k.PublicKeys(), opts).Tasks[0]
		if v.OK != opts.AllowIncomplete || v.Complete || v.Status != "claimed" || !slices.ContainsFunc(v.Notes, func(n string) bool { return strings.Contains(n, "may have run") }) {
			t.Fatalf("claimed chain, not sealed (%+v): %+v", opts, v)
		}
	}
}

// FuzzVerify: no mutation of an honest export verifies, and the verifier
// never panics.
func FuzzVerify(f *testing.F) {
	k := testKeys(f)
	c := executedChain(f, k, "tsk_fuzz")
	keys := k.PublicKeys()
	export := bytes.Join(c.lines, []byte("\n"))
	f.Add(0, byte(1), 0, uint8(0))
	f.Add(100, byte(0x20), 3, uint8(1))
	f.Add(7, byte(0x80), 1, uint8(2))
	f.Fuzz(func(t *testing.T, pos int, x byte, n int, op uint8) {
		m := bytes.Clone(export)
		if len(m) == 0 {
			return
		}
		if pos < 0 {
			pos = -pos
		}
		pos %= len(m)
		switch op % 3 {
		case 0: // flip
			if x == 0 {
				x = 1
			}
			m[pos] ^= x
		case 1: // delete a run
			end := min(len(m), pos+1+abs(n)%64)
			m = append(m[:pos:pos], m[end:]...)
		case 2: // insert a byte
			m = append(m[:pos:pos], append([]byte{x}, m[pos:]...)...)
		}
		if bytes.Equal(m, export) {
			return
		}
		rep, err := VerifyReader(bytes.NewReader(m), keys, VerifyOptions{})
		if err == nil && rep.OK {
			// Only whitespace between lines may change without effect.
			if bytes.Equal(bytes.Join(bytes.Fields(m), nil), bytes.Join(bytes.Fields(export), nil)) {
				return
			}
			t.Fatalf("mutated export verifies (op %d at %d)", op%3, pos)
		}
	})
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

func mustHash(t *testing.T, tool string, args []byte) string {
	h, err := canon.Hash(tool, args, "srv-test")
	if err != nil {
		t.Fatal(err)
	}
	return h.String()
}

// A problem names the line of the export file it is on, blank lines
// counted, so an auditor finds the record the report means.
func TestVerifyReaderNamesFileLines(t *testing.T) {
	k := testKeys(t)
	c := executedChain(t, k, "tsk_lines")
	bad := bytes.Replace(c.lines[2], []byte(`"seq":2`), []byte(`"seq":7`), 1)
	var export []byte
	for i, l := range c.lines {
		if i == 2 {
			l = bad
		}
		export = append(append(export, l...), '\n')
		if i == 0 {
			export = append(export, "\n  \n"...) // blank lines 2 and 3
		}
	}
	rep, err := VerifyReader(bytes.NewReader(export), k.PublicKeys(), VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || len(rep.Tasks) != 1 || !strings.Contains(rep.Tasks[0].Problems[0], "line 5:") {
		b, _ := json.MarshalIndent(rep, "", "  ")
		t.Fatalf("the tampered record is on line 5 of the file:\n%s", b)
	}
}

// TestVerifyDecisionBoundAssertions: an approver's passkey signs which
// decision it was asked for (canon.DecisionNonce), so a signed deny
// recorded as an approval fails, even in a chain sealed with the audit
// key; an assertion over a random nonce (made before nonces were bound)
// still verifies, with a note that it does not show its decision.
func TestVerifyDecisionBoundAssertions(t *testing.T) {
	k := testKeys(t)
	keys := k.PublicKeys()
	alice := newPasskey(t, "cred-alice")
	build := func(signed string) *memChain {
		c := newMemChain(t, k, "tsk_bound", 1)
		a := alice.signFor(t, "alice", "approve", signed, c.hash, c.at)
		c.add("decision/alice", KindDecision, Decision{Decision: "approve", Accepted: true, ChallengeID: a.ChallengeID, Approval: &a})
		c.claim()
		c.seal(KindExecuted, "completed", "approved-executed")
		return c
	}
	unbound := func(v TaskVerdict) bool {
		return slices.ContainsFunc(v.Notes, func(n string) bool { return strings.Contains(n, "does not show which decision") })
	}

	rep := Verify(build("approve").lines, keys, VerifyOptions{})
	if !rep.OK || unbound(rep.Tasks[0]) {
		t.Fatalf("a bound approval: %+v", rep)
	}
	rep = Verify(build("").lines, keys, VerifyOptions{})
	if !rep.OK || !unbound(rep.Tasks[0]) {
		t.Fatalf("an approval over a random nonce: %+v", rep)
	}
	mustFail(t, "a signed deny recorded as an approval", build("deny").lines, keys, "the passkey signed a challenge for deny, recorded as approve")

	// An in-band call (no approver group) keeps SEP-2672's random nonce:
	// no note; a deny's assertion still cannot pass for its approval.
	inBand := func(signed string) *memChain {
		c := newMemChainGroup(t, k, "tsk_inband", "", 1)
		a := alice.signFor(t, "alice", "approve", signed, c.hash, c.at)
		c.add("decision/alice", KindDecision, Decision{Decision: "approve", Accepted: true, ChallengeID: a.ChallengeID, Approval: &a})
		c.claim()
		c.seal(KindExecuted, "completed", "approved-executed")
		return c
	}
	rep = Verify(inBand("").lines, keys, VerifyOptions{})
	if !rep.OK || unbound(rep.Tasks[0]) {
		t.Fatalf("an in-band approval over a random nonce: %+v", rep)
	}
	mustFail(t, "a signed deny recorded as an in-band approval", inBand("deny").lines, keys, "the passkey signed a challenge for deny, recorded as approve")
}

// The summary counts chains by what they are: an admin or token chain is
// not a task.
func TestReportSummary(t *testing.T) {
	for _, tc := range []struct {
		rep  Report
		want string
	}{
		{Report{}, "0 chains; 0 failed"},
		{Report{Tasks: []TaskVerdict{{TaskID: "tsk_a", OK: true}}}, "1 chain: 1 task; 0 failed"},
		{Report{Tasks: []TaskVerdict{{TaskID: "tsk_a", OK: true}, {TaskID: "tsk_b"}, {TaskID: "admin-agent-5c1e", OK: true}}},
			"3 chains: 2 tasks, 1 admin chain; 1 failed"},
		{Report{Tasks: []TaskVerdict{{TaskID: "admin-approver-alice"}, {TaskID: "admin-agent-5c1e"}, {TaskID: "txt_1", OK: true}, {TaskID: "txr_2", OK: true}},
			Problems: []string{"line 3: not JSON"}},
			"4 chains: 2 admin chains, 2 transaction-token chains; 2 failed; 1 other problem"},
	} {
		if got := tc.rep.Summary(); got != tc.want {
			t.Errorf("Summary() = %q, want %q", got, tc.want)
		}
	}
	for id, want := range map[string]string{"tsk_7fq2": ChainTask, "admin-agent-5c1e": ChainAdmin, "admin-approver-alice": ChainAdmin, "txt_ab": ChainToken, "txr_cd": ChainToken} {
		if got := ChainKindOf(id); got != want {
			t.Errorf("ChainKindOf(%q) = %q, want %q", id, got, want)
		}
	}
}
