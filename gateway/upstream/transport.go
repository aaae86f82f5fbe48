package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/trace"

	"github.com/countersign/countersign/internal/telemetry"
)

// maxMessageBytes bounds one message from an upstream: a line of a stdio
// upstream's stdout, an event of an SSE stream, and an HTTP response body
// that is not a stream. The SDK bounds the first two by itself, to this
// same size (mcp.DefaultMaxLineLength, mcp.DefaultMaxEventSize), but reads
// a JSON response body whole: without this bound, an upstream answering
// with an endless body would make Countersign hold it all in memory.
const maxMessageBytes = 16 << 20

// roundTripper adds the configured headers to every request, caps the
// response bodies that are not SSE streams at maxMessageBytes, and records,
// for calls carrying a tracker, what became of their POSTs.
type roundTripper struct {
	upstream string // its name, for errors
	base     http.RoundTripper
	headers  map[string]string
	// tel, with tracing on, adds the call's trace context (traceparent).
	tel *telemetry.Telemetry
}

func (rt *roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	traced := rt.tel.TracingOn() && trace.SpanContextFromContext(req.Context()).IsValid()
	if len(rt.headers) > 0 || traced {
		req = req.Clone(req.Context())
		rt.tel.InjectHTTP(req.Context(), req.Header)
		for k, v := range rt.headers {
			if http.CanonicalHeaderKey(k) == "Host" {
				req.Host = v
			} else if req.Header.Get(k) == "" {
				req.Header.Set(k, v)
			}
		}
	}
	resp, err := rt.base.RoundTrip(req)
	if tr, ok := req.Context().Value(trackerKey{}).(*tracker); ok && req.Method == http.MethodPost {
		tr.record(resp, err)
	}
	if err == nil && !isEventStream(resp.Header.Get("Content-Type")) {
		resp.Body = &cappedBody{ReadCloser: resp.Body, left: maxMessageBytes, upstream: rt.upstream}
	}
	return resp, err
}

// isEventStream reports whether a Content-Type is text/event-stream. The
// SDK reads such a body event by event, each bounded; any other body it
// reads whole.
func isEventStream(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == "text/event-stream"
}

// cappedBody is a response body that fails once more than left bytes
// have been read from it. The SDK reading it whole then fails the session,
// and a call waiting for the answer fails with an unknown outcome.
type cappedBody struct {
	io.ReadCloser
	left     int64
	upstream string
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more tells a body of exactly the cap from a longer one.
		var one [1]byte
		if n, err := b.ReadCloser.Read(one[:]); n == 0 {
			return 0, err
		}
		return 0, fmt.Errorf("upstream %s: a response body is larger than %d bytes; Countersign does not read it", b.upstream, maxMessageBytes)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}

// writeRecorder records, for calls carrying a tracker, that their request
// was handed to the connection: from then on it may have reached the child.
// The SDK writes a call's request with the call's context, so the tracker
// sees it. (The client side of the SDK asserts no optional interface on a
// stdio connection that the wrapper would hide.)
type writeRecorder struct {
	mcp.Connection
}

func (c writeRecorder) Write(ctx context.Context, msg jsonrpc.Message) error {
	if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() {
		if tr, ok := ctx.Value(trackerKey{}).(*tracker); ok {
			tr.wrote()
		}
	}
	return c.Connection.Write(ctx, msg)
}

// refuseRedirect is the upstream client's CheckRedirect: it follows no
// redirect, since the roundTripper would give the configured headers
// (credentials) to any host and a tools/call would be sent to a server that
// is not the configured upstream. The request fails with an error naming
// the upstream and the redirect's target. The redirect answered a POST, so
// the tracker counts it as delivered, as any answer but 404: the upstream
// may have processed it (a 303 says so).
func refuseRedirect(upstream string) func(*http.Request, []*http.Request) error {
	return func(next *http.Request, _ []*http.Request) error {
		status := "a redirect"
		if next.Response != nil {
			status = next.Response.Status
		}
		return fmt.Errorf("upstream %s answered %s to %s; Countersign does not follow redirects: configure the URL it points to",
			upstream, status, next.URL.Redacted())
	}
}

type trackerKey struct{}

// tracker records whether a call's request may have reached the upstream:
// over HTTP, what became of its POSTs (see roundTripper); over stdio,
// whether it was written (see writeRecorder).
type tracker struct {
	mu         sync.Mutex
	delivered  bool // the request may have reached the server's MCP handling
	notFound   bool // a POST was answered 404: the session is gone
	dialFailed bool // a POST failed to connect: it never left
}

// wrote records that the request was written to a child's stdin, or that
// writing it began.
func (tr *tracker) wrote() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.delivered = true
}

func withTracker(ctx context.Context, tr *tracker) context.Context {
	return context.WithValue(ctx, trackerKey{}, tr)
}

func (tr *tracker) record(resp *http.Response, err error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	switch {
	case err != nil:
		// Only a failed dial certainly sent nothing.
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			tr.dialFailed = true
		} else {
			tr.delivered = true
		}
	case resp.StatusCode == http.StatusNotFound:
		// §2.5.3: a server answers 404 to a request with a session ID it
		// does not know, without processing it.
		tr.notFound = true
	default:
		tr.delivered = true
	}
}

func (tr *tracker) result() (delivered, notFound, dialFailed bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.delivered, tr.notFound, tr.dialFailed
}
