package web

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-webauthn/webauthn/protocol/webauthncbor"
	"github.com/go-webauthn/webauthn/protocol/webauthncose"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/approverapi"
	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/tasks"
)

// syncBuffer is a log sink the handler may write from any goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// withAudit opens a real audit log, with signing keys, on the env's
// embedded NATS and hands it to the handler and the approvals service (the
// timeline's source); logs go to logs.
func withAudit(t *testing.T, out **audit.Log, logs *syncBuffer) envOption {
	return func(e *env, s *setup) {
		keys, err := audit.OpenKeyring(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		l, err := audit.Open(context.Background(), e.js, audit.Options{Keys: keys})
		if err != nil {
			t.Fatal(err)
		}
		*out = l
		log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		s.site.Audit, s.site.Logger = l, log
		s.svc.Audit, s.svc.Logger = l, log
	}
}

// requestedStep is the first record of rec's chain, as the workflow writes
// it; ref overrides the approval reference when not empty.
func requestedStep(t *testing.T, rec tasks.Record, ref string, at time.Time) audit.Step {
	t.Helper()
	if ref == "" {
		ref = rec.ApprovalRef
	}
	env, err := audit.NewEnvelope(rec.Tool, rec.Arguments, rec.ActionHash, rec.Owner, "tool:"+rec.Tool, testServerID, at, false)
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

func appendSteps(t *testing.T, l *audit.Log, taskID string, steps ...audit.Step) {
	t.Helper()
	for _, s := range steps {
		if _, err := l.Append(context.Background(), taskID, s); err != nil {
			t.Fatalf("append %s: %v", s.Kind, err)
		}
	}
}

// Secrets an accepted approval records that approvers must never see.
const (
	secretComment = "comment-kept-for-auditors-only"
	secretCredID  = "cred-id-never-shown"
	secretChallID = "challenge-id-never-shown"
)

// approvalStep is an accepted approval of rec by approverID with a real
// WebAuthn assertion over rec's call, signed by a fresh passkey: the
// timeline checks the assertions as the offline verifier does.
func approvalStep(t *testing.T, rec tasks.Record, id, approverID, name string, at time.Time) audit.Step {
	t.Helper()
	a := signedApproval(t, rec, approverID, name, at)
	return audit.Step{ID: id, Kind: audit.KindDecision, At: at, Body: audit.Decision{
		Decision: tasks.DecisionApprove, Accepted: true, ChallengeID: secretChallID, Approval: &a}}
}

// signedApproval answers a fresh challenge bound to rec's action hash with
// a new P-256 passkey for "localhost", as a browser would.
func signedApproval(t *testing.T, rec tasks.Record, approverID, name string, at time.Time) audit.Approval {
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
	cd, err := json.Marshal(map[string]any{"type": "webauthn.get", "challenge": challenge, "origin": testPublicURL, "crossOrigin": false})
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
		CredentialID: secretCredID + "-" + approverID, PublicKey: cose, ChallengeID: secretChallID, Challenge: challenge,
		AuthenticatorData: ad, ClientDataJSON: cd, Signature: sig, SignCount: 3, Comment: secretComment, At: at}
}

type viewTimeline struct {
	Timeline []approverapi.TimelineEvent `json:"timeline"`
}

func (e *env) timeline(t *testing.T, ref string) ([]approverapi.TimelineEvent, string) {
	t.Helper()
	r := e.do(t, "GET", "/approver/v1/approvals/"+ref, nil)
	wantStatus(t, r, http.StatusOK)
	var v viewTimeline
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatal(err)
	}
	return v.Timeline, string(r.body)
}

// wantInOrder fails unless each of wants occurs in s, each after the last.
func wantInOrder(t *testing.T, s string, wants ...string) {
	t.Helper()
	at := 0
	for _, w := range wants {
		i := strings.Index(s[at:], w)
		if i < 0 {
			t.Fatalf("%q missing (or out of order) after offset %d in:\n%s", w, at, s)
		}
		at += i + len(w)
	}
}

func TestTimelineFromAuditChain(t *testing.T) {
	var l *audit.Log
	var logs syncBuffer
	e := newEnv(t, withAudit(t, &l, &logs))
	rec := e.newTask(t, taskSpec{quorum: 2})

	// No record yet (the workflow has not written its first): the read
	// model's timeline.
	got, _ := e.timeline(t, rec.ApprovalRef)
	if len(got) != 1 || got[0].Kind != "requested" || got[0].Detail != "held for approval" {
		t.Fatalf("timeline before any record = %+v, want the read model's", got)
	}

	t0 := time.Now().UTC().Truncate(time.Millisecond)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	ann := approvalStep(t, rec, "decision/u2", "apv_ann", "Ann Lee", at(3))
	bob := approvalStep(t, rec, "decision/u3", "apv_bob", "Bob Ortiz", at(4))
	appendSteps(t, l, rec.TaskID,
		requestedStep(t, rec, "", at(0)),
		audit.Step{ID: "notify", Kind: audit.KindNotified, At: at(1), Body: struct{}{}},
		audit.Step{ID: "decision/u1", Kind: audit.KindDecision, At: at(2), Body: audit.Decision{
			Decision: tasks.DecisionApprove, Reason: "challenge_consumed", ChallengeID: secretChallID}},
		ann,
		bob,
		audit.Step{ID: "reevaluated", Kind: audit.KindReevaluated, At: at(5), Body: audit.Policy{Allow: true, Effect: "allow", PolicyVersion: "pv-7"}},
		audit.Step{ID: "claimed", Kind: audit.KindClaimed, At: at(6), Body: audit.Policy{Allow: true, Effect: "allow", PolicyVersion: "pv-7"}},
	)
	if _, err := l.Seal(context.Background(), rec.TaskID, audit.End{Kind: audit.KindExecuted, At: at(7),
		Status: "completed", Disposition: "approved-executed", ResultDigest: strings.Repeat("ab", 32)}); err != nil {
		t.Fatal(err)
	}

	got, body := e.timeline(t, rec.ApprovalRef)
	want := []approverapi.TimelineEvent{
		{At: at(0), Kind: "requested", Detail: "Payments over 50 need two people"},
		{At: at(1), Kind: "notified"},
		{At: at(2), Kind: "rejected-decision", Detail: "rejected decision: challenge_consumed"},
		{At: at(3), Kind: "approval", Detail: "approved by Ann Lee (1 of 2)"},
		{At: at(4), Kind: "approval", Detail: "approved by Bob Ortiz (2 of 2)"},
		{At: at(6), Kind: "claimed", Detail: "policy allowed (pv-7)"},
		{At: at(7), Kind: "executed", Detail: "Approved; transfer_funds ran once"},
	}
	if len(got) != len(want) {
		t.Fatalf("timeline = %+v\nwant %+v", got, want)
	}
	for i := range want {
		if !got[i].At.Equal(want[i].At) || got[i].Kind != want[i].Kind || got[i].Detail != want[i].Detail {
			t.Errorf("event %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	secrets := []string{rec.TaskID, secretComment, secretCredID, secretChallID, "held for approval", "pv-1", strings.Repeat("ab", 32)}
	for _, s := range []audit.Step{ann, bob} {
		a := s.Body.(audit.Decision).Approval
		secrets = append(secrets, base64.StdEncoding.EncodeToString(a.Signature), base64.StdEncoding.EncodeToString(a.PublicKey), a.Challenge)
	}
	for _, secret := range secrets {
		if strings.Contains(body, secret) {
			t.Errorf("approval JSON shows %q:\n%s", secret, body)
		}
	}

	r := e.do(t, "GET", "/approve/"+rec.ApprovalRef, nil)
	wantStatus(t, r, http.StatusOK)
	page := checkPage(t, r)
	_, stepper, _ := strings.Cut(page, `id="timeline"`)
	wantInOrder(t, stepper, "Requested by "+testRequester, "Payments over 50 need two people", "Approvers notified",
		"A decision was refused", "A confirmation was replayed; nothing changed.",
		"Approved by Ann Lee (1 of 2)", "Approved by Bob Ortiz (2 of 2)", "Policy re-checked: allowed", "Executed",
		"Approved; transfer_funds ran once")
	for _, secret := range []string{rec.TaskID, secretComment, secretCredID, secretChallID, "held for approval"} {
		if strings.Contains(page, secret) {
			t.Errorf("approval page shows %q", secret)
		}
	}
	if strings.Contains(logs.String(), "audit chain unusable") {
		t.Errorf("a sound chain was logged as unusable:\n%s", logs.String())
	}
}

func TestTimelineUnsignedDenyFromAuditChain(t *testing.T) {
	var l *audit.Log
	var logs syncBuffer
	e := newEnv(t, withAudit(t, &l, &logs))
	rec := e.newTask(t, taskSpec{})
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	const detail = "Denied by Ann Lee via slack (without a passkey): call me first"
	appendSteps(t, l, rec.TaskID,
		requestedStep(t, rec, "", t0),
		audit.Step{ID: "decision/u1", Kind: audit.KindDecision, At: t0.Add(time.Second), Body: audit.Decision{
			Decision: tasks.DecisionDeny, Accepted: true,
			Unsigned: &audit.Unsigned{ApproverID: "apv_ann", ApproverName: "Ann Lee", Via: "slack", Comment: "call me first"}}},
	)
	if _, err := l.Seal(context.Background(), rec.TaskID, audit.End{Kind: audit.KindDenied, At: t0.Add(2 * time.Second),
		Status: "completed", Disposition: "denied-not-executed", Detail: detail}); err != nil {
		t.Fatal(err)
	}
	got, _ := e.timeline(t, rec.ApprovalRef)
	if len(got) != 2 || got[0].Kind != "requested" || got[1].Kind != "denied" || got[1].Detail != detail {
		t.Fatalf("timeline = %+v, want requested then denied with %q", got, detail)
	}
	r := e.do(t, "GET", "/approve/"+rec.ApprovalRef, nil)
	wantStatus(t, r, http.StatusOK)
	_, stepper, _ := strings.Cut(checkPage(t, r), `id="timeline"`)
	wantInOrder(t, stepper, "Requested by "+testRequester, "Denied", "Denied by Ann Lee via slack (without a passkey): call me first")
}

// wantReadModelTimeline fails unless the API and the page show rec's read
// model timeline, not its audit chain's.
func (e *env) wantReadModelTimeline(t *testing.T, rec tasks.Record) {
	t.Helper()
	got, _ := e.timeline(t, rec.ApprovalRef)
	if len(got) != 1 || got[0].Kind != "requested" || got[0].Detail != "held for approval" {
		t.Fatalf("timeline = %+v, want the read model's", got)
	}
	r := e.do(t, "GET", "/approve/"+rec.ApprovalRef, nil)
	wantStatus(t, r, http.StatusOK)
	page := checkPage(t, r)
	if !strings.Contains(page, "held for approval") || strings.Contains(page, "Policy re-checked: allowed") {
		t.Fatalf("page timeline is not the read model's:\n%s", page)
	}
}

// The chain checks and every fallback are the approvals service's (see
// approvals/timeline_test.go); here, that the API and the page both show
// the read model's timeline when the chain is unusable.
func TestTimelineFallsBackToReadModel(t *testing.T) {
	var l *audit.Log
	var logs syncBuffer
	e := newEnv(t, withAudit(t, &l, &logs))
	t.Run("chain of another approval", func(t *testing.T) {
		rec := e.newTask(t, taskSpec{})
		appendSteps(t, l, rec.TaskID, requestedStep(t, rec, tasks.NewID("apr_"), time.Now().UTC()))
		e.wantReadModelTimeline(t, rec)
		if !strings.Contains(logs.String(), "another call than this approval") {
			t.Errorf("the fallback is not logged with its reason:\n%s", logs.String())
		}
	})
	t.Run("missing chain", func(t *testing.T) {
		e.wantReadModelTimeline(t, e.newTask(t, taskSpec{}))
	})
}
