package passkey_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/descope/virtualwebauthn"

	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/passkey"
)

// recorder is an Options.Record that keeps what it is given, checks that
// the change has not taken effect yet, and fails while fail is set.
type recorder struct {
	tb     testing.TB
	mu     sync.Mutex
	svc    *passkey.Service
	events []passkey.Event
	fail   bool
}

func (r *recorder) record(ctx context.Context, e passkey.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail {
		return errors.New("audit log down")
	}
	switch e.Kind {
	case passkey.EventAdd:
		if _, err := r.svc.Approver(ctx, e.ApproverID); !errors.Is(err, passkey.ErrNotFound) {
			r.tb.Errorf("approver %s stored before its record (%v)", e.ApproverID, err)
		}
	case passkey.EventEnroll:
		pks, err := r.svc.Passkeys(ctx, e.ApproverID)
		if err != nil {
			r.tb.Errorf("passkeys of %s: %v", e.ApproverID, err)
		}
		for _, p := range pks {
			if p.CredentialID == e.CredentialID {
				r.tb.Errorf("passkey %s stored before its record", e.CredentialID)
			}
		}
	}
	r.events = append(r.events, e)
	return nil
}

func (r *recorder) take() []passkey.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.events
	r.events = nil
	return out
}

func (r *recorder) setFail(v bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail = v
}

// recordingEnv is newEnv's service, recording into a recorder.
func recordingEnv(t *testing.T) (*env, *recorder) {
	e := newEnv(t)
	r := &recorder{tb: t}
	svc, err := passkey.New(context.Background(), e.js, passkey.Options{
		RPID: testRPID, RPOrigins: []string{testOrigin}, RPDisplayName: "Countersign test", Now: e.clock.Now,
		Record: r.record,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.svc, r.svc = svc, svc
	return e, r
}

// Every change to who can approve is given to Record before it takes
// effect, with who made it, and a Record that fails refuses the change:
// nothing of it is stored, and the invite of a refused enrollment still
// serves once Record works again.
func TestRecordChanges(t *testing.T) {
	e, r := recordingEnv(t)
	ctx := passkey.WithActor(context.Background(), "admin:ops")

	r.setFail(true)
	if _, _, err := e.svc.AddApprover(ctx, "alice", []string{"payments"}); err == nil {
		t.Fatal("approver added while its record failed")
	}
	if as, err := e.svc.Approvers(ctx); err != nil || len(as) != 0 {
		t.Fatalf("approvers after a refused add: %v %v", as, err)
	}
	r.setFail(false)

	a, token, err := e.svc.AddApprover(ctx, "alice", []string{"payments"})
	if err != nil {
		t.Fatal(err)
	}
	evs := r.take()
	if len(evs) != 2 || evs[0].Kind != passkey.EventAdd || evs[1].Kind != passkey.EventInvite ||
		evs[0].ApproverID != a.ID || evs[1].ApproverID != a.ID || evs[0].By != "admin:ops" || evs[1].By != "admin:ops" || evs[1].Key == 0 {
		t.Fatalf("events of AddApprover: %+v", evs)
	}

	auth := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(a.ID)})
	cred := testpasskey.NewEC2Credential()
	r.setFail(true)
	if _, err := e.svc.FinishEnrollment(ctx, token, e.attestation(t, token, auth, cred, []string{"usb"}, nil)); err == nil {
		t.Fatal("passkey enrolled while its record failed")
	}
	if pks, err := e.svc.Passkeys(ctx, a.ID); err != nil || len(pks) != 0 {
		t.Fatalf("passkeys after a refused enrollment: %v %v", pks, err)
	}
	r.setFail(false)
	id, err := e.svc.FinishEnrollment(ctx, token, e.attestation(t, token, auth, cred, []string{"usb"}, nil))
	if err != nil {
		t.Fatalf("the same invite once Record works: %v", err)
	}
	evs = r.take()
	if len(evs) != 1 || evs[0].Kind != passkey.EventEnroll || evs[0].CredentialID != id || evs[0].ApproverID != a.ID || evs[0].By != "approver:"+a.ID {
		t.Fatalf("events of FinishEnrollment: %+v", evs)
	}

	if _, err := e.svc.NewInvite(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if evs = r.take(); len(evs) != 1 || evs[0].Kind != passkey.EventInvite || evs[0].Key == 0 {
		t.Fatalf("events of NewInvite: %+v", evs)
	}
	if _, _, err := e.svc.SetApproverStatus(ctx, a.ID, passkey.ActionDisable); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.NewInvite(ctx, a.ID); !errors.Is(err, passkey.ErrInvalidArgument) {
		t.Fatalf("invite of a disabled approver: %v", err)
	}
	if _, _, err := e.svc.SetApproverStatus(ctx, a.ID, passkey.ActionRevoke); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.NewInvite(ctx, a.ID); !errors.Is(err, passkey.ErrRevoked) {
		t.Fatalf("invite of a revoked approver: %v", err)
	}
	if evs = r.take(); len(evs) != 0 {
		t.Fatalf("refused invites recorded: %+v", evs)
	}

	// In-band: the agent's first enrollment adds its approver, and both
	// are the agent's doing.
	k := e.enrollInBand(t, "billing-bot", "usb")
	evs = r.take()
	if len(evs) != 2 || evs[0].Kind != passkey.EventAdd || evs[0].By != "agent:billing-bot" ||
		evs[1].Kind != passkey.EventEnroll || evs[1].CredentialID != k.CredID || evs[1].By != "agent:billing-bot" {
		t.Fatalf("events of an in-band enrollment: %+v", evs)
	}
}
