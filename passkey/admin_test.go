package passkey_test

import (
	"context"
	"errors"
	"testing"

	"github.com/countersign/countersign/passkey"
)

// A passkey revoked between the challenge and the decision is refused with
// credential_revoked; the challenge is not consumed. Revoking again changes
// nothing; enabling a revoked passkey is ErrRevoked.
func TestRevokePasskeyBetweenChallengeAndDecision(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	k := e.enroll(t, "alice", []string{"ops"})
	c := e.issue(t, "tsk_revoke1", "ops", "")
	resp := k.sign(t, e.rp, c.Ch)

	info, ch, err := e.svc.SetPasskeyStatus(ctx, k.A.ID, k.CredID, passkey.ActionRevoke)
	if err != nil {
		t.Fatal(err)
	}
	if !ch.Changed || ch.Status != passkey.StatusRevoked || info.Status != passkey.StatusRevoked || info.RevokedAt.IsZero() {
		t.Fatalf("revoke: info %+v change %+v", info, ch)
	}
	_, err = e.svc.Verify(ctx, c.verifyReq(resp))
	wantReason(t, err, passkey.ReasonCredentialRevoked)
	if got := passkey.MessageOf(passkey.ReasonCredentialRevoked); got != "Passkey has been revoked by an admin" {
		t.Fatalf("message %q", got)
	}

	_, again, err := e.svc.SetPasskeyStatus(ctx, k.A.ID, k.CredID, passkey.ActionRevoke)
	if err != nil || again.Changed || again.Status != passkey.StatusRevoked || !again.At.Equal(ch.At) {
		t.Fatalf("second revoke: %+v, %v; want unchanged, revoked at %v", again, err, ch.At)
	}
	for _, action := range []string{passkey.ActionEnable, passkey.ActionDisable} {
		if _, _, err := e.svc.SetPasskeyStatus(ctx, k.A.ID, k.CredID, action); !errors.Is(err, passkey.ErrRevoked) {
			t.Fatalf("%s a revoked passkey: %v, want ErrRevoked", action, err)
		}
	}
	// No longer offered: the group has no eligible passkey.
	_, err = e.svc.IssueChallenge(ctx, c.Req)
	wantReason(t, err, passkey.ReasonNoEligibleCredential)
	pks, err := e.svc.Passkeys(ctx, k.A.ID)
	if err != nil || len(pks) != 1 || pks[0].Status != passkey.StatusRevoked {
		t.Fatalf("Passkeys: %+v, %v", pks, err)
	}
}

// Disabling is reversible: a disabled passkey is refused, enabled again it
// verifies, on the same challenge.
func TestDisableEnablePasskey(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	k := e.enroll(t, "alice", []string{"ops"})
	c := e.issue(t, "tsk_disable1", "ops", "")
	resp := k.sign(t, e.rp, c.Ch)
	if _, ch, err := e.svc.SetPasskeyStatus(ctx, k.A.ID, k.CredID, passkey.ActionDisable); err != nil || !ch.Changed || ch.Status != passkey.StatusDisabled {
		t.Fatalf("disable: %+v %v", ch, err)
	}
	_, err := e.svc.Verify(ctx, c.verifyReq(resp))
	wantReason(t, err, passkey.ReasonCredentialDisabled)
	first, ch, err := e.svc.SetPasskeyStatus(ctx, k.A.ID, k.CredID, passkey.ActionEnable)
	if err != nil || !ch.Changed || first.Status != passkey.StatusActive {
		t.Fatalf("enable: %+v %+v %v", first, ch, err)
	}
	if _, ch, err := e.svc.SetPasskeyStatus(ctx, k.A.ID, k.CredID, passkey.ActionEnable); err != nil || ch.Changed {
		t.Fatalf("enable twice: %+v %v", ch, err)
	}
	if _, err := e.svc.Verify(ctx, c.verifyReq(resp)); err != nil {
		t.Fatalf("verify after enable: %v", err)
	}
}

// A disabled approver cannot approve, even on a challenge issued before;
// cannot be offered a challenge; and cannot enroll another passkey.
func TestDisableApprover(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	k := e.enroll(t, "alice", []string{"ops"})
	c := e.issue(t, "tsk_disable2", "ops", "")
	resp := k.sign(t, e.rp, c.Ch)
	token, err := e.svc.NewInvite(ctx, k.A.ID)
	if err != nil {
		t.Fatal(err)
	}
	a, ch, err := e.svc.SetApproverStatus(ctx, k.A.ID, passkey.ActionDisable)
	if err != nil || !ch.Changed || a.Status() != passkey.StatusDisabled || a.Active() {
		t.Fatalf("disable: %+v %+v %v", a, ch, err)
	}
	_, err = e.svc.Verify(ctx, c.verifyReq(resp))
	wantReason(t, err, passkey.ReasonApproverDisabled)
	_, err = e.svc.IssueChallenge(ctx, c.Req)
	wantReason(t, err, passkey.ReasonNoEligibleCredential)
	// No new invite, and an invite issued before cannot be used.
	if _, err := e.svc.NewInvite(ctx, k.A.ID); !errors.Is(err, passkey.ErrInvalidArgument) {
		t.Fatalf("invite of a disabled approver: %v", err)
	}
	_, err = e.svc.BeginEnrollment(ctx, token)
	wantReason(t, err, passkey.ReasonNoPendingEnrollment)

	if _, ch, err := e.svc.SetApproverStatus(ctx, k.A.ID, passkey.ActionEnable); err != nil || !ch.Changed || ch.Status != passkey.StatusActive {
		t.Fatalf("enable: %+v %v", ch, err)
	}
	if _, err := e.svc.Verify(ctx, c.verifyReq(resp)); err != nil {
		t.Fatalf("verify after enable: %v", err)
	}
}

func TestRevokeApprover(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	k := e.enroll(t, "alice", []string{"ops"})
	c := e.issue(t, "tsk_revoke2", "ops", "")
	resp := k.sign(t, e.rp, c.Ch)
	first, ch, err := e.svc.SetApproverStatus(ctx, k.A.ID, passkey.ActionRevoke)
	if err != nil || !ch.Changed || first.Status() != passkey.StatusRevoked {
		t.Fatalf("revoke: %+v %v", ch, err)
	}
	_, err = e.svc.Verify(ctx, c.verifyReq(resp))
	wantReason(t, err, passkey.ReasonApproverRevoked)
	if _, again, err := e.svc.SetApproverStatus(ctx, k.A.ID, passkey.ActionRevoke); err != nil || again.Changed || !again.At.Equal(first.RevokedAt) {
		t.Fatalf("revoke twice: %+v %v", again, err)
	}
	if _, _, err := e.svc.SetApproverStatus(ctx, k.A.ID, passkey.ActionEnable); !errors.Is(err, passkey.ErrRevoked) {
		t.Fatalf("enable revoked: %v", err)
	}
}

func TestSetStatusErrors(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	k := e.enroll(t, "alice", []string{"ops"})
	other := e.enroll(t, "bob", []string{"ops"})
	cases := []struct {
		name string
		run  func() error
		want error
	}{
		{"unknown approver", func() error {
			_, _, err := e.svc.SetApproverStatus(ctx, "0123456789abcdef0123456789abcdef", passkey.ActionDisable)
			return err
		}, passkey.ErrNotFound},
		{"malformed approver", func() error {
			_, _, err := e.svc.SetApproverStatus(ctx, "../x", passkey.ActionDisable)
			return err
		}, passkey.ErrNotFound},
		{"unknown action", func() error {
			_, _, err := e.svc.SetApproverStatus(ctx, k.A.ID, "delete")
			return err
		}, passkey.ErrInvalidArgument},
		{"unknown passkey", func() error {
			_, _, err := e.svc.SetPasskeyStatus(ctx, k.A.ID, "AAAA", passkey.ActionRevoke)
			return err
		}, passkey.ErrNotFound},
		{"malformed passkey", func() error {
			_, _, err := e.svc.SetPasskeyStatus(ctx, k.A.ID, "a.b>", passkey.ActionRevoke)
			return err
		}, passkey.ErrNotFound},
		{"another approver's passkey", func() error {
			_, _, err := e.svc.SetPasskeyStatus(ctx, k.A.ID, other.CredID, passkey.ActionRevoke)
			return err
		}, passkey.ErrNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.run(); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	// Nothing changed.
	pks, err := e.svc.Passkeys(ctx, other.A.ID)
	if err != nil || pks[0].Status != passkey.StatusActive {
		t.Fatalf("other's passkey: %+v %v", pks, err)
	}
}
