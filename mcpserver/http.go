package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/countersign/countersign/tasks"
)

// HTTP header names (matched case-insensitively by net/http).
const (
	headerProtocolVersion = "Mcp-Protocol-Version"
	headerName            = "Mcp-Name"
)

// modernVersion is the first protocol version of the stateless era.
const modernVersion = string(tasks.Era2026)

// factsKey carries *requestFacts from the HTTP layer to the MCP middleware.
type factsKey struct{}

// requestFacts is what the HTTP layer learned before the SDK saw the
// request: who is calling, and the one wire detail the SDK drops.
type requestFacts struct {
	principal string
	// httpCtx is the HTTP request's context. The SDK detaches handler
	// contexts from it; long waits (tasks/result) re-attach to it so a
	// client that hangs up frees its goroutine.
	httpCtx context.Context
	// legacyTask is set when a tools/call carries params.task (2025-11-25
	// task augmentation), which mcp.CallToolParamsRaw does not keep.
	legacyTask bool
}

func factsFrom(ctx context.Context) *requestFacts {
	f, _ := ctx.Value(factsKey{}).(*requestFacts)
	return f
}

// httpHandler wraps the SDK's handler: recover, authenticate, cap and read
// the body once, answer malformed JSON-RPC and header mismatches, and pass
// the findings on in the request context.
func (s *Server) httpHandler(sdk http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tw := &trackingWriter{ResponseWriter: w}
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.ErrorContext(r.Context(), "mcpserver: panic while serving HTTP", "panic", fmt.Sprint(v))
				if !tw.wroteHeader {
					writeRPCError(tw, http.StatusInternalServerError, nil, internal(nil))
				}
			}
		}()
		s.serveHTTP(tw, r, sdk)
	})
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request, sdk http.Handler) {
	principal, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	if r.Method != http.MethodPost {
		sdk.ServeHTTP(w, r) // the stateless SDK handler answers 405
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeRPCError(w, http.StatusRequestEntityTooLarge, nil, &rpcError{
				code: codeInvalidRequest,
				msg:  fmt.Sprintf("Request body exceeds %d bytes", s.opts.MaxBodyBytes),
			})
			return
		}
		writeRPCError(w, http.StatusBadRequest, nil, &rpcError{code: codeInvalidRequest, msg: "Could not read the request body"})
		return
	}
	facts := &requestFacts{principal: principal, httpCtx: r.Context()}
	if id, rerr, status := inspect(body, r.Header, facts); rerr != nil {
		writeRPCError(w, status, id, rerr)
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), factsKey{}, facts))
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	sdk.ServeHTTP(w, r)
}

// authenticate returns the caller's principal, or answers 401 with a
// WWW-Authenticate challenge (RFC 6750) and returns false.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (string, bool) {
	if s.opts.NoAuth {
		return AnonymousPrincipal, true
	}
	scheme, token, found := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	token = strings.TrimSpace(token)
	if !found || !strings.EqualFold(scheme, "Bearer") || token == "" {
		s.challenge(w, "")
		return "", false
	}
	principal, err := s.opts.Authenticate(r.Context(), token)
	if err != nil || principal == "" {
		s.log.InfoContext(r.Context(), "mcpserver: bearer token rejected", "err", err)
		s.challenge(w, "invalid_token")
		return "", false
	}
	return principal, true
}

func (s *Server) challenge(w http.ResponseWriter, errCode string) {
	v := `Bearer realm="countersign"`
	if errCode != "" {
		v += `, error="` + errCode + `"`
	}
	w.Header().Set("WWW-Authenticate", v)
	http.Error(w, "Unauthorized: a bearer token is required", http.StatusUnauthorized)
}

// envelope is the part of a JSON-RPC message the HTTP layer looks at.
type envelope struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params"`
}

// inspect validates the framing of one JSON-RPC message, records facts the
// SDK would lose, and checks the Mcp-Name rule for tasks/*. On failure it
// returns the id to answer with (nil for null), the error and the HTTP status.
func inspect(body []byte, h http.Header, facts *requestFacts) (json.RawMessage, *rpcError, int) {
	trimmed := bytes.TrimSpace(body)
	switch {
	case len(trimmed) == 0:
		return nil, &rpcError{code: codeInvalidRequest, msg: "Invalid Request: empty body"}, http.StatusBadRequest
	case !json.Valid(trimmed):
		return nil, &rpcError{code: codeParseError, msg: "Parse error"}, http.StatusBadRequest
	case trimmed[0] == '[':
		return nil, &rpcError{code: codeInvalidRequest, msg: "Invalid Request: batches are not supported"}, http.StatusBadRequest
	case trimmed[0] != '{':
		return nil, &rpcError{code: codeInvalidRequest, msg: "Invalid Request: not a JSON-RPC object"}, http.StatusBadRequest
	}
	var msg envelope
	if err := json.Unmarshal(trimmed, &msg); err != nil || msg.JSONRPC != "2.0" {
		return validID(msg.ID), &rpcError{code: codeInvalidRequest, msg: "Invalid Request"}, http.StatusBadRequest
	}
	if msg.Method == "" {
		return nil, nil, 0 // a response to a server request; the SDK handles it
	}
	var params struct {
		Meta   map[string]json.RawMessage `json:"_meta"`
		Task   json.RawMessage            `json:"task"`
		TaskID json.RawMessage            `json:"taskId"`
	}
	if len(msg.Params) > 0 && json.Unmarshal(msg.Params, &params) != nil {
		return nil, nil, 0 // params is not an object: the SDK answers -32602
	}
	switch msg.Method {
	case "tools/call":
		task := bytes.TrimSpace(params.Task)
		facts.legacyTask = len(task) > 0 && task[0] == '{'
	case "tasks/get", "tasks/update", "tasks/cancel":
		var metaVersion string
		_ = json.Unmarshal(params.Meta["io.modelcontextprotocol/protocolVersion"], &metaVersion)
		if h.Get(headerProtocolVersion) < modernVersion && metaVersion < modernVersion {
			break // 2025-11-25 has no Mcp-Name rule
		}
		var taskID string
		if json.Unmarshal(params.TaskID, &taskID) != nil {
			break // no string taskId: the handler answers -32602
		}
		if name, ok := decodeHeaderValue(h.Get(headerName)); !ok || name != taskID {
			return validID(msg.ID), &rpcError{code: codeHeaderMismatch, msg: "Header mismatch: Mcp-Name must equal params.taskId"}, http.StatusBadRequest
		}
	}
	return nil, nil, 0
}

// validID returns id if it is a JSON-RPC id (string or number), else nil.
func validID(id json.RawMessage) json.RawMessage {
	id = bytes.TrimSpace(id)
	if len(id) == 0 {
		return nil
	}
	var v any
	if json.Unmarshal(id, &v) != nil {
		return nil
	}
	switch v.(type) {
	case string, float64:
		return id
	}
	return nil
}

// decodeHeaderValue undoes the SEP-2243 "=?base64?…?=" encoding of a
// non-ASCII header value.
func decodeHeaderValue(v string) (string, bool) {
	if inner, ok := strings.CutPrefix(v, "=?base64?"); ok {
		if inner, ok = strings.CutSuffix(inner, "?="); ok {
			b, err := base64.StdEncoding.DecodeString(inner)
			return string(b), err == nil
		}
	}
	return v, true
}

// writeRPCError answers with a JSON-RPC error response.
func writeRPCError(w http.ResponseWriter, status int, id json.RawMessage, e *rpcError) {
	if id == nil {
		id = json.RawMessage("null")
	}
	type wireErr struct {
		Code    int64           `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data,omitempty"`
	}
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   wireErr         `json:"error"`
	}{"2.0", id, wireErr{e.code, e.msg, e.data}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// trackingWriter remembers whether the header was written, so a recovered
// panic does not write a second one.
type trackingWriter struct {
	http.ResponseWriter
	wroteHeader bool
}

func (w *trackingWriter) WriteHeader(code int) {
	w.wroteHeader = true
	w.ResponseWriter.WriteHeader(code)
}

func (w *trackingWriter) Write(b []byte) (int, error) {
	w.wroteHeader = true
	return w.ResponseWriter.Write(b)
}

func (w *trackingWriter) Flush() {
	w.wroteHeader = true
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *trackingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
