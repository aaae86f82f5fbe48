package approvals

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-webauthn/webauthn/protocol/webauthncbor"
	"github.com/go-webauthn/webauthn/protocol/webauthncose"
	"github.com/gowebpki/jcs"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/internal/testnats"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

// The tests of View's timeline (timeline.go): read from the task's audit
// chain when it holds together, the read model's otherwise. Their helpers
// are prefixed tl.

const (
	tlPublicURL = "http://localhost:8080"
	tlRequester = "agent-1"
	tlServerID  = "countersign-test"
)

// tlLogs is a log sink the service may write from any goroutine.
type tlLogs struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *tlLogs) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *tlLogs) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// tlNoEngine is an engine View never reaches.
type tlNoEngine struct{ Engine }

// tlEnv is a service over a real task store and a real audit log, with
// signing keys, on an embedded NATS; its logs go to logs.
type tlEnv struct {
	js    jetstream.JetStream
	store *tasks.Store
	audit *audit.Log
	logs  *tlLogs
	svc   *Service
}

func newTLEnv(t *testing.T) *tlEnv {
	t.Helper()
	ctx := context.Background()
	js, _ := testnats.Start(t)
	e := &tlEnv{js: js, logs: &tlLogs{}}
	var err error
	if e.store, err = tasks.NewStore(ctx, js, tasks.StoreOptions{}); err != nil {
		t.Fatal(err)
	}
	keys, err := audit.OpenKeyring(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if e.audit, err = audit.Open(ctx, js, audit.Options{Keys: keys}); err != nil {
		t.Fatal(err)
	}
	e.svc, err = New(Options{Store: e.store, Engine: tlNoEngine{}, Audit: e.audit,
		Logger: slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// task stores a pending task's read model, with the one timeline event the
// tests tell apart from the chain's ("held for approval"), and returns it.
func (e *tlEnv) task(t *testing.T, quorum int) tasks.Record {
	t.Helper()
	args := json.RawMessage(`{"amount":100,"currency":"EUR","to":"acct-42"}`)
	hash, err := canon.Hash("transfer_funds", args, tlServerID)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	rec := tasks.Record{
		TaskID:        tasks.NewID("tsk_"),
		Owner:         tlRequester,
		Era:           tasks.Era2026,
		Status:        tasks.StatusWorking,
		CreatedAt:     now,
		LastUpdatedAt: now,
		TTL:           2 * time.Hour,
		PollInterval:  2 * time.Second,
		Tool:          "transfer_funds",
		Arguments:     args,
		ActionHash:    hash.String(),
		DisplayText:   "Transfer 100 EUR to acct-42",
		ApprovalRef:   tasks.NewID("apr_"),
		Requirement: tasks.Requirement{Group: "finance", Quorum: quorum, TTL: time.Hour,
			AuthenticatorClass: passkey.ClassPlatform, Reason: "Transfers need a human"},
		ExpiresAt:     now.Add(time.Hour),
		ApprovalState: tasks.ApprovalPending,
		Timeline:      []tasks.Event{{At: now, Kind: "requested", Detail: "held for approval"}},
	}
	if err := e.store.Create(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// timeline is the timeline View shows of rec.
func (e *tlEnv) timeline(t *testing.T, rec tasks.Record) []tasks.Event {
	t.Helper()
	got, err := e.svc.View(context.Background(), rec.ApprovalRef)
	if err != nil {
		t.Fatal(err)
	}
	return got.Timeline
}

// wantReadModelTimeline fails unless View shows rec's read model timeline,
// not its audit chain's.
func (e *tlEnv) wantReadModelTimeline(t *testing.T, rec tasks.Record) {
	t.Helper()
	got := e.timeline(t, rec)
	if len(got) != 1 || got[0].Kind != "requested" || got[0].Text() != "held for approval" {
		t.Fatalf("timeline = %+v, want the read model's", got)
	}
}

// tlRequested is the first record of rec's chain, as the workflow writes
// it; ref overrides the approval reference when not empty.
func tlRequested(t *testing.T, rec tasks.Record, ref string, at time.Time) audit.Step {
	t.Helper()
	if ref == "" {
		ref = rec.ApprovalRef
	}
	env, err := audit.NewEnvelope(rec.Tool, rec.Arguments, rec.ActionHash, rec.Owner, "tool:"+rec.Tool, tlServerID, at, false)
	if err != nil {
		t.Fatal(err)
	}
	r := rec.Requirement
	return audit.Step{ID: audit.StepRequested, Kind: audit.KindRequested, At: at, Body: audit.Requested{
		Envelope: env, PolicyVersion: "pv-1", ApprovalRef: ref, DisplayText: rec.DisplayText, ExpiresAt: rec.ExpiresAt,
		Requirement: audit.Requirement{Group: r.Group, Quorum: r.Quorum, TTLSeconds: int64(r.TTL / time.Second),
			AuthenticatorClass: r.AuthenticatorClass, Reason: "Payments over 50 need two people"},
	}}
}

func tlAppend(t *testing.T, l *audit.Log, taskID string, steps ...audit.Step) {
	t.Helper()
	for _, s := range steps {
		if _, err := l.Append(context.Background(), taskID, s); err != nil {
			t.Fatalf("append %s: %v", s.Kind, err)
		}
	}
}

// Secrets an accepted approval records that approvers must never see.
const (
	tlSecretComment = "comment-kept-for-auditors-only"
	tlSecretCredID  = "cred-id-never-shown"
	tlSecretChallID = "challenge-id-never-shown"
)

// tlApproval is an accepted approval of rec by approverID with a real
// WebAuthn assertion over rec's call, signed by a fresh passkey: the
// timeline checks the assertions as the offline verifier does.
func tlApproval(t *testing.T, rec tasks.Record, id, approverID, name string, at time.Time) audit.Step {
	t.Helper()
	a := tlSignedApproval(t, rec, approverID, name, at)
	return audit.Step{ID: id, Kind: audit.KindDecision, At: at, Body: audit.Decision{
		Decision: tasks.DecisionApprove, Accepted: true, ChallengeID: tlSecretChallID, Approval: &a}}
}

// tlSignedApproval answers a fresh challenge bound to rec's action hash
// with a new P-256 passkey for "localhost", as a browser would.
func tlSignedApproval(t *testing.T, rec tasks.Record, approverID, name string, at time.Time) audit.Approval {
	t.Helper()
	hash, err := canon.ParseActionHash(rec.ActionHash)
	if err != nil {
		t.Fatal(err)
	}
	var k *ecdsa.PrivateKey
	var pub []byte
	for pub == nil || pub[1] == 0 || pub[33] == 0 { // COSE wants full 32-byte coordinates
		if k, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			t.Fatal(err)
		}
		if pub, err = k.PublicKey.Bytes(); err != nil {
			t.Fatal(err)
		}
	}
	cose, err := webauthncbor.Marshal(webauthncose.EC2PublicKeyData{
		PublicKeyData: webauthncose.PublicKeyData{KeyType: int64(webauthncose.EllipticKey), Algorithm: int64(webauthncose.AlgES256)},
		Curve:         1, XCoord: pub[1:33], YCoord: pub[33:],
	})
	if err != nil {
		t.Fatal(err)
	}
	nonce := make([]byte, 32)
	rand.Read(nonce)
	challenge := base64.RawURLEncoding.EncodeToString(append(nonce, hash[:]...))
	cd, err := json.Marshal(map[string]any{"type": "webauthn.get", "challenge": challenge, "origin": tlPublicURL, "crossOrigin": false})
	if err != nil {
		t.Fatal(err)
	}
	rp := sha256.Sum256([]byte("localhost"))
	ad := binary.BigEndian.AppendUint32(append(rp[:], 0x05), 3) // user present and verified, sign count 3
	cdHash := sha256.Sum256(cd)
	digest := sha256.Sum256(append(bytes.Clone(ad), cdHash[:]...))
	sig, err := ecdsa.SignASN1(rand.Reader, k, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	return audit.Approval{Decision: tasks.DecisionApprove, ApproverID: approverID, ApproverName: name,
		CredentialID: tlSecretCredID + "-" + approverID, PublicKey: cose, ChallengeID: tlSecretChallID, Challenge: challenge,
		AuthenticatorData: ad, ClientDataJSON: cd, Signature: sig, SignCount: 3, Comment: tlSecretComment, At: at}
}

// tlForgedLine is a well-formed record, signed by a key of the forger's,
// that links to nothing in the chain. The service holds no public keys, so
// only the chain's links can give it away.
func tlForgedLine(t *testing.T, taskID string, seq int) []byte {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	r := audit.Record{Version: audit.RecordVersion, TaskID: taskID, Seq: seq, Kind: audit.KindClaimed,
		StepID: "claimed", At: time.Now().UTC(), Prev: strings.Repeat("0", 64), KeyID: audit.KeyID(pub),
		Body: json.RawMessage(`{"allow":true,"policyVersion":"forged"}`)}
	unsigned, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if unsigned, err = jcs.Transform(unsigned); err != nil {
		t.Fatal(err)
	}
	r.Sig = base64.RawURLEncoding.EncodeToString(ed25519.Sign(priv, unsigned))
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	line, err := jcs.Transform(b)
	if err != nil {
		t.Fatal(err)
	}
	return line
}

func TestTimelineFromAuditChain(t *testing.T) {
	e := newTLEnv(t)
	rec := e.task(t, 2)

	// No record yet (the workflow has not written its first): the read
	// model's timeline.
	e.wantReadModelTimeline(t, rec)

	t0 := time.Now().UTC().Truncate(time.Millisecond)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	ann := tlApproval(t, rec, "decision/u2", "apv_ann", "Ann Lee", at(3))
	bob := tlApproval(t, rec, "decision/u3", "apv_bob", "Bob Ortiz", at(4))
	tlAppend(t, e.audit, rec.TaskID,
		tlRequested(t, rec, "", at(0)),
		audit.Step{ID: "notify", Kind: audit.KindNotified, At: at(1), Body: struct{}{}},
		audit.Step{ID: "decision/u1", Kind: audit.KindDecision, At: at(2), Body: audit.Decision{
			Decision: tasks.DecisionApprove, Reason: "challenge_consumed", ChallengeID: tlSecretChallID}},
		ann,
		bob,
		audit.Step{ID: "reevaluated", Kind: audit.KindReevaluated, At: at(5), Body: audit.Policy{Allow: true, Effect: "allow", PolicyVersion: "pv-7"}},
		audit.Step{ID: "claimed", Kind: audit.KindClaimed, At: at(6), Body: audit.Policy{Allow: true, Effect: "allow", PolicyVersion: "pv-7"}},
	)
	if _, err := e.audit.Seal(context.Background(), rec.TaskID, audit.End{Kind: audit.KindExecuted, At: at(7),
		Status: "completed", Disposition: "approved-executed", ResultDigest: strings.Repeat("ab", 32)}); err != nil {
		t.Fatal(err)
	}

	got := e.timeline(t, rec)
	want := []struct {
		at           time.Time
		kind, detail string
	}{
		{at(0), "requested", "Payments over 50 need two people"},
		{at(1), "notified", ""},
		{at(2), "rejected-decision", "rejected decision: challenge_consumed"},
		{at(3), "approval", "approved by Ann Lee (1 of 2)"},
		{at(4), "approval", "approved by Bob Ortiz (2 of 2)"},
		{at(6), "claimed", "policy allowed (pv-7)"},
		{at(7), "executed", "Approved; transfer_funds ran once"},
	}
	if len(got) != len(want) {
		t.Fatalf("timeline = %+v\nwant %+v", got, want)
	}
	for i, w := range want {
		if !got[i].At.Equal(w.at) || string(got[i].Kind) != w.kind || got[i].Text() != w.detail {
			t.Errorf("event %d = %+v (%q), want %+v", i, got[i], got[i].Text(), w)
		}
	}
	// Only what the read model's timeline says is taken from the records.
	b, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	secrets := []string{rec.TaskID, tlSecretComment, tlSecretCredID, tlSecretChallID, "held for approval", "pv-1", strings.Repeat("ab", 32)}
	for _, s := range []audit.Step{ann, bob} {
		a := s.Body.(audit.Decision).Approval
		secrets = append(secrets, base64.StdEncoding.EncodeToString(a.Signature), base64.StdEncoding.EncodeToString(a.PublicKey), a.Challenge)
	}
	for _, secret := range secrets {
		if bytes.Contains(b, []byte(secret)) {
			t.Errorf("the timeline shows %q:\n%s", secret, b)
		}
	}
	if strings.Contains(e.logs.String(), "audit chain unusable") {
		t.Errorf("a sound chain was logged as unusable:\n%s", e.logs.String())
	}
}

func TestTimelineUnsignedDenyFromAuditChain(t *testing.T) {
	e := newTLEnv(t)
	rec := e.task(t, 1)
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	const detail = "Denied by Ann Lee via slack (without a passkey): call me first"
	tlAppend(t, e.audit, rec.TaskID,
		tlRequested(t, rec, "", t0),
		audit.Step{ID: "decision/u1", Kind: audit.KindDecision, At: t0.Add(time.Second), Body: audit.Decision{
			Decision: tasks.DecisionDeny, Accepted: true,
			Unsigned: &audit.Unsigned{ApproverID: "apv_ann", ApproverName: "Ann Lee", Via: "slack", Comment: "call me first"}}},
	)
	if _, err := e.audit.Seal(context.Background(), rec.TaskID, audit.End{Kind: audit.KindDenied, At: t0.Add(2 * time.Second),
		Status: "completed", Disposition: "denied-not-executed", Detail: detail}); err != nil {
		t.Fatal(err)
	}
	got := e.timeline(t, rec)
	if len(got) != 2 || got[0].Kind != "requested" || got[1].Kind != "denied" || got[1].Text() != detail {
		t.Fatalf("timeline = %+v, want requested then denied with %q", got, detail)
	}
}

func TestTimelineFallsBackOnForgedChain(t *testing.T) {
	e := newTLEnv(t)
	ctx := context.Background()
	t0 := time.Now().UTC()

	t.Run("record linked to nothing", func(t *testing.T) {
		rec := e.task(t, 1)
		tlAppend(t, e.audit, rec.TaskID, tlRequested(t, rec, "", t0),
			audit.Step{ID: "notify", Kind: audit.KindNotified, At: t0, Body: struct{}{}})
		// Someone with write access to the stream slips a record in.
		if _, err := e.js.Publish(ctx, audit.SubjectPrefix+rec.TaskID, tlForgedLine(t, rec.TaskID, 2)); err != nil {
			t.Fatal(err)
		}
		e.wantReadModelTimeline(t, rec)
		if !strings.Contains(e.logs.String(), "[chain-links] record 2 (claimed): prev does not match the hash of record 1") {
			t.Errorf("the fallback is not logged with its reason:\n%s", e.logs.String())
		}
	})
	t.Run("chain of another approval", func(t *testing.T) {
		rec := e.task(t, 1)
		tlAppend(t, e.audit, rec.TaskID, tlRequested(t, rec, tasks.NewID("apr_"), t0))
		e.wantReadModelTimeline(t, rec)
		if !strings.Contains(e.logs.String(), "another call than this approval") {
			t.Errorf("the fallback is not logged with its reason:\n%s", e.logs.String())
		}
	})
	t.Run("forged first record", func(t *testing.T) {
		rec := e.task(t, 1)
		if _, err := e.js.Publish(ctx, audit.SubjectPrefix+rec.TaskID, tlForgedLine(t, rec.TaskID, 0)); err != nil {
			t.Fatal(err)
		}
		e.wantReadModelTimeline(t, rec)
	})
	t.Run("not canonical", func(t *testing.T) {
		rec := e.task(t, 1)
		if _, err := e.js.Publish(ctx, audit.SubjectPrefix+rec.TaskID, append([]byte(" "), tlForgedLine(t, rec.TaskID, 0)...)); err != nil {
			t.Fatal(err)
		}
		e.wantReadModelTimeline(t, rec)
	})
	t.Run("missing chain", func(t *testing.T) {
		e.wantReadModelTimeline(t, e.task(t, 1))
	})
}

// Chains whose every record is well formed and linked, but whose story
// breaks the audit rules, which only `countersign audit verify` caught
// before the timeline used the audit package's check: View shows the read
// model's timeline and the log names the rule.
func TestTimelineFallsBackOnChainBreakingRules(t *testing.T) {
	e := newTLEnv(t)
	ctx := context.Background()
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	policy := audit.Policy{Allow: true, Effect: "allow", PolicyVersion: "pv-7"}
	claim := func(i int) []audit.Step {
		return []audit.Step{
			{ID: "reevaluated", Kind: audit.KindReevaluated, At: at(i), Body: policy},
			{ID: "claimed", Kind: audit.KindClaimed, At: at(i + 1), Body: policy},
		}
	}

	for _, tc := range []struct {
		name   string
		quorum int
		build  func(t *testing.T, rec tasks.Record)
		rule   string
	}{
		{"approval accepted after the claim", 1, func(t *testing.T, rec tasks.Record) {
			tlAppend(t, e.audit, rec.TaskID, tlRequested(t, rec, "", at(0)), tlApproval(t, rec, "decision/u1", "apv_ann", "Ann Lee", at(1)))
			tlAppend(t, e.audit, rec.TaskID, claim(2)...)
			tlAppend(t, e.audit, rec.TaskID, tlApproval(t, rec, "decision/u2", "apv_bob", "Bob Ortiz", at(4)))
		}, audit.RuleDecisionAfterClaim},
		{"claimed chain ending cancelled", 1, func(t *testing.T, rec tasks.Record) {
			tlAppend(t, e.audit, rec.TaskID, tlRequested(t, rec, "", at(0)), tlApproval(t, rec, "decision/u1", "apv_ann", "Ann Lee", at(1)))
			tlAppend(t, e.audit, rec.TaskID, claim(2)...)
			if _, err := e.audit.Seal(ctx, rec.TaskID, audit.End{Kind: audit.KindCancelled, At: at(4), Status: "cancelled"}); err != nil {
				t.Fatal(err)
			}
		}, audit.RuleStoppedAfterClaim},
		{"claimed below the quorum", 2, func(t *testing.T, rec tasks.Record) {
			tlAppend(t, e.audit, rec.TaskID, tlRequested(t, rec, "", at(0)), tlApproval(t, rec, "decision/u1", "apv_ann", "Ann Lee", at(1)))
			tlAppend(t, e.audit, rec.TaskID, claim(2)...)
		}, audit.RuleQuorumBeforeClaim},
		{"approval whose assertion does not verify", 1, func(t *testing.T, rec tasks.Record) {
			s := tlApproval(t, rec, "decision/u1", "apv_ann", "Ann Lee", at(1))
			s.Body.(audit.Decision).Approval.Signature[10] ^= 1
			tlAppend(t, e.audit, rec.TaskID, tlRequested(t, rec, "", at(0)), s)
			tlAppend(t, e.audit, rec.TaskID, claim(2)...)
		}, audit.RuleApprovalEvidence},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := e.task(t, tc.quorum)
			tc.build(t, rec)
			e.wantReadModelTimeline(t, rec)
			logged := false
			for line := range strings.Lines(e.logs.String()) {
				logged = logged || strings.Contains(line, "task_id="+rec.TaskID) && strings.Contains(line, "["+tc.rule+"]")
			}
			if !logged {
				t.Errorf("the fallback is not logged with rule %s:\n%s", tc.rule, e.logs.String())
			}
		})
	}
}
