package passkey

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-webauthn/webauthn/protocol"
	"github.com/go-webauthn/webauthn/webauthn"
)

// In-band verified approval (SEP-2672 on the MCP endpoint itself): the
// caller's own passkey signs its own call. The caller is the bearer
// principal; its passkeys are the credentials of every approver mapped to
// it ([Approver.MappedTo]). A passkey enrolled in-band
// ([Service.BeginPrincipalEnrollment]) is stored exactly like one enrolled
// on the approver site, on the principal's own in-band approver (never on
// an approver an admin created): admins see it, and one enrolled on the
// approver site by an approver an admin mapped to the principal works
// in-band.

// InBandGroup is the group of the approvers that in-band enrollment
// creates, one per principal. Any agent can enroll a passkey into it with
// its bearer token alone, so it decides no task: a task challenge for it
// is refused, Verify never finds an approver eligible through it, and a
// policy decision naming it as approver_group is refused
// (pdp.InBandGroup).
const InBandGroup = "in-band"

// MappedTo reports whether the approver is explicitly mapped to principal:
// it is one of their Principals, byte for byte. Unlike [Approver.ActsAs]
// there is no fallback to the display name and no normalization: a mapping
// grants the use of passkeys for the principal's own calls, so it must name
// exactly that principal (the principals an admin maps are stored in NFC,
// as every agent name is; an OAuth subject spelled otherwise is a
// different principal and maps to nothing).
func (a Approver) MappedTo(principal string) bool {
	return principal != "" && slices.Contains(a.Principals, principal)
}

// principalApprovers returns the approvers mapped to principal, ordered by id.
func (s *Service) principalApprovers(ctx context.Context, principal string) ([]Approver, error) {
	all, err := s.Approvers(ctx)
	if err != nil {
		return nil, err
	}
	var out []Approver
	for _, a := range all {
		if a.MappedTo(principal) {
			out = append(out, a)
		}
	}
	return out, nil
}

// PrincipalCredentials returns the passkeys usable for principal's in-band
// calls under class (§4.7 filter), as credential descriptors.
func (s *Service) PrincipalCredentials(ctx context.Context, principal, class string) ([]protocol.CredentialDescriptor, error) {
	class, err := normalizeClass(class)
	if err != nil {
		return nil, err
	}
	approvers, err := s.principalApprovers(ctx, principal)
	if err != nil {
		return nil, err
	}
	var out []protocol.CredentialDescriptor
	for _, a := range approvers {
		if !a.Active() {
			continue
		}
		creds, err := s.approverCredentials(ctx, a)
		if err != nil {
			return nil, err
		}
		for _, c := range creds {
			if c.active() && classAllows(class, c.Credential.Transport) {
				out = append(out, c.Credential.Descriptor())
			}
		}
	}
	return out, nil
}

// inBandApproverID is the id of the approver in-band enrollment creates for
// principal: derived, so concurrent first enrollments of one principal, on
// any replica, create one approver.
func inBandApproverID(principal string) string {
	sum := sha256.Sum256([]byte("countersign in-band approver\x00" + principal))
	return hex.EncodeToString(sum[:approverIDSz])
}

// In-band enrollment policies ([Options.InBandEnrollment]). In-band
// enrollment is authorized by the principal's bearer token alone, so
// whoever holds the token and can run a WebAuthn ceremony (a software
// authenticator will do: attestation is "none") can enroll a passkey and
// then sign that principal's verified calls. EnrollFirst and EnrollClosed
// keep an agent that holds its own token, and can run code, from signing
// for its human.
const (
	// EnrollOpen: a principal may enroll passkeys in-band at any time
	// (SEP-2672 as written; dev's default).
	EnrollOpen = "open"
	// EnrollFirst: a principal may enroll in-band only while it has no
	// passkey at all, on any approver mapped to it and whatever the
	// passkey's status (a revoked one counts); a further passkey comes
	// through an approver-site invite. Trust on first use.
	EnrollFirst = "first"
	// EnrollClosed: no in-band enrollment; a principal's passkeys come
	// through approver-site invites of an approver mapped to it.
	EnrollClosed = "closed"
)

// enrollmentAllowed says whether principal may enroll a passkey in-band
// now, given the approvers mapped to it: nil, or an error wrapping
// ErrEnrollmentClosed or ErrNotFirstPasskey.
func (s *Service) enrollmentAllowed(mapped []Approver) error {
	switch s.enrollment {
	case EnrollClosed:
		return ErrEnrollmentClosed
	case EnrollFirst:
		for _, a := range mapped {
			if len(a.CredentialIDs) > 0 {
				return fmt.Errorf("%w (approver %s holds one)", ErrNotFirstPasskey, a.ID)
			}
		}
	}
	return nil
}

// pendingKey is the invites-bucket key of principal's pending in-band
// enrollment. Invite keys are 64 hex characters; this one cannot collide.
func pendingKey(principal string) string {
	sum := sha256.Sum256([]byte(principal))
	return "inband." + hex.EncodeToString(sum[:])
}

// enrollingApprover returns the approver a passkey enrolled in-band by
// principal belongs to: the principal's own in-band approver (derived id,
// name = the principal when it is a valid name, group [InBandGroup],
// mapped to the principal), created on first use; and every approver
// mapped to the principal, whose passkeys a new one must not duplicate.
//
// Never an approver an admin created. In-band enrollment is authorized by
// the bearer token alone, and an admin's approver may hold groups that
// decide other principals' tasks: a mapping to the principal (which also
// keeps that approver from deciding the principal's own calls) must not
// let whoever holds the token add a passkey that carries those groups.
// Passkeys enrolled on the approver site by an approver mapped to the
// principal still work in-band (PrincipalCredentials lists them).
//
// The principal is taken byte for byte: one that is not in Unicode NFC is
// refused, so two spellings of one name never share an approver or a
// pending enrollment.
func (s *Service) enrollingApprover(ctx context.Context, principal string) (Approver, []Approver, error) {
	p, err := validatePrincipal(principal)
	if err != nil {
		return Approver{}, nil, err
	}
	if p != principal {
		return Approver{}, nil, fmt.Errorf("%w: the principal is not in Unicode NFC; in-band enrollment needs its exact name", ErrInvalidArgument)
	}
	mapped, err := s.principalApprovers(ctx, p)
	if err != nil {
		return Approver{}, nil, err
	}
	if err := s.enrollmentAllowed(mapped); err != nil { // before anything is created
		return Approver{}, nil, err
	}
	id := inBandApproverID(p)
	for _, m := range mapped {
		if m.ID == id {
			if !m.Active() {
				return Approver{}, nil, fmt.Errorf("%w: the principal's in-band approver %s is %s by an admin", ErrInvalidArgument, id, m.Status())
			}
			return m, mapped, nil
		}
	}
	name := p
	if validateName(name) != nil {
		name = "in-band " + id[:12]
	}
	a := Approver{
		ID:            id,
		Name:          name,
		Groups:        []string{InBandGroup},
		Principals:    []string{p},
		CreatedAt:     s.now().UTC(),
		CredentialIDs: []string{},
	}
	if err := s.record(ctx, Event{Kind: EventAdd, ApproverID: a.ID, By: "agent:" + p}); err != nil {
		return Approver{}, nil, err
	}
	if _, err := createJSON(ctx, s.approvers, a.ID, &a); err != nil {
		if !isConflict(err) {
			return Approver{}, nil, fmt.Errorf("passkey: add in-band approver: %w", err)
		}
		// Created concurrently, or unmapped from the principal by an
		// admin since: only the former may be used.
		if a, err = s.Approver(ctx, a.ID); err != nil {
			return Approver{}, nil, err
		}
		if !a.MappedTo(p) {
			return Approver{}, nil, fmt.Errorf("%w: the in-band approver %s is not mapped to this principal", ErrInvalidArgument, a.ID)
		}
		if !a.Active() {
			return Approver{}, nil, fmt.Errorf("%w: the principal's in-band approver %s is %s by an admin", ErrInvalidArgument, a.ID, a.Status())
		}
		mapped = append(mapped, a)
	} else {
		s.log.InfoContext(ctx, "approver added for in-band enrollment", "approver_id", a.ID, "principal", p)
		mapped = append(mapped, a)
	}
	return a, mapped, nil
}

// BeginPrincipalEnrollment starts the in-band enrollment of a passkey for
// principal (SEP-2672 approval/enroll/begin): a fresh registration
// challenge, user verification required, and every passkey already usable
// for the principal excluded. The pending registration, valid 5 minutes,
// replaces any earlier one of the same principal.
func (s *Service) BeginPrincipalEnrollment(ctx context.Context, principal string) (*protocol.CredentialCreation, error) {
	a, mapped, err := s.enrollingApprover(ctx, principal)
	if err != nil {
		return nil, err
	}
	exclude := []protocol.CredentialDescriptor{}
	for _, m := range mapped {
		creds, err := s.approverCredentials(ctx, m)
		if err != nil {
			return nil, err
		}
		for _, c := range creds {
			exclude = append(exclude, c.Credential.Descriptor())
		}
	}
	creation, session, err := s.wa.BeginRegistration(waUser{a: a}, webauthn.WithExclusions(exclude))
	if err != nil {
		return nil, fmt.Errorf("passkey: begin registration: %w", err)
	}
	now := s.now().UTC()
	rec := inviteRecord{ApproverID: a.ID, CreatedAt: now, ExpiresAt: now.Add(enrollmentTTL),
		Session: session, SessionExpiresAt: now.Add(enrollmentTTL)}
	if _, err := putJSON(ctx, s.invites, pendingKey(principal), &rec); err != nil {
		return nil, fmt.Errorf("passkey: store registration session: %w", err)
	}
	s.log.InfoContext(ctx, "in-band enrollment begun", "approver_id", a.ID)
	return creation, nil
}

// FinishPrincipalEnrollment completes principal's pending in-band
// enrollment (SEP-2672 approval/enroll/finish) exactly as
// [Service.FinishEnrollment] completes an invite's: verified against the
// pending registration (no_pending_enrollment when there is none, it
// expired or was used), user verification required, a credential id
// already enrolled refused (credential_already_enrolled), the transports
// stored. The pending registration is used up only when the credential is
// stored.
func (s *Service) FinishPrincipalEnrollment(ctx context.Context, principal string, response []byte) (credentialID string, createdAt time.Time, err error) {
	if p, err := validatePrincipal(principal); err != nil || p != principal {
		return "", time.Time{}, newError(ReasonNoPendingEnrollment, err)
	}
	key := pendingKey(principal)
	var inv inviteRecord
	rev, err := getJSON(ctx, s.invites, key, &inv)
	if err != nil {
		if isNotFound(err) {
			return "", time.Time{}, newError(ReasonNoPendingEnrollment, errors.New("no in-band enrollment begun"))
		}
		return "", time.Time{}, fmt.Errorf("passkey: get pending enrollment: %w", err)
	}
	if !inv.UsedAt.IsZero() {
		return "", time.Time{}, newError(ReasonNoPendingEnrollment, errors.New("pending enrollment already used"))
	}
	// Only onto the principal's own in-band approver, still mapped to it
	// (an admin may have changed the mapping since the begin).
	if inv.ApproverID != inBandApproverID(principal) {
		return "", time.Time{}, newError(ReasonNoPendingEnrollment, errors.New("pending enrollment is not for the principal's in-band approver"))
	}
	if a, err := s.Approver(ctx, inv.ApproverID); err != nil {
		if errors.Is(err, ErrNotFound) {
			return "", time.Time{}, newError(ReasonNoPendingEnrollment, err)
		}
		return "", time.Time{}, err
	} else if !a.MappedTo(principal) {
		return "", time.Time{}, newError(ReasonNoPendingEnrollment, errors.New("the in-band approver is no longer mapped to the principal"))
	}
	// Checked again: the policy may have changed since the begin (a
	// restart with another setting), or a passkey been enrolled since.
	// Under EnrollFirst a begin replaces the principal's one pending
	// registration and a finish uses it up by compare-and-set, so of two
	// enrollments in flight at most one finishes; only a begin and finish
	// made in the milliseconds between another finish's consume and its
	// store could still add a second passkey.
	mapped, err := s.principalApprovers(ctx, principal)
	if err != nil {
		return "", time.Time{}, err
	}
	if err := s.enrollmentAllowed(mapped); err != nil {
		return "", time.Time{}, newError(ReasonNoPendingEnrollment, err)
	}
	credID, err := s.completeEnrollment(ctx, key, inv, rev, response, "agent:"+principal)
	if err != nil {
		return "", time.Time{}, err
	}
	return credID, s.now().UTC(), nil
}

// PasskeyInfo is one stored passkey as admins see it: never the key.
type PasskeyInfo struct {
	CredentialID string    `json:"credentialId"` // base64url
	Transports   []string  `json:"transports"`
	SignCount    uint32    `json:"signCount"`
	CreatedAt    time.Time `json:"createdAt"`
	LastUsedAt   time.Time `json:"lastUsedAt,omitzero"`
	// Status is StatusActive, StatusDisabled or StatusRevoked (admin.go).
	Status     string    `json:"status"`
	DisabledAt time.Time `json:"disabledAt,omitzero"`
	RevokedAt  time.Time `json:"revokedAt,omitzero"`
}

// Passkeys returns the passkeys of an approver, however they were enrolled
// (approver site or in-band), in enrollment order; ErrNotFound when there
// is no such approver.
func (s *Service) Passkeys(ctx context.Context, approverID string) ([]PasskeyInfo, error) {
	a, err := s.Approver(ctx, approverID)
	if err != nil {
		return nil, err
	}
	recs, err := s.approverCredentials(ctx, a)
	if err != nil {
		return nil, err
	}
	out := make([]PasskeyInfo, 0, len(recs))
	for _, r := range recs {
		out = append(out, r.info())
	}
	return out, nil
}

// info is the record as admins see it.
func (r credentialRecord) info() PasskeyInfo {
	ts := make([]string, 0, len(r.Credential.Transport))
	for _, t := range r.Credential.Transport {
		ts = append(ts, string(t))
	}
	return PasskeyInfo{
		CredentialID: base64.RawURLEncoding.EncodeToString(r.Credential.ID),
		Transports:   ts,
		SignCount:    r.Credential.Authenticator.SignCount,
		CreatedAt:    r.CreatedAt,
		LastUsedAt:   r.LastUsedAt,
		Status:       statusOf(r.DisabledAt, r.RevokedAt),
		DisabledAt:   r.DisabledAt,
		RevokedAt:    r.RevokedAt,
	}
}
