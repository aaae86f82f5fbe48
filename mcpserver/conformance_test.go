package mcpserver

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/tasks"
)

// The conformance fixtures (gateway/conformance) through the real
// pipeline: policy, approval service, task record, the workflow's
// activities (unattended; in the in-memory engine), wire.

var (
	confOnce   sync.Once
	confEnv    *testEnv
	confEnvErr error
)

func newConformanceHarness(tb testing.TB) *harness {
	tb.Helper()
	confOnce.Do(func() { confEnv, confEnvErr = startEnv(true) })
	if confEnvErr != nil {
		tb.Fatalf("conformance environment: %v", confEnvErr)
	}
	return confEnv.serve(tb, func(o *Options) { o.NoAuth = true },
		func(a *approvals.Options) { a.PollInterval = 100 * time.Millisecond })
}

type confTask struct {
	ResultType string `json:"resultType"`
	TaskID     string `json:"taskId"`
	Status     string `json:"status"`
	Result     *struct {
		Content []struct{ Text string } `json:"content"`
		IsError bool                    `json:"isError"`
	} `json:"result"`
	Error *struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Content []struct{ Text string } `json:"content"`
}

func (h *harness) confCall(t *testing.T, era tasks.Era, declare bool, tool string, args map[string]any) rpc {
	t.Helper()
	return h.do(t, call{era: era, tasks: declare, method: "tools/call", params: map[string]any{"name": tool, "arguments": args}})
}

func (h *harness) confGet(t *testing.T, id string) confTask {
	t.Helper()
	var got confTask
	h.do(t, call{era: tasks.Era2026, tasks: true, method: "tasks/get", params: map[string]any{"taskId": id}}).ok(t, &got)
	return got
}

func TestConformanceGreetIsSynchronous(t *testing.T) {
	h := newConformanceHarness(t)
	var res confTask
	h.confCall(t, tasks.Era2026, true, "greet", map[string]any{"name": "World"}).ok(t, &res)
	if res.ResultType != "complete" || res.TaskID != "" || len(res.Content) != 1 || res.Content[0].Text != "Hello, World!" {
		t.Fatalf("greet: %+v", res)
	}
}

func TestConformanceSlowComputeRunsAsATask(t *testing.T) {
	h := newConformanceHarness(t)
	var created confTask
	h.confCall(t, tasks.Era2026, true, "slow_compute", map[string]any{"seconds": 1, "label": "unit"}).ok(t, &created)
	if created.ResultType != "task" || created.TaskID == "" || created.Status != "working" {
		t.Fatalf("want a working task, got %+v", created)
	}
	rec := h.waitStatus(t, created.TaskID, tasks.StatusCompleted)
	if rec.Requirement.Quorum != 0 || rec.Requirement.Group != "" {
		t.Fatalf("an unattended task has no approvers: %+v", rec.Requirement)
	}
	got := h.confGet(t, created.TaskID)
	if got.Result == nil || got.Result.IsError || len(got.Result.Content) != 1 || got.Result.Content[0].Text != "Computed unit after 1s" {
		t.Fatalf("completed slow_compute: %+v", got)
	}
	if !rec.LastUpdatedAt.After(rec.CreatedAt.Add(900e6)) {
		t.Fatalf("slow_compute ran before its wait ended: created %v, ended %v", rec.CreatedAt, rec.LastUpdatedAt)
	}
}

func TestConformanceSlowComputeCancelWhileWaiting(t *testing.T) {
	h := newConformanceHarness(t)
	var created confTask
	h.confCall(t, tasks.Era2026, true, "slow_compute", map[string]any{"seconds": 60, "label": "cancel"}).ok(t, &created)
	var ack map[string]any
	h.do(t, call{era: tasks.Era2026, tasks: true, method: "tasks/cancel", params: map[string]any{"taskId": created.TaskID}}).ok(t, &ack)
	_, hasTask := ack["taskId"]
	_, hasStatus := ack["status"]
	if ack["resultType"] != "complete" || hasTask || hasStatus {
		t.Fatalf("cancel ack: %v", ack)
	}
	h.waitStatus(t, created.TaskID, tasks.StatusCancelled)
}

func TestConformanceSlowComputeWithoutTasksRunsInline(t *testing.T) {
	h := newConformanceHarness(t)
	var res confTask
	h.confCall(t, tasks.Era2026, false, "slow_compute", map[string]any{"seconds": 0, "label": "inline"}).ok(t, &res)
	if res.ResultType != "complete" || res.TaskID != "" || len(res.Content) == 0 || !strings.Contains(res.Content[0].Text, "Computed inline") {
		t.Fatalf("inline slow_compute: %+v", res)
	}
	// seconds 0 is the immediate path even for a client that holds tasks.
	h.confCall(t, tasks.Era2026, true, "slow_compute", map[string]any{"seconds": 0, "label": "now"}).ok(t, &res)
	if res.TaskID != "" || res.ResultType != "complete" {
		t.Fatalf("seconds 0 must answer at once: %+v", res)
	}
}

func TestConformanceFailingJobRequiresATask(t *testing.T) {
	h := newConformanceHarness(t)
	r := h.confCall(t, tasks.Era2026, false, "failing_job", map[string]any{})
	r.fails(t, http.StatusBadRequest, codeMissingCapability)
	if !strings.Contains(string(r.Error.Data), tasks.ExtTasks) {
		t.Fatalf("-32021 must name the tasks extension: %s", r.Error.Data)
	}
	h.confCall(t, tasks.Era2025, false, "failing_job", map[string]any{}).fails(t, http.StatusOK, codeMethodNotFound)

	var created confTask
	h.confCall(t, tasks.Era2026, true, "failing_job", map[string]any{}).ok(t, &created)
	h.waitStatus(t, created.TaskID, tasks.StatusCompleted)
	if got := h.confGet(t, created.TaskID); got.Result == nil || !got.Result.IsError {
		t.Fatalf("failing_job must complete with isError: %+v", got)
	}
}

func TestConformanceProtocolErrorJobFails(t *testing.T) {
	h := newConformanceHarness(t)
	var created confTask
	h.confCall(t, tasks.Era2026, true, "protocol_error_job", map[string]any{}).ok(t, &created)
	h.waitStatus(t, created.TaskID, tasks.StatusFailed)
	got := h.confGet(t, created.TaskID)
	if got.Status != "failed" || got.Error == nil || got.Error.Code == 0 || got.Error.Message == "" || got.Result != nil {
		t.Fatalf("protocol_error_job task: %+v", got)
	}
	// Without a task the caller gets the JSON-RPC error itself.
	h.confCall(t, tasks.Era2026, false, "protocol_error_job", map[string]any{}).fails(t, http.StatusOK, -32603)
}

func TestConformanceLegacyTaskSupport(t *testing.T) {
	h := newConformanceHarness(t)
	var list struct {
		Tools []struct {
			Name      string
			Execution struct{ TaskSupport string } `json:"execution"`
		}
	}
	h.do(t, call{era: tasks.Era2025, method: "tools/list", params: map[string]any{}}).ok(t, &list)
	want := map[string]string{"greet": "forbidden", "slow_compute": "optional", "failing_job": "required", "protocol_error_job": "optional"}
	for _, tl := range list.Tools {
		if w, ok := want[tl.Name]; ok {
			if tl.Execution.TaskSupport != w {
				t.Errorf("%s: taskSupport %q, want %q", tl.Name, tl.Execution.TaskSupport, w)
			}
			delete(want, tl.Name)
		}
	}
	if len(want) != 0 {
		t.Errorf("missing fixtures in tools/list: %v", want)
	}
}

func TestConformanceInputThenTask(t *testing.T) {
	h := newConformanceHarness(t)
	var ask struct {
		ResultType    string                     `json:"resultType"`
		TaskID        string                     `json:"taskId"`
		InputRequests map[string]json.RawMessage `json:"inputRequests"`
	}
	h.do(t, call{era: tasks.Era2026, tasks: true, caps: elicitation, method: "tools/call", params: map[string]any{
		"name": "test_tool_with_task", "arguments": map[string]any{},
	}}).ok(t, &ask)
	if ask.ResultType != "input_required" || ask.TaskID != "" || ask.InputRequests["user_name"] == nil {
		t.Fatalf("round 1 must ask for user_name: %+v", ask)
	}
	var created confTask
	h.do(t, call{era: tasks.Era2026, tasks: true, caps: elicitation, method: "tools/call", params: map[string]any{
		"name": "test_tool_with_task", "arguments": map[string]any{},
		"inputResponses": map[string]any{"user_name": map[string]any{"action": "accept", "content": map[string]any{"name": "Alice"}}},
	}}).ok(t, &created)
	if created.ResultType != "task" || created.TaskID == "" {
		t.Fatalf("round 2 must create a task: %+v", created)
	}
	h.waitStatus(t, created.TaskID, tasks.StatusCompleted)
	got := h.confGet(t, created.TaskID)
	if got.Result == nil || len(got.Result.Content) == 0 || !strings.Contains(got.Result.Content[0].Text, "Hello, Alice!") {
		t.Fatalf("the task's result must carry the gathered name first: %+v", got)
	}
	// A 2025-11-25 client cannot answer input requests.
	h.do(t, call{era: tasks.Era2025, method: "tools/call", params: map[string]any{
		"name": "test_tool_with_task", "arguments": map[string]any{}, "task": map[string]any{"ttl": 60000},
	}}).fails(t, http.StatusOK, codeInvalidParams)
}

func TestConformanceTaskAsksForInput(t *testing.T) {
	h := newConformanceHarness(t)
	type pending struct {
		confTask
		InputRequests map[string]struct {
			Method string `json:"method"`
		} `json:"inputRequests"`
	}
	var created confTask
	h.confCall(t, tasks.Era2026, true, "multi_input", map[string]any{}).ok(t, &created)
	if created.ResultType != "task" || created.Status != "input_required" {
		t.Fatalf("multi_input must create an input_required task: %+v", created)
	}
	update := func(responses map[string]any) {
		t.Helper()
		var ack map[string]any
		h.do(t, call{era: tasks.Era2026, tasks: true, method: "tasks/update", params: map[string]any{
			"taskId": created.TaskID, "inputResponses": responses}}).ok(t, &ack)
		if _, has := ack["status"]; ack["resultType"] != "complete" || has {
			t.Fatalf("tasks/update ack: %v", ack)
		}
	}
	get := func() pending {
		t.Helper()
		var got pending
		h.do(t, call{era: tasks.Era2026, tasks: true, method: "tasks/get", params: map[string]any{"taskId": created.TaskID}}).ok(t, &got)
		return got
	}
	got := get()
	if got.Status != "input_required" || len(got.InputRequests) != 2 || got.InputRequests["name"].Method != "elicitation/create" {
		t.Fatalf("tasks/get must show both requests: %+v", got)
	}
	update(map[string]any{"unknown": map[string]any{"x": 1}}) // ignored
	update(map[string]any{"name": map[string]any{"action": "accept", "content": map[string]any{"name": "Bob"}}})
	if got = get(); got.Status != "input_required" || len(got.InputRequests) != 1 || got.InputRequests["confirm"].Method == "" {
		t.Fatalf("after a partial answer only confirm is pending: %+v", got)
	}
	update(map[string]any{"confirm": map[string]any{"action": "accept", "content": map[string]any{"confirm": true}}})
	h.waitStatus(t, created.TaskID, tasks.StatusCompleted)
	final := h.confGet(t, created.TaskID)
	if final.Result == nil || !strings.Contains(final.Result.Content[0].Text, `name "Bob" (accept), confirm true`) {
		t.Fatalf("the tool must run with both answers: %+v", final)
	}
	// A completed task takes no more answers; the update is still acknowledged.
	update(map[string]any{"name": map[string]any{"action": "accept", "content": map[string]any{"name": "Eve"}}})

	// Cancel while waiting for input.
	var other confTask
	h.confCall(t, tasks.Era2026, true, "confirm_delete", map[string]any{"filename": "x.txt"}).ok(t, &other)
	h.do(t, call{era: tasks.Era2026, tasks: true, method: "tasks/cancel", params: map[string]any{"taskId": other.TaskID}}).ok(t, &map[string]any{})
	h.waitStatus(t, other.TaskID, tasks.StatusCancelled)
	// A 2025-11-25 client cannot answer a task's input requests.
	h.do(t, call{era: tasks.Era2025, method: "tools/call", params: map[string]any{
		"name": "confirm_delete", "arguments": map[string]any{"filename": "y"}, "task": map[string]any{"ttl": 60000},
	}}).fails(t, http.StatusOK, codeInvalidParams)
}
