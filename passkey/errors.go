package passkey

import (
	"errors"
)

// Reasons are the SEP-2672 §4.10 machine-readable rejection reasons, plus
// Countersign's additions (challenge_wrong_task, approver_not_eligible,
// self_approval). They are stable wire values: clients branch on them.
const (
	// Per-call assertion path (§4.8), in check order.
	ReasonMissingEvidence             = "missing_evidence"
	ReasonUnsupportedMethod           = "unsupported_method"
	ReasonChallengeUnknown            = "challenge_unknown"
	ReasonChallengeConsumed           = "challenge_consumed"
	ReasonChallengeExpired            = "challenge_expired"
	ReasonChallengeWrongTask          = "challenge_wrong_task" // Countersign addition
	ReasonChallengeWrongTool          = "challenge_wrong_tool"
	ReasonChallengeWrongDecision      = "challenge_wrong_decision" // Countersign addition
	ReasonUnknownCredential           = "unknown_credential"
	ReasonAuthenticatorClassMismatch  = "authenticator_class_mismatch"
	ReasonSignatureVerificationFailed = "signature_verification_failed"
	ReasonSignatureCounterRegression  = "signature_counter_regression"
	ReasonArgumentHashMismatch        = "argument_hash_mismatch"
	ReasonApproverNotEligible         = "approver_not_eligible" // Countersign addition
	ReasonSelfApproval                = "self_approval"         // Countersign addition
	// An admin's action (admin.go), checked at decision time: Countersign
	// additions.
	ReasonCredentialRevoked  = "credential_revoked"
	ReasonCredentialDisabled = "credential_disabled"
	ReasonApproverRevoked    = "approver_revoked"
	ReasonApproverDisabled   = "approver_disabled"

	// Challenge issuance (§4.4.3). ReasonToolNotApprovalRequired is emitted by
	// the MCP layer, which knows the tool registry; this package never returns it.
	ReasonToolNotApprovalRequired = "tool_not_approved_required"
	ReasonNoEligibleCredential    = "no_eligible_credential"

	// Enrollment finish (§4.4.2).
	ReasonCredentialAlreadyEnrolled = "credential_already_enrolled"
	ReasonNoPendingEnrollment       = "no_pending_enrollment"
	ReasonVerificationFailed        = "verification_failed"
)

// messages are the fixed, client-safe messages for each reason. Nothing
// request-specific goes in them; details stay in the cause.
var messages = map[string]string{
	ReasonMissingEvidence:             "Approval evidence is missing or malformed",
	ReasonUnsupportedMethod:           "Approval evidence method is not supported",
	ReasonChallengeUnknown:            "Approval challenge is unknown",
	ReasonChallengeConsumed:           "Approval challenge has already been used",
	ReasonChallengeExpired:            "Approval challenge has expired",
	ReasonChallengeWrongTask:          "Approval challenge was issued for a different task",
	ReasonChallengeWrongTool:          "Approval challenge was issued for a different tool",
	ReasonChallengeWrongDecision:      "Approval challenge was issued for a different decision",
	ReasonUnknownCredential:           "Passkey is not enrolled",
	ReasonAuthenticatorClassMismatch:  "Passkey does not satisfy the authenticator class policy",
	ReasonSignatureVerificationFailed: "Passkey signature verification failed",
	ReasonSignatureCounterRegression:  "Passkey signature counter did not increase",
	ReasonArgumentHashMismatch:        "Approval evidence does not match the arguments of this call",
	ReasonApproverNotEligible:         "Approver is not eligible to approve this call",
	ReasonSelfApproval:                "The requester cannot approve their own call",
	ReasonCredentialRevoked:           "Passkey has been revoked by an admin",
	ReasonCredentialDisabled:          "Passkey is disabled by an admin",
	ReasonApproverRevoked:             "Approver has been revoked by an admin",
	ReasonApproverDisabled:            "Approver is disabled by an admin",
	ReasonToolNotApprovalRequired:     "Tool does not require verified approval",
	ReasonNoEligibleCredential:        "No enrolled passkey satisfies the policy",
	ReasonCredentialAlreadyEnrolled:   "Passkey is already enrolled",
	ReasonNoPendingEnrollment:         "No pending enrollment: the invite is unknown, used or expired",
	ReasonVerificationFailed:          "Passkey registration could not be verified",
}

// Error is an approval-domain rejection carrying a SEP-2672 §4.10 reason.
// Reason and Message are safe to send to clients (JSON-RPC -32001, data.reason);
// the cause is only for logs, through [errors.Unwrap].
//
// Errors of this type are final: retrying the same input gives the same answer.
// Any other error from this package is an infrastructure failure (NATS) and
// may be retried.
type Error struct {
	Reason  string
	Message string
	cause   error
}

func newError(reason string, cause error) *Error {
	return &Error{Reason: reason, Message: messages[reason], cause: cause}
}

// Error returns the package prefix, the safe message and the reason. It never
// includes the cause.
func (e *Error) Error() string {
	return "passkey: " + e.Message + " (" + e.Reason + ")"
}

// Unwrap returns the internal cause, which may hold details unfit for clients.
func (e *Error) Unwrap() error { return e.cause }

// Is reports whether target is an *Error with the same Reason, so
// errors.Is(err, &passkey.Error{Reason: passkey.ReasonChallengeConsumed}) works.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t != nil && t.Reason == e.Reason
}

// MessageOf returns the fixed, client-safe message of reason ("" for an
// unknown reason).
func MessageOf(reason string) string { return messages[reason] }

// ReasonOf returns the reason of the first *Error in err's chain, or "" if
// there is none (an infrastructure error).
func ReasonOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

var (
	// ErrNotFound is returned when an approver does not exist.
	ErrNotFound = errors.New("passkey: not found")
	// ErrInvalidArgument is returned, wrapped with details, when a caller
	// passes a malformed name, group, class or request.
	ErrInvalidArgument = errors.New("passkey: invalid argument")
	// ErrRevoked is returned, wrapped, when an admin tries to disable or
	// enable what was revoked: revocation is permanent.
	ErrRevoked = errors.New("passkey: revoked; a revocation is permanent")
	// ErrChallengeCapacity is returned, wrapped, when the challenges
	// bucket is full (Options.ChallengeMaxBytes): IssueChallenge stores
	// nothing, and a consume that finds no room consumes nothing. It is
	// not final: space frees as challenges age out (unanswered ones soon
	// after their lifetime, consumed ones after ChallengeRetention).
	ErrChallengeCapacity = errors.New("passkey: the server is at capacity for approval challenges")
	// ErrEnrollmentClosed is returned, wrapped, when in-band enrollment
	// is closed (Options.InBandEnrollment EnrollClosed).
	ErrEnrollmentClosed = errors.New("passkey: in-band enrollment is closed on this server")
	// ErrNotFirstPasskey is returned, wrapped, when in-band enrollment is
	// open only for a first passkey (EnrollFirst) and the principal has
	// one already.
	ErrNotFirstPasskey = errors.New("passkey: the principal has a passkey already, and in-band enrollment takes only a first one on this server")
)
