package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mcpgoclient "github.com/mark3labs/mcp-go/client"
	mcpgotransport "github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/tasks"
)

// newListHarness serves an endpoint over a registry of its own (the demo
// tools), so that a test can change the tool list without disturbing the
// others.
func newListHarness(t *testing.T, tweak func(*Options)) (*harness, *gateway.Registry) {
	t.Helper()
	reg, err := gateway.NewRegistry(gateway.DemoTools(sharedEnv(t).ledger)...)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *Options) {
		o.Tools = reg
		if tweak != nil {
			tweak(o)
		}
	})
	return h, reg
}

// upstreamTool is a tool as an upstream named "up" would bring it.
func upstreamTool(name string) gateway.Tool {
	return gateway.Tool{
		Name: "up__" + name, Upstream: "up", UpstreamTool: name,
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Run: func(context.Context, gateway.Call) (tasks.CallToolResult, error) {
			return tasks.CallToolResult{}, nil
		},
	}
}

// waitFor polls cond until it holds, or fails the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("%s: not after %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// noStreamGoroutines waits until no goroutine serves a notification stream
// (ours, their keep-alives, the SDK's listen handler): a stream whose
// client left or that CloseStreams ended must leave nothing behind.
func noStreamGoroutines(t *testing.T) {
	t.Helper()
	var left string
	waitFor(t, 10*time.Second, "stream goroutines gone", func() bool {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		left = ""
		for _, fn := range []string{"mcpserver.(*Server).serveGET", "mcpserver.(*Server).serveListen", "mcp.(*Server).subscriptionsListen"} {
			if strings.Contains(stacks, fn) {
				left = fn
			}
		}
		return left == ""
	})
}

// expectNotified waits for one notification on ch and then for quiet.
func expectNotified(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no notifications/tools/list_changed", what)
	}
}

func expectQuiet(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("%s: notifications/tools/list_changed, but the served list did not change", what)
	case <-time.After(300 * time.Millisecond):
	}
}

// changeTools adds up__echo, lists, changes nothing, removes it, lists:
// each real change must reach the client, and a re-list must show it.
func changeTools(t *testing.T, reg *gateway.Registry, notified <-chan struct{}, list func() []string) {
	t.Helper()
	if err := reg.Replace("up", []gateway.Tool{upstreamTool("echo")}); err != nil {
		t.Fatal(err)
	}
	expectNotified(t, notified, "tool added")
	if got := list(); !slices.Contains(got, "up__echo") || !slices.Contains(got, "transfer_funds") {
		t.Fatalf("tools after the upstream added one: %v", got)
	}
	// The same list again: nothing to tell.
	if err := reg.Replace("up", []gateway.Tool{upstreamTool("echo")}); err != nil {
		t.Fatal(err)
	}
	expectQuiet(t, notified, "same tools")
	if err := reg.Replace("up", nil); err != nil {
		t.Fatal(err)
	}
	expectNotified(t, notified, "tool removed")
	if got := list(); slices.Contains(got, "up__echo") || !slices.Contains(got, "transfer_funds") {
		t.Fatalf("tools after the upstream removed one: %v", got)
	}
}

// goSDKListener connects the go-sdk client in the era of version with a
// ToolListChangedHandler. In 2026-07-28 the client opens subscriptions/listen
// itself once server/discover declares tools.listChanged; in 2025-11-25 it
// opens the standalone GET stream after initialize.
func goSDKListener(t *testing.T, h *harness, p, version string) (*mcp.ClientSession, <-chan struct{}) {
	t.Helper()
	notified := make(chan struct{}, 16)
	c := mcp.NewClient(&mcp.Implementation{Name: "go-sdk-listen-test", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { notified <- struct{}{} },
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   h.ts.URL,
		HTTPClient: &http.Client{Transport: clientShim{token: tok(p)}},
	}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	if got := cs.InitializeResult().ProtocolVersion; got != version {
		t.Fatalf("negotiated %s, want %s", got, version)
	}
	if caps := cs.InitializeResult().Capabilities; caps.Tools == nil || !caps.Tools.ListChanged {
		t.Fatalf("capabilities %+v: no tools.listChanged", caps)
	}
	return cs, notified
}

func sdkToolNames(t *testing.T, cs *mcp.ClientSession) func() []string {
	return func() []string {
		t.Helper()
		res, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatalf("tools/list: %v", err)
		}
		var names []string
		for _, tl := range res.Tools {
			names = append(names, tl.Name)
		}
		return names
	}
}

// TestGoSDKClientHearsToolListChanged: the go-sdk client in each era opens
// its notification stream by itself (2026-07-28: subscriptions/listen,
// whose first event is the acknowledgement, sent once the subscription is
// registered; 2025-11-25: the GET stream) and hears every change.
func TestGoSDKClientHearsToolListChanged(t *testing.T) {
	for _, tc := range []struct {
		era    tasks.Era
		stream string
	}{{tasks.Era2026, "listen stream"}, {tasks.Era2025, "GET stream"}} {
		t.Run(string(tc.era), func(t *testing.T) {
			h, reg := newListHarness(t, nil)
			p := principal(t, "a")
			cs, notified := goSDKListener(t, h, p, string(tc.era))
			waitFor(t, 10*time.Second, tc.stream, func() bool { return h.srv.streams.liveCount(p) == 1 })
			changeTools(t, reg, notified, sdkToolNames(t, cs))

			if err := cs.Close(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 10*time.Second, "stream released after the client left", func() bool {
				return h.srv.streams.openCount(p) == 0 && h.srv.streams.liveCount(p) == 0
			})
			noStreamGoroutines(t)
		})
	}
}

func TestMCPGoLegacyClientHearsToolListChanged(t *testing.T) {
	h, reg := newListHarness(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := principal(t, "a")
	tr, err := mcpgotransport.NewStreamableHTTP(h.ts.URL,
		mcpgotransport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + tok(p)}),
		//lint:ignore SA1019 the standalone GET stream is exactly what the 2025-11-25 test needs
		mcpgotransport.WithContinuousListening())
	if err != nil {
		t.Fatal(err)
	}
	c := mcpgoclient.NewClient(tr, mcpgoclient.WithProtocolVersion(mcpgo.LATEST_LEGACY_PROTOCOL_VERSION))
	notified := make(chan struct{}, 16)
	c.OnNotification(func(n mcpgo.JSONRPCNotification) {
		if n.Method == "notifications/tools/list_changed" {
			notified <- struct{}{}
		}
	})
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	init, err := c.Initialize(ctx, mcpgo.InitializeRequest{Params: mcpgo.InitializeParams{
		ProtocolVersion: "2025-11-25",
		ClientInfo:      mcpgo.Implementation{Name: "mcp-go-listen-test", Version: "1"},
	}})
	if err != nil {
		t.Fatalf("initialize: %v", err)
	}
	if init.ProtocolVersion != "2025-11-25" || init.Capabilities.Tools == nil || !init.Capabilities.Tools.ListChanged {
		t.Fatalf("initialize: %+v", init)
	}
	waitFor(t, 10*time.Second, "GET stream", func() bool { return h.srv.streams.liveCount(p) == 1 })
	changeTools(t, reg, notified, func() []string {
		res, err := c.ListTools(ctx, mcpgo.ListToolsRequest{})
		if err != nil {
			t.Fatalf("tools/list: %v", err)
		}
		var names []string
		for _, tl := range res.Tools {
			names = append(names, tl.Name)
		}
		return names
	})

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "stream released after the client left", func() bool {
		return h.srv.streams.openCount(p) == 0 && h.srv.streams.liveCount(p) == 0
	})
	noStreamGoroutines(t)
}

// openStream opens a raw notification stream: a 2025-11-25 GET, or a
// 2026-07-28 subscriptions/listen POST when listen is set.
func openStream(t *testing.T, h *harness, p string, listen bool, hdr map[string]string) *http.Response {
	t.Helper()
	method, body := http.MethodGet, []byte(nil)
	req, err := http.NewRequest(method, h.ts.URL, nil)
	if listen {
		body, _ = json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "method": "subscriptions/listen", "params": map[string]any{
			"notifications": map[string]any{"toolsListChanged": true},
			"_meta": map[string]any{
				"io.modelcontextprotocol/protocolVersion":    string(tasks.Era2026),
				"io.modelcontextprotocol/clientCapabilities": map[string]any{},
				"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "raw-test", "version": "1"},
			},
		}})
		req, err = http.NewRequest(http.MethodPost, h.ts.URL, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", string(tasks.Era2026))
		req.Header.Set("Mcp-Method", "subscriptions/listen")
	} else {
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", string(tasks.Era2025))
	}
	if err != nil {
		t.Fatal(err)
	}
	if p != "" {
		req.Header.Set("Authorization", "Bearer "+tok(p))
	}
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// readUntil reads SSE lines until one contains want, or fails.
func readUntil(t *testing.T, sc *bufio.Scanner, want string) {
	t.Helper()
	got := make(chan bool, 1)
	go func() {
		for sc.Scan() {
			if strings.Contains(sc.Text(), want) {
				got <- true
				return
			}
		}
		got <- false
	}()
	select {
	case ok := <-got:
		if !ok {
			t.Fatalf("stream ended before %q", want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no %q on the stream", want)
	}
}

func TestNotificationStreams(t *testing.T) {
	h, reg := newListHarness(t, func(o *Options) {
		o.KeepAlive = 50 * time.Millisecond
		o.MaxStreamsPerPrincipal = 2
		o.MaxInFlightPerPrincipal = 1
	})
	p := principal(t, "a")

	for _, c := range []struct {
		name   string
		token  string
		hdr    map[string]string
		status int
	}{
		{"no token", "", nil, http.StatusUnauthorized},
		{"not accepting SSE", p, map[string]string{"Accept": "application/json"}, http.StatusNotAcceptable},
		{"no Accept", p, map[string]string{"Accept": ""}, http.StatusNotAcceptable},
		{"2026-07-28 has no GET stream", p, map[string]string{"Mcp-Protocol-Version": string(tasks.Era2026)}, http.StatusMethodNotAllowed},
	} {
		resp := openStream(t, h, c.token, false, c.hdr)
		if resp.StatusCode != c.status {
			t.Errorf("%s: HTTP %d, want %d", c.name, resp.StatusCode, c.status)
		}
		resp.Body.Close()
	}

	// A listen the SDK refuses (no notifications filter) is a plain
	// JSON-RPC error, and gives its stream slot back.
	h.do(t, call{token: tok(p), era: tasks.Era2026, method: "subscriptions/listen"}).fails(t, http.StatusBadRequest, codeInvalidParams)
	if n := h.srv.streams.openCount(p); n != 0 {
		t.Fatalf("%d streams open after a refused listen", n)
	}

	// A GET stream: headers, keep-alives, the notification.
	get := openStream(t, h, p, false, nil)
	if get.StatusCode != http.StatusOK || get.Header.Get("Content-Type") != "text/event-stream" || get.Header.Get("X-Accel-Buffering") != "no" {
		t.Fatalf("GET: HTTP %d, headers %v", get.StatusCode, get.Header)
	}
	getLines := bufio.NewScanner(get.Body)
	readUntil(t, getLines, ": keep-alive")

	// A listen stream, the SDK's, through our layers: keep-alives too.
	listen := openStream(t, h, p, true, nil)
	if listen.StatusCode != http.StatusOK || listen.Header.Get("Content-Type") != "text/event-stream" || listen.Header.Get("X-Accel-Buffering") != "no" {
		t.Fatalf("listen: HTTP %d, headers %v", listen.StatusCode, listen.Header)
	}
	listenLines := bufio.NewScanner(listen.Body)
	readUntil(t, listenLines, "notifications/subscriptions/acknowledged")
	readUntil(t, listenLines, ": keep-alive")

	// Streams hold no in-flight slot: with a cap of one, requests still run.
	h.do(t, call{token: tok(p), era: tasks.Era2026, method: "tools/list"}).ok(t, nil)
	h.do(t, call{token: tok(p), era: tasks.Era2025, method: "tools/list"}).ok(t, nil)

	// But the principal's streams are capped; another principal's are not.
	for _, listen := range []bool{false, true} {
		over := openStream(t, h, p, listen, nil)
		var r rpc
		_ = json.NewDecoder(over.Body).Decode(&r)
		if over.StatusCode != http.StatusTooManyRequests || r.Error == nil || r.Error.Code != CodeTooManyRequests ||
			!strings.Contains(r.Error.Message, "Too many open notification streams") {
			t.Errorf("stream over the cap (listen %v): HTTP %d %+v", listen, over.StatusCode, r.Error)
		}
		over.Body.Close()
	}
	other := openStream(t, h, principal(t, "b"), false, nil)
	if other.StatusCode != http.StatusOK {
		t.Errorf("another principal's stream: HTTP %d", other.StatusCode)
	}
	other.Body.Close()

	// A change reaches both streams.
	if err := reg.Replace("up", []gateway.Tool{upstreamTool("echo")}); err != nil {
		t.Fatal(err)
	}
	readUntil(t, getLines, `data: {"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`)
	readUntil(t, listenLines, `"method":"notifications/tools/list_changed"`)

	// Shutdown ends both streams and refuses new ones.
	h.srv.CloseStreams()
	for name, sc := range map[string]*bufio.Scanner{"GET": getLines, "listen": listenLines} {
		ended := make(chan struct{})
		go func() {
			for sc.Scan() {
			}
			close(ended)
		}()
		select {
		case <-ended:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s stream still open after CloseStreams", name)
		}
	}
	waitFor(t, 10*time.Second, "streams released", func() bool {
		return h.srv.streams.openCount(p) == 0 && h.srv.streams.liveCount(p) == 0
	})
	noStreamGoroutines(t)
	late := openStream(t, h, p, false, nil)
	if late.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("GET after CloseStreams: HTTP %d", late.StatusCode)
	}
}

// A change while a 2025-11-25 request is in flight (its stateless session
// is a "legacy session" the SDK tries to notify, on a stream it does not
// have) logs nothing: tool changes are routine.
func TestToolChangeDuringLegacyRequestIsQuiet(t *testing.T) {
	h, reg := newListHarness(t, nil)
	p := principal(t, "a")
	id := h.createTask(t, p, tasks.Era2025, acct(t, "wait"))
	done := make(chan rpc, 1)
	go func() {
		r, err := h.try(call{token: tok(p), era: tasks.Era2025, method: "tasks/result", params: map[string]any{"taskId": id}})
		if err != nil {
			r.Body = []byte(err.Error())
		}
		done <- r
	}()
	time.Sleep(300 * time.Millisecond) // tasks/result is waiting
	if err := reg.Replace("up", []gateway.Tool{upstreamTool("echo")}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // past the SDK's 10 ms debounce
	if _, err := h.env.workflow.Cancel(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("tasks/result did not return after the task ended")
	}
	if logs := h.log.String(); strings.Contains(logs, "list_changed") {
		t.Errorf("a routine tool change was logged:\n%s", logs)
	}
}

// EndStreams ends one principal's streams (its token was disabled or
// revoked), both kinds, and leaves another principal's open.
func TestEndStreams(t *testing.T) {
	h, _ := newListHarness(t, func(o *Options) { o.KeepAlive = 50 * time.Millisecond })
	p, q := principal(t, "a"), principal(t, "b")
	get := openStream(t, h, p, false, nil)
	listen := openStream(t, h, p, true, nil)
	other := openStream(t, h, q, false, nil)
	defer other.Body.Close()
	for _, r := range []*http.Response{get, listen, other} {
		if r.StatusCode != http.StatusOK {
			t.Fatalf("open: HTTP %d", r.StatusCode)
		}
	}
	getLines, listenLines, otherLines := bufio.NewScanner(get.Body), bufio.NewScanner(listen.Body), bufio.NewScanner(other.Body)
	readUntil(t, getLines, ": keep-alive")
	readUntil(t, listenLines, "notifications/subscriptions/acknowledged")

	h.srv.EndStreams(p)
	for name, sc := range map[string]*bufio.Scanner{"GET": getLines, "listen": listenLines} {
		ended := make(chan struct{})
		go func() {
			for sc.Scan() {
			}
			close(ended)
		}()
		select {
		case <-ended:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s stream still open after EndStreams", name)
		}
	}
	waitFor(t, 10*time.Second, "streams released", func() bool {
		return h.srv.streams.openCount(p) == 0 && h.srv.streams.liveCount(p) == 0
	})
	readUntil(t, otherLines, ": keep-alive") // the other principal's goes on
	if n := h.srv.streams.openCount(q); n != 1 {
		t.Fatalf("other principal: %d streams", n)
	}
}

// TestStreamRevokedAsItOpens: a token revoked after its request was
// authenticated but before its stream was registered for EndStreams (the
// revocation's EndStreams found nothing to end) must not get a stream that
// outlives it: the token is checked again once the stream is registered.
func TestStreamRevokedAsItOpens(t *testing.T) {
	var calls atomic.Int64
	h, _ := newListHarness(t, func(o *Options) {
		o.Authenticate = func(ctx context.Context, bearer string) (string, error) {
			if bearer == "tok:late-revoked" && calls.Add(1)%2 == 0 {
				return "", errors.New("revoked") // every second check: revoked meanwhile
			}
			return testAuth(ctx, bearer)
		}
	})
	for _, listen := range []bool{false, true} {
		r := openStream(t, h, "late-revoked", listen, nil)
		r.Body.Close()
		if r.StatusCode != http.StatusUnauthorized {
			t.Errorf("listen=%v: HTTP %d, want 401", listen, r.StatusCode)
		}
	}
	if n := h.srv.streams.openCount("late-revoked"); n != 0 {
		t.Errorf("%d streams left open", n)
	}
}

// SEP-2663, Task Status Notifications: a client that asks for task status
// notifications on subscriptions/listen without declaring the tasks
// extension gets -32021 naming it. A declaring client is acknowledged
// without taskIds: this server agrees to send none, and the client polls.
func TestListenTaskIDsNeedTasksExtension(t *testing.T) {
	h := newHarness(t, nil)
	p := tok(principal(t, "a"))
	params := map[string]any{"notifications": map[string]any{"taskIds": []string{"tsk_x"}, "toolsListChanged": true}}
	r := h.do(t, call{token: p, era: tasks.Era2026, method: methodListen, params: params})
	r.fails(t, http.StatusBadRequest, codeMissingCapability)
	if want := string(missingTasksData); string(r.Error.Data) != want {
		t.Errorf("data %s, want %s", r.Error.Data, want)
	}
	resp := openListen(t, h, p, params, true)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, "notifications/subscriptions/acknowledged") {
			if strings.Contains(line, "taskIds") || !strings.Contains(line, "toolsListChanged") {
				t.Errorf("acknowledgement: %s", line)
			}
			return
		}
	}
	t.Fatalf("no acknowledgement (HTTP %d)", resp.StatusCode)
}

// openListen opens a 2026-07-28 subscriptions/listen with params, for at
// most two seconds.
func openListen(t *testing.T, h *harness, token string, params map[string]any, declare bool) *http.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	t.Cleanup(cancel)
	caps := map[string]any{}
	if declare {
		caps["extensions"] = map[string]any{tasks.ExtTasks: map[string]any{}}
	}
	p := map[string]any{"_meta": map[string]any{
		"io.modelcontextprotocol/protocolVersion":    string(tasks.Era2026),
		"io.modelcontextprotocol/clientCapabilities": caps,
	}}
	for k, v := range params {
		p[k] = v
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": methodListen, "params": p})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.ts.URL, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", string(tasks.Era2026))
	req.Header.Set("Mcp-Method", methodListen)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}
