package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/tasks"
)

// bearer adds a bearer token to every request of a go-sdk client.
type bearer string

func (b bearer) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(req)
}

var objectSchema = json.RawMessage(`{"type":"object"}`)

func pong(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "pong"}}}, nil
}

// An upstream adds a tool while agents are connected: a 2026-07-28 client
// (subscriptions/listen) and a 2025-11-25 client (the GET stream) are both
// told, and their next tools/list has <prefix>__<tool>. Beside it, two
// upstreams that send malformed JSON (one on every answer, one on a call)
// do not stop the good one or the demo tools from serving.
func TestUpstreamToolListChanged(t *testing.T) {
	// The good upstream: an in-process go-sdk server over Streamable HTTP.
	live := mcp.NewServer(&mcp.Implementation{Name: "live", Version: "1"}, nil)
	live.AddTool(&mcp.Tool{Name: "ping", InputSchema: objectSchema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, pong)
	liveTS := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return live }, nil))
	t.Cleanup(liveTS.Close)

	// junk answers every request with truncated JSON.
	junkTS := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":`)
	}))
	t.Cleanup(junkTS.Close)

	// garble is a real server whose answer to tools/call of "garble" is
	// truncated JSON.
	garble := mcp.NewServer(&mcp.Implementation{Name: "garble", Version: "1"}, nil)
	garble.AddTool(&mcp.Tool{Name: "garble", InputSchema: objectSchema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, pong)
	garbleSDK := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return garble }, nil)
	garbleTS := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			if bytes.Contains(body, []byte(`"tools/call"`)) {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{"jsonrpc":"2.0","id":`)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		garbleSDK.ServeHTTP(w, r)
	}))
	t.Cleanup(garbleTS.Close)

	path := filepath.Join(t.TempDir(), "countersign.yaml")
	cfg := "upstreams:\n" +
		"  - name: live\n    url: " + liveTS.URL + "\n" +
		"  - name: junk\n    url: " + junkTS.URL + "\n" +
		"  - name: garble\n    url: " + garbleTS.URL + "\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startStackConfig(t, app.Config{ConfigFile: path}, 0)
	s.waitTool(t, "live__ping")
	s.waitTool(t, "garble__garble")

	// Both clients open their stream inside Connect (the listen request's
	// or the GET's response headers have arrived when it returns), so a
	// change from here on reaches them.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type client struct {
		era      string
		cs       *mcp.ClientSession
		notified chan struct{}
	}
	var clients []client
	for _, era := range []string{"2026-07-28", "2025-11-25"} {
		notified := make(chan struct{}, 16)
		c := mcp.NewClient(&mcp.Implementation{Name: "e2e-listen", Version: "1"}, &mcp.ClientOptions{
			ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { notified <- struct{}{} },
		})
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{
			Endpoint:   s.Base + "/mcp",
			HTTPClient: &http.Client{Transport: bearer(s.AgentToken)},
		}, &mcp.ClientSessionOptions{ProtocolVersion: era})
		if err != nil {
			t.Fatalf("%s: connect: %v", era, err)
		}
		t.Cleanup(func() { _ = cs.Close() })
		if got := cs.InitializeResult().ProtocolVersion; got != era {
			t.Fatalf("negotiated %s, want %s", got, era)
		}
		clients = append(clients, client{era, cs, notified})
	}

	live.AddTool(&mcp.Tool{Name: "fresh", InputSchema: objectSchema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, pong)
	for _, c := range clients {
		select {
		case <-c.notified:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no notifications/tools/list_changed after the upstream added a tool", c.era)
		}
		res, err := c.cs.ListTools(ctx, nil)
		if err != nil {
			t.Fatalf("%s: tools/list: %v", c.era, err)
		}
		var names []string
		for _, tl := range res.Tools {
			names = append(names, tl.Name)
		}
		for _, want := range []string{"live__fresh", "live__ping", "transfer_funds"} {
			if !slices.Contains(names, want) {
				t.Errorf("%s: tools/list %v lacks %s", c.era, names, want)
			}
		}
		if slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, "junk__") }) {
			t.Errorf("%s: tools/list %v has tools of the junk upstream", c.era, names)
		}
	}

	// The garbled call fails; the others keep serving.
	r := s.Call2026(s.AgentToken, "tools/call", "garble__garble", map[string]any{"name": "garble__garble", "arguments": map[string]any{}}, true)
	if r.Error == nil && !strings.Contains(string(r.Result), `"isError":true`) {
		t.Fatalf("a call answered with malformed JSON succeeded: %s", r.Result)
	}
	for _, tool := range []string{"live__fresh", "live__ping", "list_transfers"} {
		r := s.Call2026(s.AgentToken, "tools/call", tool, map[string]any{"name": tool, "arguments": map[string]any{}}, true)
		if r.Error != nil || strings.Contains(string(r.Result), `"isError":true`) {
			t.Fatalf("%s after the malformed answers: %+v %s", tool, r.Error, r.Result)
		}
	}
	resp, err := http.Get(s.Base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "upstream junk: down") {
		t.Errorf("/readyz = %d %q, want it to name the junk upstream", resp.StatusCode, body)
	}

	// Shutdown with both streams open: they end, so the HTTP server's
	// graceful shutdown does not wait out its 15 s (Stop reports a failed
	// shutdown).
	start := time.Now()
	s.Stop()
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("shutdown with open notification streams took %v", d)
	}
}

// An upstream changes a tool's input schema while a call to it awaits
// approval: once approved, the call does not run, and the task says why
// (activities.ExecuteTool's tool pin).
func TestUpstreamToolChangedWhileAwaitingApproval(t *testing.T) {
	var writes atomic.Int32
	write := func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		writes.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "wrote"}}}, nil
	}
	live := mcp.NewServer(&mcp.Implementation{Name: "live", Version: "1"}, nil)
	live.AddTool(&mcp.Tool{Name: "write", InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}}}`)}, write)
	liveTS := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return live }, nil))
	t.Cleanup(liveTS.Close)
	path := filepath.Join(t.TempDir(), "countersign.yaml")
	if err := os.WriteFile(path, []byte("upstreams:\n  - name: live\n    url: "+liveTS.URL+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startStackConfig(t, app.Config{ConfigFile: path}, 0)
	s.waitTool(t, "live__write")
	alice := s.Enroll("alice", "approvers")

	task := s.CreateTask(s.AgentToken, "live__write", map[string]any{"path": "/srv/a"})
	// The upstream redefines write: the path is now where it deletes.
	live.AddTool(&mcp.Tool{Name: "write", InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"delete":{"type":"boolean"}}}`)}, write)
	s.waitTool(t, `delete`)
	if r := s.Approve(alice, s.RefOf(task.TaskID), "approve"); !r.Accepted {
		t.Fatalf("approve: %+v", r)
	}
	d := s.WaitTerminal(s.AgentToken, task.TaskID)
	const why = "The tool changed after the call was made: upstream live now serves live__write with another input schema."
	if disposition(d) != tasks.DeniedNotExecuted || !strings.Contains(string(d.Result), why) {
		t.Fatalf("task ended %s/%s: %s; want denied-not-executed saying %q", d.Status, disposition(d), d.Result, why)
	}
	if n := writes.Load(); n != 0 {
		t.Fatalf("the changed tool ran %d times", n)
	}
}
