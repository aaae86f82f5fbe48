package passkey

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-webauthn/webauthn/protocol"
	"github.com/go-webauthn/webauthn/webauthn"
)

// credentialRecord is the stored credential, keyed by base64url(credential id).
type credentialRecord struct {
	ApproverID string              `json:"approverId"`
	Credential webauthn.Credential `json:"credential"`
	CreatedAt  time.Time           `json:"createdAt"`
	LastUsedAt time.Time           `json:"lastUsedAt,omitzero"`
	// CounterChallenge is the challenge whose assertion claimed the stored
	// signature counter (verify.go, claimCounter): another attempt of that
	// assertion is not a regression, since only one can consume it.
	CounterChallenge string `json:"counterChallenge,omitempty"`
	// DisabledAt and RevokedAt are set by an admin (admin.go).
	DisabledAt time.Time `json:"disabledAt,omitzero"`
	RevokedAt  time.Time `json:"revokedAt,omitzero"`
}

// waUser adapts an approver to webauthn.User. The WebAuthn user handle is the
// approver id's bytes: random, stable, and free of personal data.
type waUser struct {
	a     Approver
	creds []webauthn.Credential
}

func (u waUser) WebAuthnID() []byte                         { return []byte(u.a.ID) }
func (u waUser) WebAuthnName() string                       { return u.a.Name }
func (u waUser) WebAuthnDisplayName() string                { return u.a.Name }
func (u waUser) WebAuthnCredentials() []webauthn.Credential { return u.creds }

// usable reports whether an invite can still be used at now.
func (r *inviteRecord) usable(now time.Time) bool {
	return r.UsedAt.IsZero() && now.Before(r.ExpiresAt)
}

// loadInvite returns the invite for token and its revision, or a
// no_pending_enrollment error if it is unknown, used or expired.
func (s *Service) loadInvite(ctx context.Context, token string) (inviteRecord, uint64, error) {
	var inv inviteRecord
	if !validToken(token) {
		return inv, 0, newError(ReasonNoPendingEnrollment, errors.New("malformed invite token"))
	}
	rev, err := getJSON(ctx, s.invites, inviteKey(token), &inv)
	if err != nil {
		if isNotFound(err) {
			return inv, 0, newError(ReasonNoPendingEnrollment, errors.New("unknown invite"))
		}
		return inv, 0, fmt.Errorf("passkey: get invite: %w", err)
	}
	if !inv.UsedAt.IsZero() {
		return inv, 0, newError(ReasonNoPendingEnrollment, errors.New("invite already used"))
	}
	if !s.now().Before(inv.ExpiresAt) {
		return inv, 0, newError(ReasonNoPendingEnrollment, errors.New("invite expired"))
	}
	return inv, rev, nil
}

// approverCredentials loads the stored credentials listed on an approver.
// Ids whose record is missing are skipped.
func (s *Service) approverCredentials(ctx context.Context, a Approver) ([]credentialRecord, error) {
	out := make([]credentialRecord, 0, len(a.CredentialIDs))
	for _, id := range a.CredentialIDs {
		var rec credentialRecord
		if _, err := getJSON(ctx, s.credentials, id, &rec); err != nil {
			if isNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("passkey: get credential: %w", err)
		}
		if rec.ApproverID != a.ID {
			continue
		}
		out = append(out, rec)
	}
	return out, nil
}

// BeginEnrollment starts passkey registration for the invite's approver and
// returns the options for navigator.credentials.create(). User verification
// is required, a resident key is preferred, and the approver's enrolled
// credentials are excluded. Each call issues a fresh registration challenge,
// valid for 5 minutes and stored in the invite (replacing any earlier one).
//
// The returned options omit excludeCredentials when it is empty (the library
// type has omitempty); SEP-2672 §4.4.1 wants an empty array, which the MCP
// layer adds when it serializes the response.
func (s *Service) BeginEnrollment(ctx context.Context, token string) (*protocol.CredentialCreation, error) {
	inv, _, err := s.loadInvite(ctx, token)
	if err != nil {
		return nil, err
	}
	a, err := s.Approver(ctx, inv.ApproverID)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, newError(ReasonNoPendingEnrollment, err)
		}
		return nil, err
	}
	if err := enrollable(a); err != nil {
		return nil, err
	}
	creds, err := s.approverCredentials(ctx, a)
	if err != nil {
		return nil, err
	}
	exclude := make([]protocol.CredentialDescriptor, 0, len(creds))
	for _, c := range creds {
		exclude = append(exclude, c.Credential.Descriptor())
	}
	creation, session, err := s.wa.BeginRegistration(waUser{a: a}, webauthn.WithExclusions(exclude))
	if err != nil {
		return nil, fmt.Errorf("passkey: begin registration: %w", err)
	}
	now := s.now().UTC()
	_, err = casUpdate(ctx, s.invites, inviteKey(token), func(r *inviteRecord) error {
		if !r.usable(now) {
			return newError(ReasonNoPendingEnrollment, errors.New("invite used or expired during begin"))
		}
		r.Session = session
		r.SessionExpiresAt = now.Add(enrollmentTTL)
		return nil
	})
	if err != nil {
		if ReasonOf(err) != "" {
			return nil, err
		}
		if isNotFound(err) {
			return nil, newError(ReasonNoPendingEnrollment, err)
		}
		return nil, fmt.Errorf("passkey: store registration session: %w", err)
	}
	s.log.InfoContext(ctx, "enrollment begun", "approver_id", a.ID)
	return creation, nil
}

// FinishEnrollment verifies the registration response (the raw JSON of the
// PublicKeyCredential from navigator.credentials.create()) against the
// invite's pending session and stores the credential with its transports.
// The invite is consumed, by compare-and-set, only when the credential is
// stored: a failed verification leaves it usable.
func (s *Service) FinishEnrollment(ctx context.Context, token string, response []byte) (credentialID string, err error) {
	inv, rev, err := s.loadInvite(ctx, token)
	if err != nil {
		return "", err
	}
	return s.completeEnrollment(ctx, inviteKey(token), inv, rev, response, "approver:"+inv.ApproverID)
}

// completeEnrollment verifies a registration response against the pending
// registration of the invite record inv (at revision rev, under key in the
// invites bucket) and stores the credential; the record is used up, by
// compare-and-set at rev, only when the credential is stored. The
// enrollment is recorded, by by, before the credential is stored.
func (s *Service) completeEnrollment(ctx context.Context, key string, inv inviteRecord, rev uint64, response []byte, by string) (credentialID string, err error) {
	now := s.now().UTC()
	if inv.Session == nil || !now.Before(inv.SessionExpiresAt) {
		return "", newError(ReasonNoPendingEnrollment, errors.New("no registration session, or it expired"))
	}
	a, err := s.Approver(ctx, inv.ApproverID)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return "", newError(ReasonNoPendingEnrollment, err)
		}
		return "", err
	}
	if err := enrollable(a); err != nil {
		return "", err
	}
	parsed, err := protocol.ParseCredentialCreationResponseBytes(response)
	if err != nil {
		s.logEnrollFailure(ctx, a.ID, err)
		return "", newError(ReasonVerificationFailed, err)
	}
	cred, err := s.wa.CreateCredential(waUser{a: a}, *inv.Session, parsed)
	if err != nil {
		s.logEnrollFailure(ctx, a.ID, err)
		return "", newError(ReasonVerificationFailed, err)
	}
	if !cred.Flags.UserVerified || !cred.Flags.UserPresent {
		// The library enforces this from the session; this is a backstop.
		return "", newError(ReasonVerificationFailed, errors.New("registration without user verification"))
	}
	credID := base64.RawURLEncoding.EncodeToString(cred.ID)

	// Defense in depth (§4.4.2): refuse a credential id that is already
	// enrolled, before touching the invite.
	if _, err := s.credentials.Get(ctx, credID); err == nil {
		return "", newError(ReasonCredentialAlreadyEnrolled, errors.New("credential id exists"))
	} else if !isNotFound(err) {
		return "", fmt.Errorf("passkey: check credential: %w", err)
	}

	// Consume the invite at the revision we verified against. A concurrent
	// finish or a newer begin changes the revision and loses here.
	used := inv
	used.UsedAt = now
	used.CredentialID = credID
	used.Session = nil
	usedRev, err := updateJSON(ctx, s.invites, key, &used, rev)
	if err != nil {
		if isConflict(err) {
			return "", newError(ReasonNoPendingEnrollment, fmt.Errorf("invite changed concurrently: %w", err))
		}
		return "", fmt.Errorf("passkey: consume invite: %w", err)
	}

	if err := s.record(ctx, Event{Kind: EventEnroll, ApproverID: a.ID, CredentialID: credID, By: by}); err != nil {
		s.releaseInvite(ctx, key, used, usedRev)
		return "", err
	}
	cred.Transport = slices.Compact(slices.Sorted(slices.Values(cred.Transport)))
	rec := credentialRecord{ApproverID: a.ID, Credential: *cred, CreatedAt: now}
	if _, err := createJSON(ctx, s.credentials, credID, &rec); err != nil {
		s.releaseInvite(ctx, key, used, usedRev)
		if isConflict(err) {
			return "", newError(ReasonCredentialAlreadyEnrolled, err)
		}
		return "", fmt.Errorf("passkey: store credential: %w", err)
	}
	_, err = casUpdate(ctx, s.approvers, a.ID, func(ap *Approver) error {
		if slices.Contains(ap.CredentialIDs, credID) {
			return errNoChange
		}
		ap.CredentialIDs = append(ap.CredentialIDs, credID)
		return nil
	})
	if err != nil {
		// Undo so the approver can retry with the same invite.
		if derr := s.credentials.Delete(ctx, credID); derr != nil {
			s.log.ErrorContext(ctx, "orphaned credential after failed enrollment", "approver_id", a.ID, "credential_id", credID, "error", derr)
		}
		s.releaseInvite(ctx, key, used, usedRev)
		return "", fmt.Errorf("passkey: link credential to approver: %w", err)
	}
	s.log.InfoContext(ctx, "passkey enrolled", "approver_id", a.ID, "credential_id", credID,
		"transports", cred.Transport, "backup_eligible", cred.Flags.BackupEligible)
	return credID, nil
}

// releaseInvite undoes the consumption of an invite after a later step of
// FinishEnrollment failed. The registration session is not restored: the
// approver starts again with BeginEnrollment.
func (s *Service) releaseInvite(ctx context.Context, key string, used inviteRecord, rev uint64) {
	used.UsedAt = time.Time{}
	used.CredentialID = ""
	if _, err := updateJSON(ctx, s.invites, key, &used, rev); err != nil {
		s.log.ErrorContext(ctx, "could not release invite after failed enrollment", "approver_id", used.ApproverID, "error", err)
	}
}

func (s *Service) logEnrollFailure(ctx context.Context, approverID string, err error) {
	attrs := []any{"approver_id", approverID, "reason", ReasonVerificationFailed, "error", err}
	var pe *protocol.Error
	if errors.As(err, &pe) && pe.DevInfo != "" {
		attrs = append(attrs, "detail", pe.DevInfo)
	}
	s.log.WarnContext(ctx, "enrollment rejected", attrs...)
}
