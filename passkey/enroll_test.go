package passkey_test

import (
	"context"
	"encoding/base64"
	"errors"
	"testing"
	"time"

	"github.com/descope/virtualwebauthn"
	"github.com/go-webauthn/webauthn/protocol"
	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/passkey"
)

func TestNewValidatesRP(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name    string
		rpID    string
		origins []string
	}{
		{"empty rp id", "", []string{"https://example.com"}},
		{"no origins", "example.com", nil},
		{"origin outside rp id", "example.com", []string{"https://example.org"}},
		{"suffix but not subdomain", "example.com", []string{"https://badexample.com"}},
		{"http for non-localhost", "example.com", []string{"http://example.com"}},
		{"origin with path", "example.com", []string{"https://example.com/app"}},
		{"origin without scheme", "example.com", []string{"example.com"}},
		{"unparsable origin", "example.com", []string{"https://exa mple.com"}},
		{"rp id with scheme", "https://example.com", []string{"https://example.com"}},
		{"rp id is an ip", "127.0.0.1", []string{"https://127.0.0.1"}},
		{"rp id with port", "example.com:443", []string{"https://example.com"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := passkey.New(context.Background(), e.js, passkey.Options{RPID: tt.rpID, RPOrigins: tt.origins})
			if err == nil {
				t.Fatal("New accepted a bad RP configuration")
			}
		})
	}
	for _, ok := range []passkey.Options{
		{RPID: "example.com", RPOrigins: []string{"https://example.com", "https://approvals.example.com:8443"}},
		{RPID: "localhost", RPOrigins: []string{"http://localhost:8080"}},
	} {
		if _, err := passkey.New(context.Background(), e.js, ok); err != nil {
			t.Errorf("New(%v): %v", ok.RPOrigins, err)
		}
	}
}

func TestNewCreatesFileBuckets(t *testing.T) {
	e := newEnv(t)
	for _, b := range []string{passkey.BucketApprovers, passkey.BucketInvites, passkey.BucketCredentials, passkey.BucketChallenges} {
		kv, err := e.js.KeyValue(context.Background(), b)
		if err != nil {
			t.Fatalf("bucket %s: %v", b, err)
		}
		st, err := kv.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Config().Storage; got != jetstream.FileStorage {
			t.Errorf("bucket %s storage = %v, want file", b, got)
		}
	}
}

func TestAddApproverValidates(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name   string
		who    string
		groups []string
	}{
		{"empty name", "", []string{"ops"}},
		{"leading space", " alice", []string{"ops"}},
		{"control char", "ali\nce", []string{"ops"}},
		{"markup", "<script>", []string{"ops"}},
		{"too long", string(make([]byte, 200)), []string{"ops"}},
		{"no groups", "alice", nil},
		{"empty group", "alice", []string{""}},
		{"group with space", "alice", []string{"o ps"}},
		{"group starting with dot", "alice", []string{".ops"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := e.svc.AddApprover(context.Background(), tt.who, tt.groups)
			if !errors.Is(err, passkey.ErrInvalidArgument) {
				t.Fatalf("AddApprover(%q, %q) = %v, want ErrInvalidArgument", tt.who, tt.groups, err)
			}
		})
	}
}

func TestApprovers(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if got, err := e.svc.Approvers(ctx); err != nil || len(got) != 0 {
		t.Fatalf("Approvers on empty bucket = %v, %v", got, err)
	}
	a, token, err := e.svc.AddApprover(ctx, "Alice Müller", []string{"ops", "finance", "ops"})
	if err != nil {
		t.Fatal(err)
	}
	if raw, err := base64.RawURLEncoding.DecodeString(token); err != nil || len(raw) < 16 {
		t.Errorf("invite token %d chars is not >=128-bit base64url", len(token))
	}
	if diff := cmp.Diff([]string{"finance", "ops"}, a.Groups); diff != "" {
		t.Errorf("groups (-want +got):\n%s", diff)
	}
	b, _, err := e.svc.AddApprover(ctx, "bob", []string{"ops"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.svc.Approvers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("Approvers = %d, want 2", len(got))
	}
	one, err := e.svc.Approver(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(a, one); diff != "" {
		t.Errorf("Approver (-added +read):\n%s", diff)
	}
	if _, err := e.svc.Approver(ctx, "0123456789abcdef0123456789abcdef"); !errors.Is(err, passkey.ErrNotFound) {
		t.Errorf("unknown approver: %v, want ErrNotFound", err)
	}
	if _, err := e.svc.Approver(ctx, "../etc"); !errors.Is(err, passkey.ErrNotFound) {
		t.Errorf("malformed approver id: %v, want ErrNotFound", err)
	}
	if _, err := e.svc.NewInvite(ctx, "0123456789abcdef0123456789abcdef"); !errors.Is(err, passkey.ErrNotFound) {
		t.Errorf("NewInvite for unknown approver: %v, want ErrNotFound", err)
	}
	if _, err := e.svc.NewInvite(ctx, b.ID); err != nil {
		t.Errorf("NewInvite: %v", err)
	}
}

func TestEnrollHappyPath(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, token, err := e.svc.AddApprover(ctx, "alice", []string{"finance"})
	if err != nil {
		t.Fatal(err)
	}
	creation, err := e.svc.BeginEnrollment(ctx, token)
	if err != nil {
		t.Fatal(err)
	}
	opts := creation.Response
	if opts.AuthenticatorSelection.UserVerification != protocol.VerificationRequired {
		t.Errorf("userVerification = %q, want required", opts.AuthenticatorSelection.UserVerification)
	}
	if opts.AuthenticatorSelection.ResidentKey != protocol.ResidentKeyRequirementPreferred {
		t.Errorf("residentKey = %q, want preferred", opts.AuthenticatorSelection.ResidentKey)
	}
	if opts.RelyingParty.ID != testRPID || len(opts.Challenge) != 32 {
		t.Errorf("rp id %q, challenge %d bytes", opts.RelyingParty.ID, len(opts.Challenge))
	}

	auth := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(a.ID)})
	cred := testpasskey.NewEC2Credential()
	resp := e.attestation(t, token, auth, cred, []string{"usb", "nfc"}, nil)
	id, err := e.svc.FinishEnrollment(ctx, token, resp)
	if err != nil {
		t.Fatalf("FinishEnrollment: %v", err)
	}
	if want := base64.RawURLEncoding.EncodeToString(cred.ID); id != want {
		t.Errorf("credential id = %q, want %q", id, want)
	}
	got, err := e.svc.Approver(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{id}, got.CredentialIDs); diff != "" {
		t.Errorf("approver credentials (-want +got):\n%s", diff)
	}
	// The stored transports come back in allowCredentials.
	c := e.issue(t, "task-1", "finance", passkey.ClassCrossPlatform)
	allow := c.Ch.RequestOptions.AllowedCredentials
	if len(allow) != 1 || base64.RawURLEncoding.EncodeToString(allow[0].CredentialID) != id {
		t.Fatalf("allowCredentials = %+v", allow)
	}
	if diff := cmp.Diff([]protocol.AuthenticatorTransport{protocol.NFC, protocol.USB}, allow[0].Transport); diff != "" {
		t.Errorf("transports (-want +got):\n%s", diff)
	}

	// A second invite excludes the enrolled passkey.
	token2, err := e.svc.NewInvite(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	creation2, err := e.svc.BeginEnrollment(ctx, token2)
	if err != nil {
		t.Fatal(err)
	}
	ex := creation2.Response.CredentialExcludeList
	if len(ex) != 1 || base64.RawURLEncoding.EncodeToString(ex[0].CredentialID) != id {
		t.Errorf("excludeCredentials = %+v, want the enrolled credential", ex)
	}
}

func TestInviteSingleUse(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, token, err := e.svc.AddApprover(ctx, "alice", []string{"finance"})
	if err != nil {
		t.Fatal(err)
	}
	auth := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(a.ID)})
	cred := testpasskey.NewEC2Credential()
	resp := e.attestation(t, token, auth, cred, nil, nil)
	if _, err := e.svc.FinishEnrollment(ctx, token, resp); err != nil {
		t.Fatal(err)
	}
	// Same response again, a new begin, and another credential: all refused.
	_, err = e.svc.FinishEnrollment(ctx, token, resp)
	wantReason(t, err, passkey.ReasonNoPendingEnrollment)
	_, err = e.svc.BeginEnrollment(ctx, token)
	wantReason(t, err, passkey.ReasonNoPendingEnrollment)
	for _, bad := range []string{"", "short", token + "x", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"} {
		_, err = e.svc.BeginEnrollment(ctx, bad)
		wantReason(t, err, passkey.ReasonNoPendingEnrollment)
	}
}

func TestFinishWithoutBegin(t *testing.T) {
	e := newEnv(t)
	_, token, err := e.svc.AddApprover(context.Background(), "alice", []string{"finance"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.svc.FinishEnrollment(context.Background(), token, []byte(`{}`))
	wantReason(t, err, passkey.ReasonNoPendingEnrollment)
}

func TestInviteExpired(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, token, err := e.svc.AddApprover(ctx, "alice", []string{"finance"})
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(passkey.DefaultInviteTTL)
	_, err = e.svc.BeginEnrollment(ctx, token)
	wantReason(t, err, passkey.ReasonNoPendingEnrollment)

	// A registration session outlives neither its 5 minutes nor the invite.
	token2, err := e.svc.NewInvite(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	auth := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(a.ID)})
	cred := testpasskey.NewEC2Credential()
	resp := e.attestation(t, token2, auth, cred, nil, nil)
	e.clock.Advance(5*time.Minute + time.Second)
	_, err = e.svc.FinishEnrollment(ctx, token2, resp)
	wantReason(t, err, passkey.ReasonNoPendingEnrollment)
}

func TestEnrollRejectsTamperedRegistration(t *testing.T) {
	tests := []struct {
		name   string
		opts   virtualwebauthn.AuthenticatorOptions
		rp     func(virtualwebauthn.RelyingParty) virtualwebauthn.RelyingParty
		mutate func(*virtualwebauthn.AttestationOptions)
		resp   func([]byte) []byte
	}{
		{name: "mutated clientDataJSON.challenge", mutate: func(o *virtualwebauthn.AttestationOptions) { o.Challenge[0] ^= 1 }},
		{name: "no user verification", opts: virtualwebauthn.AuthenticatorOptions{UserNotVerified: true}},
		{name: "wrong origin", rp: func(rp virtualwebauthn.RelyingParty) virtualwebauthn.RelyingParty {
			rp.Origin = "https://evil.example"
			return rp
		}},
		{name: "wrong rp id", rp: func(rp virtualwebauthn.RelyingParty) virtualwebauthn.RelyingParty {
			rp.ID = "evil.example"
			return rp
		}},
		{name: "garbage", resp: func([]byte) []byte { return []byte(`{"id":"x"`) }},
		{name: "empty", resp: func([]byte) []byte { return nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			a, token, err := e.svc.AddApprover(ctx, "alice", []string{"finance"})
			if err != nil {
				t.Fatal(err)
			}
			opts := tt.opts
			opts.UserHandle = []byte(a.ID)
			auth := virtualwebauthn.NewAuthenticatorWithOptions(opts)
			cred := testpasskey.NewEC2Credential()
			good := e.rp
			if tt.rp != nil {
				e.rp = tt.rp(e.rp)
			}
			resp := e.attestation(t, token, auth, cred, nil, tt.mutate)
			if tt.resp != nil {
				resp = tt.resp(resp)
			}
			_, err = e.svc.FinishEnrollment(ctx, token, resp)
			wantReason(t, err, passkey.ReasonVerificationFailed)

			// Nothing stored, and the invite still works.
			got, err := e.svc.Approver(ctx, a.ID)
			if err != nil {
				t.Fatal(err)
			}
			if len(got.CredentialIDs) != 0 {
				t.Fatalf("credential stored after failure: %v", got.CredentialIDs)
			}
			kv, err := e.js.KeyValue(ctx, passkey.BucketCredentials)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := kv.Get(ctx, base64.RawURLEncoding.EncodeToString(cred.ID)); !errors.Is(err, jetstream.ErrKeyNotFound) {
				t.Fatalf("credential record after failure: %v", err)
			}
			e.rp = good
			ok := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(a.ID)})
			if _, err := e.svc.FinishEnrollment(ctx, token, e.attestation(t, token, ok, cred, nil, nil)); err != nil {
				t.Fatalf("invite unusable after a failed enrollment: %v", err)
			}
		})
	}
}

func TestReEnrollSameCredential(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	k := e.enroll(t, "alice", []string{"finance"})

	// Same approver, new invite, same authenticator credential: the virtual
	// authenticator ignores excludeCredentials, like a bypassing client would.
	token, err := e.svc.NewInvite(ctx, k.A.ID)
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.svc.FinishEnrollment(ctx, token, e.attestation(t, token, k.Auth, k.Cred, nil, nil))
	wantReason(t, err, passkey.ReasonCredentialAlreadyEnrolled)

	// Another approver trying to claim the same credential id.
	b, token2, err := e.svc.AddApprover(ctx, "bob", []string{"ops"})
	if err != nil {
		t.Fatal(err)
	}
	authB := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(b.ID)})
	_, err = e.svc.FinishEnrollment(ctx, token2, e.attestation(t, token2, authB, k.Cred, nil, nil))
	wantReason(t, err, passkey.ReasonCredentialAlreadyEnrolled)

	// The invite was not burnt.
	other := testpasskey.NewEC2Credential()
	if _, err := e.svc.FinishEnrollment(ctx, token, e.attestation(t, token, k.Auth, other, nil, nil)); err != nil {
		t.Fatalf("invite unusable after already-enrolled: %v", err)
	}
	got, err := e.svc.Approver(ctx, k.A.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.CredentialIDs) != 2 {
		t.Errorf("alice has %d credentials, want 2", len(got.CredentialIDs))
	}
}

func TestRSAPasskey(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, token, err := e.svc.AddApprover(ctx, "alice", []string{"finance"})
	if err != nil {
		t.Fatal(err)
	}
	auth := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(a.ID)})
	cred := virtualwebauthn.NewCredential(virtualwebauthn.KeyTypeRSA)
	id, err := e.svc.FinishEnrollment(ctx, token, e.attestation(t, token, auth, cred, []string{"usb"}, nil))
	if err != nil {
		t.Fatal(err)
	}
	a, _ = e.svc.Approver(ctx, a.ID)
	k := &kit{A: a, CredID: id, Auth: auth, Cred: cred}
	c := e.issue(t, "task-rsa", "finance", "")
	if _, err := e.svc.Verify(ctx, c.verifyReq(k.sign(t, e.rp, c.Ch))); err != nil {
		t.Fatalf("Verify with RSA passkey: %v", err)
	}
}
