package upstream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/tasks"
)

// The test binary doubles as a stdio MCP server when this variable is set.
const helperEnv = "UPSTREAM_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		backoffMin, backoffMax = 50*time.Millisecond, 500*time.Millisecond
		os.Exit(m.Run())
	case "server":
		runHelper(false)
	case "hang":
		runHelper(true)
	case "slow":
		// A server that takes a while to start (npx downloading it, a
		// JVM): it reads nothing until then.
		time.Sleep(1500 * time.Millisecond)
		runHelper(false)
	case "junk":
		runJunk()
	case "spam":
		runSpam()
	case "flood":
		runFlood()
	}
	os.Exit(0)
}

var objectSchema = json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}}}`)

func text(s string) []mcp.Content { return []mcp.Content{&mcp.TextContent{Text: s}} }

func argText(req *mcp.CallToolRequest) string {
	var a struct{ Text string }
	_ = json.Unmarshal(req.Params.Arguments, &a)
	return a.Text
}

var codeSchema = json.RawMessage(`{"type":"object","properties":{"code":{"type":"integer"}}}`)

func argCode(req *mcp.CallToolRequest) int64 {
	var a struct{ Code int64 }
	_ = json.Unmarshal(req.Params.Arguments, &a)
	return a.Code
}

// runHelper serves echo, block, env (its environment, a line per variable)
// and fail (a JSON-RPC error answer with the given code) over stdio; with hang, tools/list never answers.
func runHelper(hang bool) {
	fmt.Fprintf(os.Stderr, "helper started pid=%d var=%s\n", os.Getpid(), os.Getenv("HELPER_VAR"))
	s := mcp.NewServer(&mcp.Implementation{Name: "helper", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "echo", InputSchema: objectSchema}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: text(argText(req))}, nil
	})
	s.AddTool(&mcp.Tool{Name: "block", InputSchema: objectSchema}, func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		fmt.Fprint(os.Stderr, "blocking\npartial ") // a line, then a partial one
		fmt.Fprintln(os.Stderr, "line")
		select {
		case <-ctx.Done():
		case <-time.After(time.Minute):
		}
		return &mcp.CallToolResult{Content: text("unblocked")}, nil
	})
	s.AddTool(&mcp.Tool{Name: "env", InputSchema: objectSchema}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: text(strings.Join(os.Environ(), "\n"))}, nil
	})
	s.AddTool(&mcp.Tool{Name: "fail", InputSchema: codeSchema}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		code := argCode(req)
		fmt.Fprintf(os.Stderr, "fail ran code=%d\n", code)
		return nil, &jsonrpc.Error{Code: code, Message: "the tool failed"}
	})
	if hang {
		s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
			return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
				if method == "tools/list" {
					<-ctx.Done()
				}
				return next(ctx, method, req)
			}
		})
	}
	_ = s.Run(context.Background(), &mcp.StdioTransport{})
}

// runJunk answers every line on stdin with malformed JSON.
func runJunk() {
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		fmt.Println(`{"jsonrpc":"2.0","id":1,"result":{protocolVersion}}`)
	}
}

// runSpam is a stdio server with one tool that, once listed, sends
// notifications/tools/list_changed without pause.
func runSpam() {
	var mu sync.Mutex
	send := func(line string) error {
		mu.Lock()
		defer mu.Unlock()
		_, err := fmt.Println(line)
		return err
	}
	var spamming sync.Once
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(sc.Bytes(), &m) != nil || m.ID == nil {
			continue
		}
		switch m.Method {
		case "initialize":
			send(`{"jsonrpc":"2.0","id":` + string(m.ID) + `,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{"listChanged":true}},"serverInfo":{"name":"spam","version":"1"}}}`)
		case "tools/list":
			send(`{"jsonrpc":"2.0","id":` + string(m.ID) + `,"result":{"tools":[{"name":"echo","inputSchema":{"type":"object"}}]}}`)
			spamming.Do(func() {
				go func() {
					for send(`{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`) == nil {
					}
				}()
			})
		default:
			send(`{"jsonrpc":"2.0","id":` + string(m.ID) + `,"error":{"code":-32601,"message":"no"}}`)
		}
	}
}

// runFlood serves echo, which writes a line to stderr before it answers;
// flood, which starts writing lines of 100 bytes to stderr as fast as it
// can, up to 1 GB; flooded, which answers how many bytes of them it has
// written; and stop, which stops the flood and answers the same.
func runFlood() {
	var written atomic.Int64
	stop, stopped := make(chan struct{}), make(chan struct{})
	s := mcp.NewServer(&mcp.Implementation{Name: "flood", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "echo", InputSchema: objectSchema}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		fmt.Fprintf(os.Stderr, "echo %s\n", argText(req))
		return &mcp.CallToolResult{Content: text(argText(req))}, nil
	})
	s.AddTool(&mcp.Tool{Name: "flood", InputSchema: objectSchema}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		chunk := bytes.Repeat([]byte(strings.Repeat("f", 99)+"\n"), 1000)
		go func() {
			defer close(stopped)
			for range 10_000 {
				select {
				case <-stop:
					return
				default:
				}
				n, err := os.Stderr.Write(chunk)
				written.Add(int64(n))
				if err != nil {
					return
				}
			}
		}()
		return &mcp.CallToolResult{Content: text("flooding")}, nil
	})
	s.AddTool(&mcp.Tool{Name: "flooded", InputSchema: objectSchema}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: text(fmt.Sprint(written.Load()))}, nil
	})
	s.AddTool(&mcp.Tool{Name: "stop", InputSchema: objectSchema}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		close(stop)
		<-stopped
		return &mcp.CallToolResult{Content: text(fmt.Sprint(written.Load()))}, nil
	})
	_ = s.Run(context.Background(), &mcp.StdioTransport{})
}

// logBuf collects JSON log records.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) logger() *slog.Logger { return slog.New(slog.NewJSONHandler(l, nil)) }

func (l *logBuf) records() []map[string]any {
	l.mu.Lock()
	data := bytes.Clone(l.b.Bytes())
	l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r map[string]any
		if json.Unmarshal(sc.Bytes(), &r) == nil {
			out = append(out, r)
		}
	}
	return out
}

// wait polls for a record matching f.
func (l *logBuf) wait(t *testing.T, what string, f func(map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		for _, r := range l.records() {
			if f(r) {
				return r
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	var msgs []string
	for _, r := range l.records() {
		msgs = append(msgs, fmt.Sprintf("%v: %v", r["msg"], r["error"]))
	}
	t.Fatalf("no log record: %s; logged: %q", what, msgs)
	return nil
}

// changes records OnChange calls.
type changes chan []Tool

func (c changes) onChange(tools []Tool) { c <- tools }

func (c changes) drain() {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}

// wait returns the first reported list satisfying f.
func (c changes) wait(t *testing.T, what string, f func([]Tool) bool) []Tool {
	t.Helper()
	timeout := time.After(15 * time.Second)
	for {
		select {
		case tools := <-c:
			if f(tools) {
				return tools
			}
		case <-timeout:
			t.Fatalf("no tool list change: %s", what)
		}
	}
}

func names(tools []Tool) []string {
	var n []string
	for _, t := range tools {
		n = append(n, t.Name)
	}
	sort.Strings(n)
	return n
}

func find(tools []Tool, name string) Tool {
	for _, t := range tools {
		if t.Name == name {
			return t
		}
	}
	return Tool{}
}

func has(name string) func([]Tool) bool {
	return func(tools []Tool) bool { return find(tools, name).Run != nil }
}

func run(t *testing.T, tool Tool, args string) (tasks.CallToolResult, error) {
	t.Helper()
	return runCtx(t, context.Background(), tool, args)
}

func runCtx(t *testing.T, ctx context.Context, tool Tool, args string) (tasks.CallToolResult, error) {
	t.Helper()
	if tool.Run == nil {
		t.Fatal("tool missing")
	}
	return tool.Run(ctx, gateway.Call{IdempotencyKey: "k", Arguments: json.RawMessage(args)})
}

// runFor runs tool with a deadline d away.
func runFor(t *testing.T, d time.Duration, tool Tool, args string) (tasks.CallToolResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return runCtx(t, ctx, tool, args)
}

func firstText(t *testing.T, r tasks.CallToolResult) string {
	t.Helper()
	if len(r.Content) == 0 {
		t.Fatalf("no content in %+v", r)
	}
	var c tasks.Content
	if err := json.Unmarshal(r.Content[0], &c); err != nil {
		t.Fatal(err)
	}
	return c.Text
}

func jsonEqual(t *testing.T, got json.RawMessage, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("bad JSON %s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("got %s, want %s", got, want)
	}
}

// outcomeUnknown checks that err is a plain error: neither ErrNotSent nor a
// protocol error.
func outcomeUnknown(t *testing.T, err error) {
	t.Helper()
	var pe *gateway.ProtocolError
	if err == nil || errors.Is(err, ErrNotSent) || errors.As(err, &pe) {
		t.Fatalf("want a plain error, got %v", err)
	}
}

type httpUpstream struct {
	srv     *mcp.Server
	ts      *httptest.Server
	handler atomic.Pointer[http.Handler]
	writes  atomic.Int32
	noToken atomic.Int32 // requests without the configured header
	// slowEnded receives the slow tool's context error when it returns.
	slowEnded chan error
}

func (h *httpUpstream) fresh() {
	var hd http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return h.srv }, nil)
	h.handler.Store(&hd)
}

// broken answers 404 to requests with a session and 503 to the rest: the
// server lost its sessions and cannot start new ones. Unlike the Go SDK's
// plain-text 404 (see "session lost"), the SDK client does not break the
// session on this one: only the call's own re-initialization request does.
func (h *httpUpstream) broken() {
	var hd http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Mcp-Session-Id") != "" {
			// As the TypeScript SDK answers: 404 with a JSON-RPC error.
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"},"id":null}`)
			return
		}
		http.Error(w, "down", http.StatusServiceUnavailable)
	})
	h.handler.Store(&hd)
}

func newHTTPUpstream(t *testing.T) *httpUpstream {
	h := &httpUpstream{
		srv:       mcp.NewServer(&mcp.Implementation{Name: "test", Version: "1"}, nil),
		slowEnded: make(chan error, 10),
	}
	s := h.srv
	s.AddTool(&mcp.Tool{Name: "echo", Title: "Echo", Description: "Echoes.", InputSchema: objectSchema,
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: text(argText(req))}, nil
		})
	s.AddTool(&mcp.Tool{Name: "write", InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"fail":{"type":"boolean"}}}`),
		OutputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"n":{"type":"integer"}}}`)},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			n := h.writes.Add(1)
			var a struct {
				Path string
				Fail bool
			}
			_ = json.Unmarshal(req.Params.Arguments, &a)
			return &mcp.CallToolResult{
				Content:           text("wrote " + a.Path),
				StructuredContent: map[string]any{"path": a.Path, "n": n},
				IsError:           a.Fail,
			}, nil
		})
	s.AddTool(&mcp.Tool{Name: "slow", InputSchema: objectSchema}, func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
		}
		h.slowEnded <- ctx.Err()
		return &mcp.CallToolResult{Content: text("done")}, nil
	})
	s.AddTool(&mcp.Tool{Name: "huge", InputSchema: objectSchema}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: text(strings.Repeat("x", 5<<20))}, nil
	})
	s.AddTool(&mcp.Tool{Name: "failing", InputSchema: objectSchema}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return nil, &jsonrpc.Error{Code: -32050, Message: "boom"}
	})
	noop := func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{}, nil
	}
	s.AddTool(&mcp.Tool{Name: "bad name", InputSchema: objectSchema}, noop)
	s.AddTool(&mcp.Tool{Name: strings.Repeat("l", 125), InputSchema: objectSchema}, noop) // too long once prefixed
	// The SDK will not register a tool with a non-object schema; add one to
	// the listing.
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			res, err := next(ctx, method, req)
			if lr, ok := res.(*mcp.ListToolsResult); ok && err == nil {
				lr.Tools = append(lr.Tools,
					&mcp.Tool{Name: "stringschema", InputSchema: map[string]any{"type": "string"}},
					&mcp.Tool{Name: "noschema"})
			}
			return res, err
		}
	})
	h.fresh()
	h.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Token") != "secret" {
			h.noToken.Add(1)
		}
		(*h.handler.Load()).ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		h.ts.CloseClientConnections()
		h.ts.Close()
	})
	return h
}

func TestHTTP(t *testing.T) {
	h := newHTTPUpstream(t)
	var logs logBuf
	ch := make(changes, 100)
	start := time.Now()
	u := Start(context.Background(), Options{
		Name: "web", Prefix: "up", URL: h.ts.URL,
		Headers: map[string]string{"X-Token": "secret"},
		Logger:  logs.logger(), OnChange: ch.onChange,
	})
	t.Cleanup(func() { u.Close() })
	if time.Since(start) > time.Second {
		t.Fatal("Start blocked")
	}

	tools := ch.wait(t, "initial list", func(tools []Tool) bool { return tools != nil })
	want := []string{"up__echo", "up__failing", "up__huge", "up__slow", "up__write"}
	if got := names(tools); !reflect.DeepEqual(got, want) {
		t.Fatalf("tools %v, want %v", got, want)
	}
	if st := u.State(); !st.Up || st.Tools != 5 || st.Err != "" {
		t.Fatalf("state %+v", st)
	}
	for _, bad := range []string{"bad name", strings.Repeat("l", 125), "stringschema", "noschema"} {
		logs.wait(t, "refusal of "+bad, func(r map[string]any) bool {
			return r["msg"] == "upstream tool refused" && r["tool"] == bad && r["upstream"] == "web"
		})
	}
	var gw []gateway.Tool
	for _, tl := range tools {
		gw = append(gw, tl.Tool)
	}
	if _, err := gateway.NewRegistry(gw...); err != nil {
		t.Fatalf("registry refuses the tools: %v", err)
	}

	echo, write := find(tools, "up__echo"), find(tools, "up__write")
	if !echo.ReadOnly || write.ReadOnly {
		t.Fatalf("read-only: echo %v write %v", echo.ReadOnly, write.ReadOnly)
	}
	if echo.Title != "Echo" || echo.Description != "Echoes." || echo.Upstream != "web" || echo.UpstreamTool != "echo" {
		t.Fatalf("echo: %+v", echo)
	}
	jsonEqual(t, echo.InputSchema, string(objectSchema))
	jsonEqual(t, write.OutputSchema, `{"type":"object","properties":{"path":{"type":"string"},"n":{"type":"integer"}}}`)
	var ann map[string]any
	if err := json.Unmarshal(echo.Annotations, &ann); err != nil || ann["readOnlyHint"] != true {
		t.Fatalf("annotations %s", echo.Annotations)
	}
	if d := echo.Describe(json.RawMessage(`{ "text": "hi" }`)); d != `web: echo({"text":"hi"})` {
		t.Fatalf("describe: %q", d)
	}

	t.Run("echo", func(t *testing.T) {
		r, err := run(t, echo, `{"text":"hello"}`)
		if err != nil || r.IsError || firstText(t, r) != "hello" {
			t.Fatalf("%+v %v", r, err)
		}
	})
	t.Run("structured", func(t *testing.T) {
		r, err := run(t, write, `{"path":"a"}`)
		if err != nil || r.IsError || firstText(t, r) != "wrote a" {
			t.Fatalf("%+v %v", r, err)
		}
		jsonEqual(t, r.StructuredContent, `{"path":"a","n":1}`)
		r, err = run(t, write, `{"path":"b","fail":true}`)
		if err != nil || !r.IsError {
			t.Fatalf("%+v %v", r, err)
		}
		jsonEqual(t, r.StructuredContent, `{"path":"b","n":2}`)
	})
	t.Run("jsonrpc error", func(t *testing.T) {
		r, err := run(t, find(tools, "up__failing"), `{}`)
		if err != nil || !r.IsError || firstText(t, r) != "upstream error -32050: boom" {
			t.Fatalf("%+v %v", r, err)
		}
	})
	t.Run("cap", func(t *testing.T) {
		r, err := run(t, find(tools, "up__huge"), `{}`)
		if err != nil || !r.IsError || len(r.Content) != 1 {
			t.Fatalf("%v %v", r.IsError, err)
		}
		if txt := firstText(t, r); !strings.Contains(txt, "over the 1048576-byte cap") || !strings.Contains(txt, "was 524") {
			t.Fatalf("text %q", txt)
		}
	})
	t.Run("bad arguments", func(t *testing.T) {
		_, err := run(t, echo, `{"text":`)
		var pe *gateway.ProtocolError
		if !errors.As(err, &pe) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		sch := make(changes, 10)
		short := Start(context.Background(), Options{Name: "short", URL: h.ts.URL, Headers: map[string]string{"X-Token": "secret"},
			Timeout: 300 * time.Millisecond, Logger: logs.logger(), OnChange: sch.onChange})
		defer short.Close()
		list := sch.wait(t, "short up", has("short__slow"))
		begin := time.Now()
		_, err := run(t, find(list, "short__slow"), `{}`)
		outcomeUnknown(t, err)
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(begin) > 5*time.Second {
			t.Fatalf("err %v after %v", err, time.Since(begin))
		}
		// The upstream was told to cancel.
		select {
		case err := <-h.slowEnded:
			if err == nil {
				t.Fatal("slow tool ran to completion")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("slow tool still running")
		}
	})
	t.Run("list_changed", func(t *testing.T) {
		h.srv.AddTool(&mcp.Tool{Name: "added", InputSchema: objectSchema}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: text("new")}, nil
		})
		tools := ch.wait(t, "added tool", has("up__added"))
		r, err := run(t, find(tools, "up__added"), `{}`)
		if err != nil || firstText(t, r) != "new" {
			t.Fatalf("%+v %v", r, err)
		}
	})
	t.Run("session lost", func(t *testing.T) {
		ch.drain()
		h.fresh() // a new session store: the client's session is unknown
		before := h.writes.Load()
		r, err := run(t, write, `{"path":"c"}`)
		if err != nil || r.IsError {
			t.Fatalf("%+v %v", r, err)
		}
		if n := h.writes.Load() - before; n != 1 {
			t.Fatalf("write ran %d times", n)
		}
		logs.wait(t, "re-initialization", func(r map[string]any) bool {
			return strings.HasPrefix(fmt.Sprint(r["msg"]), "upstream session lost")
		})
		if !u.State().Up {
			t.Fatalf("state %+v", u.State())
		}
		// Re-initializing re-lists without reporting the tools as gone.
		select {
		case tools := <-ch:
			if tools == nil {
				t.Fatal("tools reported gone during re-initialization")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no re-listing")
		}
	})
	t.Run("not sent", func(t *testing.T) {
		ch.drain()
		h.broken()
		before := h.writes.Load()
		// The call waits for the upstream while an attempt to reconnect is
		// due before its deadline, and sees them fail (503); it gives up at
		// its deadline, or as soon as the next attempt comes after it.
		begin := time.Now()
		_, err := runFor(t, 500*time.Millisecond, write, `{"path":"d"}`)
		d := time.Since(begin)
		if !errors.Is(err, ErrNotSent) || !strings.Contains(err.Error(), "Service Unavailable") {
			t.Fatalf("err %v after %v", err, d)
		}
		if d < 500*time.Millisecond && !strings.Contains(err.Error(), "comes after the call's deadline") {
			t.Fatalf("err %v after %v", err, d)
		}
		if h.writes.Load() != before {
			t.Fatal("write ran")
		}
		ch.wait(t, "down", func(tools []Tool) bool { return tools == nil })
		if st := u.State(); st.Up || st.Err == "" {
			t.Fatalf("state %+v", st)
		}
		_, err = runFor(t, 200*time.Millisecond, write, `{"path":"e"}`)
		if !errors.Is(err, ErrNotSent) || !strings.Contains(err.Error(), "is not connected") {
			t.Fatalf("err %v", err)
		}
		h.fresh()
		tools := ch.wait(t, "back up", func(tools []Tool) bool { return tools != nil })
		r, err := run(t, find(tools, "up__echo"), `{"text":"again"}`)
		if err != nil || firstText(t, r) != "again" {
			t.Fatalf("%+v %v", r, err)
		}
	})
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	if os.Getenv("UPSTREAM_TEST_DUMP") != "" {
		t.Log(logs.b.String())
	}
	if n := h.noToken.Load(); n != 0 {
		t.Fatalf("%d requests without the configured header", n)
	}
}

func stderrLine(prefix string) func(map[string]any) bool {
	return func(r map[string]any) bool {
		return r["msg"] == "upstream stderr" && r["upstream"] == "helper" && strings.HasPrefix(fmt.Sprint(r["line"]), prefix)
	}
}

func pidOf(t *testing.T, r map[string]any) int {
	t.Helper()
	var pid int
	var v string
	if _, err := fmt.Sscanf(fmt.Sprint(r["line"]), "helper started pid=%d var=%s", &pid, &v); err != nil || v != "v1" {
		t.Fatalf("line %v: %v", r["line"], err)
	}
	return pid
}

func TestStdioRestart(t *testing.T) {
	var logs logBuf
	ch := make(changes, 100)
	u := Start(context.Background(), Options{
		Name: "helper", Command: []string{os.Args[0]},
		Env:    map[string]string{helperEnv: "server", "HELPER_VAR": "v1"},
		Logger: logs.logger(), OnChange: ch.onChange,
	})
	t.Cleanup(func() { u.Close() })

	tools := ch.wait(t, "initial list", has("helper__block"))
	pid := pidOf(t, logs.wait(t, "start line", stderrLine("helper started")))

	done := make(chan error, 1)
	go func() {
		_, err := run(t, find(tools, "helper__block"), `{}`)
		done <- err
	}()
	logs.wait(t, "blocking line", stderrLine("blocking"))
	logs.wait(t, "partial line joined", stderrLine("partial line"))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		outcomeUnknown(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("call in flight did not return")
	}

	tools = ch.wait(t, "tools back", func(tools []Tool) bool { return tools != nil })
	var pid2 int
	logs.wait(t, "restart", func(r map[string]any) bool {
		if !stderrLine("helper started")(r) {
			return false
		}
		pid2 = pidOf(t, r)
		return pid2 != pid
	})
	r, err := run(t, find(tools, "helper__echo"), `{"text":"back"}`)
	if err != nil || firstText(t, r) != "back" {
		t.Fatalf("%+v %v", r, err)
	}
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid2, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("child %d still there after Close: %v", pid2, err)
	}
	if _, err := run(t, find(tools, "helper__echo"), `{}`); !errors.Is(err, ErrNotSent) {
		t.Fatalf("after Close: %v", err)
	}
}

func TestStdioHangingList(t *testing.T) {
	var logs logBuf
	u := Start(context.Background(), Options{
		Name: "helper", Command: []string{os.Args[0]}, Env: map[string]string{helperEnv: "hang"},
		// The timeout bounds the connection too: it must leave a race-built
		// helper on a loaded machine time to start and answer initialize,
		// or the failure is the connection's and never the listing's.
		ListTimeout: 2 * time.Second, Logger: logs.logger(),
	})
	logs.wait(t, "listing failure", func(r map[string]any) bool {
		return r["msg"] == "upstream unavailable" && strings.Contains(fmt.Sprint(r["error"]), "listing tools")
	})
	if st := u.State(); st.Up || !strings.Contains(st.Err, "listing tools") {
		t.Fatalf("state %+v", st)
	}
	begin := time.Now()
	u.Close()
	if d := time.Since(begin); d > 8*time.Second {
		t.Fatalf("Close took %v", d)
	}
}

// A stdio upstream that takes longer to start than ListTimeout comes up:
// each connection that timed out gives the next one twice as long. Every
// attempt used to get ListTimeout, killed the process and started it again,
// so it never came up.
func TestStdioSlowStart(t *testing.T) {
	var logs logBuf
	ch := make(changes, 100)
	u := Start(context.Background(), Options{
		Name: "helper", Command: []string{os.Args[0]}, Env: map[string]string{helperEnv: "slow"},
		ListTimeout: time.Second, Logger: logs.logger(), OnChange: ch.onChange,
	})
	t.Cleanup(func() { u.Close() })
	ch.wait(t, "the slow upstream's tools", has("helper__echo"))
	if st := u.State(); !st.Up {
		t.Fatalf("state %+v", st)
	}
}

// An upstream that writes malformed JSON is down with an error, and is
// retried; an upstream beside it serves all along, and nothing panics.
func TestStdioMalformedJSON(t *testing.T) {
	var logs logBuf
	junk := Start(context.Background(), Options{
		Name: "junk", Command: []string{os.Args[0]}, Env: map[string]string{helperEnv: "junk"},
		ListTimeout: 5 * time.Second, Logger: logs.logger(),
	})
	t.Cleanup(func() { junk.Close() })
	ch := make(changes, 100)
	good := Start(context.Background(), Options{
		Name: "helper", Command: []string{os.Args[0]}, Env: map[string]string{helperEnv: "server"},
		Logger: slog.New(slog.DiscardHandler), OnChange: ch.onChange,
	})
	t.Cleanup(func() { good.Close() })

	tools := ch.wait(t, "the good upstream's tools", has("helper__echo"))
	logs.wait(t, "the junk upstream fails", func(r map[string]any) bool { return r["msg"] == "upstream unavailable" })
	// The error says what was wrong.
	if st := junk.State(); st.Up || !strings.Contains(st.Err, "invalid character") {
		t.Fatalf("junk upstream state %+v", st)
	}
	r, err := run(t, find(tools, "helper__echo"), `{"text":"still here"}`)
	if err != nil || firstText(t, r) != "still here" {
		t.Fatalf("the good upstream beside the junk one: %+v %v", r, err)
	}
	if st := good.State(); !st.Up {
		t.Fatalf("good upstream state %+v", st)
	}
}

func TestMisconfigured(t *testing.T) {
	u := Start(context.Background(), Options{Name: "x", Logger: slog.New(slog.DiscardHandler)})
	if st := u.State(); st.Up || !strings.Contains(st.Err, "neither") {
		t.Fatalf("state %+v", st)
	}
	u.Close()
}

func TestCheckToolName(t *testing.T) {
	for name, ok := range map[string]bool{
		"a": true, "A-z_0.9": true, strings.Repeat("a", 128): true,
		"": false, strings.Repeat("a", 129): false, "a b": false, "a/b": false, "é": false,
	} {
		if err := CheckToolName(name); (err == nil) != ok {
			t.Errorf("%q: %v", name, err)
		}
	}
	// The refusal names the character, not the first byte of its UTF-8.
	if err := CheckToolName("ünïcode"); err == nil || !strings.Contains(err.Error(), "'ü'") {
		t.Errorf("ünïcode: %v, want it to name 'ü'", err)
	}
}

// A child's stderr is logged a record per line, without its line feed
// (and a carriage return before it); a line longer than maxStderrLine is
// logged cut there and marked, and the rest of it dropped.
func TestLineLogger(t *testing.T) {
	var logs logBuf
	w := &lineLogger{lim: newStderrLimit(logs.logger(), time.Hour)}
	fmt.Fprint(w, "one\r\ntw")
	fmt.Fprint(w, "o\n\nthree")
	w.Write(bytes.Repeat([]byte("x"), maxStderrLine+10))
	fmt.Fprint(w, "xx\nfour\n")
	w.Write(bytes.Repeat([]byte("y"), maxStderrLine)) // a line of exactly maxStderrLine
	fmt.Fprint(w, "\nfive")
	w.flush()
	var lines []string
	for _, r := range logs.records() {
		if r["msg"] != "upstream stderr" {
			t.Errorf("record %v", r)
		}
		lines = append(lines, fmt.Sprint(r["line"]))
	}
	want := []string{"one", "two", "three" + strings.Repeat("x", maxStderrLine-5) + stderrCut, "four", strings.Repeat("y", maxStderrLine), "five"}
	if !reflect.DeepEqual(lines, want) {
		t.Fatalf("lines %q", lines)
	}
}

// A line cut at maxStderrLine is cut before a UTF-8 character the limit
// falls inside, not through it (which a log shows as U+FFFD).
func TestLineLoggerCutsAtACharacter(t *testing.T) {
	for _, char := range []string{"é", "€", "😀"} {
		// in: how many bytes of the second char fall before the limit.
		for in := 1; in < len(char); in++ {
			var logs logBuf
			w := &lineLogger{lim: newStderrLimit(logs.logger(), time.Hour)}
			head := strings.Repeat("a", maxStderrLine-len(char)-in) + char
			fmt.Fprint(w, head+char+"tail\nnext\n")
			w.flush()
			var lines []string
			for _, r := range logs.records() {
				lines = append(lines, fmt.Sprint(r["line"]))
			}
			if want := []string{head + stderrCut, "next"}; !reflect.DeepEqual(lines, want) {
				t.Errorf("%q cut after %d bytes: logged %d lines, the first ending %q", char, in, len(lines), lines[0][max(0, len(lines[0])-30):])
			}
		}
	}
}

// An upstream's stderr is logged within its budget: stderrLineBurst lines
// (stderrByteBurst bytes) at once, then stderrLinesPerSec lines
// (stderrBytesPerSec bytes) a second. The lines over it are dropped and
// counted, whole, and the count is logged every stderrReportEvery after a
// drop, and when the child's stderr ends.
func TestStderrBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs logBuf
		w := &lineLogger{lim: newStderrLimit(logs.logger().With("upstream", "noisy"), 10*time.Second)}
		seen := 0
		check := func(step string, logged int, summary map[string]any) {
			t.Helper()
			synctest.Wait()
			var got []map[string]any
			n := 0
			for _, r := range logs.records()[seen:] {
				if r["upstream"] != "noisy" {
					t.Errorf("%s: record %v without the upstream's name", step, r)
				}
				if r["msg"] == "upstream stderr" {
					n++
				} else {
					got = append(got, map[string]any{"msg": r["msg"], "level": r["level"], "lines": r["lines"], "bytes": r["bytes"]})
				}
			}
			seen += n + len(got)
			var want []map[string]any
			if summary != nil {
				want = []map[string]any{summary}
			}
			if n != logged || !reflect.DeepEqual(got, want) {
				t.Fatalf("%s: %d lines logged, other records %v; want %d lines, %v", step, n, got, logged, want)
			}
		}
		dropped := func(lines, bytes int) map[string]any {
			return map[string]any{"msg": "upstream stderr dropped", "level": "WARN", "lines": float64(lines), "bytes": float64(bytes)}
		}
		short := strings.Repeat("z", 99) + "\n"
		w.Write([]byte(strings.Repeat(short, 1000)))
		check("a burst of 1000 lines", stderrLineBurst, nil)
		time.Sleep(10 * time.Second)
		check("10 seconds later", 0, dropped(1000-stderrLineBurst, (1000-stderrLineBurst)*99))

		// The line bucket is full again, and the byte bucket is the limit.
		long := strings.Repeat("y", maxStderrLine) + "\n"
		w.Write([]byte(strings.Repeat(long, 40)))
		fmt.Fprintf(w, "%s\n", strings.Repeat("w", 3*maxStderrLine)) // dropped and counted whole
		check("40 lines of maxStderrLine bytes and a longer one", stderrByteBurst/maxStderrLine, nil)
		w.flush()
		check("the end of the child's stderr", 0, dropped(40-stderrByteBurst/maxStderrLine+1, (40-stderrByteBurst/maxStderrLine)*maxStderrLine+3*maxStderrLine))
		time.Sleep(time.Minute)
		check("a minute later", 0, nil)
	})
}

// Found by FuzzUpstreamToolList: keys of an input schema are matched
// exactly, as clients read them, not as encoding/json decodes structs.
func TestInputSchemaKeysExact(t *testing.T) {
	for _, tc := range []struct {
		schema any
		ok     bool
	}{
		{map[string]any{"type": "object"}, true},
		{map[string]any{"tYpe": "object"}, false},
		{map[string]any{"Type": "object", "properties": map[string]any{}}, false},
		{map[string]any{"type": "string"}, false},
		{nil, false},
	} {
		if _, err := inputSchema(tc.schema); (err == nil) != tc.ok {
			t.Errorf("%v: %v, want ok=%v", tc.schema, err, tc.ok)
		}
	}
}

// An upstream's JSON-RPC error answer is an answer, whatever its code: the
// call reached the upstream (here the tool ran), so it is never reported as
// not sent. The go-sdk client turns the codes of its own closing errors,
// -32003 and -32004, into mcp.ErrConnectionClosed, which is also what it
// returns when it refuses a call on a closing connection; only the latter
// is "not sent". Such an answer, and one with -32005, the SDK's code for a
// request the HTTP transport rejected, is reported as outcome unknown: the
// code alone cannot tell a tool's failure from the SDK's own error (a server
// that refused the call while shutting down, an HTTP request that failed).
func TestClosingCodeAnswer(t *testing.T) {
	var ran atomic.Int32
	srv := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	srv.AddTool(&mcp.Tool{Name: "fail", InputSchema: codeSchema}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		ran.Add(1)
		return nil, &jsonrpc.Error{Code: argCode(req), Message: "the tool failed"}
	})
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(ts.Close)
	var logs logBuf
	hch, sch := make(changes, 100), make(changes, 100)
	web := Start(context.Background(), Options{Name: "web", URL: ts.URL, Logger: logs.logger(), OnChange: hch.onChange})
	t.Cleanup(func() { web.Close() })
	helper := Start(context.Background(), Options{Name: "helper", Command: []string{os.Args[0]},
		Env: map[string]string{helperEnv: "server"}, Logger: logs.logger(), OnChange: sch.onChange})
	t.Cleanup(func() { helper.Close() })
	webFail := find(hch.wait(t, "http tools", has("web__fail")), "web__fail")
	helperFail := find(sch.wait(t, "stdio tools", has("helper__fail")), "helper__fail")

	for _, code := range []int64{-32003, -32004, -32005} {
		args := fmt.Sprintf(`{"code":%d}`, code)
		t.Run(fmt.Sprintf("http %d", code), func(t *testing.T) {
			before := ran.Load()
			_, err := run(t, webFail, args)
			if n := ran.Load() - before; n != 1 {
				t.Fatalf("the tool ran %d times", n)
			}
			outcomeUnknown(t, err)
			if !strings.Contains(err.Error(), "the tool failed") {
				t.Fatalf("the error does not carry the upstream's message: %v", err)
			}
		})
		t.Run(fmt.Sprintf("stdio %d", code), func(t *testing.T) {
			_, err := run(t, helperFail, args)
			logs.wait(t, "the tool ran", stderrLine(fmt.Sprintf("fail ran code=%d", code)))
			outcomeUnknown(t, err)
			if !strings.Contains(err.Error(), "the tool failed") {
				t.Fatalf("the error does not carry the upstream's message: %v", err)
			}
		})
	}
	// Another code is the tool's error result, as before.
	r, err := run(t, helperFail, `{"code":-32050}`)
	if err != nil || !r.IsError || firstText(t, r) != "upstream error -32050: the tool failed" {
		t.Fatalf("%+v %v", r, err)
	}
}

// A call on a stdio session that is already closed is refused by the SDK
// before anything is written to the child: it surely did not leave.
func TestStdioClosedSessionNotSent(t *testing.T) {
	ch := make(changes, 100)
	u := Start(context.Background(), Options{Name: "helper", Command: []string{os.Args[0]},
		Env: map[string]string{helperEnv: "server"}, Logger: slog.New(slog.DiscardHandler), OnChange: ch.onChange})
	t.Cleanup(func() { u.Close() })
	ch.wait(t, "tools", has("helper__echo"))
	sess, _ := u.current()
	if sess == nil {
		t.Fatal("no session")
	}
	sess.Close()
	_, out, err := u.send(context.Background(), sess, "echo", json.RawMessage(`{}`))
	if err == nil || out != sessionGone || !errors.Is(err, mcp.ErrConnectionClosed) {
		t.Fatalf("outcome %v, err %v", out, err)
	}
}

// An HTTP upstream's redirect is not followed: neither the configured
// headers (here a bearer token) nor the call go to a host that is not the
// configured upstream. A redirected call is outcome unknown, like any other
// answer but 404 (a 303 says the POST was processed), and its error names
// the upstream and where it was sent; a redirect of the connection's own
// requests leaves the upstream down with that error.
func TestHTTPRedirectNotFollowed(t *testing.T) {
	var ran atomic.Int32
	srv := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	srv.AddTool(&mcp.Tool{Name: "write", InputSchema: objectSchema}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		ran.Add(1)
		return &mcp.CallToolResult{Content: text("wrote")}, nil
	})
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	// other serves the same sessions, so a followed redirect would run the
	// call there.
	var otherRequests atomic.Int32
	var otherAuth sync.Map
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		otherRequests.Add(1)
		otherAuth.Store(r.Header.Get("Authorization"), true)
		sdk.ServeHTTP(w, r)
	}))
	t.Cleanup(other.Close)
	location := other.URL + "/elsewhere"
	var redirect atomic.Bool
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if redirect.Load() {
			http.Redirect(w, r, location, http.StatusTemporaryRedirect)
			return
		}
		sdk.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	opts := Options{Name: "web", URL: ts.URL, Headers: map[string]string{"Authorization": "Bearer s3cret"},
		Logger: slog.New(slog.DiscardHandler)}

	ch := make(changes, 100)
	o := opts
	o.OnChange = ch.onChange
	u := Start(context.Background(), o)
	t.Cleanup(func() { u.Close() })
	write := find(ch.wait(t, "tools", has("web__write")), "web__write")
	redirect.Store(true)
	_, err := run(t, write, `{}`)
	outcomeUnknown(t, err)
	if !strings.Contains(err.Error(), "upstream web") || !strings.Contains(err.Error(), location) {
		t.Fatalf("the error does not name the upstream and the redirect's target: %v", err)
	}
	if n := ran.Load(); n != 0 {
		t.Fatalf("the tool ran %d times", n)
	}

	// A new connection meets the redirect at initialize.
	fresh := Start(context.Background(), opts)
	t.Cleanup(func() { fresh.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for st := fresh.State(); !strings.Contains(st.Err, location); st = fresh.State() {
		if time.Now().After(deadline) {
			t.Fatalf("state %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := otherRequests.Load(); n != 0 {
		otherAuth.Range(func(k, _ any) bool { t.Logf("Authorization sent to the other host: %q", k); return true })
		t.Fatalf("%d requests went to the redirect's target", n)
	}
}

// A stdio upstream inherits only a few variables of Countersign's
// environment, not its secrets; it gets the rest through Env.
func TestStdioEnvironment(t *testing.T) {
	t.Setenv("COUNTERSIGN_TEST_SECRET", "s3cret")
	t.Setenv("LANG", "C.UTF-8")
	ch := make(changes, 100)
	u := Start(context.Background(), Options{Name: "helper", Command: []string{os.Args[0]},
		Env:    map[string]string{helperEnv: "server", "GIVEN": "yes", "LANG": "en_US.UTF-8"},
		Logger: slog.New(slog.DiscardHandler), OnChange: ch.onChange})
	t.Cleanup(func() { u.Close() })
	r, err := run(t, find(ch.wait(t, "tools", has("helper__env")), "helper__env"), `{}`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range strings.Split(firstText(t, r), "\n") {
		k, v, _ := strings.Cut(kv, "=")
		got[k] = v
	}
	want := map[string]string{helperEnv: "server", "GIVEN": "yes", "LANG": "en_US.UTF-8"}
	for _, k := range []string{"PATH", "HOME", "USER", "LOGNAME", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "SHELL", "TERM"} {
		if v, ok := os.LookupEnv(k); ok {
			want[k] = v
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the child's environment is\n%v\nwant\n%v", got, want)
	}
}

// The size cap counts _meta with the content and the structured content: a
// result is stored whole, and a huge _meta alone could make it too large
// for the workflow's history.
func TestResultCapCountsMeta(t *testing.T) {
	u := &Upstream{opts: Options{Name: "web", MaxResultBytes: 100}, log: slog.New(slog.DiscardHandler)}
	r := u.result("t", &mcp.CallToolResult{Content: text("ok"), Meta: mcp.Meta{"big": strings.Repeat("x", 100)}})
	if !r.IsError || r.Meta != nil || !strings.Contains(firstText(t, r), "over the 100-byte cap") {
		t.Fatalf("%+v", r)
	}
	r = u.result("t", &mcp.CallToolResult{Content: text("ok"), Meta: mcp.Meta{"k": "v"}})
	if r.IsError || r.Meta["k"] != "v" {
		t.Fatalf("%+v", r)
	}
}

// An upstream's result cannot carry the _meta keys with which Countersign
// states its decisions: an allowed call's result reaches the agent as the
// upstream sent it, and a disposition there would read as Countersign's.
// Nor can it carry Countersign's own io.countersign/ keys: an audit
// receipt (io.countersign/audit) on an allowed call's result, which
// Countersign audits no chain for, would read as Countersign's record of
// the call, and a transaction-token error on a token call that ran would
// say the token was refused and the call did not run.
func TestResultDropsCountersignMeta(t *testing.T) {
	u := &Upstream{opts: Options{Name: "web", MaxResultBytes: 1 << 20}, log: slog.New(slog.DiscardHandler)}
	for _, tc := range []struct {
		name       string
		meta, want mcp.Meta
	}{
		{"dispositions", mcp.Meta{
			tasks.MetaDisposition:        "denied-not-executed",
			tasks.MetaDispositionAuthZEN: "denied-not-executed",
			tasks.MetaRelatedTask:        map[string]any{"taskId": "tsk_other"},
			tasks.MetaImmediateResponse:  "The call has NOT run.",
			"vendor/trace":               "abc",
		}, mcp.Meta{"vendor/trace": "abc"}},
		{"io.countersign/", mcp.Meta{
			"io.countersign/audit":                   map[string]any{"recordRef": "tsk_other/6", "hash": "ab", "signature": "c2ln", "keyId": "k"},
			"io.countersign/transaction-token-error": map[string]any{"reason": "jti_replayed", "retry_allowed": true},
			"io.countersign.vendor/x":                "kept",
		}, mcp.Meta{"io.countersign.vendor/x": "kept"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := len(tc.meta)
			r := u.result("t", &mcp.CallToolResult{Content: text("wrote"), Meta: tc.meta})
			if !reflect.DeepEqual(r.Meta, map[string]any(tc.want)) {
				t.Fatalf("_meta %v, want %v", r.Meta, tc.want)
			}
			if len(tc.meta) != n {
				t.Errorf("the upstream's result was changed: %v", tc.meta)
			}
		})
	}
}

// An upstream's JSON-RPC error answer becomes the tool's error result
// under the same size cap as a result: its message was taken whole, so a
// 16 MiB message (one upstream message's limit) made a result that no
// task could store, and an approved call that the upstream had answered
// ended outcome-unknown.
func TestErrorAnswerCapped(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	srv.AddTool(&mcp.Tool{Name: "fail", InputSchema: json.RawMessage(`{"type":"object"}`)}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return nil, &jsonrpc.Error{Code: -32000, Message: strings.Repeat("e", 2000)}
	})
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(ts.Close)
	ch := make(changes, 100)
	u := Start(context.Background(), Options{Name: "web", URL: ts.URL, MaxResultBytes: 1000, Logger: slog.New(slog.DiscardHandler), OnChange: ch.onChange})
	t.Cleanup(func() { u.Close() })
	r, err := run(t, find(ch.wait(t, "tools", has("web__fail")), "web__fail"), `{}`)
	if err != nil {
		t.Fatal(err)
	}
	if !r.IsError || !strings.Contains(firstText(t, r), "over the 1000-byte cap") {
		t.Fatalf("%.300s", firstText(t, r))
	}
}

// processGone reports whether pid has exited: it is not there, or it is a
// zombie (its new parent, maybe this test's PID 1, has not reaped it).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

func waitGone(t *testing.T, what string, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !processGone(pid); {
		if time.Now().After(deadline) {
			t.Fatalf("%s (pid %d) still running", what, pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A stdio upstream started through a wrapper that leaves a process of its
// own behind (here sh, with a background sleep, exec'ing the server): that
// process is ended with the upstream, when the upstream is closed and when
// the server dies (and is restarted).
// startWrapped starts a stdio upstream through a wrapper (sh) that leaves
// a sleep of its own behind and execs the helper server.
func startWrapped(t *testing.T) (*Upstream, *logBuf, changes) {
	logs := &logBuf{}
	ch := make(changes, 100)
	u := Start(context.Background(), Options{
		Name:    "helper",
		Command: []string{"sh", "-c", `sleep 300 & echo "grandchild pid=$!" >&2; exec "$0"`, os.Args[0]},
		Env:     map[string]string{helperEnv: "server", "HELPER_VAR": "v1"},
		Logger:  logs.logger(), OnChange: ch.onChange,
	})
	t.Cleanup(func() { u.Close() })
	ch.wait(t, "initial list", has("helper__echo"))
	return u, logs, ch
}

// grandchild returns the PID of the first sleep a wrapper started after
// skip (startWrapped).
func grandchild(t *testing.T, logs *logBuf, skip int) int {
	var pid int
	logs.wait(t, "grandchild line", func(r map[string]any) bool {
		if !stderrLine("grandchild pid=")(r) {
			return false
		}
		_, err := fmt.Sscanf(fmt.Sprint(r["line"]), "grandchild pid=%d", &pid)
		return err == nil && pid != skip
	})
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	return pid
}

func TestStdioProcessGroup(t *testing.T) {
	t.Run("close", func(t *testing.T) {
		u, logs, _ := startWrapped(t)
		sleep := grandchild(t, logs, 0)
		if processGone(sleep) {
			t.Fatal("the grandchild is gone before Close")
		}
		if err := u.Close(); err != nil {
			t.Fatal(err)
		}
		waitGone(t, "the grandchild after Close", sleep)
	})
	t.Run("server dies", func(t *testing.T) {
		_, logs, ch := startWrapped(t)
		server := pidOf(t, logs.wait(t, "start line", stderrLine("helper started")))
		sleep := grandchild(t, logs, 0)
		if err := syscall.Kill(server, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitGone(t, "the grandchild after the server died", sleep)
		tools := ch.wait(t, "tools back", func(tools []Tool) bool { return tools != nil })
		grandchild(t, logs, sleep)
		r, err := run(t, find(tools, "helper__echo"), `{"text":"back"}`)
		if err != nil || firstText(t, r) != "back" {
			t.Fatalf("%+v %v", r, err)
		}
	})
}

// restartable is an HTTP MCP server at a fixed address that the test stops
// and starts again.
type restartable struct {
	addr string
	srv  atomic.Pointer[http.Server]
	runs atomic.Int32 // the write tool's
	mcp  *mcp.Server
}

// newRestartable serves a write tool with schema.
func newRestartable(t *testing.T, schema json.RawMessage) *restartable {
	r := &restartable{}
	r.setTool(schema)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = ln.Addr().String()
	r.serve(ln)
	t.Cleanup(r.stop)
	return r
}

// setTool makes the next start serve write with schema.
func (r *restartable) setTool(schema json.RawMessage) {
	r.mcp = mcp.NewServer(&mcp.Implementation{Name: "restartable", Version: "1"}, nil)
	r.mcp.AddTool(&mcp.Tool{Name: "write", InputSchema: schema}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		r.runs.Add(1)
		return &mcp.CallToolResult{Content: text("written")}, nil
	})
}

func (r *restartable) serve(ln net.Listener) {
	s := r.mcp
	hs := &http.Server{Handler: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil), ReadHeaderTimeout: 5 * time.Second}
	// A fresh connection per request: a POST on a kept-alive connection
	// the server closed is outcome unknown (it was written), while a
	// refused connection certainly sent nothing.
	hs.SetKeepAlivesEnabled(false)
	r.srv.Store(hs)
	go hs.Serve(ln)
}

// stop closes the listener and every connection: the server is gone.
func (r *restartable) stop() { r.srv.Load().Close() }

// start serves again at the same address, with no session of before.
func (r *restartable) start(t *testing.T) {
	t.Helper()
	var ln net.Listener
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if ln, err = net.Listen("tcp", r.addr); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	r.serve(ln)
}

// A call made while its HTTP upstream is stopped waits for it: once the
// upstream is back, the call runs there, once. The wait is bounded by the
// call's deadline and Timeout, and a call whose tool the upstream lists
// differently once back is not sent.
func TestHTTPCallWaitsForRestart(t *testing.T) {
	start := func(t *testing.T, r *restartable, timeout time.Duration) (*logBuf, Tool) {
		logs := &logBuf{}
		ch := make(changes, 100)
		u := Start(context.Background(), Options{Name: "web", URL: "http://" + r.addr, Timeout: timeout,
			Logger: logs.logger(), OnChange: ch.onChange})
		t.Cleanup(func() { u.Close() })
		return logs, find(ch.wait(t, "tools", has("web__write")), "web__write")
	}
	waiting := func(t *testing.T, logs *logBuf, done <-chan error) {
		t.Helper()
		logs.wait(t, "the call waiting", func(r map[string]any) bool {
			return strings.HasPrefix(fmt.Sprint(r["msg"]), "upstream unreachable; waiting") ||
				strings.HasPrefix(fmt.Sprint(r["msg"]), "upstream session lost; waiting")
		})
		time.Sleep(300 * time.Millisecond)
		select {
		case err := <-done:
			t.Fatalf("the call ended during the outage: %v", err)
		default:
		}
	}

	t.Run("runs after the restart", func(t *testing.T) {
		r := newRestartable(t, objectSchema)
		logs, write := start(t, r, 30*time.Second)
		r.stop()
		done := make(chan error, 1)
		go func() {
			res, err := run(t, write, `{"text":"x"}`)
			if err == nil && (res.IsError || firstText(t, res) != "written") {
				err = fmt.Errorf("result %+v", res)
			}
			done <- err
		}()
		waiting(t, logs, done)
		r.start(t)
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the call did not complete after the restart")
		}
		if n := r.runs.Load(); n != 1 {
			t.Fatalf("write ran %d times", n)
		}
	})
	t.Run("bounded by Timeout", func(t *testing.T) {
		r := newRestartable(t, objectSchema)
		_, write := start(t, r, 700*time.Millisecond)
		r.stop()
		begin := time.Now()
		_, err := run(t, write, `{}`)
		if d := time.Since(begin); !errors.Is(err, ErrNotSent) || d < 700*time.Millisecond || d > 5*time.Second {
			t.Fatalf("err %v after %v", err, d)
		}
	})
	t.Run("tool changed meanwhile", func(t *testing.T) {
		r := newRestartable(t, objectSchema)
		logs, write := start(t, r, 30*time.Second)
		r.stop()
		done := make(chan error, 1)
		go func() {
			_, err := run(t, write, `{}`)
			done <- err
		}()
		waiting(t, logs, done)
		r.setTool(codeSchema)
		r.start(t)
		select {
		case err := <-done:
			if !errors.Is(err, ErrNotSent) || !strings.Contains(err.Error(), "another input schema") {
				t.Fatalf("err %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the call did not end after the restart")
		}
		if n := r.runs.Load(); n != 0 {
			t.Fatalf("write ran %d times", n)
		}
	})
}

// A session that ends while OnChange is busy is replaced all the same: a
// call that finds it gone gets a new session in time instead of waiting its
// whole timeout for a supervisor stuck in OnChange. Each broken answer below
// ends the session (the SDK fails the connection on a message it cannot
// decode); by the second, the supervisor has reported at least once since
// the first list, and OnChange blocks from then on.
func TestSessionReplacedWhileOnChangeBlocks(t *testing.T) {
	peer := newFuzzPeer(t)
	ch := make(changes, 1)
	release := make(chan struct{})
	first := true
	u := Start(context.Background(), Options{Name: "fz", URL: peer.ts.URL, Timeout: 5 * time.Second,
		Logger: (&logBuf{}).logger(), OnChange: func(tools []Tool) {
			if first {
				first = false
				ch <- tools
				return
			}
			<-release
		}})
	t.Cleanup(func() { u.Close() })
	t.Cleanup(func() { close(release) })
	tool := find(ch.wait(t, "tools", has("fz__t")), "fz__t")

	answer := func(s string) {
		peer.mu.Lock()
		peer.next = []byte(s)
		peer.mu.Unlock()
	}
	for round := 1; round <= 3; round++ {
		answer(`not json`)
		if _, err := run(t, tool, `{}`); err == nil || errors.Is(err, ErrNotSent) {
			t.Fatalf("round %d: a broken answer: err %v", round, err)
		}
		answer(`{"jsonrpc":"2.0","id":@ID@,"result":{"content":[{"type":"text","text":"ok"}]}}`)
		before, begin := peer.delivered.Load(), time.Now()
		res, err := run(t, tool, `{}`)
		if err != nil || firstText(t, res) != "ok" {
			t.Fatalf("round %d: after %v: result %+v, err %v", round, time.Since(begin), res, err)
		}
		if n := peer.delivered.Load() - before; n != 1 {
			t.Fatalf("round %d: the call reached the upstream %d times", round, n)
		}
	}
}

// A call that finds no session does not wait when the supervisor's next
// attempt to connect starts after the call's deadline: no session can come
// in time. It waits when the attempt starts before.
func TestAwaitSessionOnlyForAnAttemptInTime(t *testing.T) {
	down := func(retryIn time.Duration) *Upstream {
		return &Upstream{done: make(chan struct{}), changed: make(chan struct{}),
			state: State{Err: "connecting: connection refused"}, retryAt: time.Now().Add(retryIn)}
	}
	t.Run("after the deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		begin := time.Now()
		_, _, err := down(time.Hour).awaitSession(ctx, nil, 0)
		if err == nil || !strings.Contains(err.Error(), "connection refused (not waiting: the next attempt to reconnect, in ") || !strings.Contains(err.Error(), ", comes after the call's deadline)") {
			t.Fatalf("err %v", err)
		}
		if d := time.Since(begin); d > time.Second {
			t.Fatalf("gave up after %v", d)
		}
	})
	t.Run("before the deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		begin := time.Now()
		_, _, err := down(100*time.Millisecond).awaitSession(ctx, nil, 0)
		if err == nil || !strings.Contains(err.Error(), "waited for it until context deadline exceeded") {
			t.Fatalf("err %v", err)
		}
		if d := time.Since(begin); d < 200*time.Millisecond {
			t.Fatalf("gave up after %v", d)
		}
	})
}

// An HTTP upstream that answers a call with an endless JSON body (not an
// SSE stream, whose events the SDK bounds itself) is read only up to
// maxMessageBytes: the call fails with an unknown outcome instead of
// Countersign holding the body in memory, however long it is.
func TestHTTPEndlessBodyCapped(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	srv.AddTool(&mcp.Tool{Name: "flood", InputSchema: objectSchema}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: text("never sent")}, nil
	})
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	// Stop at 4 times the cap: far past it, yet bounded, so that a
	// Countersign without the cap fails the test instead of the machine.
	const stopAt = 4 * maxMessageBytes
	var written atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !bytes.Contains(body, []byte(`"tools/call"`)) {
			r.Body = io.NopCloser(bytes.NewReader(body))
			sdk.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		n, _ := io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"`)
		written.Add(int64(n))
		for written.Load() < stopAt {
			n, err := w.Write(chunk)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(ts.Close)
	ch := make(changes, 100)
	u := Start(context.Background(), Options{Name: "web", URL: ts.URL, Timeout: 20 * time.Second,
		Logger: slog.New(slog.DiscardHandler), OnChange: ch.onChange})
	t.Cleanup(func() { u.Close() })
	flood := find(ch.wait(t, "tools", has("web__flood")), "web__flood")
	_, err := run(t, flood, `{}`)
	outcomeUnknown(t, err)
	// What the server wrote past the cap sits in socket buffers: a few
	// MiB at most.
	if n := written.Load(); n > maxMessageBytes+8<<20 {
		t.Fatalf("the upstream wrote %d bytes and Countersign read on; the cap is %d", n, maxMessageBytes)
	}
}

// An upstream that sends notifications/tools/list_changed without pause is
// listed again at most once per relistEvery, not once per notification:
// each listing converts and compiles every tool and tells every agent when
// the list differs. The notifications are not lost: the upstream is still
// listed again, once the interval has passed.
func TestListChangedSpamRateLimited(t *testing.T) {
	var listed atomic.Int32
	u := Start(context.Background(), Options{
		Name: "spam", Command: []string{os.Args[0]}, Env: map[string]string{helperEnv: "spam"},
		Logger: slog.New(slog.DiscardHandler), OnChange: func(tools []Tool) {
			if tools != nil {
				listed.Add(1)
			}
		},
	})
	t.Cleanup(func() { u.Close() })
	await := func(n int32) time.Time {
		for deadline := time.Now().Add(10 * time.Second); listed.Load() < n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("listed %d times, want %d", listed.Load(), n)
			}
		}
		return time.Now()
	}
	first := await(1)
	// The flood is not lost: the upstream is listed again.
	await(2)
	// And not more often than once per relistEvery: bounded by the time
	// since the first listing, however slow the machine (before the
	// limit, 16 listings in 1.5 s).
	time.Sleep(2 * relistEvery)
	elapsed := time.Since(first)
	if n, most := listed.Load(), int32(elapsed/relistEvery)+1; n > most {
		t.Fatalf("listed %d times in %v under a flood of list_changed; want at most %d", n, elapsed.Round(time.Millisecond), most)
	}
}

// A tool got from one listing is not sent once the session lists it again
// (list_changed) with another input schema, or not at all: the call was
// made, and perhaps approved, against the tool as it was.
func TestCallChecksTheCurrentListing(t *testing.T) {
	var runs atomic.Int32
	srv := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	write := func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		runs.Add(1)
		return &mcp.CallToolResult{Content: text("written")}, nil
	}
	srv.AddTool(&mcp.Tool{Name: "write", InputSchema: objectSchema}, write)
	srv.AddTool(&mcp.Tool{Name: "erase", InputSchema: objectSchema}, write)
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(ts.Close)
	ch := make(changes, 100)
	u := Start(context.Background(), Options{Name: "web", URL: ts.URL, Logger: slog.New(slog.DiscardHandler), OnChange: ch.onChange})
	t.Cleanup(func() { u.Close() })
	tools := ch.wait(t, "tools", has("web__erase"))
	oldWrite, oldErase := find(tools, "web__write"), find(tools, "web__erase")
	if _, err := run(t, oldWrite, `{}`); err != nil || runs.Load() != 1 {
		t.Fatalf("before the change: %v, %d runs", err, runs.Load())
	}

	srv.AddTool(&mcp.Tool{Name: "write", InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}}}`)}, write)
	srv.RemoveTools("erase")
	ch.wait(t, "the new listing", func(tools []Tool) bool {
		return tools != nil && find(tools, "web__erase").Run == nil && find(tools, "web__write").Pin() != oldWrite.Pin()
	})
	for _, tc := range []struct {
		tool    Tool
		want    string
		changed bool // a *gateway.ToolChangedError says how
	}{
		{oldWrite, "lists write with another input schema now", true},
		{oldErase, "no longer lists erase now", false},
	} {
		_, err := run(t, tc.tool, `{}`)
		if !errors.Is(err, ErrNotSent) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrNotSent saying %q", tc.tool.Name, err, tc.want)
		}
		var changed *gateway.ToolChangedError
		if errors.As(err, &changed) != tc.changed {
			t.Errorf("%s: %v is a ToolChangedError: %v, want %v", tc.tool.Name, err, !tc.changed, tc.changed)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the tools ran %d times, want 1 (before the change)", n)
	}
}

// An upstream whose tool list is huge (here endless pages of one tool with
// a description a sixteenth of maxListBytes, lowered to 1 MiB) is refused
// once the tools listed reach maxListBytes, not held in memory up to the
// page limit: the upstream is down, with an error that says why.
func TestHugeToolListRefused(t *testing.T) {
	// Restored after the upstream is closed (cleanups run last first).
	was := maxListBytes
	t.Cleanup(func() { maxListBytes = was })
	maxListBytes = 1 << 20
	srv := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	var pages atomic.Int32
	big := strings.Repeat("d", maxListBytes/16)
	srv.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method != "tools/list" {
				return next(ctx, method, req)
			}
			n := pages.Add(1)
			return &mcp.ListToolsResult{
				Tools:      []*mcp.Tool{{Name: fmt.Sprintf("t%d", n), Description: big, InputSchema: map[string]any{"type": "object"}}},
				NextCursor: "more",
			}, nil
		}
	})
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(ts.Close)
	u := Start(context.Background(), Options{Name: "web", URL: ts.URL, Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { u.Close() })
	deadline := time.Now().Add(15 * time.Second)
	for st := u.State(); !strings.Contains(st.Err, "listing tools"); st = u.State() {
		if time.Now().After(deadline) {
			t.Fatalf("state %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := u.State(); st.Up || !strings.Contains(st.Err, fmt.Sprintf("more than %d bytes", maxListBytes)) {
		t.Errorf("state %+v", st)
	}
	// The first attempt read 16 pages (a few more by the time the state
	// is read, on the next attempt), not 100.
	if n := pages.Load(); n > 40 {
		t.Errorf("%d pages listed", n)
	}
}

// A tool the upstream lists twice, with different input schemas, is not
// served at all: which of the two the upstream runs is unknown, so policy,
// the approver and the pin would judge one while the upstream ran the other.
func TestToolListedTwiceRefused(t *testing.T) {
	logs := &logBuf{}
	u := &Upstream{opts: Options{Name: "web", Prefix: "web"}, log: logs.logger()}
	tools := u.convert([]*mcp.Tool{
		{Name: "write", InputSchema: map[string]any{"type": "object", "properties": map[string]any{"path": map[string]any{"const": "/tmp/safe"}}}},
		{Name: "write", InputSchema: map[string]any{"type": "object"}},
		{Name: "echo", InputSchema: map[string]any{"type": "object"}},
	})
	if got := names(tools); !reflect.DeepEqual(got, []string{"web__echo"}) {
		t.Fatalf("served %v, want only web__echo", got)
	}
	logs.wait(t, "refusal", func(r map[string]any) bool {
		return r["msg"] == "upstream tool refused" && r["tool"] == "write" && r["error"] == "listed 2 times"
	})
}

// Lists that come while OnChange is busy are not queued: once it returns,
// it receives only the latest of them. Here OnChange blocks on the first
// list while the upstream changes its tools eight times, each change
// listed (relistEvery is lowered) before the next is made.
func TestOnChangeGetsOnlyTheLatestList(t *testing.T) {
	saved := relistEvery
	relistEvery = 10 * time.Millisecond
	t.Cleanup(func() { relistEvery = saved })
	srv := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	noop := func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{}, nil
	}
	srv.AddTool(&mcp.Tool{Name: "v0", InputSchema: objectSchema}, noop)
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(ts.Close)
	blocked, release := make(chan struct{}), make(chan struct{})
	later := make(changes, 100) // the lists received after the first
	first := true
	u := Start(context.Background(), Options{Name: "web", URL: ts.URL, Logger: slog.New(slog.DiscardHandler),
		OnChange: func(tools []Tool) {
			if first {
				first = false
				close(blocked)
				<-release
				return
			}
			later <- tools
		}})
	t.Cleanup(func() { u.Close() })
	select {
	case <-blocked:
	case <-time.After(15 * time.Second):
		t.Fatal("no first list")
	}
	const edits = 8
	for i := 1; i <= edits; i++ {
		name := fmt.Sprintf("v%d", i)
		srv.AddTool(&mcp.Tool{Name: name, InputSchema: objectSchema}, noop)
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if _, tools := u.current(); tools[name].Run != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("change %d not listed", i)
			}
		}
	}
	close(release)
	// The supervisor publishes a listing a moment before it queues it for
	// OnChange, so the list before the newest may come too.
	newest, received := fmt.Sprintf("web__v%d", edits), 0
	later.wait(t, "the newest list", func(tools []Tool) bool {
		received++
		return has(newest)(tools)
	})
	time.Sleep(200 * time.Millisecond)
	if n := len(later); n > 0 {
		t.Fatalf("OnChange received %d lists after the newest", n)
	}
	if received > 2 {
		t.Fatalf("OnChange received %d lists once it returned, want at most 2, the last the newest", received)
	}
}

// An OnChange that never returns does not keep Close from returning: Close
// waits for it onChangeWait (lowered here), then returns an error saying
// so, and the call, once it returns, is the last.
func TestCloseDoesNotWaitForeverForOnChange(t *testing.T) {
	saved := onChangeWait
	onChangeWait = 300 * time.Millisecond
	t.Cleanup(func() { onChangeWait = saved })
	h := newHTTPUpstream(t)
	blocked, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	u := Start(context.Background(), Options{Name: "web", URL: h.ts.URL, Logger: slog.New(slog.DiscardHandler),
		OnChange: func([]Tool) {
			if calls.Add(1) == 1 {
				close(blocked)
			}
			<-release
		}})
	select {
	case <-blocked:
	case <-time.After(15 * time.Second):
		t.Fatal("no first list")
	}
	// A list queued behind the blocked call: never delivered after Close.
	h.srv.AddTool(&mcp.Tool{Name: "new", InputSchema: objectSchema}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{}, nil
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, tools := u.current(); tools["new"].Run != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the new tool not listed")
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- u.Close() }()
	var err error
	select {
	case err = <-closed:
	case <-time.After(onChangeWait + 5*time.Second):
		close(release)
		t.Fatalf("Close has not returned after %v with OnChange blocked; the bound is %v", onChangeWait+5*time.Second, onChangeWait)
	}
	if err == nil || !strings.Contains(err.Error(), "upstream web: OnChange has not returned after 300ms") {
		t.Fatalf("Close: %v", err)
	}
	close(release)
	select {
	case <-u.delivered:
	case <-time.After(5 * time.Second):
		t.Fatal("the delivering goroutine did not end once OnChange returned")
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("OnChange called %d times, want once", n)
	}
}

// A stdio upstream that floods its stderr (here 64 MB or more, as fast as
// it can) gets no more of it logged than its budget allows, and is not
// slowed down: its stderr is drained as fast as it writes, so that its
// calls, which write to stderr too, answer at once while it floods. The
// lines dropped are summarized while it runs (stderrReportEvery is
// lowered), and each line is either logged or counted as dropped.
func TestStdioStderrFlood(t *testing.T) {
	saved := stderrReportEvery
	stderrReportEvery = 200 * time.Millisecond
	t.Cleanup(func() { stderrReportEvery = saved })
	var logs logBuf
	ch := make(changes, 100)
	begin := time.Now()
	u := Start(context.Background(), Options{Name: "noisy", Command: []string{os.Args[0]}, Env: map[string]string{helperEnv: "flood"},
		Logger: logs.logger(), OnChange: ch.onChange})
	t.Cleanup(func() { u.Close() })
	tools := ch.wait(t, "tools", has("noisy__flooded"))
	if _, err := run(t, find(tools, "noisy__flood"), `{}`); err != nil {
		t.Fatal(err)
	}
	echoed := 0 // bytes of the echo lines
	for i := range 5 {
		arg, start := fmt.Sprintf("call %d", i), time.Now()
		r, err := runFor(t, 10*time.Second, find(tools, "noisy__echo"), fmt.Sprintf(`{"text":%q}`, arg))
		if err != nil || firstText(t, r) != arg {
			t.Fatalf("%s during the flood: %+v, %v", arg, r, err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("%s during the flood took %v", arg, d)
		}
		echoed += len("echo " + arg)
	}
	const enough = 64_000_000
	count := func(tool string) int {
		t.Helper()
		start := time.Now()
		r, err := runFor(t, 10*time.Second, find(tools, "noisy__"+tool), `{}`)
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("%s during the flood took %v", tool, d)
		}
		var n int
		fmt.Sscan(firstText(t, r), &n)
		return n
	}
	for deadline := time.Now().Add(30 * time.Second); count("flooded") < enough; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the flood is not drained: %d bytes written in 30 s", count("flooded"))
		}
	}
	// The log as a whole, of 64 MB of stderr: the budget, and each
	// record's own fields.
	logSize := func() int {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		return logs.b.Len()
	}
	budget := func(elapsed time.Duration) (lines, bytes int) {
		return stderrLineBurst + int(stderrLinesPerSec*elapsed.Seconds()) + 1,
			stderrByteBurst + int(stderrBytesPerSec*elapsed.Seconds()) + 1
	}
	const perRecord, others = 256, 50
	if lines, bytes := budget(time.Since(begin)); logSize() > bytes+perRecord*(lines+others) {
		t.Fatalf("the log holds %d bytes after %v; the budget is %d lines, %d bytes", logSize(), time.Since(begin).Round(time.Millisecond), lines, bytes)
	}
	logs.wait(t, "a summary of the lines dropped, while the upstream runs", func(r map[string]any) bool {
		return r["msg"] == "upstream stderr dropped"
	})
	flooded := count("stop")
	u.Close()
	elapsed := time.Since(begin)

	var logged, loggedBytes, dropped, droppedBytes, records int
	for _, r := range logs.records() {
		records++
		switch r["msg"] {
		case "upstream stderr":
			logged++
			loggedBytes += len(r["line"].(string))
		case "upstream stderr dropped":
			dropped += int(r["lines"].(float64))
			droppedBytes += int(r["bytes"].(float64))
		default:
			continue
		}
		if r["upstream"] != "noisy" {
			t.Errorf("record %v does not name the upstream", r)
		}
	}
	t.Logf("in %v, %d lines (%d bytes) logged, %d lines (%d bytes) dropped", elapsed.Round(time.Millisecond), logged, loggedBytes, dropped, droppedBytes)
	mostLines, mostBytes := budget(elapsed)
	if logged > mostLines || loggedBytes > mostBytes {
		t.Errorf("in %v, %d lines (%d bytes) logged; the budget is %d lines, %d bytes", elapsed.Round(time.Millisecond), logged, loggedBytes, mostLines, mostBytes)
	}
	if most := mostBytes + perRecord*(mostLines+others); logSize() > most || records > mostLines+others {
		t.Errorf("the log holds %d records, %d bytes, of %d MB of stderr; want at most %d records, %d bytes", records, logSize(), flooded/1_000_000, mostLines+others, most)
	}
	if lines, bytes := logged+dropped, loggedBytes+droppedBytes; lines != flooded/100+5 || bytes != flooded/100*99+echoed {
		t.Errorf("logged and dropped: %d lines, %d bytes; the upstream wrote %d lines, %d bytes", lines, bytes, flooded/100+5, flooded/100*99+echoed)
	}
}
