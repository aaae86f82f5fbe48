package approverapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

// Error codes of the {"error", "message"} bodies. Passkey rejections use
// the passkey reason names (SEP-2672 §4.10) as their code instead.
const (
	CodeInvalidRequest          = "invalid_request"
	CodeBodyTooLarge            = "body_too_large"
	CodeNotFound                = "not_found"
	CodeTaskNotPending          = tasks.ErrTypeTaskNotPending
	CodeRateLimited             = "rate_limited"
	CodeVerificationUnavailable = tasks.ErrTypeVerificationUnavailable
	CodeDecisionInProgress      = "decision_in_progress"
	CodeAtCapacity              = "at_capacity"
	CodeLimitUnavailable        = "limit_unavailable"
	CodeInternal                = "internal"
)

// MsgInternal is the message of every internal failure: its cause goes
// only to the log.
const MsgInternal = "internal error"

// ErrorBody is every error answer.
type ErrorBody struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

// Error is a client-safe failure an edge found itself (a malformed
// request, an unknown path…): status, code and message go to the client;
// the cause, if any, only to the log.
type Error struct {
	Status  int
	Code    string
	Message string
	Cause   error
}

func (e *Error) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("approverapi: %s: %s: %v", e.Code, e.Message, e.Cause)
	}
	return "approverapi: " + e.Code + ": " + e.Message
}

func (e *Error) Unwrap() error { return e.Cause }

// BadRequest is a 400 invalid_request whose message names the rule broken.
func BadRequest(format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Code: CodeInvalidRequest, Message: fmt.Sprintf(format, args...)}
}

// NotFound is a 404 not_found.
func NotFound(message string) *Error {
	return &Error{Status: http.StatusNotFound, Code: CodeNotFound, Message: message}
}

// BodyTooLarge is a 413 for a body over max bytes.
func BodyTooLarge(max int64) *Error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Code: CodeBodyTooLarge,
		Message: fmt.Sprintf("request body exceeds %d bytes", max)}
}

var errBadDecision = BadRequest("decision must be %q or %q", tasks.DecisionApprove, tasks.DecisionDeny)

// passkeyStatus maps passkey rejection reasons to statuses. A reason not
// listed here is 422: the request was well formed, the evidence not.
var passkeyStatus = map[string]int{
	passkey.ReasonNoPendingEnrollment:       http.StatusGone,
	passkey.ReasonCredentialAlreadyEnrolled: http.StatusConflict,
	passkey.ReasonVerificationFailed:        http.StatusBadRequest,
	passkey.ReasonNoEligibleCredential:      http.StatusConflict,
}

// ErrorReply maps an error to its answer, an [ErrorBody]:
//
//	*Error                                its own status, code and message
//	approvals.ErrNotFound                 404 not_found
//	approvals.ErrInvalidDecision          400 invalid_request
//	approvals.ErrNotPending               409 task_not_pending
//	approvals.ErrTooManyChallenges        429 rate_limited
//	approvals.ErrVerificationUnavailable  503 verification_unavailable (try again)
//	approvals.ErrInProgress               503 decision_in_progress, Retry-After 2:
//	                                      the same request again gets the outcome
//	approvals.ErrLimitUnavailable         503 limit_unavailable, Retry-After 2:
//	                                      the rate limit could not be checked
//	passkey.ErrChallengeCapacity          503 at_capacity: no room for a challenge
//	*passkey.Error                        by reason: 410, 409, 400, else 422, with
//	                                      the reason as code
//	anything else                         500 internal "internal error"
//
// A 500's cause is for the edge to log, never to send.
func ErrorReply(err error) Reply {
	var e *Error
	var pe *passkey.Error
	switch {
	case errors.As(err, &e):
		return errReply(e.Status, e.Code, e.Message)
	case errors.Is(err, approvals.ErrNotFound):
		return errReply(http.StatusNotFound, CodeNotFound, "no such approval")
	case errors.Is(err, approvals.ErrInvalidDecision):
		return errReply(errBadDecision.Status, errBadDecision.Code, errBadDecision.Message)
	case errors.Is(err, approvals.ErrNotPending):
		return errReply(http.StatusConflict, CodeTaskNotPending, "the approval is no longer pending")
	case errors.Is(err, approvals.ErrTooManyChallenges):
		return errReply(http.StatusTooManyRequests, CodeRateLimited,
			"too many passkey challenges for this approval; wait a few seconds and try again")
	case errors.Is(err, approvals.ErrVerificationUnavailable):
		return errReply(http.StatusServiceUnavailable, CodeVerificationUnavailable, "the decision could not be verified; try again")
	case errors.Is(err, approvals.ErrInProgress):
		r := errReply(http.StatusServiceUnavailable, CodeDecisionInProgress,
			"the decision is still being processed; send the same request again for its outcome")
		r.RetryAfter = "2"
		return r
	case errors.Is(err, approvals.ErrLimitUnavailable):
		r := errReply(http.StatusServiceUnavailable, CodeLimitUnavailable,
			"the challenge limits could not be checked, so no challenge was made; try again")
		r.RetryAfter = "2"
		return r
	case errors.Is(err, passkey.ErrChallengeCapacity):
		return errReply(http.StatusServiceUnavailable, CodeAtCapacity,
			"the server is at capacity for approval challenges; try again later")
	case errors.As(err, &pe):
		status, ok := passkeyStatus[pe.Reason]
		if !ok {
			status = http.StatusUnprocessableEntity
		}
		return errReply(status, pe.Reason, pe.Message)
	}
	return errReply(http.StatusInternalServerError, CodeInternal, MsgInternal)
}

func errReply(status int, code, message string) Reply {
	return Reply{Status: status, Body: ErrorBody{Error: code, Message: message}}
}

// Decode reads one JSON value from b into dst, refusing unknown fields and
// trailing data. A failure is a 400 (*Error) whose message says what is
// wrong (with the byte offset of a syntax error) and echoes at most a
// clipped field name.
func Decode(b []byte, dst any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return BadRequest("request body must contain a single JSON object")
	}
	return nil
}

// jsonError turns a decoding failure into a specific, client-safe 400.
func jsonError(err error) *Error {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		return BadRequest("malformed JSON at byte %d: %s", syntax.Offset, syntax.Error())
	case errors.Is(err, io.ErrUnexpectedEOF):
		return BadRequest("malformed JSON: unexpected end of input")
	case errors.As(err, &typ):
		if typ.Field == "" {
			return BadRequest("request body must be a JSON object")
		}
		return BadRequest("field %q must not be a JSON %s", Clip(typ.Field), typ.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return BadRequest("unknown field %s", Clip(strings.TrimPrefix(err.Error(), "json: unknown field ")))
	}
	return BadRequest("malformed JSON")
}

// Clip bounds client-supplied text echoed in an error message.
func Clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return strings.ToValidUTF8(s[:max], "") + "…"
}
