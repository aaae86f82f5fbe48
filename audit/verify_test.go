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
			c.seal(KindExecuted, "completed", "approved-executed")
			return c
		}, "approved-executed"},
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

func TestVerifyAllowIncomplete(t *testing.T) {
	k := testKeys(t)
	c := newMemChain(t, k, "tsk_p", 1)
	c.add("notify", KindNotified, struct{}{})
	rep := Verify(c.lines, k.PublicKeys(), VerifyOptions{AllowIncomplete: true})
	if !rep.OK || rep.Tasks[0].Complete {
		t.Fatalf("pending chain with AllowIncomplete: %+v", rep)
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
