package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/tasks"
)

// elicitation declares the client's elicitation capability (2026-07-28).
var elicitation = map[string]any{"elicitation": map[string]any{}}

// sseMessage is one JSON-RPC message of a text/event-stream response.
type sseMessage struct {
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
}

// sseMessages parses a text/event-stream body into its JSON-RPC messages.
func sseMessages(tb testing.TB, r rpc) []sseMessage {
	tb.Helper()
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		tb.Fatalf("want a stream, got HTTP %d %s: %s", r.Status, ct, r.Body)
	}
	var out []sseMessage
	sc := bufio.NewScanner(bytes.NewReader(r.Body))
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data:")
		if !ok {
			continue
		}
		var m sseMessage
		if err := json.Unmarshal([]byte(strings.TrimSpace(data)), &m); err != nil {
			tb.Fatalf("stream event %q: %v", data, err)
		}
		out = append(out, m)
	}
	return out
}

// notes returns the params of the stream's notifications of one method,
// and checks that the stream ends with the result.
func notes(tb testing.TB, msgs []sseMessage, method string) []map[string]any {
	tb.Helper()
	if len(msgs) == 0 || msgs[len(msgs)-1].Result == nil {
		tb.Fatalf("the stream must end with the result: %+v", msgs)
	}
	var out []map[string]any
	for _, m := range msgs {
		if m.Method != method {
			continue
		}
		var p map[string]any
		if err := json.Unmarshal(m.Params, &p); err != nil {
			tb.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

func TestProgressIsStreamedWhenAsked(t *testing.T) {
	h := newConformanceHarness(t)
	for _, era := range []tasks.Era{tasks.Era2025, tasks.Era2026} {
		t.Run(string(era), func(t *testing.T) {
			r := h.do(t, call{era: era, method: "tools/call", params: map[string]any{
				"name": "test_tool_with_progress", "arguments": map[string]any{},
				"_meta": map[string]any{"progressToken": "p-1"},
			}})
			got := notes(t, sseMessages(t, r), "notifications/progress")
			if len(got) != 3 {
				t.Fatalf("want 3 progress notifications, got %v", got)
			}
			for i, want := range []float64{0, 50, 100} {
				if got[i]["progressToken"] != "p-1" || got[i]["progress"] != want || got[i]["total"] != 100.0 {
					t.Errorf("notification %d: %v", i, got[i])
				}
			}
		})
	}
	t.Run("no token: JSON", func(t *testing.T) {
		r := h.confCall(t, tasks.Era2026, false, "test_tool_with_progress", map[string]any{})
		var res toolCallResult
		r.ok(t, &res)
		if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("Content-Type %q", ct)
		}
	})
	t.Run("JSON-only client: JSON", func(t *testing.T) {
		r := h.do(t, call{era: tasks.Era2026, method: "tools/call", headers: map[string]string{"Accept": "application/json"}, params: map[string]any{
			"name": "test_tool_with_progress", "arguments": map[string]any{},
			"_meta": map[string]any{"progressToken": "p-2"},
		}})
		// The SDK's stateless handler wants both media types; whatever it
		// answers, it is not a stream.
		if ct := r.Header.Get("Content-Type"); strings.HasPrefix(ct, "text/event-stream") {
			t.Errorf("a client that does not accept a stream got one: %s", r.Body)
		}
	})
}

func TestLogMessagesFollowTheLevel(t *testing.T) {
	h := newConformanceHarness(t)
	// 2025-11-25: the session's logging/setLevel cannot be remembered by a
	// stateless server; a streamed call gets info and above.
	r := h.confCall(t, tasks.Era2025, false, "test_tool_with_logging", map[string]any{})
	if got := notes(t, sseMessages(t, r), "notifications/message"); len(got) != 3 || got[0]["data"] != "Tool execution started" || got[0]["level"] != "info" {
		t.Errorf("2025-11-25: want 3 info messages, got %v", got)
	}
	// 2026-07-28: only when the request asks for a level.
	r = h.confCall(t, tasks.Era2026, false, "test_logging_tool", map[string]any{})
	if got := notes(t, sseMessages(t, r), "notifications/message"); len(got) != 0 {
		t.Errorf("2026-07-28 without a log level: %v", got)
	}
	r = h.do(t, call{era: tasks.Era2026, method: "tools/call", params: map[string]any{
		"name": "test_logging_tool", "arguments": map[string]any{},
		"_meta": map[string]any{"io.modelcontextprotocol/logLevel": "warning"},
	}})
	if got := notes(t, sseMessages(t, r), "notifications/message"); len(got) != 0 {
		t.Errorf("2026-07-28 at warning, info messages: %v", got)
	}
	r = h.do(t, call{era: tasks.Era2026, method: "tools/call", params: map[string]any{
		"name": "test_logging_tool", "arguments": map[string]any{},
		"_meta": map[string]any{"io.modelcontextprotocol/logLevel": "debug"},
	}})
	if got := notes(t, sseMessages(t, r), "notifications/message"); len(got) != 3 {
		t.Errorf("2026-07-28 at debug: want 3 messages, got %v", got)
	}
}

func TestProgressOutsideAStreamIsANoOp(t *testing.T) {
	h := newConformanceHarness(t)
	s := h.srv
	// No call info, no notifier, no token: nothing happens, nothing panics.
	s.progress(context.Background(), 1, 2, "x")
	s.logToClient(context.Background(), "info", "x")
	ctx := context.WithValue(context.Background(), callInfoKey{}, &callInfo{})
	s.progress(ctx, 1, 2, "x")
	s.logToClient(ctx, "info", "x")
	ctx = context.WithValue(context.Background(), callInfoKey{}, &callInfo{notify: &notifier{token: "t"}})
	s.progress(ctx, 1, 2, "x")
}

func TestInputRequestsFollowClientCapabilities(t *testing.T) {
	h := newConformanceHarness(t)
	var ask struct {
		ResultType    string                     `json:"resultType"`
		InputRequests map[string]json.RawMessage `json:"inputRequests"`
	}
	h.do(t, call{era: tasks.Era2026, caps: map[string]any{"sampling": map[string]any{}}, method: "tools/call", params: map[string]any{
		"name": "test_input_required_result_capabilities", "arguments": map[string]any{},
	}}).ok(t, &ask)
	if ask.ResultType != "input_required" || len(ask.InputRequests) != 1 || ask.InputRequests["capital_question"] == nil {
		t.Errorf("a client with sampling only must be asked only to sample: %+v", ask)
	}
	// A client that can answer none of the questions.
	r := h.confCall(t, tasks.Era2026, false, "test_input_required_result_capabilities", map[string]any{})
	r.fails(t, http.StatusBadRequest, codeMissingCapability)
	if !strings.Contains(string(r.Error.Data), `"requiredCapabilities"`) {
		t.Errorf("data: %s", r.Error.Data)
	}
}

func TestRequiredClientCapability(t *testing.T) {
	h := newConformanceHarness(t)
	r := h.confCall(t, tasks.Era2026, false, "test_missing_capability", map[string]any{})
	r.fails(t, http.StatusBadRequest, codeMissingCapability)
	if string(r.Error.Data) != `{"requiredCapabilities":{"sampling":{}}}` {
		t.Errorf("data: %s", r.Error.Data)
	}
	var res toolCallResult
	h.do(t, call{era: tasks.Era2026, caps: map[string]any{"sampling": map[string]any{}}, method: "tools/call", params: map[string]any{
		"name": "test_missing_capability", "arguments": map[string]any{},
	}}).ok(t, &res)
	if res.IsError {
		t.Errorf("with sampling declared: %+v", res)
	}
}

func TestToolsOnlyServerRefusesOtherFeatures(t *testing.T) {
	h := newHarness(t, nil)
	for _, era := range []tasks.Era{tasks.Era2025, tasks.Era2026} {
		for _, method := range []string{"prompts/list", "resources/list", "resources/templates/list", "completion/complete"} {
			r := h.do(t, call{token: tok(principal(t, "a")), era: era, method: method, params: map[string]any{}})
			if r.Error == nil || r.Error.Code != codeMethodNotFound {
				t.Errorf("%s %s: want -32601, got HTTP %d: %s", era, method, r.Status, r.Body)
			}
		}
	}
}

// Many goroutines report progress for one call, and one keeps reporting
// after the tool has returned: the client sees strictly increasing values,
// the stream ends with the result (notes checks it: nothing trails it),
// and nothing races.
func TestProgressConcurrentAndAfterTheResult(t *testing.T) {
	stop := make(chan struct{})
	after := make(chan struct{})
	tool := gateway.Tool{
		Name: "race_progress", Upstream: "race", UpstreamTool: "progress", Approval: "never",
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Run: func(_ context.Context, call gateway.Call) (tasks.CallToolResult, error) {
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					for i := range 50 {
						call.ReportProgress(float64(i*8+g%3), 0, "")
					}
				})
			}
			wg.Wait()
			go func() {
				defer close(after)
				for i := 1000; ; i++ {
					select {
					case <-stop:
						return
					default:
						call.ReportProgress(float64(i), 0, "late")
						call.Log("info", "late")
					}
				}
			}()
			return tasks.CallToolResult{Content: []json.RawMessage{tasks.TextContent("done")}}, nil
		},
	}
	reg, err := gateway.NewRegistry(tool)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *Options) { o.Tools = reg })
	r := h.do(t, call{token: tok(principal(t, "a")), era: tasks.Era2026, method: "tools/call", params: map[string]any{
		"name": "race_progress", "arguments": map[string]any{}, "_meta": map[string]any{"progressToken": 7},
	}})
	close(stop)
	<-after
	got := notes(t, sseMessages(t, r), "notifications/progress")
	if len(got) == 0 {
		t.Fatal("no progress notifications")
	}
	last := -1.0
	for _, p := range got {
		v, _ := p["progress"].(float64)
		if v <= last || p["progressToken"] != 7.0 {
			t.Fatalf("progress not strictly increasing: %v", got)
		}
		last = v
	}
}
