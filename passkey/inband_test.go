package passkey_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/descope/virtualwebauthn"

	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/pdp"
)

// enrollInBand enrolls a passkey for principal through the in-band methods
// (approval/enroll/begin and finish).
func (e *env) enrollInBand(tb testing.TB, principal string, transports ...string) *kit {
	tb.Helper()
	ctx := context.Background()
	creation, err := e.svc.BeginPrincipalEnrollment(ctx, principal)
	if err != nil {
		tb.Fatalf("BeginPrincipalEnrollment: %v", err)
	}
	raw, _ := json.Marshal(creation)
	opts, err := virtualwebauthn.ParseAttestationOptions(string(raw))
	if err != nil {
		tb.Fatal(err)
	}
	auth := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(opts.UserID)})
	cred := testpasskey.NewEC2Credential()
	id, _, err := e.svc.FinishPrincipalEnrollment(ctx, principal, withTransports(tb, virtualwebauthn.CreateAttestationResponse(e.rp, auth, cred, *opts), transports))
	if err != nil {
		tb.Fatalf("FinishPrincipalEnrollment: %v", err)
	}
	auth.AddCredential(cred)
	return &kit{CredID: id, Auth: auth, Cred: cred}
}

func (e *env) issueInBand(tb testing.TB, principal, class string) (*call, error) {
	tb.Helper()
	req := passkey.ChallengeRequest{
		Tool:               "place_trade",
		ActionHash:         hashOf(tb, "place_trade", `{"symbol":"AAPL"}`),
		Principal:          principal,
		AuthenticatorClass: class,
		DisplayText:        "Buy 1 AAPL",
	}
	ch, err := e.svc.IssueChallenge(context.Background(), req)
	return &call{Req: req, Ch: ch}, err
}

func inBandReq(c *call, principal string, resp json.RawMessage) passkey.VerifyRequest {
	return passkey.VerifyRequest{
		ChallengeID: c.Ch.ID, Tool: c.Req.Tool, ActionHash: c.Req.ActionHash,
		Principal: principal, AuthenticatorClass: c.Req.AuthenticatorClass,
		Method: passkey.MethodWebAuthn, Response: resp,
	}
}

func TestInBandEnrollAndVerify(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.issueInBand(t, "agent-a", ""); passkey.ReasonOf(err) != passkey.ReasonNoEligibleCredential {
		t.Fatalf("challenge before enrollment: %v, want no_eligible_credential", err)
	}
	k := e.enrollInBand(t, "agent-a", "usb")
	// The approver in-band enrollment created is an approver like any other.
	as, err := e.svc.Approvers(ctx)
	if err != nil || len(as) != 1 || !as[0].MappedTo("agent-a") || len(as[0].CredentialIDs) != 1 || as[0].CredentialIDs[0] != k.CredID {
		t.Fatalf("approvers = %+v, %v", as, err)
	}
	c, err := e.issueInBand(t, "agent-a", "")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(c.Ch.RequestOptions.AllowedCredentials); n != 1 {
		t.Fatalf("allowCredentials = %d, want 1", n)
	}
	resp := k.sign(t, e.rp, c.Ch)
	// Another principal's call: the challenge is not theirs to know, and
	// nothing is consumed.
	_, err = e.svc.Verify(ctx, inBandReq(c, "agent-b", resp))
	wantReason(t, err, passkey.ReasonChallengeUnknown)
	// A task decision cannot use an in-band challenge either.
	tr := inBandReq(c, "", resp)
	tr.Group, tr.TaskID = passkey.InBandGroup, "tsk_x"
	_, err = e.svc.Verify(ctx, tr)
	wantReason(t, err, passkey.ReasonChallengeUnknown)
	v, err := e.svc.Verify(ctx, inBandReq(c, "agent-a", resp))
	if err != nil || v.CredentialID != k.CredID {
		t.Fatalf("Verify = %+v, %v", v, err)
	}
	_, err = e.svc.Verify(ctx, inBandReq(c, "agent-a", resp))
	wantReason(t, err, passkey.ReasonChallengeConsumed)

	// A second in-band enrollment adds to the same approver and excludes
	// the first passkey.
	creation, err := e.svc.BeginPrincipalEnrollment(ctx, "agent-a")
	if err != nil || len(creation.Response.CredentialExcludeList) != 1 {
		t.Fatalf("second begin: %v, exclude %v", err, creation)
	}
}

func TestInBandNoPendingEnrollment(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	_, _, err := e.svc.FinishPrincipalEnrollment(ctx, "agent-a", []byte(`{}`))
	wantReason(t, err, passkey.ReasonNoPendingEnrollment)
	e.enrollInBand(t, "agent-a")
	// The pending registration was used up.
	_, _, err = e.svc.FinishPrincipalEnrollment(ctx, "agent-a", []byte(`{}`))
	wantReason(t, err, passkey.ReasonNoPendingEnrollment)
	// Expired.
	if _, err := e.svc.BeginPrincipalEnrollment(ctx, "agent-a"); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(6 * 60e9)
	_, _, err = e.svc.FinishPrincipalEnrollment(ctx, "agent-a", []byte(`{}`))
	wantReason(t, err, passkey.ReasonNoPendingEnrollment)
	// Begun by another principal.
	if _, err := e.svc.BeginPrincipalEnrollment(ctx, "agent-b"); err != nil {
		t.Fatal(err)
	}
	_, _, err = e.svc.FinishPrincipalEnrollment(ctx, "agent-c", []byte(`{}`))
	wantReason(t, err, passkey.ReasonNoPendingEnrollment)
}

// A passkey enrolled on the approver site works in-band once its approver
// is mapped to the principal, and not before.
func TestInBandApproverSitePasskey(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	k := e.enroll(t, "alice", []string{"approvers"}, "usb")
	if _, err := e.issueInBand(t, "agent-a", ""); passkey.ReasonOf(err) != passkey.ReasonNoEligibleCredential {
		t.Fatalf("unmapped: %v, want no_eligible_credential", err)
	}
	// An in-band challenge of a mapped colleague, signed with alice's
	// passkey: not enrolled for that principal.
	e.enrollInBand(t, "agent-b", "usb")
	c, err := e.issueInBand(t, "agent-b", "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.svc.Verify(ctx, inBandReq(c, "agent-b", k.sign(t, e.rp, c.Ch)))
	wantReason(t, err, passkey.ReasonUnknownCredential)

	mapped := e.enrollMapped(t, "bob", "agent-c", "usb")
	c, err = e.issueInBand(t, "agent-c", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Verify(ctx, inBandReq(c, "agent-c", mapped.sign(t, e.rp, c.Ch))); err != nil {
		t.Fatalf("mapped approver's passkey in-band: %v", err)
	}
}

// The authenticator-class filter applies at issuance and at verification.
func TestInBandAuthenticatorClass(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	k := e.enrollInBand(t, "agent-a", "internal")
	if _, err := e.issueInBand(t, "agent-a", passkey.ClassCrossPlatform); passkey.ReasonOf(err) != passkey.ReasonNoEligibleCredential {
		t.Fatalf("internal-only for cross-platform: %v, want no_eligible_credential", err)
	}
	c, err := e.issueInBand(t, "agent-a", passkey.ClassPlatform)
	if err != nil {
		t.Fatal(err)
	}
	// Verified under a stricter class than issued: refused, not consumed.
	req := inBandReq(c, "agent-a", k.sign(t, e.rp, c.Ch))
	req.AuthenticatorClass = passkey.ClassCrossPlatform
	_, err = e.svc.Verify(ctx, req)
	wantReason(t, err, passkey.ReasonAuthenticatorClassMismatch)
	req.AuthenticatorClass = passkey.ClassPlatform
	if _, err := e.svc.Verify(ctx, req); err != nil {
		t.Fatalf("platform: %v", err)
	}
}

// enrollMapped adds an approver on the approver site, mapped to principal,
// with one passkey.
func (e *env) enrollMapped(tb testing.TB, name, principal string, transports ...string) *kit {
	tb.Helper()
	ctx := context.Background()
	a, token, err := e.svc.AddApprover(ctx, name, []string{"approvers"}, passkey.WithPrincipals(principal))
	if err != nil {
		tb.Fatal(err)
	}
	auth := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(a.ID)})
	cred := testpasskey.NewEC2Credential()
	id, err := e.svc.FinishEnrollment(ctx, token, e.attestation(tb, token, auth, cred, transports, nil))
	if err != nil {
		tb.Fatal(err)
	}
	auth.AddCredential(cred)
	return &kit{A: a, CredID: id, Auth: auth, Cred: cred}
}

// In-band challenges have their own lifetime (SEP-2672 §4.4.3: 60 s by
// default; --verified-challenge-ttl), told to the browser as the timeout;
// task challenges keep theirs.
func TestInBandChallengeTTL(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.enrollInBand(t, "agent-a", "usb")
	c, err := e.issueInBand(t, "agent-a", "")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Ch.ExpiresAt.Sub(e.clock.Now()); got != passkey.DefaultInBandChallengeTTL || c.Ch.RequestOptions.Timeout != 60000 {
		t.Errorf("default: expires in %v, timeout %d", got, c.Ch.RequestOptions.Timeout)
	}
	svc, err := passkey.New(ctx, e.js, passkey.Options{RPID: testRPID, RPOrigins: []string{testOrigin}, Now: e.clock.Now, InBandChallengeTTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := svc.IssueChallenge(ctx, c.Req)
	if err != nil {
		t.Fatal(err)
	}
	if got := ch.ExpiresAt.Sub(e.clock.Now()); got != 10*time.Second || ch.RequestOptions.Timeout != 10000 {
		t.Errorf("10s: expires in %v, timeout %d", got, ch.RequestOptions.Timeout)
	}
	for _, bad := range []time.Duration{-time.Second, passkey.MaxChallengeTTL + time.Second} {
		if _, err := passkey.New(ctx, e.js, passkey.Options{RPID: testRPID, RPOrigins: []string{testOrigin}, InBandChallengeTTL: bad}); err == nil {
			t.Errorf("InBandChallengeTTL %v accepted", bad)
		}
	}
	e.enroll(t, "bob", []string{"approvers"}, "usb")
	task := e.issue(t, "tsk_ttl", "approvers", "")
	if got := task.Ch.ExpiresAt.Sub(e.clock.Now()); got != passkey.DefaultChallengeTTL {
		t.Errorf("task challenge expires in %v", got)
	}
}

// Unsolicited client extension outputs (the reference's test emulator
// returns credProps unasked) fail the ceremony by default and are ignored
// with IgnoreUnsolicitedExtensions, the in-band service's setting.
func TestIgnoreUnsolicitedExtensions(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	k := e.enrollInBand(t, "agent-a", "usb")
	withCredProps := func(resp json.RawMessage) json.RawMessage {
		var m map[string]any
		if err := json.Unmarshal(resp, &m); err != nil {
			t.Fatal(err)
		}
		m["clientExtensionResults"] = map[string]any{"credProps": map[string]any{"rk": true}}
		b, _ := json.Marshal(m)
		return b
	}
	c, err := e.issueInBand(t, "agent-a", "")
	if err != nil {
		t.Fatal(err)
	}
	resp := withCredProps(k.sign(t, e.rp, c.Ch))
	_, err = e.svc.Verify(ctx, inBandReq(c, "agent-a", resp))
	wantReason(t, err, passkey.ReasonSignatureVerificationFailed)
	lenient, err := passkey.New(ctx, e.js, passkey.Options{RPID: testRPID, RPOrigins: []string{testOrigin}, Now: e.clock.Now, IgnoreUnsolicitedExtensions: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lenient.Verify(ctx, inBandReq(c, "agent-a", resp)); err != nil {
		t.Fatalf("lenient service: %v", err)
	}
}

// The reference's three per-call tests at this layer, in-band: a valid
// assertion verifies, the same assertion for other arguments is
// argument_hash_mismatch (and consumes nothing), a second use is
// challenge_consumed.
func TestInBandHappyTamperReplay(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	k := e.enrollInBand(t, "agent-a", "usb")
	c, err := e.issueInBand(t, "agent-a", "")
	if err != nil {
		t.Fatal(err)
	}
	resp := k.sign(t, e.rp, c.Ch)
	tampered := inBandReq(c, "agent-a", resp)
	tampered.ActionHash = hashOf(t, "place_trade", `{"symbol":"AAPL","quantity":1000}`)
	_, err = e.svc.Verify(ctx, tampered)
	wantReason(t, err, passkey.ReasonArgumentHashMismatch)
	if _, err := e.svc.Verify(ctx, inBandReq(c, "agent-a", resp)); err != nil {
		t.Fatalf("valid assertion after a tampered one: %v", err)
	}
	_, err = e.svc.Verify(ctx, inBandReq(c, "agent-a", resp))
	wantReason(t, err, passkey.ReasonChallengeConsumed)
	// An in-band challenge names a principal, not a group.
	_, err = e.svc.IssueChallenge(ctx, passkey.ChallengeRequest{Tool: "t", ActionHash: c.Req.ActionHash, Principal: "agent-a", Group: "approvers", DisplayText: "x"})
	if !errors.Is(err, passkey.ErrInvalidArgument) {
		t.Fatalf("principal and group: %v", err)
	}
}

// In-band enrollment is authorized by the bearer token alone, so it never
// adds a passkey to an approver an admin created: mapping alice (group
// approvers) to agent-a, which also keeps her from deciding agent-a's own
// calls, must not let agent-a's token add a passkey that decides other
// principals' tasks as alice. The passkey lands on agent-a's own in-band
// approver, works for agent-a's in-band calls, and decides nothing else.
func TestInBandEnrollNeverOntoAnAdminsApprover(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	alice := e.enrollMapped(t, "alice", "agent-a", "usb")
	k := e.enrollInBand(t, "agent-a", "usb")

	as, err := e.svc.Approvers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		if a.ID == alice.A.ID && len(a.CredentialIDs) != 1 {
			t.Fatalf("alice's passkeys = %v, want only her own", a.CredentialIDs)
		}
		if a.ID != alice.A.ID && (!a.MappedTo("agent-a") || len(a.Groups) != 1 || a.Groups[0] != passkey.InBandGroup || len(a.CredentialIDs) != 1 || a.CredentialIDs[0] != k.CredID) {
			t.Fatalf("in-band approver = %+v, want agent-a's, in group %s, holding %s", a, passkey.InBandGroup, k.CredID)
		}
	}
	if len(as) != 2 {
		t.Fatalf("approvers = %+v, want alice and agent-a's in-band approver", as)
	}

	// A task of another principal, for alice's group: the agent's passkey
	// is not offered, and its assertion decides nothing.
	c := e.issue(t, "tsk_other", "approvers", "")
	if n := len(c.Ch.RequestOptions.AllowedCredentials); n != 1 {
		t.Fatalf("allowCredentials = %d, want alice's only", n)
	}
	req := c.verifyReq(k.sign(t, e.rp, c.Ch))
	req.Requester = "agent-b"
	_, err = e.svc.Verify(ctx, req)
	wantReason(t, err, passkey.ReasonApproverNotEligible)

	// Nor can a task name the in-band group, which any agent can join
	// (policy refuses such a decision too: pdp.InBandGroup).
	if pdp.InBandGroup != passkey.InBandGroup {
		t.Fatalf("pdp.InBandGroup = %q, passkey.InBandGroup = %q", pdp.InBandGroup, passkey.InBandGroup)
	}
	_, err = e.svc.IssueChallenge(ctx, passkey.ChallengeRequest{TaskID: "tsk_ib", Tool: "t", ActionHash: c.Req.ActionHash, Group: passkey.InBandGroup, DisplayText: "x"})
	if !errors.Is(err, passkey.ErrInvalidArgument) {
		t.Fatalf("task challenge for the in-band group: %v, want ErrInvalidArgument", err)
	}

	// Both passkeys still sign agent-a's own in-band calls.
	for _, signer := range []*kit{k, alice} {
		ib, err := e.issueInBand(t, "agent-a", "")
		if err != nil {
			t.Fatal(err)
		}
		if n := len(ib.Ch.RequestOptions.AllowedCredentials); n != 2 {
			t.Fatalf("in-band allowCredentials = %d, want 2", n)
		}
		if _, err := e.svc.Verify(ctx, inBandReq(ib, "agent-a", signer.sign(t, e.rp, ib.Ch))); err != nil {
			t.Fatalf("in-band with %s: %v", signer.CredID, err)
		}
	}
}

// A principal is taken byte for byte: the decomposed spelling of a mapped
// principal maps to nothing and cannot enroll in-band, so it can neither
// add a passkey to the composed one's approver nor replace its pending
// enrollment.
func TestInBandPrincipalIsExact(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	composed, decomposed := "oauth:jos\u00e9", "oauth:jose\u0301"
	e.enrollInBand(t, composed, "usb")
	as, err := e.svc.Approvers(ctx)
	if err != nil || len(as) != 1 {
		t.Fatalf("approvers = %+v, %v", as, err)
	}
	if !as[0].MappedTo(composed) || as[0].MappedTo(decomposed) {
		t.Errorf("MappedTo: composed %v, decomposed %v; want true, false", as[0].MappedTo(composed), as[0].MappedTo(decomposed))
	}
	if _, err := e.svc.BeginPrincipalEnrollment(ctx, decomposed); !errors.Is(err, passkey.ErrInvalidArgument) {
		t.Errorf("begin for the decomposed spelling: %v, want ErrInvalidArgument", err)
	}
	if _, _, err := e.svc.FinishPrincipalEnrollment(ctx, decomposed, []byte(`{}`)); passkey.ReasonOf(err) != passkey.ReasonNoPendingEnrollment {
		t.Errorf("finish for the decomposed spelling: %v, want no_pending_enrollment", err)
	}
}

// The in-band approver an admin disabled cannot enroll: begin says so at
// once, rather than a finish that can never succeed.
func TestInBandEnrollDisabledApprover(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.enrollInBand(t, "agent-a", "usb")
	as, err := e.svc.Approvers(ctx)
	if err != nil || len(as) != 1 {
		t.Fatalf("approvers = %+v, %v", as, err)
	}
	if _, _, err := e.svc.SetApproverStatus(ctx, as[0].ID, passkey.ActionDisable); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.BeginPrincipalEnrollment(ctx, "agent-a"); !errors.Is(err, passkey.ErrInvalidArgument) {
		t.Errorf("begin with a disabled in-band approver: %v, want ErrInvalidArgument", err)
	}
}

// withEnrollment is e with a second Service on the same buckets whose
// in-band enrollment policy is policy (another replica, or this one after
// a restart with another setting).
func (e *env) withEnrollment(tb testing.TB, policy string) *env {
	tb.Helper()
	svc, err := passkey.New(context.Background(), e.js, passkey.Options{
		RPID: testRPID, RPOrigins: []string{testOrigin}, RPDisplayName: "Countersign test",
		Now: e.clock.Now, InBandEnrollment: policy,
	})
	if err != nil {
		tb.Fatal(err)
	}
	f := *e
	f.svc = svc
	return &f
}

// finishInBand answers creation (a begin's options) with a new passkey
// through f's Service.
func (f *env) finishInBand(tb testing.TB, principal string, creation any) error {
	tb.Helper()
	raw, _ := json.Marshal(creation)
	opts, err := virtualwebauthn.ParseAttestationOptions(string(raw))
	if err != nil {
		tb.Fatal(err)
	}
	auth := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(opts.UserID)})
	resp := withTransports(tb, virtualwebauthn.CreateAttestationResponse(f.rp, auth, testpasskey.NewEC2Credential(), *opts), []string{"usb"})
	_, _, err = f.svc.FinishPrincipalEnrollment(context.Background(), principal, resp)
	return err
}

// TestInBandEnrollmentPolicy: "closed" refuses every in-band enrollment
// before anything is created; "first" takes a principal's first passkey
// only, counting those of approvers mapped to it on the approver site;
// both are checked again at the finish, so a begin made under "open"
// (before a restart) or before another passkey arrived stores nothing.
func TestInBandEnrollmentPolicy(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	closed, first := e.withEnrollment(t, passkey.EnrollClosed), e.withEnrollment(t, passkey.EnrollFirst)

	if _, err := closed.svc.BeginPrincipalEnrollment(ctx, "agent-a"); !errors.Is(err, passkey.ErrEnrollmentClosed) {
		t.Fatalf("closed begin: %v, want ErrEnrollmentClosed", err)
	}
	if as, err := e.svc.Approvers(ctx); err != nil || len(as) != 0 {
		t.Fatalf("closed begin left approvers %+v, %v", as, err)
	}

	first.enrollInBand(t, "agent-a", "usb")
	if _, err := first.svc.BeginPrincipalEnrollment(ctx, "agent-a"); !errors.Is(err, passkey.ErrNotFirstPasskey) {
		t.Fatalf("first, second begin: %v, want ErrNotFirstPasskey", err)
	}
	// A passkey from the approver site counts.
	e.enrollMapped(t, "bob", "agent-b", "usb")
	if _, err := first.svc.BeginPrincipalEnrollment(ctx, "agent-b"); !errors.Is(err, passkey.ErrNotFirstPasskey) {
		t.Fatalf("first, mapped approver's passkey: %v, want ErrNotFirstPasskey", err)
	}
	// Begun under "open", finished after a restart with "closed".
	creation, err := e.svc.BeginPrincipalEnrollment(ctx, "agent-c")
	if err != nil {
		t.Fatal(err)
	}
	err = closed.finishInBand(t, "agent-c", creation)
	if passkey.ReasonOf(err) != passkey.ReasonNoPendingEnrollment || !errors.Is(err, passkey.ErrEnrollmentClosed) {
		t.Fatalf("closed finish: %v, want no_pending_enrollment (closed)", err)
	}
	// Begun under "first", and a passkey enrolled on the approver site
	// before the finish.
	creation, err = first.svc.BeginPrincipalEnrollment(ctx, "agent-d")
	if err != nil {
		t.Fatal(err)
	}
	e.enrollMapped(t, "carol", "agent-d", "usb")
	err = first.finishInBand(t, "agent-d", creation)
	if passkey.ReasonOf(err) != passkey.ReasonNoPendingEnrollment || !errors.Is(err, passkey.ErrNotFirstPasskey) {
		t.Fatalf("first finish after another passkey: %v, want no_pending_enrollment (not first)", err)
	}
	for _, p := range []string{"agent-c", "agent-d"} {
		if creds, err := e.svc.PrincipalCredentials(ctx, p, "platform"); err != nil || len(creds) != map[string]int{"agent-c": 0, "agent-d": 1}[p] {
			t.Errorf("%s: credentials %d, %v", p, len(creds), err)
		}
	}
	// "open" still takes further passkeys.
	e.enrollInBand(t, "agent-a", "usb")

	if _, err := passkey.New(ctx, e.js, passkey.Options{RPID: testRPID, RPOrigins: []string{testOrigin}, InBandEnrollment: "never"}); err == nil {
		t.Error(`InBandEnrollment "never" accepted`)
	}
}
