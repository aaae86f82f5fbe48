package passkey

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"time"
)

// Statuses of an approver or a passkey, as admins set them.
const (
	StatusActive   = "active"
	StatusDisabled = "disabled" // reversible: Enable brings it back
	StatusRevoked  = "revoked"  // permanent
)

// Admin actions on an approver or a passkey.
const (
	ActionDisable = "disable"
	ActionEnable  = "enable"
	ActionRevoke  = "revoke"
)

// Change is the result of an admin action: the status after it, whether
// it changed anything (a second revoke changes nothing and is not an
// error), the KV revision of the record that holds the status (an
// idempotency key for the audit record of the change) and when the status
// was set.
type Change struct {
	Status   string
	Changed  bool
	Revision uint64
	At       time.Time
}

func statusOf(disabledAt, revokedAt time.Time) string {
	switch {
	case !revokedAt.IsZero():
		return StatusRevoked
	case !disabledAt.IsZero():
		return StatusDisabled
	}
	return StatusActive
}

// Status is the approver's status: StatusActive, StatusDisabled or
// StatusRevoked.
func (a Approver) Status() string { return statusOf(a.DisabledAt, a.RevokedAt) }

// Active reports whether the approver may take part: neither disabled nor
// revoked. An inactive approver's passkeys are not offered in challenges
// and do not verify; they cannot enroll passkeys or open their inbox.
func (a Approver) Active() bool { return a.Status() == StatusActive }

func (r credentialRecord) active() bool { return statusOf(r.DisabledAt, r.RevokedAt) == StatusActive }

// usable refuses a passkey, or the approver it belongs to, that an admin
// disabled or revoked.
func usable(a Approver, cred credentialRecord) error {
	switch {
	case !cred.RevokedAt.IsZero():
		return newError(ReasonCredentialRevoked, nil)
	case !cred.DisabledAt.IsZero():
		return newError(ReasonCredentialDisabled, nil)
	case !a.RevokedAt.IsZero():
		return newError(ReasonApproverRevoked, nil)
	case !a.DisabledAt.IsZero():
		return newError(ReasonApproverDisabled, nil)
	}
	return nil
}

// enrollable refuses to enroll a passkey for an inactive approver.
func enrollable(a Approver) error {
	if a.Active() {
		return nil
	}
	return newError(ReasonNoPendingEnrollment, fmt.Errorf("approver %s is %s", a.ID, a.Status()))
}

// applyAction sets the status timestamps for action at now. It returns
// errNoChange when the status already is the action's, and ErrRevoked when
// the target is revoked and the action is not a revoke.
func applyAction(action string, now time.Time, disabledAt, revokedAt *time.Time) error {
	if action != ActionRevoke && !revokedAt.IsZero() {
		return ErrRevoked
	}
	switch action {
	case ActionRevoke:
		if !revokedAt.IsZero() {
			return errNoChange
		}
		*revokedAt = now
	case ActionDisable:
		if !disabledAt.IsZero() {
			return errNoChange
		}
		*disabledAt = now
	case ActionEnable:
		if disabledAt.IsZero() {
			return errNoChange
		}
		*disabledAt = time.Time{}
	default:
		return fmt.Errorf("%w: unknown action %q (want disable, enable or revoke)", ErrInvalidArgument, action)
	}
	return nil
}

// actionTime is when the status that action leads to was set.
func actionTime(action string, disabledAt, revokedAt time.Time, now time.Time) time.Time {
	switch action {
	case ActionRevoke:
		return revokedAt
	case ActionDisable:
		return disabledAt
	}
	return now
}

// SetApproverStatus disables, enables or revokes an approver. It takes
// effect at once on every replica: each verification reads the approver
// (no cache), so a decision signed after it, even on a challenge issued
// before, is refused (approver_disabled, approver_revoked). Disable and
// enable are reversible; a revoke is permanent, and an action on a revoked
// approver other than revoke is ErrRevoked. Repeating the current status
// changes nothing (Change.Changed false). An unknown approver wraps
// ErrNotFound.
func (s *Service) SetApproverStatus(ctx context.Context, id, action string) (Approver, Change, error) {
	if !isHexID(id) {
		return Approver{}, Change{}, fmt.Errorf("%w: approver %q", ErrNotFound, id)
	}
	for range casAttempts {
		var a Approver
		rev, err := getJSON(ctx, s.approvers, id, &a)
		if err != nil {
			if isNotFound(err) {
				return Approver{}, Change{}, fmt.Errorf("%w: approver %q", ErrNotFound, id)
			}
			return Approver{}, Change{}, fmt.Errorf("passkey: get approver: %w", err)
		}
		now := s.now().UTC()
		err = applyAction(action, now, &a.DisabledAt, &a.RevokedAt)
		if errors.Is(err, errNoChange) {
			return a, Change{Status: a.Status(), Revision: rev, At: actionTime(action, a.DisabledAt, a.RevokedAt, now)}, nil
		}
		if err != nil {
			return a, Change{Status: a.Status(), Revision: rev}, fmt.Errorf("approver %s: %w", id, err)
		}
		newRev, err := updateJSON(ctx, s.approvers, id, &a, rev)
		if isConflict(err) {
			continue
		}
		if err != nil {
			return Approver{}, Change{}, fmt.Errorf("passkey: %s approver: %w", action, err)
		}
		s.log.InfoContext(ctx, "approver status set", "approver_id", id, "action", action, "status", a.Status())
		return a, Change{Status: a.Status(), Changed: true, Revision: newRev, At: now}, nil
	}
	return Approver{}, Change{}, errCASExhausted
}

// SetPasskeyStatus disables, enables or revokes one passkey of an
// approver, as SetApproverStatus does an approver: at once on every
// replica (credential_disabled, credential_revoked at the next
// verification, a challenge already issued included), no longer offered in
// challenges; a revoked passkey stays recorded, so the same credential
// cannot be enrolled again. A credential that is not the approver's, or an
// unknown approver, wraps ErrNotFound.
func (s *Service) SetPasskeyStatus(ctx context.Context, approverID, credentialID, action string) (PasskeyInfo, Change, error) {
	if _, err := s.Approver(ctx, approverID); err != nil {
		return PasskeyInfo{}, Change{}, err
	}
	notFound := fmt.Errorf("%w: passkey %q of approver %q", ErrNotFound, credentialID, approverID)
	if raw, err := base64.RawURLEncoding.DecodeString(credentialID); err != nil || len(raw) == 0 || len(raw) > maxCredentialIDBytes {
		return PasskeyInfo{}, Change{}, notFound
	}
	for range casAttempts {
		var rec credentialRecord
		rev, err := getJSON(ctx, s.credentials, credentialID, &rec)
		if err != nil {
			if isNotFound(err) {
				return PasskeyInfo{}, Change{}, notFound
			}
			return PasskeyInfo{}, Change{}, fmt.Errorf("passkey: get credential: %w", err)
		}
		if rec.ApproverID != approverID {
			return PasskeyInfo{}, Change{}, notFound
		}
		now := s.now().UTC()
		err = applyAction(action, now, &rec.DisabledAt, &rec.RevokedAt)
		if errors.Is(err, errNoChange) {
			return rec.info(), Change{Status: rec.info().Status, Revision: rev, At: actionTime(action, rec.DisabledAt, rec.RevokedAt, now)}, nil
		}
		if err != nil {
			return rec.info(), Change{Status: rec.info().Status, Revision: rev}, fmt.Errorf("passkey %s: %w", credentialID, err)
		}
		newRev, err := updateJSON(ctx, s.credentials, credentialID, &rec, rev)
		if isConflict(err) {
			continue // a verification advanced the counter meanwhile
		}
		if err != nil {
			return PasskeyInfo{}, Change{}, fmt.Errorf("passkey: %s passkey: %w", action, err)
		}
		info := rec.info()
		s.log.InfoContext(ctx, "passkey status set", "approver_id", approverID, "credential_id", credentialID, "action", action, "status", info.Status)
		return info, Change{Status: info.Status, Changed: true, Revision: newRev, At: now}, nil
	}
	return PasskeyInfo{}, Change{}, errCASExhausted
}

// Standing reports whether an approval given by approverID with the passkey
// credentialID still stands: the approver exists and is active, and so is
// the passkey, still one of the approver's. It returns the approver (whose
// groups the approval counts for) when it does. Read now, with no cache, so
// an admin's disable or revoke of either takes an earlier approval back
// from a quorum not yet reached. An empty credentialID checks the approver
// alone.
func (s *Service) Standing(ctx context.Context, approverID, credentialID string) (Approver, bool, error) {
	a, err := s.Approver(ctx, approverID)
	if errors.Is(err, ErrNotFound) {
		return Approver{}, false, nil
	}
	if err != nil || !a.Active() {
		return Approver{}, false, err
	}
	if credentialID == "" {
		return a, true, nil
	}
	if raw, err := base64.RawURLEncoding.DecodeString(credentialID); err != nil || len(raw) == 0 || len(raw) > maxCredentialIDBytes {
		return Approver{}, false, nil
	}
	var rec credentialRecord
	if _, err := getJSON(ctx, s.credentials, credentialID, &rec); err != nil {
		if isNotFound(err) {
			return Approver{}, false, nil
		}
		return Approver{}, false, fmt.Errorf("passkey: get credential: %w", err)
	}
	if rec.ApproverID != a.ID || usable(a, rec) != nil {
		return Approver{}, false, nil
	}
	return a, true, nil
}
