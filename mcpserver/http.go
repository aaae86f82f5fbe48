package mcpserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/internal/authn"
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
	// subject is the caller's policy subject properties (OAuth callers'
	// scopes and claims); nil for a static agent token.
	subject map[string]any
	// httpCtx is the HTTP request's context. The SDK detaches handler
	// contexts from it; long waits (tasks/result) re-attach to it so a
	// client that hangs up frees its goroutine.
	httpCtx context.Context
	// legacyTask is set when a tools/call carries params.task (2025-11-25
	// task augmentation), which mcp.CallToolParamsRaw does not keep.
	legacyTask bool
	// method and id are the JSON-RPC method and id (empty for a response
	// or a malformed message), for the request budget's answers.
	method string
	id     json.RawMessage
	// tool is a tools/call's params.name; wantsNotes is set when the call
	// asks for notifications (a _meta progressToken, or a 2026-07-28 _meta
	// log level).
	tool       string
	wantsNotes bool
	// stream: the request is served as text/event-stream (see
	// Server.answersAsStream).
	stream bool
}

func factsFrom(ctx context.Context) *requestFacts {
	f, _ := ctx.Value(factsKey{}).(*requestFacts)
	return f
}

// httpHandler wraps the SDK's handler: recover, authenticate, cap and read
// the body once, answer malformed JSON-RPC and header mismatches, and pass
// the findings on in the request context.
func (s *Server) httpHandler(sdk, sse http.Handler) http.Handler {
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
		s.serveHTTP(tw, r, sdk, sse)
	})
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request, sdk, sse http.Handler) {
	var body []byte
	hint, refused := s.refuseKnownOverBudget(w, r, &body)
	if refused {
		return
	}
	// The token lookup holds a working slot (counted against the
	// principal's share when the token is a recent one); the body is read
	// outside one (internal/httplimit bounds slow bodies), and a quick
	// method takes one again once admitted by its budget.
	leave, ok := s.enter(w, r, hint, nil)
	if !ok {
		return
	}
	principal, subject, ok := s.authenticate(w, r)
	leave()
	if !ok {
		return
	}
	if r.Method == http.MethodGet {
		s.serveGET(w, r, principal)
		return
	}
	if r.Method != http.MethodPost {
		release, ok := s.admit(w, r, principal, "", nil)
		if !ok {
			return
		}
		defer release()
		sdk.ServeHTTP(w, r) // the stateless SDK handler answers 405
		return
	}
	if body == nil {
		if body, ok = s.readBody(w, r); !ok {
			return
		}
	}
	facts := &requestFacts{principal: principal, subject: subject, httpCtx: r.Context()}
	id, rerr, status := inspect(body, r.Header, facts)
	// Every message counts against the budget, malformed ones included.
	if id == nil {
		id = facts.id
	}
	listen := rerr == nil && facts.method == methodListen
	var release func()
	if listen {
		release, ok = s.admitStream(w, r, principal, methodListen, id)
	} else {
		release, ok = s.admit(w, r, principal, facts.method, id)
	}
	if !ok {
		return
	}
	defer release()
	if rerr != nil {
		writeRPCError(w, status, id, rerr)
		return
	}
	if quickMethod(facts.method) {
		// Its store work is short. A method that may wait (for a task,
		// an upstream, an approval window) holds no working slot: its
		// budget's in-flight slot bounds it.
		leave, ok := s.enter(w, r, "", id)
		if !ok {
			return
		}
		defer leave()
	}
	facts.stream = s.answersAsStream(r, facts)
	if !s.sdkTaskGet && s.serveTaskGet(w, r, body, facts) {
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), factsKey{}, facts))
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	switch {
	case listen:
		s.serveListen(w, r, sdk, principal)
		return
	case facts.stream:
		sse.ServeHTTP(w, r)
		return
	}
	if id == nil {
		sdk.ServeHTTP(w, r)
		return
	}
	aw := &answerWriter{ResponseWriter: w, id: id, method: facts.method, era: headerEra(r.Header)}
	sdk.ServeHTTP(aw, r)
	aw.finish()
}

// answerWriter puts the SDK's own answers to a request in this package's
// words, where the SDK answers before any handler of ours runs or rewords
// what one returned:
//
//   - A method the server does not serve: before 2026-07-28 the SDK
//     answers a plain-text HTTP 400 ("JSON RPC not handled: …"), which the
//     2025-11-25 transport does not allow for a request (the answer is a
//     JSON object or an SSE stream) and which breaks a Go SDK client's
//     connection: that client keeps a connection alive after a non-2xx
//     answer only if the body is a JSON-RPC error. The writer holds back a
//     plain-text 400 and, if it is that one, answers HTTP 200 with -32601,
//     as the server's other 2025-11-25 errors are answered; any other
//     plain-text answer passes through unchanged.
//   - -32601 in JSON, which the SDK words `JSON RPC not handled: "<method>"
//     unsupported` (2026-07-28, HTTP 404) or `method not found:
//     "<method>"` (a method of the other era, in either): the message
//     becomes methodNotFound's, the same in both eras. Status and id stay.
//   - An error whose message shows the SDK's decoder at work ("cannot
//     unmarshal … into Go struct field …"), for params nested deeper than
//     the HTTP layer checks them (checkParams): -32602 with a message that
//     names the method, not Go types; the SDK's code 0 for such an
//     initialize becomes -32602.
//
// The SDK writes a JSON answer in one Write; the writer reads only the
// first, and decodes it only when it holds a JSON-RPC error.
type answerWriter struct {
	http.ResponseWriter
	id     json.RawMessage
	method string
	era    tasks.Era
	held   bool // a plain-text 400 is held back
	body   bytes.Buffer
	wrote  bool // the first body bytes went out
}

// notHandled is how the SDK's plain-text answer to an unknown method
// starts (its internal jsonrpc2.ErrNotHandled).
const notHandled = "JSON RPC not handled"

func (w *answerWriter) WriteHeader(code int) {
	if code == http.StatusBadRequest && strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
		w.held = true
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *answerWriter) Write(b []byte) (int, error) {
	if w.held {
		return w.body.Write(b)
	}
	if !w.wrote {
		w.wrote = true
		if out, ok := w.reword(b); ok {
			if _, err := w.ResponseWriter.Write(out); err != nil {
				return 0, err
			}
			return len(b), nil
		}
	}
	return w.ResponseWriter.Write(b)
}

// Fragments of the SDK's texts that must not reach a client: its
// method-not-found forms (this package's start "Method not found") and its
// decoder's type errors.
var (
	sdkNotFound = []string{notHandled, "method not found"}
	sdkDecoder  = []string{"Go struct field", "Go value of type", "cannot unmarshal", "unmarshaling", "json: ", "interface {}", "map["}
)

// reword returns the JSON answer b in this package's words, or false to
// send it as it is.
func (w *answerWriter) reword(b []byte) ([]byte, bool) {
	if !strings.HasPrefix(w.Header().Get("Content-Type"), "application/json") || !bytes.Contains(b, []byte(`"error"`)) {
		return nil, false
	}
	var msg struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code    int64           `json:"code"`
			Message string          `json:"message"`
			Data    json.RawMessage `json:"data"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &msg) != nil || msg.Error == nil || msg.Result != nil {
		return nil, false
	}
	e := &rpcError{code: msg.Error.Code, msg: msg.Error.Message, data: msg.Error.Data}
	switch {
	case e.code == codeMethodNotFound && hasAny(e.msg, sdkNotFound):
		e.msg = methodNotFound(w.method, w.era).msg
	case (e.code == codeInvalidParams || e.code == 0) && hasAny(e.msg, sdkDecoder):
		e.code, e.data = codeInvalidParams, nil
		e.msg = "Invalid params: the params of " + w.method + " do not match the method's schema (a member has the wrong type)"
	default:
		return nil, false
	}
	return rpcErrorBody(w.id, e), true
}

// hasAny reports whether s contains one of the fragments.
func hasAny(s string, fragments []string) bool {
	for _, f := range fragments {
		if strings.Contains(s, f) {
			return true
		}
	}
	return false
}

func (w *answerWriter) Flush() {
	if w.held {
		return
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *answerWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// finish writes what was held back.
func (w *answerWriter) finish() {
	if !w.held {
		return
	}
	if strings.HasPrefix(w.body.String(), notHandled) {
		w.Header().Del("X-Content-Type-Options")
		writeRPCError(w.ResponseWriter, http.StatusOK, w.id, methodNotFound(w.method, w.era))
		return
	}
	w.ResponseWriter.WriteHeader(http.StatusBadRequest)
	_, _ = w.ResponseWriter.Write(w.body.Bytes())
}

// maxWorking bounds the requests that do store work at once, across
// principals: a token lookup, and a quick method's reads and writes of the
// task store (each takes a slot of its own; the body is read between);
// workingWait is how long a request waits for a slot before it is refused
// with 503 and Retry-After. Without the bound, thousands of concurrent
// pollers each started a token lookup and a record read at once: the
// store's answers took longer than its 5 s timeout, every request failed
// and was retried, and throughput collapsed (measured in
// internal/abusetest TestTenThousandPollers: 3,000 pollers, hardly any
// answered). Bounded, the store answers at its own pace and the excess
// waits or is told when to come back. Requests that wait by design
// (tools/call, tasks/result, notification streams) take no second slot.
const (
	maxWorking  = 128
	workingWait = time.Second
)

// enter takes a working slot, waiting up to workingWait; leave gives it
// back and may be called more than once. Refused, enter answers 503 with
// Retry-After and a JSON-RPC error for id. principal, when the bearer token
// is a recently seen one, is counted against its share (see shareFull), so
// that one agent's flood cannot hold every slot while another agent waits.
func (s *Server) enter(w http.ResponseWriter, r *http.Request, principal string, id json.RawMessage) (leave func(), ok bool) {
	busy := func() {
		w.Header().Set("Retry-After", "1")
		writeRPCError(w, http.StatusServiceUnavailable, id, &rpcError{code: CodeTooManyRequests, msg: "Server busy; retry after the Retry-After delay"})
	}
	if principal != "" {
		s.sharesMu.Lock()
		if s.shares[principal] >= s.opts.MaxInFlightPerPrincipal {
			// Checked before, in refuseKnownOverBudget; this is the rare
			// request that raced past it.
			s.sharesMu.Unlock()
			busy()
			return nil, false
		}
		s.shares[principal]++
		s.sharesMu.Unlock()
	}
	unshare := func() {
		if principal != "" {
			s.sharesMu.Lock()
			if s.shares[principal]--; s.shares[principal] <= 0 {
				delete(s.shares, principal)
			}
			s.sharesMu.Unlock()
		}
	}
	select {
	case s.working <- struct{}{}:
	default:
		t := time.NewTimer(workingWait)
		defer t.Stop()
		select {
		case s.working <- struct{}{}:
		case <-t.C:
			unshare()
			busy()
			return nil, false
		case <-r.Context().Done():
			unshare()
			return nil, false
		}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			unshare()
			<-s.working
		})
	}, true
}

// shareFull reports whether principal holds as many working slots (token
// lookups under way) as it may have requests in flight: one more would
// most likely be refused by its budget anyway, after a lookup that another
// agent's request needs the slot for.
func (s *Server) shareFull(principal string) bool {
	s.sharesMu.Lock()
	defer s.sharesMu.Unlock()
	return s.shares[principal] >= s.opts.MaxInFlightPerPrincipal
}

// quickMethod reports whether a method's work is short (reads and small
// writes of the task store), so that it keeps its working slot to the end.
func quickMethod(method string) bool {
	switch method {
	case "tools/call", "tasks/result", methodListen:
		return false
	}
	return true
}

// answersAsStream reports whether a request is answered as text/event-stream
// rather than application/json: a tools/call whose client accepts a stream
// and either asks for notifications (a progress token, a 2026-07-28 log
// level) or calls a conformance fixture that sends them unasked
// (conformance.Fixture.Notifies). A stream carries the request's
// notifications before its one response; every other request stays JSON.
func (s *Server) answersAsStream(r *http.Request, facts *requestFacts) bool {
	if facts.method != "tools/call" || !acceptsEventStream(r.Header.Values("Accept")) {
		return false
	}
	if facts.wantsNotes {
		return true
	}
	fx, ok := s.opts.Fixtures.Lookup(facts.tool)
	return ok && fx.Notifies
}

// readBody reads the request body under MaxBodyBytes, or answers the
// failure and returns false.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if r.ContentLength > s.opts.MaxBodyBytes {
		// Declared too large: refused before a byte is read, and the
		// connection closed rather than drained.
		w.Header().Set("Connection", "close")
		writeRPCError(w, http.StatusRequestEntityTooLarge, nil, &rpcError{
			code: codeInvalidRequest,
			msg:  fmt.Sprintf("Request body exceeds %d bytes", s.opts.MaxBodyBytes),
		})
		return nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err == nil {
		return body, true
	}
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		writeRPCError(w, http.StatusRequestEntityTooLarge, nil, &rpcError{
			code: codeInvalidRequest,
			msg:  fmt.Sprintf("Request body exceeds %d bytes", s.opts.MaxBodyBytes),
		})
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The server's read deadline (internal/httplimit answers in our
		// place when it guards the endpoint).
		WriteHTTPError(w, http.StatusRequestTimeout, "Request body not received in time")
	default:
		writeRPCError(w, http.StatusBadRequest, nil, &rpcError{code: codeInvalidRequest, msg: "Could not read the request body"})
	}
	return nil, false
}

// refuseKnownOverBudget answers 429 for a bearer token that recently
// authenticated as a principal now over its budget, without looking the
// token up again: a flooding agent's refusals must stay cheap, or they
// slow everyone down just the same. The token cache only ever refuses;
// admission always authenticates. A POST body it had to read (for the
// method and id) is left in *body. principal is the token's recently seen
// principal ("" when unknown), for the working-slot share (enter).
func (s *Server) refuseKnownOverBudget(w http.ResponseWriter, r *http.Request, body *[]byte) (principal string, refused bool) {
	if s.opts.NoAuth {
		return "", false
	}
	principal, ok := s.recent.get(bearerToken(r))
	if !ok {
		return "", false
	}
	full := s.shareFull(principal)
	if !full && !s.budget.Exhausted(principal, s.now()) {
		return principal, false
	}
	var method string
	var id json.RawMessage
	if r.Method == http.MethodPost {
		b, ok := s.readBody(w, r)
		if !ok {
			return principal, true
		}
		*body = b
		// Read as inspect reads it; a message it would refuse is charged
		// as one that holds a slot.
		if msg, rerr := decodeEnvelope(bytes.TrimSpace(b)); rerr == nil {
			method, id = msg.Method, validID(msg.ID)
		}
	}
	// Long-lived requests hold no in-flight slot (see admit).
	slot := method != "tasks/result" && method != methodListen && r.Method != http.MethodGet
	retry, refused := s.budget.Refuses(principal, slot, s.now())
	if full {
		retry, refused = max(retry, time.Second), true
	}
	if !refused {
		return principal, false
	}
	s.refuse(w, r, principal, method, id, retry)
	return principal, true
}

// admit charges one request to principal's budget. Admitted, the request
// holds one of the principal's in-flight slots until release, except
// 2025-11-25 tasks/result, which waits for its task by design and only
// spends a token (so do notification streams: admitStream). Refused, admit
// answers HTTP 429 with Retry-After and a CodeTooManyRequests error for id,
// and returns false.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, principal, method string, id json.RawMessage) (release func(), ok bool) {
	now := s.now()
	var retry time.Duration
	if method == "tasks/result" {
		retry, ok = s.budget.Spend(principal, now)
		release = func() {}
	} else {
		release, retry, ok = s.budget.Acquire(principal, now)
	}
	if ok {
		return release, true
	}
	s.refuse(w, r, principal, method, id, retry)
	return nil, false
}

// refusalPause is how long a refusal is held before it is answered. An
// agent that ignores Retry-After and retries in a tight loop would
// otherwise turn cheap refusals into a flood that still starves everyone
// else of CPU (measured: another agent's median tasks/get went from 0.5 ms
// to over 200 ms with immediate refusals, and stayed near 1 ms with this
// pause). Held, each of its connections makes at most one request a
// second. A held refusal costs a parked goroutine on a connection that is
// open anyway (the listener caps those); it ends early if the client
// hangs up. A client that honours Retry-After waits that long anyway.
// The pause is one to one and a half seconds, jittered.
const refusalPause = time.Second

func (s *Server) refuse(w http.ResponseWriter, r *http.Request, principal, method string, id json.RawMessage, retry time.Duration) {
	s.log.DebugContext(r.Context(), "mcpserver: request over budget", "principal", principal, "method", method)
	// Jittered, so that a flood's refusals do not come back in waves.
	pause := time.NewTimer(refusalPause + rand.N(refusalPause/2))
	select {
	case <-pause.C:
	case <-r.Context().Done():
		pause.Stop()
	}
	w.Header().Set("Retry-After", strconv.Itoa(int(retry/time.Second)))
	writeRPCError(w, http.StatusTooManyRequests, id, &rpcError{code: CodeTooManyRequests, msg: msgTooManyRequests})
}

// recentPrincipals maps a digest of recently authenticated bearer tokens to
// their principal. It is bounded: when full it starts over.
type recentPrincipals struct {
	mu sync.Mutex
	m  map[[sha256.Size]byte]string
}

const maxRecentPrincipals = 10_000

func (c *recentPrincipals) get(token string) (string, bool) {
	if token == "" {
		return "", false
	}
	d := sha256.Sum256([]byte(token))
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.m[d]
	return p, ok
}

func (c *recentPrincipals) put(token, principal string) {
	d := sha256.Sum256([]byte(token))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxRecentPrincipals {
		c.m = make(map[[sha256.Size]byte]string)
	}
	c.m[d] = principal
}

// bearerToken is the token of an "Authorization: Bearer X" header, or "".
func bearerToken(r *http.Request) string {
	return authn.BearerToken(strings.TrimSpace(r.Header.Get("Authorization")))
}

// WriteHTTPError answers a request the HTTP layer refused before it was
// read, in this endpoint's shape: a JSON-RPC error with id null, code
// -32600 for 408 and 413, CodeTooManyRequests for 429 and 503, -32603
// otherwise. message must be safe to send. It lets a server-wide guard (see
// internal/httplimit) answer /mcp clients like the endpoint does.
func WriteHTTPError(w http.ResponseWriter, status int, message string) {
	code := int64(codeInternal)
	switch status {
	case http.StatusRequestTimeout, http.StatusRequestEntityTooLarge:
		code = codeInvalidRequest
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		code = CodeTooManyRequests
	}
	writeRPCError(w, status, nil, &rpcError{code: code, msg: message})
}

// authenticate returns the caller's principal and, for an OAuth access
// token, its policy subject properties; or it answers 401 with a
// WWW-Authenticate challenge (RFC 6750) and returns false.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (string, map[string]any, bool) {
	if s.opts.NoAuth {
		return AnonymousPrincipal, nil, true
	}
	token := bearerToken(r)
	oauth := s.opts.OAuth
	if token == "" {
		if oauth != nil {
			s.oauthChallenge(w, oauth, nil)
			return "", nil, false
		}
		s.challenge(w, "", nil)
		return "", nil, false
	}
	var (
		principal string
		subject   map[string]any
		err       error
	)
	if oauth != nil && oauth.Claims(token) {
		principal, subject, err = oauth.Authenticate(r.Context(), token)
	} else {
		principal, err = s.opts.Authenticate(r.Context(), token)
	}
	switch {
	case errors.Is(err, ErrAuthUnavailable):
		s.log.WarnContext(r.Context(), "mcpserver: access token cannot be verified now", "err", err)
		w.Header().Set("Retry-After", "5")
		http.Error(w, "Service Unavailable: the authorization server's keys cannot be fetched; retry later", http.StatusServiceUnavailable)
		return "", nil, false
	case errors.Is(err, authn.ErrUnavailable):
		// The token store did not answer: no verdict on the token, so not
		// 401 (an agent told 401 may give up a good token).
		s.log.WarnContext(r.Context(), "mcpserver: bearer token cannot be checked now", "err", err)
		w.Header().Set("Retry-After", "1")
		http.Error(w, "Service Unavailable: the token cannot be checked now; retry later", http.StatusServiceUnavailable)
		return "", nil, false
	}
	if err != nil || principal == "" {
		s.log.InfoContext(r.Context(), "mcpserver: bearer token rejected", "err", err)
		if oauth != nil {
			s.oauthChallenge(w, oauth, err)
			return "", nil, false
		}
		s.challenge(w, "invalid_token", err)
		return "", nil, false
	}
	s.recent.put(token, principal)
	return principal, subject, true
}

// ErrAuthUnavailable is what OAuth.Authenticate returns when it cannot
// verify any token now (the issuer's keys were never fetched): 503, not 401.
var ErrAuthUnavailable = errors.New("mcpserver: token verification unavailable")

// OAuth makes /mcp an OAuth 2.1 resource server besides the static agent
// tokens (internal/oauth, through internal/app).
type OAuth interface {
	// Claims reports whether token is an access token of the configured
	// issuer; only those go to Authenticate, any other to the static table.
	Claims(token string) bool
	// Authenticate verifies an access token and returns its principal
	// and the subject properties policy sees for it
	// (input.subject.properties: its scopes and claims), which the call
	// carries to the re-evaluation after approval.
	Authenticate(ctx context.Context, token string) (principal string, subject map[string]any, err error)
	// Challenge is the 401/403 answer to a missing (err nil) or rejected
	// token: the status and the WWW-Authenticate value (RFC 6750, RFC 9728).
	Challenge(err error) (status int, header string)
}

func (s *Server) oauthChallenge(w http.ResponseWriter, oauth OAuth, err error) {
	status, header := oauth.Challenge(err)
	w.Header().Set("WWW-Authenticate", header)
	msg := "Unauthorized: a bearer token is required"
	switch {
	case status == http.StatusForbidden:
		msg = "Forbidden: the access token lacks a required scope"
	case errors.Is(err, authn.ErrDisabled):
		msg = "Unauthorized: " + disabledAgent
	case err != nil:
		msg = "Unauthorized: the bearer token is invalid"
	}
	http.Error(w, msg, status)
}

// disabledAgent is what the holder of a disabled agent's valid token is
// told (an OAuth principal's is told as much by the OAuth challenge). An
// unknown, wrong or revoked token learns only that it is invalid.
const disabledAgent = "this agent is disabled at Countersign"

// challenge answers 401 with a static-token challenge; errCode is "" for a
// missing token, else "invalid_token", and err why the token was refused.
func (s *Server) challenge(w http.ResponseWriter, errCode string, err error) {
	v := `Bearer realm="countersign"`
	if errCode != "" {
		v += `, error="` + errCode + `"`
	}
	msg := "Unauthorized: a bearer token is required"
	switch {
	case errCode == "invalid_token" && errors.Is(err, authn.ErrDisabled):
		v += `, error_description="` + disabledAgent + `"`
		msg = "Unauthorized: " + disabledAgent
	case errCode == "invalid_token":
		msg = "Unauthorized: the bearer token is invalid (unknown or revoked)"
	}
	w.Header().Set("WWW-Authenticate", v)
	http.Error(w, msg, http.StatusUnauthorized)
}

// envelope is the part of a JSON-RPC message the HTTP layer looks at.
type envelope struct {
	JSONRPC string
	ID      json.RawMessage
	Method  string
	Params  json.RawMessage
}

// The member names the HTTP layer reads: of every message, and of the
// params of the methods whose params it reads.
var (
	envelopeNames   = []string{"jsonrpc", "id", "method", "params"}
	toolCallNames   = []string{"_meta", "task", "name"}
	taskMethodNames = []string{"_meta", "taskId"}
)

// The HTTP layer must read a message exactly as the SDK does, or a request
// is budgeted and checked as one thing and run as another. The SDK decodes
// member names exactly, and of duplicate keys keeps the last (as it does
// for a key spelled with escapes); encoding/json into a struct matches
// names case-insensitively, so "Method":"tasks/result" after
// "method":"tools/call" was budgeted as tasks/result (a token, no in-flight
// slot) and run as tools/call, and a "TASKID" after params.taskId was
// compared with Mcp-Name in its place. So the layer decodes into maps,
// which keep keys as sent (the last duplicate winning, unescaped, as in the
// SDK), and takes exactly the member the SDK takes; and it refuses, with
// HTTP 400 and -32600, a message with a key that equals a name it reads
// under case folding without being that name. With no such key, a
// case-sensitive and a case-insensitive reader take the same member, so no
// decoder in the SDK or behind it can be shown another. No JSON-RPC or MCP
// member is spelled that way; no client sends one.

// decodeMembers decodes a JSON object into its members, keyed as sent, and
// checks that no key differs only in letter case from one of names. It
// returns an error for a value that is not an object (or null), and
// caseOK false for such a key.
func decodeMembers(b []byte, names []string) (m map[string]json.RawMessage, caseOK bool, err error) {
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, false, err
	}
	return m, exactKeys(m, names...), nil
}

// exactKeys reports whether every key of m that matches one of names
// case-insensitively is that name exactly.
func exactKeys(m map[string]json.RawMessage, names ...string) bool {
	for k := range m {
		for _, n := range names {
			if k != n && strings.EqualFold(k, n) {
				return false
			}
		}
	}
	return true
}

// caseVariant is the error for a message with a key that differs only in
// letter case from a name the HTTP layer reads (see decodeMembers).
func caseVariant(where string, names []string) *rpcError {
	return &rpcError{code: codeInvalidRequest, msg: fmt.Sprintf(
		"Invalid Request: a %s member name differs only in letter case from %s; member names are case-sensitive",
		where, strings.Join(names, ", "))}
}

// decodeEnvelope reads a JSON-RPC message's envelope as the SDK does. A
// member of the wrong type, or a key that differs only in case from an
// envelope name, is -32600; the envelope read so far comes with it.
func decodeEnvelope(b []byte) (envelope, *rpcError) {
	bad := &rpcError{code: codeInvalidRequest, msg: "Invalid Request"}
	m, caseOK, err := decodeMembers(b, envelopeNames)
	if err != nil || m == nil {
		return envelope{}, bad
	}
	msg := envelope{ID: m["id"], Params: m["params"]}
	if !caseOK {
		return msg, caseVariant("message", envelopeNames)
	}
	if json.Unmarshal(m["jsonrpc"], &msg.JSONRPC) != nil || msg.JSONRPC != "2.0" {
		return msg, bad
	}
	if v, ok := m["method"]; ok && json.Unmarshal(v, &msg.Method) != nil {
		return msg, bad
	}
	return msg, nil
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
	msg, rerr := decodeEnvelope(trimmed)
	if rerr != nil {
		return validID(msg.ID), rerr, http.StatusBadRequest
	}
	if msg.Method == "" {
		return nil, nil, 0 // a response to a server request; the SDK handles it
	}
	if echo, rerr := checkID(msg.Method, msg.ID); rerr != nil {
		return echo, rerr, http.StatusBadRequest
	}
	facts.method, facts.id = msg.Method, validID(msg.ID)
	if rerr := checkVersion(h); rerr != nil {
		return facts.id, rerr, http.StatusBadRequest
	}
	var names []string
	switch msg.Method {
	case "tools/call":
		names = toolCallNames
	case "tasks/get", "tasks/update", "tasks/cancel":
		names = taskMethodNames
	}
	var params map[string]json.RawMessage
	if names != nil && present(msg.Params) {
		var caseOK bool
		var err error
		if params, caseOK, err = decodeMembers(msg.Params, names); err == nil && !caseOK {
			return facts.id, caseVariant("params", names), http.StatusBadRequest
		}
	}
	if facts.id != nil {
		// A request, which the SDK would answer in its own words.
		era := headerEra(h)
		if notServed(msg.Method, era) {
			return facts.id, methodNotFound(msg.Method, era), unknownMethodStatus(h)
		}
		if rerr := checkParams(msg.Method, era, msg.Params); rerr != nil {
			return facts.id, rerr, invalidParamsStatus(h)
		}
	}
	if msg.Method == methodListen {
		if rerr := checkListen(msg.Params); rerr != nil {
			return facts.id, rerr, http.StatusBadRequest
		}
		return nil, nil, 0
	}
	if names == nil {
		return nil, nil, 0 // params the layer does not read
	}
	var meta map[string]json.RawMessage
	if present(params["_meta"]) && json.Unmarshal(params["_meta"], &meta) != nil {
		return nil, nil, 0 // _meta is not an object: the SDK answers -32602
	}
	switch msg.Method {
	case "tools/call":
		task := bytes.TrimSpace(params["task"])
		facts.legacyTask = len(task) > 0 && task[0] == '{'
		_ = json.Unmarshal(params["name"], &facts.tool) // a string, or this is a notification
		facts.wantsNotes = present(meta["progressToken"]) || present(meta[metaLogLevel])
	default: // tasks/get, tasks/update, tasks/cancel
		var metaVersion string
		_ = json.Unmarshal(meta["io.modelcontextprotocol/protocolVersion"], &metaVersion)
		if h.Get(headerProtocolVersion) < modernVersion && metaVersion < modernVersion {
			break // 2025-11-25 has no Mcp-Name rule
		}
		var taskID string
		if json.Unmarshal(params["taskId"], &taskID) != nil {
			break // no string taskId: the SDK answers
		}
		if name, ok := decodeHeaderValue(h.Get(headerName)); !ok || name != taskID {
			return validID(msg.ID), &rpcError{code: codeHeaderMismatch, msg: "Header mismatch: Mcp-Name must equal params.taskId"}, http.StatusBadRequest
		}
	}
	return nil, nil, 0
}

// checkListen refuses a 2026-07-28 subscriptions/listen that asks for task
// status notifications (params.notifications.taskIds) without declaring
// the tasks extension in its _meta client capabilities: SEP-2663 requires
// -32021 naming the extension. The SDK, which does not know taskIds,
// would acknowledge the rest and drop them silently. Members are read by
// their exact names, as the SDK reads them; params it cannot read are the
// SDK's to answer.
func checkListen(raw json.RawMessage) *rpcError {
	var params, notes, meta, caps, exts map[string]json.RawMessage
	var taskIDs []json.RawMessage
	var version string
	if json.Unmarshal(raw, &params) != nil || json.Unmarshal(params["notifications"], &notes) != nil ||
		json.Unmarshal(notes["taskIds"], &taskIDs) != nil || len(taskIDs) == 0 ||
		json.Unmarshal(params["_meta"], &meta) != nil ||
		json.Unmarshal(meta["io.modelcontextprotocol/protocolVersion"], &version) != nil || version < modernVersion {
		return nil
	}
	_ = json.Unmarshal(meta[metaClientCapabilities], &caps)
	_ = json.Unmarshal(caps["extensions"], &exts)
	if _, ok := exts[tasks.ExtTasks]; ok {
		return nil
	}
	return missingTasksCapability()
}

// metaLogLevel is the _meta key of a 2026-07-28 request's log level.
//
//lint:ignore SA1019 MCP logging (deprecated in 2026-07-28, SEP-2577) stays supported for 2025-11-25 clients and the conformance logging scenarios
const metaLogLevel = mcp.MetaKeyLogLevel

// present reports whether a JSON value is there and not null.
func present(v json.RawMessage) bool {
	v = bytes.TrimSpace(v)
	return len(v) > 0 && !bytes.Equal(v, []byte("null"))
}

// maxSafeID is the largest integer id every side reads exactly: the SDK
// decodes a numeric id as a float64 and answers with its int64 conversion,
// and JavaScript clients hold ids as doubles.
const maxSafeID = 1<<53 - 1

// checkID refuses an id that the SDK would answer with another id or in
// plain text. MCP ids are strings or integers, never null. The SDK decodes
// a numeric id as a float64 and answers with its int64 conversion, so a
// number beyond ±(2^53-1) or with a fraction was answered with the id
// rounded (2^53+1 as 2^53, 1.5 as 1, 10^22 as -2^63), after the request
// had run: the client could not match the answer to its request, and a
// tools/call it then retried ran twice. The refusal echoes such a number
// as sent. A null id, or one of another type, the SDK answered with a
// plain-text HTTP 400 that no JSON-RPC client reads as an error; it gets
// -32600 with id null, as JSON-RPC answers an id it cannot read. So does a
// notification (a notifications/ method) that carries an id, echoing it.
func checkID(method string, id json.RawMessage) (json.RawMessage, *rpcError) {
	id = bytes.TrimSpace(id)
	if len(id) == 0 {
		return nil, nil
	}
	switch id[0] {
	case '"':
	case 'n':
		return nil, &rpcError{code: codeInvalidRequest, msg: "Invalid Request: id must not be null; use a string or an integer"}
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		var f float64
		if json.Unmarshal(id, &f) != nil || f != math.Trunc(f) || math.Abs(f) > maxSafeID {
			return id, &rpcError{code: codeInvalidRequest, msg: "Invalid Request: a numeric id must be an integer from -(2^53-1) to 2^53-1; use a string for larger ids"}
		}
	default:
		return nil, &rpcError{code: codeInvalidRequest, msg: "Invalid Request: id must be a string or an integer"}
	}
	if strings.HasPrefix(method, "notifications/") {
		return id, &rpcError{code: codeInvalidRequest, msg: "Invalid Request: " + method + " is a notification and must not carry an id"}
	}
	return nil, nil
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
	b := rpcErrorBody(id, e)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// rpcErrorBody encodes a JSON-RPC error response; a nil id is null.
func rpcErrorBody(id json.RawMessage, e *rpcError) []byte {
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
	return b
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
