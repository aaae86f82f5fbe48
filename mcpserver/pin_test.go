package mcpserver

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/approvals/approvalstest"
	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
)

// TestGatedCallPinsItsTool: a call held for approval carries, in its
// envelope and in the record a resume starts it from, the pin of the tool
// as this endpoint served it (gateway.Tool.Pin), which ExecuteTool checks.
func TestGatedCallPinsItsTool(t *testing.T) {
	e := sharedEnv(t)
	rec := &approvalstest.Recording{Engine: e.workflow}
	h := e.serve(t, func(o *Options) {
		o.PublicURL = "http://countersign.test"
		o.Authenticate = testAuth
	}, func(ao *approvals.Options) { ao.Engine = rec })
	who := principal(t, "a")
	var task taskResult2026
	h.do(t, call{token: tok(who), era: tasks.Era2026, tasks: true, method: "tools/call",
		params: map[string]any{"name": "transfer_funds", "arguments": transferArgs("acct-pin", 5000)}}).ok(t, &task)
	if task.TaskID == "" {
		t.Fatalf("want a task, got %+v", task)
	}
	if err := h.approvals.WaitStart(context.Background(), task.TaskID); err != nil {
		t.Fatal(err)
	}
	tool, _ := e.tools.Lookup("transfer_funds")
	want := tool.Pin()
	inputs := rec.Inputs()
	if len(inputs) != 1 || !cmp.Equal(inputs[0].Envelope.ToolPin, &want) {
		t.Fatalf("started envelopes %+v, want one pinned %+v", inputs, want)
	}
	r, err := e.store.Get(context.Background(), task.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if r.Start == nil || !cmp.Equal(r.Start.ToolPin, &want) {
		t.Fatalf("record start facts %+v, want the pin %+v", r.Start, want)
	}
}

// TestAllowedCallRunsOnlyTheToolDecidedOn: a call policy allowed runs only
// against the tool policy saw. If an upstream's new listing replaces the
// tool between the decision and the run, nothing is sent and the caller is
// told why; the tool as it is now runs when called again.
func TestAllowedCallRunsOnlyTheToolDecidedOn(t *testing.T) {
	e := sharedEnv(t)
	var runs atomic.Int32
	served := func(schema string) gateway.Tool {
		return gateway.Tool{
			Name: "up__write", Upstream: "up", UpstreamTool: "write",
			Endpoint: gateway.Endpoint{URL: "http://up.test/mcp"}, InputSchema: json.RawMessage(schema),
			Run: func(context.Context, gateway.Call) (tasks.CallToolResult, error) {
				runs.Add(1)
				return tasks.CallToolResult{Content: []json.RawMessage{json.RawMessage(`{"type":"text","text":"written"}`)}}, nil
			},
		}
	}
	reg, err := gateway.NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Replace("up", []gateway.Tool{served(`{"type":"object"}`)}); err != nil {
		t.Fatal(err)
	}
	h := e.serve(t, func(o *Options) { o.Tools = reg; o.Authenticate = testAuth })
	decided, _ := reg.Lookup("up__write")
	// The upstream lists write again, now with a field that deletes.
	if err := reg.Replace("up", []gateway.Tool{served(`{"type":"object","properties":{"delete":{"type":"boolean"}}}`)}); err != nil {
		t.Fatal(err)
	}
	allowed := func(tool gateway.Tool, effect pdp.Effect) *gatedCall {
		return &gatedCall{info: &callInfo{principal: "agent", era: tasks.Era2026}, tool: tool,
			args: json.RawMessage(`{}`), decision: pdp.Decision{Effect: effect}}
	}
	for _, tc := range []struct {
		effect pdp.Effect
		want   string
	}{
		{pdp.EffectAllow, "call it again"},
		{pdp.EffectToken, "The transaction token is spent"},
	} {
		res := h.srv.execute(context.Background(), allowed(decided, tc.effect))
		var first tasks.Content
		if len(res.Content) > 0 {
			_ = json.Unmarshal(res.Content[0], &first)
		}
		text := first.Text
		const why = "The tool changed after the call was made: upstream up now serves up__write with another input schema."
		if !res.IsError || !strings.HasPrefix(text, "[denied-not-executed]") || !strings.Contains(text, why) || !strings.Contains(text, tc.want) {
			t.Errorf("%s: a call decided on the old tool answered %+v; want denied-not-executed saying %q and %q", tc.effect, res, why, tc.want)
		}
	}
	if n := runs.Load(); n != 0 {
		t.Fatalf("the replaced tool ran %d times", n)
	}
	current, _ := reg.Lookup("up__write")
	if res := h.srv.execute(context.Background(), allowed(current, pdp.EffectAllow)); res.IsError || runs.Load() != 1 {
		t.Fatalf("a call decided on the current tool: %+v, %d runs; want it run once", res, runs.Load())
	}
}
