package audit

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"testing"
	"time"

	"github.com/go-webauthn/webauthn/protocol/webauthncbor"
	"github.com/go-webauthn/webauthn/protocol/webauthncose"

	"github.com/countersign/countersign/internal/canon"
)

// passkey is a software authenticator for "localhost".
type passkey struct {
	id   string
	priv *ecdsa.PrivateKey
	cose []byte
	n    uint32
}

func newPasskey(t testing.TB, id string) *passkey {
	t.Helper()
	for {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := k.PublicKey.Bytes()
		if pub[1] == 0 || pub[33] == 0 {
			continue
		}
		cose, err := webauthncbor.Marshal(webauthncose.EC2PublicKeyData{
			PublicKeyData: webauthncose.PublicKeyData{KeyType: int64(webauthncose.EllipticKey), Algorithm: int64(webauthncose.AlgES256)},
			Curve:         1, XCoord: pub[1:33], YCoord: pub[33:],
		})
		if err != nil {
			t.Fatal(err)
		}
		return &passkey{id: id, priv: k, cose: cose}
	}
}

// approve signs a fresh challenge bound to hash and to decision, as
// Countersign issues them.
func (p *passkey) approve(t testing.TB, approver, decision string, hash canon.ActionHash, at time.Time) Approval {
	t.Helper()
	return p.signFor(t, approver, decision, decision, hash, at)
}

// signFor signs a fresh challenge bound to hash and to signed ("": a
// random nonce, as challenges were before nonces were bound), recorded as
// a decision to decision.
func (p *passkey) signFor(t testing.TB, approver, decision, signed string, hash canon.ActionHash, at time.Time) Approval {
	t.Helper()
	nonce := make([]byte, 32)
	rand.Read(nonce)
	if signed != "" {
		var err error
		if nonce, err = canon.DecisionNonce(nonce[:16], signed); err != nil {
			t.Fatal(err)
		}
	}
	ch := base64.RawURLEncoding.EncodeToString(append(nonce, hash[:]...))
	cd, _ := json.Marshal(map[string]any{"type": "webauthn.get", "challenge": ch, "origin": "http://localhost:8080", "crossOrigin": false})
	rp := sha256.Sum256([]byte("localhost"))
	p.n++
	ad := append(rp[:], 0x05)
	ad = binary.BigEndian.AppendUint32(ad, p.n)
	cdh := sha256.Sum256(cd)
	digest := sha256.Sum256(append(bytes.Clone(ad), cdh[:]...))
	sig, err := ecdsa.SignASN1(rand.Reader, p.priv, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	return Approval{Decision: decision, ApproverID: approver, ApproverName: approver + "-name", CredentialID: p.id,
		PublicKey: p.cose, ChallengeID: "ch-" + approver, Challenge: ch, AuthenticatorData: ad, ClientDataJSON: cd,
		Signature: sig, SignCount: p.n, At: at}
}

// memChain builds a chain in memory exactly as Log.Append does.
type memChain struct {
	t      testing.TB
	keys   *Keyring
	taskID string
	lines  [][]byte
	recs   []Record
	hashes []string
	hash   canon.ActionHash
	at     time.Time
}

func newMemChain(t testing.TB, keys *Keyring, taskID string, quorum int) *memChain {
	t.Helper()
	return newMemChainGroup(t, keys, taskID, "approvers", quorum)
}

// newMemChainGroup is newMemChain with the approver group; group "" and
// quorum 0 is an unattended task.
func newMemChainGroup(t testing.TB, keys *Keyring, taskID, group string, quorum int) *memChain {
	t.Helper()
	args := json.RawMessage(`{"to":"acct-991","amount":50000,"currency":"USD"}`)
	h, err := canon.Hash("transfer_funds", args, "srv-test")
	if err != nil {
		t.Fatal(err)
	}
	c := &memChain{t: t, keys: keys, taskID: taskID, hash: h, at: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	env, err := NewEnvelope("transfer_funds", args, h.String(), "dev-agent", "tool:transfer_funds", "srv-test", c.at, false)
	if err != nil {
		t.Fatal(err)
	}
	c.add(StepRequested, KindRequested, Requested{Envelope: env, PolicyVersion: "pv1",
		Requirement: Requirement{Group: group, Quorum: quorum, TTLSeconds: 3600, AuthenticatorClass: "platform", Reason: "big"},
		ApprovalRef: "apr_x", DisplayText: "Transfer", ExpiresAt: c.at.Add(time.Hour)})
	return c
}

func (c *memChain) add(stepID, kind string, body any) {
	c.t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		c.t.Fatal(err)
	}
	prev := ""
	if n := len(c.hashes); n > 0 {
		prev = c.hashes[n-1]
	}
	c.at = c.at.Add(time.Second)
	line, rec, err := seal(Record{TaskID: c.taskID, Seq: len(c.lines), Kind: kind, StepID: stepID, At: c.at, Prev: prev, Body: b}, c.keys)
	if err != nil {
		c.t.Fatal(err)
	}
	c.lines = append(c.lines, line)
	c.recs = append(c.recs, rec)
	c.hashes = append(c.hashes, Hash(line))
}

func (c *memChain) decide(p *passkey, approver, decision string) {
	a := p.approve(c.t, approver, decision, c.hash, c.at)
	c.add("decision/"+approver+decision, KindDecision, Decision{Decision: decision, Accepted: true, ChallengeID: a.ChallengeID, Approval: &a})
}

func (c *memChain) seal(kind, status, disposition string) {
	c.t.Helper()
	e := Ended{Status: status, Disposition: disposition}
	if kind == KindExecuted || kind == KindExecutionError {
		e.ResultDigest = "ab"
	}
	c.add(StepEnd, kind, e)
	o, err := BuildOutcome(c.recs, c.hashes)
	if err != nil {
		c.t.Fatal(err)
	}
	c.add(StepOutcome, KindOutcome, o)
}

// executedChain is a complete, honest chain: quorum 2, both approve,
// policy allows, claimed, executed.
func executedChain(t testing.TB, keys *Keyring, taskID string) *memChain {
	c := newMemChain(t, keys, taskID, 2)
	c.add("notify", KindNotified, struct{}{})
	c.add("decision/bad", KindDecision, Decision{Decision: "approve", Reason: "signature_verification_failed", ChallengeID: "x"})
	c.decide(newPasskey(t, "cred-a"), "alice", "approve")
	c.decide(newPasskey(t, "cred-b"), "bob", "approve")
	c.add("reevaluated", KindReevaluated, Policy{Allow: true, Effect: "allow", PolicyVersion: "pv2"})
	c.add("claimed", KindClaimed, Policy{Allow: true, Effect: "allow", PolicyVersion: "pv2"})
	c.seal(KindExecuted, "completed", "approved-executed")
	return c
}

func testKeys(t testing.TB) *Keyring {
	t.Helper()
	k, err := OpenKeyring(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// reject records a rejected decision: no evidence, only the reason.
func (c *memChain) reject(step, decision, reason string) {
	c.add("decision/"+step, KindDecision, Decision{Decision: decision, Reason: reason, ChallengeID: "ch-" + step})
}

// claim records the allowing re-evaluation and the execution claim.
func (c *memChain) claim() {
	c.add("reevaluated", KindReevaluated, Policy{Allow: true, Effect: "allow", PolicyVersion: "pv2"})
	c.add("claimed", KindClaimed, Policy{Allow: true, Effect: "allow", PolicyVersion: "pv2"})
}

// approvedChain is a requested chain with quorum whose listed approvers
// each approved with their own passkey.
func approvedChain(t testing.TB, keys *Keyring, taskID string, quorum int, approvers ...string) *memChain {
	c := newMemChain(t, keys, taskID, quorum)
	c.add("notify", KindNotified, struct{}{})
	for _, a := range approvers {
		c.decide(newPasskey(t, "cred-"+a), a, "approve")
	}
	return c
}
