package passkey

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-webauthn/webauthn/protocol"
	"github.com/go-webauthn/webauthn/webauthn"

	"github.com/countersign/countersign/internal/canon"
)

// MethodWebAuthn is the only evidence method SEP-2672 defines.
const MethodWebAuthn = "webauthn"

const (
	maxConsumerKeyLen = 256
	// maxResponseBytes bounds the assertion JSON; real ones are a few KB.
	maxResponseBytes = 64 << 10
	// maxCredentialIDBytes is WebAuthn's limit. Longer ids are never enrolled,
	// and are not sent to NATS as keys (a subject beyond the 4 KB control line
	// limit would break the connection).
	maxCredentialIDBytes = 1023
)

// VerifyRequest carries one piece of approval evidence and the call it must
// match. TaskID, Tool, ActionHash, Group and AuthenticatorClass come from the
// server's own record of the call, never from the client.
type VerifyRequest struct {
	ChallengeID string
	TaskID      string
	Tool        string
	ActionHash  canon.ActionHash
	// Group is the approver group allowed to approve this call.
	Group string
	// Principal, for an in-band call, is the bearer principal that made it
	// and whose own passkey must sign it. It replaces Group and Requester:
	// the challenge must have been issued to the same principal (else it is
	// challenge_unknown: another principal's challenge is not this one's to
	// know), and the credential must belong to an approver mapped to it
	// (else unknown_credential: not enrolled for this principal).
	Principal string
	// AuthenticatorClass is ClassPlatform or ClassCrossPlatform ("" means
	// cross-platform). The stricter of it and the challenge's class applies.
	AuthenticatorClass string
	// Requester is the principal that made the call; an approver who acts as
	// it (Approver.ActsAs: one of their principals, or their id) is refused.
	// Empty skips the check (the in-band flow, where the user approves their
	// own agent's call).
	Requester string
	// ConsumerKey makes Verify idempotent: after a successful consume, a retry
	// with the same key (and the same task, tool, hash and credential) returns
	// the same result. Empty means a random key, i.e. no idempotent retry.
	ConsumerKey string
	// Decision is the decision the assertion is submitted for. When set, the
	// challenge must have been issued for the same decision
	// (challenge_wrong_decision otherwise).
	Decision string
	// Method is the evidence method; "" is treated as "webauthn".
	Method string
	// Response is the PublicKeyCredential JSON from navigator.credentials.get().
	Response json.RawMessage
	// CheckOnly runs every check and reports the verdict without claiming
	// the counter or consuming the challenge: the edge uses it to turn
	// invalid evidence away before it reaches the task's workflow, which
	// then verifies again and consumes. A challenge already consumed by
	// ConsumerKey passes (that consumer may retry).
	CheckOnly bool
}

// Verified is a successful, consumed approval, with the raw assertion parts
// for the audit record.
type Verified struct {
	ApproverID        string `json:"approverId"`
	ApproverName      string `json:"approverName"`
	CredentialID      string `json:"credentialId"` // base64url, no padding
	SignCount         uint32 `json:"signCount"`
	PublicKey         []byte `json:"publicKey"` // COSE key
	ChallengeID       string `json:"challengeId"`
	AuthenticatorData []byte `json:"authenticatorData"`
	ClientDataJSON    []byte `json:"clientDataJson"`
	Signature         []byte `json:"signature"`
}

// Verify checks approval evidence in SEP-2672 §4.8 order and, only if every
// check passes, claims the stored signature counter and consumes the
// challenge, each atomically. The checks, each with its reason:
//
//  1. missing_evidence: empty or malformed evidence or response
//  2. unsupported_method: method other than "webauthn"
//  3. challenge_unknown
//  4. challenge_consumed (a retry with the consuming ConsumerKey succeeds
//     again; in-band, only within the challenge's lifetime from the consume
//     and while the passkey is still usable: see replay)
//  5. challenge_expired
//  6. challenge_wrong_task, then challenge_wrong_tool
//  7. unknown_credential, then credential_revoked, credential_disabled,
//     approver_revoked, approver_disabled (an admin's action, read now;
//     unknown_credential to an in-band call, whose reasons are §4.10's)
//  8. authenticator_class_mismatch
//  9. signature_verification_failed: any WebAuthn failure (signature, origin,
//     RP id, user verification, challenge)
//  10. signature_counter_regression: stored > 0 and new <= stored (unless
//     new == stored was claimed by an assertion over this same challenge)
//  11. argument_hash_mismatch
//  12. approver_not_eligible: approver not in the group
//  13. self_approval: approver is the requester
//
// then the counter claim and the consume, each by compare-and-set. The claim
// stores the new counter at the revision the checks read; when it loses the
// race, the credential is read and checked again, so of assertions with the
// same counter over different challenges (a cloned authenticator) at most
// one gets past it, on any replica, and the others are
// signature_counter_regression. A lost consume is challenge_consumed. A
// rejected assertion never consumes the challenge.
//
// Rejections are *Error; other errors are infrastructure failures and may be
// retried with the same ConsumerKey. A malformed request from the caller
// (unknown class) wraps ErrInvalidArgument.
func (s *Service) Verify(ctx context.Context, req VerifyRequest) (Verified, error) {
	v, err := s.verify(ctx, &req)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			attrs := []any{"challenge_id", logID(req.ChallengeID), "task_id", req.TaskID, "reason", e.Reason}
			if e.cause != nil {
				attrs = append(attrs, "error", e.cause)
				var pe *protocol.Error
				if errors.As(e.cause, &pe) && pe.DevInfo != "" {
					attrs = append(attrs, "detail", pe.DevInfo)
				}
			}
			s.log.WarnContext(ctx, "approval evidence rejected", attrs...)
		} else {
			s.log.ErrorContext(ctx, "approval verification failed", "challenge_id", logID(req.ChallengeID), "task_id", req.TaskID, "error", err)
		}
		return Verified{}, err
	}
	s.log.InfoContext(ctx, "approval verified", "challenge_id", v.ChallengeID, "task_id", req.TaskID,
		"approver_id", v.ApproverID, "credential_id", v.CredentialID, "sign_count", v.SignCount)
	return v, nil
}

// logID keeps attacker-chosen challenge ids out of logs unless they have our shape.
func logID(id string) string {
	if isHexID(id) {
		return id
	}
	return "(malformed)"
}

func (s *Service) verify(ctx context.Context, req *VerifyRequest) (Verified, error) {
	reqClass, err := normalizeClass(req.AuthenticatorClass)
	if err != nil {
		return Verified{}, err
	}
	if len(req.ConsumerKey) > maxConsumerKeyLen {
		return Verified{}, fmt.Errorf("%w: consumer key longer than %d bytes", ErrInvalidArgument, maxConsumerKeyLen)
	}

	// Numbers are SEP-2672 §4.8 steps.
	// 1–2. Evidence present and well formed.
	raw := bytes.TrimSpace(req.Response)
	if len(raw) == 0 || len(raw) > maxResponseBytes || raw[0] != '{' || !json.Valid(raw) {
		return Verified{}, newError(ReasonMissingEvidence, errors.New("response is not a JSON object"))
	}
	if req.ChallengeID == "" {
		return Verified{}, newError(ReasonMissingEvidence, errors.New("no challenge id"))
	}
	// 3. Method.
	if req.Method != "" && req.Method != MethodWebAuthn {
		return Verified{}, newError(ReasonUnsupportedMethod, fmt.Errorf("method %.32q", req.Method))
	}
	// The WebAuthn response shape is part of "well formed"; it is checked after
	// the method because its shape depends on the method.
	parsed, err := protocol.ParseCredentialRequestResponseBytes(raw)
	if err != nil {
		return Verified{}, newError(ReasonMissingEvidence, err)
	}
	credID := base64.RawURLEncoding.EncodeToString(parsed.RawID)

	// 4. Known challenge.
	if !isHexID(req.ChallengeID) {
		return Verified{}, newError(ReasonChallengeUnknown, errors.New("malformed challenge id"))
	}
	var ch challengeRecord
	chRev, err := getJSON(ctx, s.challenges, req.ChallengeID, &ch)
	if err != nil {
		if isNotFound(err) {
			return Verified{}, newError(ReasonChallengeUnknown, nil)
		}
		return Verified{}, fmt.Errorf("passkey: get challenge: %w", err)
	}
	if ch.Principal != req.Principal {
		// In-band challenges answer only their own principal, and task
		// challenges only task decisions.
		return Verified{}, newError(ReasonChallengeUnknown, errors.New("challenge issued to another principal or flow"))
	}
	// 5. Not consumed, unless by this very consumer (idempotent retry).
	if ch.ConsumedBy != "" {
		if req.ConsumerKey != "" && ch.ConsumedBy == req.ConsumerKey {
			return s.replay(ctx, req, &ch, credID)
		}
		return Verified{}, newError(ReasonChallengeConsumed, nil)
	}
	// 6. Not expired.
	now := s.now().UTC()
	if !now.Before(ch.ExpiresAt) {
		return Verified{}, newError(ReasonChallengeExpired, nil)
	}
	// 7. Issued for this task and tool.
	if ch.TaskID != req.TaskID {
		return Verified{}, newError(ReasonChallengeWrongTask, nil)
	}
	if ch.Tool != req.Tool {
		return Verified{}, newError(ReasonChallengeWrongTool, nil)
	}
	if req.Decision != "" && ch.Decision != req.Decision {
		return Verified{}, newError(ReasonChallengeWrongDecision, nil)
	}
	// 8. Enrolled credential, linked to an existing approver.
	if len(parsed.RawID) > maxCredentialIDBytes {
		return Verified{}, newError(ReasonUnknownCredential, errors.New("credential id too long"))
	}
	var cred credentialRecord
	credRev, err := getJSON(ctx, s.credentials, credID, &cred)
	if err != nil {
		if isNotFound(err) {
			return Verified{}, newError(ReasonUnknownCredential, nil)
		}
		return Verified{}, fmt.Errorf("passkey: get credential: %w", err)
	}
	a, err := s.Approver(ctx, cred.ApproverID)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return Verified{}, newError(ReasonUnknownCredential, err)
		}
		return Verified{}, err
	}
	if !slices.Contains(a.CredentialIDs, credID) {
		return Verified{}, newError(ReasonUnknownCredential, errors.New("credential not linked to its approver"))
	}
	if req.Principal != "" && !a.MappedTo(req.Principal) {
		return Verified{}, newError(ReasonUnknownCredential, errors.New("credential not enrolled for this principal"))
	}
	// 8a (Countersign). Neither the passkey nor its approver is disabled or
	// revoked by an admin: read now, at decision time, on every replica.
	if err := usable(a, cred); err != nil {
		return Verified{}, inBandReason(req, err)
	}
	// 9. Authenticator class: both the caller's and the challenge's.
	if !classAllows(reqClass, cred.Credential.Transport) || !classAllows(ch.AuthenticatorClass, cred.Credential.Transport) {
		return Verified{}, newError(ReasonAuthenticatorClassMismatch, nil)
	}
	// 10. WebAuthn verification against the stored challenge and public key.
	wire, err := ch.wireChallenge()
	if err != nil {
		return Verified{}, err
	}
	session := webauthn.SessionData{
		Challenge:            wire,
		RelyingPartyID:       s.rpID,
		UserID:               []byte(a.ID),
		AllowedCredentialIDs: [][]byte{cred.Credential.ID},
		UserVerification:     protocol.VerificationRequired,
	}
	user := waUser{a: a, creds: []webauthn.Credential{cred.Credential}}
	if _, err := s.wa.ValidateLogin(user, session, parsed); err != nil {
		return Verified{}, newError(ReasonSignatureVerificationFailed, err)
	}
	authData := parsed.Response.AuthenticatorData
	if !authData.Flags.HasUserVerified() { // backstop: the library checks it
		return Verified{}, newError(ReasonSignatureVerificationFailed, errors.New("user not verified"))
	}
	// 11. Counter strictly increases unless both are zero.
	if err := counterCheck(&cred, authData.Counter, req.ChallengeID); err != nil {
		return s.counterRejected(ctx, req, credID, err)
	}
	// 12. The call's action hash is the one the challenge committed to.
	if ch.ActionHash != req.ActionHash.String() {
		return Verified{}, newError(ReasonArgumentHashMismatch, nil)
	}
	// 12a (Countersign). Approver is in the group, both the caller's and
	// the challenge's (in-band: mapped to the principal, checked in step 8).
	if req.Principal == "" && (req.Group == "" || req.Group == InBandGroup || !inGroup(a, req.Group) || !inGroup(a, ch.Group)) {
		return Verified{}, newError(ReasonApproverNotEligible, nil)
	}
	// 12b (Countersign). Not the requester: an identity the approver acts
	// as, never a comparison of display names (Approver.ActsAs).
	if r := strings.TrimSpace(req.Requester); req.Principal == "" && r != "" && a.ActsAs(r) {
		return Verified{}, newError(ReasonSelfApproval, nil)
	}

	// 13. Every check passed: claim the counter, then consume, by
	// compare-and-set on the revision read in step 4 (unless the caller only
	// asked whether it would pass).
	if req.CheckOnly {
		return Verified{ApproverID: a.ID, ApproverName: a.Name, CredentialID: credID, ChallengeID: req.ChallengeID}, nil
	}
	key := req.ConsumerKey
	if key == "" {
		key = "anonymous-" + randomID(16)
	}
	v := Verified{
		ApproverID:        a.ID,
		ApproverName:      a.Name,
		CredentialID:      credID,
		SignCount:         authData.Counter,
		PublicKey:         cred.Credential.PublicKey,
		ChallengeID:       req.ChallengeID,
		AuthenticatorData: parsed.Raw.AssertionResponse.AuthenticatorData,
		ClientDataJSON:    parsed.Raw.AssertionResponse.ClientDataJSON,
		Signature:         parsed.Raw.AssertionResponse.Signature,
	}
	if err := s.claimCounter(ctx, req, a, credID, cred, credRev, v.SignCount, now); err != nil {
		if ReasonOf(err) == ReasonSignatureCounterRegression {
			return s.counterRejected(ctx, req, credID, err)
		}
		return Verified{}, err
	}
	// A claimed counter that is not followed by the consume (a lost race, a
	// store failure) stays claimed: the authenticator did make the assertion,
	// and its own retry passes step 11 (counterCheck).
	ch.ConsumedBy = key
	ch.ConsumedAt = now
	ch.Result = &v
	if _, err := updateJSON(ctx, s.challenges, req.ChallengeID, &ch, chRev); err != nil {
		if isFull(err) {
			return Verified{}, fmt.Errorf("passkey: consume challenge: %w: %w", ErrChallengeCapacity, err)
		}
		if !isConflict(err) {
			return Verified{}, fmt.Errorf("passkey: consume challenge: %w", err)
		}
		// Lost the race. If it was lost to ourselves (a concurrent retry with
		// the same key), that is the same success.
		var cur challengeRecord
		if _, gerr := getJSON(ctx, s.challenges, req.ChallengeID, &cur); gerr == nil &&
			req.ConsumerKey != "" && cur.ConsumedBy == req.ConsumerKey {
			return s.replay(ctx, req, &cur, credID)
		}
		return Verified{}, newError(ReasonChallengeConsumed, err)
	}
	// 14. A zero counter claimed nothing: record the use time. Fast path:
	// write at the revision read in step 8; on a conflict fall back to the
	// read-modify-write loop.
	if v.SignCount == 0 {
		next := cred
		next.LastUsedAt = now
		if _, err := updateJSON(ctx, s.credentials, credID, &next, credRev); err != nil {
			if !isConflict(err) {
				return Verified{}, fmt.Errorf("passkey: record passkey use: %w", err)
			}
			if err := s.advanceCounter(ctx, credID, 0, now); err != nil {
				return Verified{}, err
			}
		}
	}
	return v, nil
}

// counterCheck is step 11: an assertion's signature counter must exceed the
// stored one, unless both are zero (an authenticator that reports no
// counter, such as a synced passkey). An equal counter passes only when an
// assertion over the same challenge claimed it (claimCounter): that is this
// assertion, tried again after a claim whose consume did not follow, or an
// assertion competing for the same single consume.
func counterCheck(cred *credentialRecord, count uint32, challengeID string) error {
	stored := cred.Credential.Authenticator.SignCount
	if count > stored || (count == 0 && stored == 0) ||
		(count == stored && cred.CounterChallenge == challengeID) {
		return nil
	}
	return newError(ReasonSignatureCounterRegression, fmt.Errorf("stored %d, asserted %d", stored, count))
}

// counterRejected answers an assertion that failed the counter check with
// rejection, unless the challenge is consumed by now. The counter is the one
// piece of state a concurrent Verify of this same assertion changes; if that
// is what happened, step 5 is the accurate answer (or the same success, for a
// retry with the consuming key).
func (s *Service) counterRejected(ctx context.Context, req *VerifyRequest, credID string, rejection error) (Verified, error) {
	var cur challengeRecord
	if _, err := getJSON(ctx, s.challenges, req.ChallengeID, &cur); err == nil && cur.ConsumedBy != "" {
		if req.ConsumerKey != "" && cur.ConsumedBy == req.ConsumerKey {
			return s.replay(ctx, req, &cur, credID)
		}
		return Verified{}, newError(ReasonChallengeConsumed, nil)
	}
	return Verified{}, rejection
}

// claimCounter stores count as the credential's signature counter, with the
// challenge that claimed it and the use time, before the challenge is
// consumed. It writes by compare-and-set at rev, the revision the checks
// read cred at; when another write got there first, it reads the credential
// again and checks it again (its status, and the counter: counterCheck), so
// of two assertions with the same counter over different challenges at most
// one claims it, whatever replica verifies them. It never lowers the
// counter. It writes nothing when there is nothing to claim: both counters
// zero, or the counter already claimed by this challenge.
func (s *Service) claimCounter(ctx context.Context, req *VerifyRequest, a Approver, credID string,
	cred credentialRecord, rev uint64, count uint32, now time.Time) error {
	for range casAttempts {
		if count == cred.Credential.Authenticator.SignCount {
			return nil // both zero, or claimed by this challenge (counterCheck passed)
		}
		cred.Credential.Authenticator.SignCount = count
		cred.CounterChallenge = req.ChallengeID
		if cred.LastUsedAt.Before(now) {
			cred.LastUsedAt = now
		}
		_, err := updateJSON(ctx, s.credentials, credID, &cred, rev)
		if err == nil {
			return nil
		}
		if !isConflict(err) {
			return fmt.Errorf("passkey: claim signature counter: %w", err)
		}
		cred = credentialRecord{}
		if rev, err = getJSON(ctx, s.credentials, credID, &cred); err != nil {
			if isNotFound(err) {
				return newError(ReasonUnknownCredential, err)
			}
			return fmt.Errorf("passkey: get credential: %w", err)
		}
		if err := usable(a, cred); err != nil {
			return inBandReason(req, err)
		}
		if err := counterCheck(&cred, count, req.ChallengeID); err != nil {
			return err
		}
	}
	return errCASExhausted
}

// replay answers a retry by the consumer that already consumed the challenge.
// It must carry the same call and credential. It does not check the counter,
// which the first attempt claimed before the consume; it re-applies the use
// time, which may not have been stored if that attempt failed after the
// consume (and the counter, never lowering it).
//
// An in-band retry (the client's own: the same signed call sent again, to
// recover a first attempt that died, or was refused, after the consume) is
// held to what that act could still do now: it comes within the challenge's
// own lifetime counted from the consume (else the challenge is consumed and
// that is the answer), and neither the passkey nor its approver has been
// disabled or revoked since, nor unmapped from the principal. Without these
// a client could keep a consumed assertion and replay it hours later, after
// an admin revoked the passkey. A task decision's retry is the workflow's
// (its activity, retried by Temporal, under the update's id), for a decision
// the workflow already holds: it is answered whenever it comes, and quorum
// re-reads the approver's status anyway.
func (s *Service) replay(ctx context.Context, req *VerifyRequest, ch *challengeRecord, credID string) (Verified, error) {
	if ch.Result == nil || ch.TaskID != req.TaskID || ch.Tool != req.Tool ||
		ch.ActionHash != req.ActionHash.String() || ch.Result.CredentialID != credID {
		return Verified{}, newError(ReasonChallengeConsumed, errors.New("consumer key reused for a different call"))
	}
	if req.Principal != "" {
		if err := s.replayable(ctx, req, ch, credID); err != nil {
			return Verified{}, err
		}
	}
	if req.CheckOnly {
		return *ch.Result, nil
	}
	if err := s.advanceCounter(ctx, credID, ch.Result.SignCount, ch.ConsumedAt); err != nil {
		return Verified{}, err
	}
	return *ch.Result, nil
}

// replayable reports whether an in-band retry may still have its consumed
// challenge's result (see replay).
func (s *Service) replayable(ctx context.Context, req *VerifyRequest, ch *challengeRecord, credID string) error {
	if life := ch.ExpiresAt.Sub(ch.CreatedAt); !s.now().Before(ch.ConsumedAt.Add(life)) {
		return newError(ReasonChallengeConsumed, fmt.Errorf("retry %s after the consume, past the challenge's lifetime", s.now().Sub(ch.ConsumedAt).Round(time.Second)))
	}
	var cred credentialRecord
	if _, err := getJSON(ctx, s.credentials, credID, &cred); err != nil {
		if isNotFound(err) {
			return newError(ReasonUnknownCredential, nil)
		}
		return fmt.Errorf("passkey: get credential: %w", err)
	}
	a, err := s.Approver(ctx, cred.ApproverID)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return newError(ReasonUnknownCredential, err)
		}
		return err
	}
	if !a.MappedTo(req.Principal) {
		return newError(ReasonUnknownCredential, errors.New("credential no longer enrolled for this principal"))
	}
	return inBandReason(req, usable(a, cred))
}

// inBandReason keeps an in-band rejection within SEP-2672 §4.10's reasons:
// to the caller of an in-band call, a passkey or approver an admin disabled
// or revoked is a passkey not enrolled (unknown_credential; the admin's
// action stays in the cause, for the log). Task decisions keep the
// specific reason their approver is shown.
func inBandReason(req *VerifyRequest, err error) error {
	if err == nil || req.Principal == "" {
		return err
	}
	return newError(ReasonUnknownCredential, err)
}

// advanceCounter raises the stored signature counter to count (never lowers
// it) and records the use time, by compare-and-set. It is idempotent.
func (s *Service) advanceCounter(ctx context.Context, credID string, count uint32, usedAt time.Time) error {
	_, err := casUpdate(ctx, s.credentials, credID, func(r *credentialRecord) error {
		changed := false
		if count > r.Credential.Authenticator.SignCount {
			r.Credential.Authenticator.SignCount = count
			changed = true
		}
		if r.LastUsedAt.Before(usedAt) {
			r.LastUsedAt = usedAt
			changed = true
		}
		if !changed {
			return errNoChange
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("passkey: update signature counter: %w", err)
	}
	return nil
}
