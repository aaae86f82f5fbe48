package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/tasks"
)

// fuzzPeer is an HTTP upstream whose answer to tools/call is whatever the
// fuzzer gives: initialize and tools/list are the go-sdk server's, so the
// client gets that far; every tools/call is answered with next, with the
// request's own id put in place of @ID@.
type fuzzPeer struct {
	ts        *httptest.Server
	mu        sync.Mutex
	next      []byte
	sse       bool
	delivered atomic.Int32 // tools/call requests that reached the peer
}

func newFuzzPeer(t testing.TB) *fuzzPeer {
	srv := mcp.NewServer(&mcp.Implementation{Name: "fuzz", Version: "1"}, nil)
	srv.AddTool(&mcp.Tool{Name: "t", InputSchema: objectSchema}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: text("not fuzzed")}, nil
	})
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	p := &fuzzPeer{}
	p.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if r.Method != http.MethodPost || json.Unmarshal(body, &req) != nil || req.Method != "tools/call" {
			r.Body = io.NopCloser(bytes.NewReader(body))
			sdk.ServeHTTP(w, r)
			return
		}
		p.delivered.Add(1)
		p.mu.Lock()
		out, sse := bytes.ReplaceAll(p.next, []byte("@ID@"), req.ID), p.sse
		p.mu.Unlock()
		if sse {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("event: message\ndata: "))
			_, _ = w.Write(out)
			_, _ = w.Write([]byte("\n\n"))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out)
	}))
	t.Cleanup(func() {
		p.ts.CloseClientConnections()
		p.ts.Close()
	})
	return p
}

// FuzzUpstreamResult answers a real tools/call of the upstream client (the
// go-sdk client over Streamable HTTP, as in production) with arbitrary
// bytes. Whatever comes back:
//
//   - nothing panics and the call returns within its timeout;
//   - a call that reached the upstream is never reported as not sent
//     (ErrNotSent lets the workflow fail the task cleanly as if nothing
//     ran; saying so of a delivered call would be a lie about a side
//     effect);
//   - a result is storable as the task's result: every content item and
//     the structured content are valid JSON, the whole encodes, and it is
//     (content, structured content and _meta) within the size cap or
//     replaced by an error saying it was not.
func FuzzUpstreamResult(f *testing.F) {
	const maxResult = 4 << 10
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":@ID@,"result":{"content":[{"type":"text","text":"ok"}]}}`,
		`{"jsonrpc":"2.0","id":@ID@,"result":{"content":[{"type":"text","text":"ok"}],"structuredContent":{"n":1},"isError":true,"_meta":{"k":"v"}}}`,
		`{"jsonrpc":"2.0","id":@ID@,"result":{"content":[{"type":"image","data":"AAAA","mimeType":"image/png"},{"type":"resource_link","uri":"file:///x","name":"x"}]}}`,
		`{"jsonrpc":"2.0","id":@ID@,"result":{"content":[{"type":"resource","resource":{"uri":"file:///x","text":"t"}}]}}`,
		`{"jsonrpc":"2.0","id":@ID@,"result":{"content":[{"type":"audio","data":"AAAA","mimeType":"audio/wav"}]}}`,
		`{"jsonrpc":"2.0","id":@ID@,"result":{"content":[{"type":"nope"}]}}`,
		`{"jsonrpc":"2.0","id":@ID@,"result":{"content":null}}`,
		`{"jsonrpc":"2.0","id":@ID@,"result":{}}`,
		`{"jsonrpc":"2.0","id":@ID@,"result":null}`,
		`{"jsonrpc":"2.0","id":@ID@,"result":{"content":[{"type":"text","text":"` + strings.Repeat("x", maxResult) + `"}]}}`,
		`{"jsonrpc":"2.0","id":@ID@,"result":{"content":[],"_meta":{"k":"` + strings.Repeat("x", maxResult) + `"}}}`,
		`{"jsonrpc":"2.0","id":@ID@,"error":{"code":-32050,"message":"boom"}}`,
		`{"jsonrpc":"2.0","id":@ID@,"error":{"code":-32602,"message":"bad","data":{"x":[1]}}}`,
		// The codes of the go-sdk's own closing errors, which its client
		// reports as mcp.ErrConnectionClosed.
		`{"jsonrpc":"2.0","id":@ID@,"error":{"code":-32003,"message":"client is closing"}}`,
		`{"jsonrpc":"2.0","id":@ID@,"error":{"code":-32004,"message":"server is closing"}}`,
		`{"jsonrpc":"2.0","id":@ID@,"error":{"code":-32005,"message":"rejected by transport"}}`,
		`{"jsonrpc":"2.0","id":@ID@,"result":{"inputRequests":{"a":{"method":"elicitation/create","params":{}}}}}`,
		`{"jsonrpc":"2.0","id":@ID@}`,
		`{"jsonrpc":"2.0","id":"@ID@","result":{"content":[]}}`,
		`{"jsonrpc":"1.0","id":@ID@,"result":{"content":[]}}`,
		`[{"jsonrpc":"2.0","id":@ID@,"result":{"content":[]}}]`,
		`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}`,
		`not json`,
		``,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	// Many answers break the session (the SDK fails the connection on a
	// message it cannot decode). Reconnect at once, so that the next call
	// finds a session in time and reaches the peer instead of giving up as
	// not sent.
	oldMin, oldMax := backoffMin, backoffMax
	backoffMin, backoffMax = time.Millisecond, 10*time.Millisecond
	f.Cleanup(func() { backoffMin, backoffMax = oldMin, oldMax })
	peer := newFuzzPeer(f)
	// Every reconnection reports the tools again; OnChange must not block,
	// so the lists after the first with the tool are dropped.
	ch := make(changes, 1)
	u := Start(context.Background(), Options{
		Name: "fz", URL: peer.ts.URL, Timeout: 300 * time.Millisecond, MaxResultBytes: maxResult,
		Logger: (&logBuf{}).logger(), OnChange: func(tools []Tool) {
			select {
			case ch <- tools:
			default:
			}
		},
	})
	f.Cleanup(func() { u.Close() })
	var tool Tool
	for tool.Run == nil {
		select {
		case tools := <-ch:
			tool = find(tools, "fz__t")
		case <-time.After(20 * time.Second):
			f.Fatal("the upstream never listed its tool")
		}
	}

	f.Fuzz(func(t *testing.T, answer []byte, sse bool) {
		peer.mu.Lock()
		peer.next, peer.sse = answer, sse
		peer.mu.Unlock()
		before := peer.delivered.Load()
		// A call that outlives its timeout by far is a hang: crash with
		// every goroutine's stack, so the input is kept as a failure.
		hung := time.AfterFunc(8*time.Second, func() {
			buf := make([]byte, 1<<20)
			panic("hung call:\n" + string(buf[:runtime.Stack(buf, true)]))
		})
		res, err := tool.Run(context.Background(), gateway.Call{IdempotencyKey: "k", Arguments: json.RawMessage(`{}`)})
		hung.Stop()
		if peer.delivered.Load() > before && errors.Is(err, ErrNotSent) {
			t.Fatalf("a delivered call was reported as not sent: %v", err)
		}
		var pe *gateway.ProtocolError
		if errors.As(err, &pe) {
			t.Fatalf("a protocol error for valid arguments: %v", err)
		}
		if err != nil {
			return
		}
		checkStorable(t, res, maxResult)
	})
}

// checkStorable fails unless r can be stored and shown as a task's result.
func checkStorable(t *testing.T, r tasks.CallToolResult, maxResult int) {
	t.Helper()
	size := 0
	for i, c := range r.Content {
		if !json.Valid(c) {
			t.Fatalf("content %d is not JSON: %q", i, c)
		}
		size += len(c)
	}
	if r.StructuredContent != nil {
		if !json.Valid(r.StructuredContent) {
			t.Fatalf("structured content is not JSON: %q", r.StructuredContent)
		}
		size += len(r.StructuredContent)
	}
	if r.Meta != nil {
		m, err := json.Marshal(r.Meta)
		if err != nil {
			t.Fatalf("_meta does not encode: %v", err)
		}
		size += len(m)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatalf("the result does not encode: %v", err)
	}
	var back tasks.CallToolResult
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("the encoded result does not decode: %v: %s", err, b)
	}
	if size > maxResult && !(r.IsError && len(r.Content) == 1 && bytes.Contains(r.Content[0], []byte("byte cap"))) {
		t.Fatalf("a result of %d bytes passed the %d-byte cap", size, maxResult)
	}
}

// FuzzUpstreamToolList feeds an arbitrary tools/list result through the
// conversion the upstream applies to what it lists (after the go-sdk's own
// decoding): every tool it exposes has a valid prefixed name, an object
// input schema and valid JSON annotations, no two share a name, and the
// gateway's registry accepts the lot.
func FuzzUpstreamToolList(f *testing.F) {
	for _, s := range []string{
		`{"tools":[{"name":"echo","inputSchema":{"type":"object"}}]}`,
		`{"tools":[{"name":"echo","title":"E","description":"d","inputSchema":{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]},"outputSchema":{"type":"object"},"annotations":{"readOnlyHint":true,"destructiveHint":false,"title":"t"}}]}`,
		`{"tools":[{"name":"a","inputSchema":{"type":"object"}},{"name":"a","inputSchema":{"type":"object"}}]}`,
		`{"tools":[{"name":"bad name","inputSchema":{"type":"object"}},{"name":"","inputSchema":{"type":"object"}}]}`,
		`{"tools":[{"name":"s","inputSchema":{"type":"string"}},{"name":"n"},{"name":"x","inputSchema":true}]}`,
		`{"tools":[{"name":"r","inputSchema":{"type":"object","$ref":"#/$defs/x","$defs":{"x":{"type":"object"}}}}]}`,
		`{"tools":[{"name":"` + strings.Repeat("l", 130) + `","inputSchema":{"type":"object"}}]}`,
		`{"tools":[null,{"name":"ok","inputSchema":{"type":"object"}}]}`,
		`{"tools":[]}`,
	} {
		f.Add([]byte(s))
	}
	u := &Upstream{opts: Options{Name: "fz", Prefix: "fz"}, log: (&logBuf{}).logger()}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var res mcp.ListToolsResult
		if json.Unmarshal(raw, &res) != nil {
			return // the go-sdk client refuses the listing before we see it
		}
		tools := u.convert(res.Tools)
		seen := map[string]bool{}
		var gw []gateway.Tool
		for _, tl := range tools {
			if err := CheckToolName(tl.Name); err != nil || !strings.HasPrefix(tl.Name, "fz__") {
				t.Fatalf("exposed tool name %q: %v", tl.Name, err)
			}
			if seen[tl.Name] {
				t.Fatalf("tool %q exposed twice", tl.Name)
			}
			seen[tl.Name] = true
			var schema map[string]any
			if json.Unmarshal(tl.InputSchema, &schema) != nil || schema["type"] != "object" {
				t.Fatalf("tool %q exposed with input schema %s", tl.Name, tl.InputSchema)
			}
			if tl.Annotations != nil && !json.Valid(tl.Annotations) {
				t.Fatalf("tool %q annotations %q", tl.Name, tl.Annotations)
			}
			if tl.OutputSchema != nil && !json.Valid(tl.OutputSchema) {
				t.Fatalf("tool %q output schema %q", tl.Name, tl.OutputSchema)
			}
			if tl.Run == nil {
				t.Fatalf("tool %q cannot run", tl.Name)
			}
			gw = append(gw, tl.Tool)
		}
		if _, err := gateway.NewRegistry(gw...); err != nil {
			t.Fatalf("the registry refuses the converted tools: %v", err)
		}
	})
}
