package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/countersign/countersign/internal/authn"
)

// Notification streams: how clients learn that the tool list changed.
//
// 2026-07-28: subscriptions/listen (SEP-2575) is the SDK's; this package
// lets it through the HTTP wrapper (admission below, keep-alives, shutdown).
// 2025-11-25: the endpoint is stateless, so the SDK answers GET with 405;
// serveGET serves the standalone SSE stream itself, carrying only
// notifications/tools/list_changed.

const (
	methodListen = "subscriptions/listen"
	// listChangedEvent is the 2025-11-25 GET stream's one event.
	listChangedEvent  = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n\n"
	keepAliveComment  = ": keep-alive\n\n"
	msgTooManyStreams = "Too many open notification streams: this caller already holds its maximum of subscriptions/listen and GET streams; close one first"
	msgShuttingDown   = "The server is shutting down; reconnect to another replica or retry shortly"
)

// streams counts each principal's open notification streams and ends them
// all at shutdown, or one principal's on EndStreams.
type streams struct {
	mu   sync.Mutex
	open map[string]int
	// live counts the streams whose first bytes went out (tests wait on it:
	// a listen stream's first event is its acknowledgement, sent once the
	// subscription is registered).
	live    map[string]int
	closing context.Context
	close   context.CancelFunc
	// enders end each principal's streams on EndStreams.
	enders map[string]map[*context.CancelFunc]struct{}
}

func (st *streams) init() {
	st.open = map[string]int{}
	st.live = map[string]int{}
	st.enders = map[string]map[*context.CancelFunc]struct{}{}
	st.closing, st.close = context.WithCancel(context.Background())
}

// watch returns the context of one stream of principal: ended with parent,
// at shutdown, or by EndStreams(principal). Call done when the stream ends.
func (st *streams) watch(parent context.Context, principal string) (ctx context.Context, done func()) {
	ctx, cancel := context.WithCancel(parent)
	stop := context.AfterFunc(st.closing, cancel)
	key := &cancel
	st.mu.Lock()
	if st.enders[principal] == nil {
		st.enders[principal] = map[*context.CancelFunc]struct{}{}
	}
	st.enders[principal][key] = struct{}{}
	st.mu.Unlock()
	return ctx, func() {
		stop()
		cancel()
		st.mu.Lock()
		defer st.mu.Unlock()
		if delete(st.enders[principal], key); len(st.enders[principal]) == 0 {
			delete(st.enders, principal)
		}
	}
}

// stillAuthorized checks a stream's static bearer token again once the
// stream is registered for EndStreams, and answers 401 if it has been
// disabled or revoked since the request was authenticated. An OAuth access
// token (not ended by EndStreams: it expires) and a token store that does
// not answer now pass: a later revocation still ends the stream.
func (s *Server) stillAuthorized(ctx context.Context, w http.ResponseWriter, r *http.Request) bool {
	if s.opts.NoAuth {
		return true
	}
	token := bearerToken(r)
	if oauth := s.opts.OAuth; oauth != nil && oauth.Claims(token) {
		return true
	}
	principal, err := s.opts.Authenticate(ctx, token)
	if errors.Is(err, authn.ErrUnavailable) || (err == nil && principal != "") {
		return true
	}
	s.log.InfoContext(ctx, "mcpserver: bearer token revoked as its stream opened", "err", err)
	s.challenge(w, "invalid_token", err)
	return false
}

// EndStreams ends principal's open notification streams, on this replica:
// call it when the principal's token is disabled or revoked (every request
// authenticates anew, but a stream authenticated once, when it opened).
func (s *Server) EndStreams(principal string) {
	s.streams.mu.Lock()
	defer s.streams.mu.Unlock()
	for cancel := range s.streams.enders[principal] {
		(*cancel)()
	}
}

// acquire takes one of principal's max stream slots. It fails with the HTTP
// status and message to answer: 429 over the cap, 503 once closing.
func (st *streams) acquire(principal string, max int) (release func(), status int, msg string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closing.Err() != nil {
		return nil, http.StatusServiceUnavailable, msgShuttingDown
	}
	if st.open[principal] >= max {
		return nil, http.StatusTooManyRequests, msgTooManyStreams
	}
	st.open[principal]++
	var once sync.Once
	return func() {
		once.Do(func() {
			st.mu.Lock()
			defer st.mu.Unlock()
			if st.open[principal]--; st.open[principal] <= 0 {
				delete(st.open, principal)
			}
		})
	}, 0, ""
}

// started records that a stream of principal went live, and returns the
// function that records its end.
func (st *streams) started(principal string) (ended func()) {
	st.mu.Lock()
	st.live[principal]++
	st.mu.Unlock()
	return func() {
		st.mu.Lock()
		defer st.mu.Unlock()
		if st.live[principal]--; st.live[principal] <= 0 {
			delete(st.live, principal)
		}
	}
}

func (st *streams) liveCount(principal string) int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.live[principal]
}

func (st *streams) openCount(principal string) int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.open[principal]
}

// CloseStreams ends every open notification stream (2026-07-28
// subscriptions/listen, 2025-11-25 GET) and refuses new ones with HTTP 503.
// Call it when the HTTP server starts shutting down
// (http.Server.RegisterOnShutdown): Shutdown waits for handlers to return,
// and these would not on their own. Idempotent.
func (s *Server) CloseStreams() { s.streams.close() }

// EndWaits ends every wait for a task's decision, those in progress and
// those to come: a gated call held by Options.InlineWait and
// countersign_await answer with how the task stands (as when their time is
// up), and a 2025-11-25 tasks/result, which would wait until the task
// ends, answers -32603 "The server is shutting down; …", to be sent again.
// The tasks go on. Call it when the HTTP server starts shutting down, as
// CloseStreams: Shutdown waits for handlers, and a wait could outlast its
// deadline, cutting the connection without an answer. Idempotent.
func (s *Server) EndWaits() { s.endWaits() }

// admitStream admits a notification stream of principal: it spends a
// request token (no in-flight slot: the stream is long-lived by design,
// like 2025-11-25 tasks/result) and takes one of the principal's stream
// slots. Refused, it answers and returns false.
func (s *Server) admitStream(w http.ResponseWriter, r *http.Request, principal, method string, id []byte) (release func(), ok bool) {
	if retry, ok := s.budget.Spend(principal, s.now()); !ok {
		s.refuse(w, r, principal, method, id, retry)
		return nil, false
	}
	release, status, msg := s.streams.acquire(principal, s.opts.MaxStreamsPerPrincipal)
	if release == nil {
		// Not paused like a budget refusal: each try spent a token, so a
		// client that loops runs into the paused refusal soon enough.
		s.log.InfoContext(r.Context(), "mcpserver: notification stream refused", "principal", principal, "method", method, "status", status)
		w.Header().Set("Retry-After", "1")
		writeRPCError(w, status, id, &rpcError{code: CodeTooManyRequests, msg: msg})
		return nil, false
	}
	return release, true
}

// serveListen passes a 2026-07-28 subscriptions/listen to the SDK, which
// holds the response open as an SSE stream (it forces SSE for listen even
// in JSONResponse mode) until the client cancels: here it gets its stream
// slot, keep-alives, X-Accel-Buffering: no, and an end at shutdown.
func (s *Server) serveListen(w http.ResponseWriter, r *http.Request, sdk http.Handler, principal string) {
	ctx, ended := s.streams.watch(r.Context(), principal)
	defer ended()
	if !s.stillAuthorized(ctx, w, r) { // see serveGET
		return
	}
	w.Header().Set("X-Accel-Buffering", "no")
	sw := &sseWriter{ResponseWriter: w}
	sw.onStart = func() { sw.onEnd = s.streams.started(principal) }
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(s.opts.KeepAlive)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				sw.keepAlive()
			}
		}
	})
	sdk.ServeHTTP(sw, r.WithContext(ctx))
	close(done)
	wg.Wait()
	sw.end()
}

// sseWriter serializes the SDK's writes with the keep-alive comments. The
// SDK writes each SSE event in one Write, so a comment never splits one.
type sseWriter struct {
	http.ResponseWriter
	mu      sync.Mutex
	started bool // the response's header went out
	sse     bool // and it is text/event-stream
	onStart func()
	onEnd   func()
}

func (w *sseWriter) startLocked() {
	if w.started {
		return
	}
	w.started = true
	w.sse = strings.HasPrefix(w.Header().Get("Content-Type"), "text/event-stream")
	if w.sse && w.onStart != nil {
		w.onStart()
	}
}

func (w *sseWriter) WriteHeader(code int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.startLocked()
	w.ResponseWriter.WriteHeader(code)
}

func (w *sseWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.startLocked()
	return w.ResponseWriter.Write(b)
}

func (w *sseWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *sseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// keepAlive writes an SSE comment, once the SDK has started an SSE
// response (never before: it may still answer an error as JSON).
func (w *sseWriter) keepAlive() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.sse {
		return
	}
	if _, err := w.ResponseWriter.Write([]byte(keepAliveComment)); err == nil {
		_ = http.NewResponseController(w.ResponseWriter).Flush()
	}
}

func (w *sseWriter) end() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.onEnd != nil {
		w.onEnd()
	}
}

// serveGET serves a 2025-11-25 client's GET: the standalone SSE stream,
// which delivers notifications/tools/list_changed whenever the served tool
// list changes, and a keep-alive comment when quiet, until the client
// leaves or the server shuts down. Events have no IDs: nothing is replayed
// (Last-Event-ID is ignored), a client that reconnects lists the tools
// again. 2026-07-28 has no GET stream (405, as that revision says); a GET
// that does not accept text/event-stream is 406.
func (s *Server) serveGET(w http.ResponseWriter, r *http.Request, principal string) {
	if r.Header.Get(headerProtocolVersion) >= modernVersion {
		w.Header().Set("Allow", "POST")
		http.Error(w, "Method Not Allowed: protocol version "+modernVersion+" has no GET stream; use subscriptions/listen", http.StatusMethodNotAllowed)
		return
	}
	if !acceptsEventStream(r.Header.Values("Accept")) {
		http.Error(w, "Not Acceptable: a GET opens an SSE stream; Accept must include text/event-stream", http.StatusNotAcceptable)
		return
	}
	release, ok := s.admitStream(w, r, principal, "GET", nil)
	if !ok {
		return
	}
	defer release()
	// The stream is registered for EndStreams before its 200 goes out, and
	// the token checked once more after that: a revocation that landed
	// since the request was authenticated would otherwise end nothing,
	// and the stream would outlive it.
	ctx, done := s.streams.watch(r.Context(), principal)
	defer done()
	if !s.stillAuthorized(ctx, w, r) {
		return
	}
	changed := s.toolsChangedChan()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache, no-transform")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return
	}
	defer s.streams.started(principal)()
	keep := time.NewTicker(s.opts.KeepAlive)
	defer keep.Stop()
	for {
		var msg string
		select {
		case <-ctx.Done(): // the client left, shutdown, or EndStreams
			return
		case <-changed:
			changed = s.toolsChangedChan()
			msg = listChangedEvent
		case <-keep.C:
			msg = keepAliveComment
		}
		if _, err := fmt.Fprint(w, msg); err != nil {
			return
		}
		if rc.Flush() != nil {
			return
		}
	}
}

// acceptsEventStream reports whether an Accept header admits
// text/event-stream.
func acceptsEventStream(values []string) bool {
	for _, v := range values {
		for part := range strings.SplitSeq(v, ",") {
			mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
			if err != nil {
				continue
			}
			switch mt {
			case "text/event-stream", "text/*", "*/*":
				return true
			}
		}
	}
	return false
}
