package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/countersign/countersign/internal/approverapi"
	"github.com/countersign/countersign/passkey"
)

// Error codes of the API's {"error", "message"} bodies. Passkey rejections
// use the passkey reason names (SEP-2672 §4.10) as their code instead. The
// approver API's own codes are approverapi's, shared with the NATS decision
// service.
const (
	codeInvalidRequest       = approverapi.CodeInvalidRequest
	codeBodyTooLarge         = approverapi.CodeBodyTooLarge
	codeUnsupportedMediaType = "unsupported_media_type"
	codeUnauthorized         = "unauthorized"
	codeCrossOrigin          = "cross_origin_request"
	codeNotFound             = approverapi.CodeNotFound
	codeMethodNotAllowed     = "method_not_allowed"
	codeNameTaken            = "name_taken"
	codeTaskNotPending       = approverapi.CodeTaskNotPending
	codeInternal             = approverapi.CodeInternal
)

const msgInternal = approverapi.MsgInternal

// errorBody is every API error response.
type errorBody = approverapi.ErrorBody

// apiError is a client-safe failure: status, code and message go to the
// client; the cause, if any, only to the log.
type apiError = approverapi.Error

var (
	badRequest = approverapi.BadRequest
	notFound   = approverapi.NotFound
)

var (
	errCrossOrigin = &apiError{Status: http.StatusForbidden, Code: codeCrossOrigin,
		Message: "cross-origin requests are not accepted"}
	errUnauthorized = &apiError{Status: http.StatusUnauthorized, Code: codeUnauthorized,
		Message: "an admin bearer token is required"}
	errInvalidAdminToken = &apiError{Status: http.StatusUnauthorized, Code: codeUnauthorized,
		Message: "the admin bearer token is invalid: unknown, revoked, or not an admin token"}
	errTooManyInboxChallenges = &apiError{Status: http.StatusTooManyRequests, Code: approverapi.CodeRateLimited,
		Message: "too many passkey challenges for this approval; wait a few seconds and try again"}
)

// apiFunc is an API endpoint; a returned error is written by writeError.
type apiFunc func(w http.ResponseWriter, r *http.Request) error

func (h *Handler) api(fn apiFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := fn(w, r); err != nil {
			h.writeError(w, r, err)
		}
	}
}

// writeError is the one place an error becomes a response, by
// approverapi.ErrorReply (the NATS decision service answers by the same).
// Client-safe errors keep their status and message; anything else is
// logged with its cause and answered with a fixed 500.
func (h *Handler) writeError(w http.ResponseWriter, r *http.Request, err error) {
	h.send(w, r, approverapi.ErrorReply(err), err)
}

// send writes an API answer. err, when not nil, is the failure rep answers:
// its cause goes to the log, never to the client.
func (h *Handler) send(w http.ResponseWriter, r *http.Request, rep approverapi.Reply, err error) {
	if err != nil {
		var ae *apiError
		var pe *passkey.Error
		switch {
		case rep.Status == http.StatusInternalServerError:
			h.log.ErrorContext(r.Context(), "web: internal error", "route", r.Pattern, "error", err)
		case errors.As(err, &ae):
			if ae.Cause != nil {
				h.log.DebugContext(r.Context(), "web: request refused", "route", r.Pattern, "code", ae.Code, "error", ae.Cause)
			}
		case errors.As(err, &pe):
			h.log.InfoContext(r.Context(), "web: passkey rejection", "route", r.Pattern, "reason", pe.Reason)
		default:
			h.log.DebugContext(r.Context(), "web: request refused", "route", r.Pattern, "status", rep.Status, "error", err)
		}
	}
	if rep.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="countersign-admin"`)
	}
	if rep.RetryAfter != "" {
		w.Header().Set("Retry-After", rep.RetryAfter)
	}
	writeJSON(w, rep.Status, rep.Body)
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
// trailing data (approverapi.Decode). An empty body is an error only when
// required.
func (h *Handler) decodeJSON(w http.ResponseWriter, r *http.Request, dst any, required bool) error {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.maxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return approverapi.BodyTooLarge(h.maxBody)
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
		return &apiError{Status: http.StatusUnsupportedMediaType, Code: codeUnsupportedMediaType,
			Message: "Content-Type must be application/json"}
	}
	return approverapi.Decode(b, dst)
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
		return &apiError{Status: http.StatusMethodNotAllowed, Code: codeMethodNotAllowed,
			Message: "method not allowed; use " + strings.Join(allow, " or ")}
	}
	return notFound("no such endpoint")
}
