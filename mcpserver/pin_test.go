package mcpserver

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/approvals/approvalstest"
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
