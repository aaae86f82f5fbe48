package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

// Error codes of the API's {"error", "message"} bodies. Passkey rejections
// use the passkey reason names (SEP-2672 §4.10) as their code instead.
const (
	codeInvalidRequest       = "invalid_request"
	codeBodyTooLarge         = "body_too_large"
	codeUnsupportedMediaType = "unsupported_media_type"
	codeUnauthorized         = "unauthorized"
	codeCrossOrigin          = "cross_origin_request"
	codeNotFound             = "not_found"
	codeMethodNotAllowed     = "method_not_allowed"
	codeNameTaken            = "name_taken"
	codeTaskNotPending       = tasks.ErrTypeTaskNotPending
	codeInternal             = "internal"
)

const msgInternal = "internal error"

// errorBody is every API error response.
type errorBody struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

// apiError is a client-safe failure: status, code and message go to the
// client; the cause, if any, only to the log.
type apiError struct {
	status  int
	code    string
	message string
	cause   error
}

func (e *apiError) Error() string {
	if e.cause != nil {
		return fmt.Sprintf("web: %s: %s: %v", e.code, e.message, e.cause)
	}
	return "web: " + e.code + ": " + e.message
}

func (e *apiError) Unwrap() error { return e.cause }

func badRequest(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, code: codeInvalidRequest, message: fmt.Sprintf(format, args...)}
}

func notFound(message string) *apiError {
	return &apiError{status: http.StatusNotFound, code: codeNotFound, message: message}
}

var (
	errCrossOrigin = &apiError{status: http.StatusForbidden, code: codeCrossOrigin,
		message: "cross-origin requests are not accepted"}
	errUnauthorized = &apiError{status: http.StatusUnauthorized, code: codeUnauthorized,
		message: "an admin bearer token is required"}
	errApprovalNotFound = notFound("no such approval")
	errTaskNotPending   = &apiError{status: http.StatusConflict, code: codeTaskNotPending,
		message: "the approval is no longer pending"}
	errTooManyChallenges = &apiError{status: http.StatusTooManyRequests, code: "rate_limited",
		message: "too many passkey challenges for this approval; wait a few seconds and try again"}
)

// passkeyStatus maps passkey rejection reasons to HTTP statuses. A reason
// not listed here is 422: the request was well formed, the evidence not.
var passkeyStatus = map[string]int{
	passkey.ReasonNoPendingEnrollment:       http.StatusGone,
	passkey.ReasonCredentialAlreadyEnrolled: http.StatusConflict,
	passkey.ReasonVerificationFailed:        http.StatusBadRequest,
	passkey.ReasonNoEligibleCredential:      http.StatusConflict,
}

// apiFunc is an API endpoint; a returned error is written by writeError.
type apiFunc func(w http.ResponseWriter, r *http.Request) error

func (h *Handler) api(fn apiFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := fn(w, r); err != nil {
			h.writeError(w, r, err)
		}
	}
}

// writeError is the one place an error becomes a response. Client-safe
// errors keep their status and message; anything else is logged with its
// cause and answered with a fixed 500.
func (h *Handler) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var ae *apiError
	var pe *passkey.Error
	switch {
	case errors.As(err, &ae):
		if ae.cause != nil {
			h.log.DebugContext(r.Context(), "web: request refused", "route", r.Pattern, "code", ae.code, "error", ae.cause)
		}
		if ae.status == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="countersign-admin"`)
		}
		writeJSON(w, ae.status, errorBody{Error: ae.code, Message: ae.message})
	case errors.As(err, &pe):
		status, ok := passkeyStatus[pe.Reason]
		if !ok {
			status = http.StatusUnprocessableEntity
		}
		h.log.InfoContext(r.Context(), "web: passkey rejection", "route", r.Pattern, "reason", pe.Reason)
		writeJSON(w, status, errorBody{Error: pe.Reason, Message: pe.Message})
	default:
		h.log.ErrorContext(r.Context(), "web: internal error", "route", r.Pattern, "error", err)
		writeJSON(w, http.StatusInternalServerError, errorBody{Error: codeInternal, Message: msgInternal})
	}
}

// writeJSON writes v with the given status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(errorBody{Error: codeInternal, Message: msgInternal})
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// decodeJSON reads a bounded JSON body into dst, refusing unknown fields and
// trailing data. An empty body is an error only when required.
func (h *Handler) decodeJSON(w http.ResponseWriter, r *http.Request, dst any, required bool) error {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.maxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return &apiError{status: http.StatusRequestEntityTooLarge, code: codeBodyTooLarge,
				message: fmt.Sprintf("request body exceeds %d bytes", h.maxBody)}
		}
		return badRequest("could not read the request body")
	}
	if len(bytes.TrimSpace(b)) == 0 {
		if required {
			return badRequest("request body is empty; expected a JSON object")
		}
		return nil
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return &apiError{status: http.StatusUnsupportedMediaType, code: codeUnsupportedMediaType,
			message: "Content-Type must be application/json"}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("request body must contain a single JSON object")
	}
	return nil
}

// jsonError turns a decoding failure into a specific, client-safe 400.
func jsonError(err error) *apiError {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		return badRequest("malformed JSON at byte %d: %s", syntax.Offset, syntax.Error())
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("malformed JSON: unexpected end of input")
	case errors.As(err, &typ):
		if typ.Field == "" {
			return badRequest("request body must be a JSON object")
		}
		return badRequest("field %q must not be a JSON %s", clip(typ.Field), typ.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return badRequest("unknown field %s", clip(strings.TrimPrefix(err.Error(), "json: unknown field ")))
	}
	return badRequest("malformed JSON")
}

// clip bounds client-supplied text echoed in an error message.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return strings.ToValidUTF8(s[:max], "") + "…"
}

// apiFallback answers unknown API paths (404) and known paths with another
// method (405), in JSON.
func (h *Handler) apiFallback(w http.ResponseWriter, r *http.Request) error {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost} {
		if m == r.Method {
			continue
		}
		probe := r.WithContext(r.Context())
		probe.Method = m
		if _, pattern := h.mux.Handler(probe); pattern != "" && pattern != "/admin/" && pattern != "/approver/" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		return &apiError{status: http.StatusMethodNotAllowed, code: codeMethodNotAllowed,
			message: "method not allowed; use " + strings.Join(allow, " or ")}
	}
	return notFound("no such endpoint")
}
