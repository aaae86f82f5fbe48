// Package httplimit bounds what slow or idle clients can hold on an HTTP
// server: request bodies get a read deadline, bodies still arriving after a
// short grace need one of a fixed number of slots, and the listener caps
// open connections.
//
// # Invariants
//
//   - A request body is read within Options.BodyTimeout of the handler's
//     start, or the read fails and the guard answers 408.
//   - A body still arriving after Options.SlowAfter holds one of
//     Options.MaxSlowBodies slots until it ends. With every slot taken, its
//     read is cut at once and the guard answers 503 with Retry-After: no
//     queueing. A client that sends its body promptly never needs a slot,
//     so slow readers cannot lock out the others.
//   - The guard's answer replaces whatever the handler writes after the
//     failed read (if the handler wrote nothing yet, which is the case for
//     every handler that reads its body before answering). Its shape is
//     Options.Reject's.
//   - Only read deadlines are set, never write deadlines: responses
//     (Streamable HTTP SSE streams, long polls) may last as long as they
//     need. Once a body has been read to its end, net/http clears the read
//     deadline itself before it starts watching for the client hanging up.
package httplimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxConns is the connection cap of the servers this repository
// runs when none is configured (golang.org/x/net/netutil.LimitListener: at
// the cap, Accept waits and new clients wait in the kernel's backlog).
const DefaultMaxConns = 4096

// Defaults for the zero values of [Options].
const (
	DefaultBodyTimeout   = 10 * time.Second
	DefaultSlowAfter     = time.Second
	DefaultMaxSlowBodies = 128
)

// Error codes of the default Reject's {"error", "message"} bodies (the
// approver API's shape).
const (
	CodeRequestTimeout = "request_timeout"
	CodeServerBusy     = "server_busy"
)

// Options configures [NewBodies]. Zero values take the defaults.
type Options struct {
	// BodyTimeout is how long a request body may take to arrive, counted
	// from the handler's start (default 10s).
	BodyTimeout time.Duration
	// SlowAfter is when a body still arriving becomes a slow reader that
	// needs a slot (default 1s).
	SlowAfter time.Duration
	// MaxSlowBodies is how many slow readers may be read at once across the
	// server (default 128).
	MaxSlowBodies int
	// Reject writes the guard's error response: status 408 or 503 and a
	// client-safe message. Nil writes the approver API's JSON error body
	// ({"error": "request_timeout"|"server_busy", "message": …}).
	Reject func(w http.ResponseWriter, r *http.Request, status int, message string)
}

// Bodies guards request bodies (see the package documentation). One Bodies
// is shared by every handler of a server: the slots are server-wide.
type Bodies struct {
	timeout   time.Duration
	slowAfter time.Duration
	slots     chan struct{}
	reject    func(w http.ResponseWriter, r *http.Request, status int, message string)

	reading atomic.Int64 // bodies being read now
	shed    atomic.Int64 // bodies cut for want of a slot, ever
}

// NewBodies validates opts and returns the guard.
func NewBodies(opts Options) (*Bodies, error) {
	if opts.BodyTimeout < 0 || opts.SlowAfter < 0 || opts.MaxSlowBodies < 0 {
		return nil, errors.New("httplimit: limits must not be negative")
	}
	if opts.BodyTimeout == 0 {
		opts.BodyTimeout = DefaultBodyTimeout
	}
	if opts.SlowAfter == 0 {
		opts.SlowAfter = DefaultSlowAfter
	}
	if opts.MaxSlowBodies == 0 {
		opts.MaxSlowBodies = DefaultMaxSlowBodies
	}
	if opts.SlowAfter > opts.BodyTimeout {
		opts.SlowAfter = opts.BodyTimeout
	}
	if opts.Reject == nil {
		opts.Reject = WriteJSONError
	}
	return &Bodies{
		timeout:   opts.BodyTimeout,
		slowAfter: opts.SlowAfter,
		slots:     make(chan struct{}, opts.MaxSlowBodies),
		reject:    opts.Reject,
	}, nil
}

// Reading is the number of request bodies being read now.
func (g *Bodies) Reading() int { return int(g.reading.Load()) }

// SlowReaders is the number of slots taken now.
func (g *Bodies) SlowReaders() int { return len(g.slots) }

// Shed is the number of bodies cut so far because every slot was taken.
func (g *Bodies) Shed() int { return int(g.shed.Load()) }

// Handler guards the bodies of requests to next.
func (g *Bodies) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(g.timeout)); err != nil {
			// Not a server connection (a recorder, a bridge): nothing
			// to hold open, nothing to guard.
			next.ServeHTTP(w, r)
			return
		}
		st := &bodyState{g: g, rc: rc}
		g.reading.Add(1)
		st.timer = time.AfterFunc(g.slowAfter, st.slow)
		defer st.handlerDone()

		gw := &guardWriter{ResponseWriter: w, st: st, r: r}
		r2 := r.WithContext(r.Context())
		r2.Body = &guardedBody{ReadCloser: r.Body, st: st}
		next.ServeHTTP(gw, r2)
		gw.rejectIfFailed()
	})
}

// BodyError is the read error of a body the guard cut: Status 408 (too
// slow) or 503 (no slot). It wraps the connection's timeout error, so
// errors.Is(err, os.ErrDeadlineExceeded) holds.
type BodyError struct {
	Status int
	Err    error
}

func (e *BodyError) Error() string {
	if e.Status == http.StatusServiceUnavailable {
		return "httplimit: request body cut: too many slow request bodies: " + e.Err.Error()
	}
	return "httplimit: request body not received in time: " + e.Err.Error()
}

func (e *BodyError) Unwrap() error { return e.Err }

// Timeout reports true, as the wrapped net.Error does.
func (e *BodyError) Timeout() bool { return true }

// bodyState is one guarded request. mu orders the slot timer against the
// end of the body and of the handler: once ended, the timer must not touch
// the connection's deadline, which then belongs to the next request.
type bodyState struct {
	g     *Bodies
	rc    *http.ResponseController
	timer *time.Timer

	mu       sync.Mutex
	ended    bool // body finished or handler returned
	eof      bool // the body was read to its end
	hasSlot  bool
	shedding bool // cut for want of a slot
	failed   int  // 408 or 503 once the body failed the guard
}

// slow runs SlowAfter into the request: take a slot or cut the read.
func (st *bodyState) slow() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended {
		return
	}
	select {
	case st.g.slots <- struct{}{}:
		st.hasSlot = true
	default:
		st.shedding = true
		st.g.shed.Add(1)
		_ = st.rc.SetReadDeadline(time.Now()) // the pending read fails now
	}
}

// readFailed records why a body read failed, and returns the error to hand
// the handler.
func (st *bodyState) readFailed(err error) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	var ne interface{ Timeout() bool }
	if st.failed == 0 && errors.As(err, &ne) && ne.Timeout() {
		st.failed = http.StatusRequestTimeout
		if st.shedding {
			st.failed = http.StatusServiceUnavailable
		}
	}
	st.endLocked()
	if st.failed != 0 {
		return &BodyError{Status: st.failed, Err: err}
	}
	return err
}

func (st *bodyState) end(eof bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.eof = st.eof || eof
	st.endLocked()
}

// handlerDone ends the guard when the handler returns. A body left unread
// is cut: net/http would otherwise read the rest of it (up to 256 KiB)
// before closing, holding the connection until the body deadline.
func (st *bodyState) handlerDone() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.endLocked()
	if !st.eof && st.failed == 0 {
		_ = st.rc.SetReadDeadline(time.Now())
	}
}

func (st *bodyState) endLocked() {
	if st.ended {
		return
	}
	st.ended = true
	st.timer.Stop()
	st.g.reading.Add(-1)
	if st.hasSlot {
		<-st.g.slots
		st.hasSlot = false
	}
}

func (st *bodyState) status() (failed int, ended bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.failed, st.ended
}

// guardedBody ends the guard at the body's end or first error.
type guardedBody struct {
	io.ReadCloser
	st *bodyState
}

func (b *guardedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF:
		b.st.end(true)
	case err != nil:
		err = b.st.readFailed(err)
	}
	return n, err
}

func (b *guardedBody) Close() error {
	b.st.end(false)
	return b.ReadCloser.Close()
}

// guardWriter replaces the handler's response with the guard's once the
// body failed, and asks for the connection to close when the handler
// answers before the body ended (so net/http does not wait for the rest).
type guardWriter struct {
	http.ResponseWriter
	st       *bodyState
	r        *http.Request
	wrote    bool // the handler's header went out
	rejected bool // the guard's response went out
}

// intercept reports whether the handler's output must be dropped, writing
// the guard's response first if it is due.
func (w *guardWriter) intercept() bool {
	if w.rejected {
		return true
	}
	if w.wrote {
		return false
	}
	failed, ended := w.st.status()
	if failed != 0 {
		w.reject(failed)
		return true
	}
	if !ended {
		w.Header().Set("Connection", "close")
	}
	w.wrote = true
	return false
}

func (w *guardWriter) reject(status int) {
	w.rejected = true
	h := w.Header()
	h.Set("Connection", "close")
	msg := fmt.Sprintf("the request body was not received within %s", w.st.g.timeout)
	if status == http.StatusServiceUnavailable {
		h.Set("Retry-After", strconv.Itoa(max(1, int(w.st.g.slowAfter/time.Second))))
		msg = "the server is reading too many slow request bodies; send the body promptly or retry shortly"
	}
	w.st.g.reject(w.ResponseWriter, w.r, status, msg)
}

// rejectIfFailed answers for a handler that wrote nothing after a failed
// body.
func (w *guardWriter) rejectIfFailed() {
	if w.wrote || w.rejected {
		return
	}
	if failed, _ := w.st.status(); failed != 0 {
		w.reject(failed)
	}
}

func (w *guardWriter) WriteHeader(code int) {
	if w.intercept() {
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *guardWriter) Write(b []byte) (int, error) {
	if w.intercept() {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

func (w *guardWriter) Flush() {
	if w.intercept() {
		return
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (w *guardWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// WriteJSONError writes the approver API's error shape: {"error": code,
// "message": message}, with code request_timeout for 408, server_busy for
// 503 and 429, and invalid_request otherwise.
func WriteJSONError(w http.ResponseWriter, _ *http.Request, status int, message string) {
	code := "invalid_request"
	switch status {
	case http.StatusRequestTimeout:
		code = CodeRequestTimeout
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
		code = CodeServerBusy
	}
	b, _ := json.Marshal(struct {
		Error   string `json:"error"`
		Message string `json:"message"`
	}{code, message})
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
