package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	mcpgoclient "github.com/mark3labs/mcp-go/client"
	mcpgotransport "github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/tasks"
)

// clientShim is the go-sdk client's HTTP transport in these tests: it adds
// the bearer token and, for tasks/*, the Mcp-Name header, which go-sdk
// v1.8.0 sets only for tools/call, prompts/get and resources/read.
type clientShim struct {
	token string
}

func (c clientShim) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+c.token)
	if m := req.Header.Get("Mcp-Method"); strings.HasPrefix(m, "tasks/") && req.Header.Get("Mcp-Name") == "" && req.Body != nil {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			Params struct {
				TaskID string `json:"taskId"`
			} `json:"params"`
		}
		if json.Unmarshal(body, &msg) == nil && msg.Params.TaskID != "" {
			req.Header.Set("Mcp-Name", msg.Params.TaskID)
		}
	}
	return http.DefaultTransport.RoundTrip(req)
}

// sdkTask is a SEP-2663 task as the go-sdk client decodes it.
type sdkTask struct {
	mcp.ResultBase
	ResultType string          `json:"resultType"`
	TaskID     string          `json:"taskId"`
	Status     string          `json:"status"`
	Result     json.RawMessage `json:"result"`
}

// sdkAck is a SEP-2663 tasks/cancel acknowledgement.
type sdkAck struct {
	mcp.ResultBase
	ResultType string `json:"resultType"`
}

func connectGoSDK(t *testing.T, h *harness, p string, declareTasks bool) *mcp.ClientSession {
	t.Helper()
	opts := &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}}
	if declareTasks {
		opts.Capabilities.AddExtension(tasks.ExtTasks, nil)
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "go-sdk-test", Version: "1"}, opts)
	for _, err := range []error{
		mcp.AddSendingCustomMethod[*taskParams, *sdkTask](c, "tasks/get"),
		mcp.AddSendingCustomMethod[*taskParams, *sdkAck](c, "tasks/cancel"),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   h.ts.URL,
		HTTPClient: &http.Client{Transport: clientShim{token: tok(p)}},
	}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func textOf(r *mcp.CallToolResult) string {
	var parts []string
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func TestGoSDKClient(t *testing.T) {
	h := newHarness(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := principal(t, "a")
	cs := connectGoSDK(t, h, p, true)

	if init := cs.InitializeResult(); init == nil || init.Capabilities == nil || init.Capabilities.Extensions[tasks.ExtTasks] == nil {
		t.Fatalf("discovered capabilities: %+v", init)
	}
	list, err := cs.ListTools(ctx, nil)
	if err != nil || len(list.Tools) != 8 {
		t.Fatalf("ListTools: %v %+v", err, list)
	}

	to := acct(t, "ok")
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "transfer_funds", Arguments: transferArgs(to, 42)})
	if err != nil || res.IsError || !strings.Contains(textOf(res), "Transferred 42") {
		t.Fatalf("allowed call: %v %+v", err, res)
	}
	if n := h.transfersTo(t, to); n != 1 {
		t.Errorf("%d transfers", n)
	}

	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "transfer_funds", Arguments: transferArgs(acct(t, "no"), 9_000_000)})
	if err != nil || !res.IsError || res.Meta[tasks.MetaDisposition] != string(tasks.DeniedNotExecuted) {
		t.Fatalf("denied call: %v %+v", err, res)
	}

	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "transfer_funds", Arguments: map[string]any{"to": "x"}})
	var wire *jsonrpc.Error
	if !errors.As(err, &wire) || wire.Code != codeInvalidParams {
		t.Fatalf("invalid arguments: %v", err)
	}

	// The gated call: go-sdk v1.8.0 has no tasks, so read the task ID from
	// the raw wire, then drive it with the custom methods.
	id := h.createTask(t, p, tasks.Era2026, acct(t, "held"))
	got, err := mcp.CallCustomMethod[*taskParams, *sdkTask](ctx, cs, "tasks/get", &taskParams{TaskID: id})
	if err != nil || got.ResultType != "complete" || got.TaskID != id || got.Status != "working" {
		t.Fatalf("tasks/get: %v %+v", err, got)
	}
	ack, err := mcp.CallCustomMethod[*taskParams, *sdkAck](ctx, cs, "tasks/cancel", &taskParams{TaskID: id})
	if err != nil || ack.ResultType != "complete" {
		t.Fatalf("tasks/cancel: %v %+v", err, ack)
	}
	h.waitStatus(t, id, tasks.StatusCancelled)

	_, err = mcp.CallCustomMethod[*taskParams, *sdkTask](ctx, cs, "tasks/get", &taskParams{TaskID: tasks.NewID("tsk_")})
	if !errors.As(err, &wire) || wire.Code != codeInvalidParams || wire.Message != msgTaskNotFound {
		t.Fatalf("unknown task: %v", err)
	}

	t.Run("without tasks", func(t *testing.T) {
		cs := connectGoSDK(t, h, p, false)
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "transfer_funds", Arguments: transferArgs(acct(t, "deg"), 5000)})
		if err != nil || !res.IsError || !strings.HasPrefix(textOf(res), "[approval-pending]") || !strings.Contains(textOf(res), "has NOT run") {
			t.Fatalf("degraded: %v %+v", err, res)
		}
		_, err = mcp.CallCustomMethod[*taskParams, *sdkTask](ctx, cs, "tasks/get", &taskParams{TaskID: id})
		if !errors.As(err, &wire) || wire.Code != codeMissingCapability {
			t.Fatalf("tasks/get without the extension: %v", err)
		}
	})
}

// TestGoSDKClientTaskResult records what go-sdk v1.8.0 makes of a
// CreateTaskResult: it has no tasks support, so this pins its behaviour.
func TestGoSDKClientTaskResult(t *testing.T) {
	h := newHarness(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := principal(t, "a")
	cs := connectGoSDK(t, h, p, true)
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "transfer_funds", Arguments: transferArgs(acct(t, "held"), 5000)})
	if err != nil {
		t.Fatalf("CallTool: %v", err)
	}
	// The SDK keeps resultType unexported and drops the task fields; what
	// reaches its caller is an empty, non-error result whose _meta note
	// names the task and says the call has not run.
	page, _, err := h.env.store.List(ctx, p, "", 10)
	if err != nil || len(page) != 1 {
		t.Fatalf("tasks of %s: %v %d", p, err, len(page))
	}
	note, _ := res.Meta[tasks.MetaImmediateResponse].(string)
	if res.IsError || len(res.Content) != 0 || !strings.Contains(note, page[0].TaskID) || !strings.Contains(note, "NOT run") {
		t.Errorf("go-sdk view of a CreateTaskResult: %+v", res)
	}
}

func TestMCPGoLegacyClient(t *testing.T) {
	h := newHarness(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := principal(t, "a")
	tr, err := mcpgotransport.NewStreamableHTTP(h.ts.URL, mcpgotransport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + tok(p)}))
	if err != nil {
		t.Fatal(err)
	}
	c := mcpgoclient.NewClient(tr, mcpgoclient.WithProtocolVersion(mcpgo.LATEST_LEGACY_PROTOCOL_VERSION))
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	init, err := c.Initialize(ctx, mcpgo.InitializeRequest{Params: mcpgo.InitializeParams{
		ProtocolVersion: "2025-11-25",
		ClientInfo:      mcpgo.Implementation{Name: "mcp-go-test", Version: "1"},
	}})
	if err != nil {
		t.Fatalf("initialize: %v", err)
	}
	if init.ProtocolVersion != "2025-11-25" || init.Capabilities.Tasks == nil {
		t.Fatalf("initialize: %+v", init)
	}

	tools, err := c.ListTools(ctx, mcpgo.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	support := map[string]string{}
	for _, tl := range tools.Tools {
		if tl.Execution != nil {
			support[tl.Name] = string(tl.Execution.TaskSupport)
		}
	}
	if support["transfer_funds"] != "optional" || support["list_transfers"] != "forbidden" {
		t.Errorf("taskSupport %v", support)
	}

	// mcp-go's CallTool parses only CallToolResult, so the task-augmented
	// call goes through its transport; the task methods use the client.
	to := acct(t, "held")
	resp, err := tr.SendRequest(ctx, mcpgotransport.JSONRPCRequest{JSONRPC: "2.0", ID: mcpgo.NewRequestId(int64(1001)), Method: "tools/call",
		Params: map[string]any{"name": "transfer_funds", "arguments": transferArgs(to, 5000), "task": map[string]any{"ttl": 60000}}})
	if err != nil || resp.Error != nil {
		t.Fatalf("task-augmented call: %v %+v", err, resp)
	}
	var created mcpgo.CreateTaskResult
	if err := json.Unmarshal(resp.Result, &created); err != nil || created.Task.TaskId == "" || created.Task.Status != mcpgo.TaskStatusWorking {
		t.Fatalf("CreateTaskResult %s: %v", resp.Result, err)
	}
	id := created.Task.TaskId

	got, err := c.GetTask(ctx, mcpgo.GetTaskRequest{Params: mcpgo.GetTaskParams{TaskId: id}})
	if err != nil || got.TaskId != id || got.Status != mcpgo.TaskStatusWorking || got.PollInterval == nil {
		t.Fatalf("GetTask: %v %+v", err, got)
	}
	list, err := c.ListTasks(ctx, mcpgo.ListTasksRequest{})
	if err != nil || len(list.Tasks) != 1 || list.Tasks[0].TaskId != id {
		t.Fatalf("ListTasks: %v %+v", err, list)
	}
	cancelled, err := c.CancelTask(ctx, mcpgo.CancelTaskRequest{Params: mcpgo.CancelTaskParams{TaskId: id}})
	if err != nil || cancelled.Status != mcpgo.TaskStatusCancelled {
		t.Fatalf("CancelTask: %v %+v", err, cancelled)
	}
	if _, err := c.CancelTask(ctx, mcpgo.CancelTaskRequest{Params: mcpgo.CancelTaskParams{TaskId: id}}); err == nil {
		t.Error("cancelling a terminal task succeeded")
	}
	result, err := c.TaskResult(ctx, mcpgo.TaskResultRequest{Params: mcpgo.TaskResultParams{TaskId: id}})
	if err != nil || !result.IsError {
		t.Fatalf("TaskResult: %v %+v", err, result)
	}
	if n := h.transfersTo(t, to); n != 0 {
		t.Errorf("%d transfers", n)
	}

	// An allowed call, plain.
	ok, err := c.CallTool(ctx, mcpgo.CallToolRequest{Params: mcpgo.CallToolParams{Name: "transfer_funds", Arguments: transferArgs(acct(t, "ok"), 7)}})
	if err != nil || ok.IsError {
		t.Fatalf("allowed call: %v %+v", err, ok)
	}
	// A gated call without a task: the degraded denial.
	deg, err := c.CallTool(ctx, mcpgo.CallToolRequest{Params: mcpgo.CallToolParams{Name: "transfer_funds", Arguments: transferArgs(acct(t, "deg"), 5000)}})
	if err != nil || !deg.IsError {
		t.Fatalf("degraded call: %v %+v", err, deg)
	}
	// Another principal cannot see the task.
	_, err = c.GetTask(ctx, mcpgo.GetTaskRequest{Params: mcpgo.GetTaskParams{TaskId: tasks.NewID("tsk_")}})
	if err == nil || !strings.Contains(err.Error(), "Task not found") {
		t.Errorf("unknown task: %v", err)
	}
}

func TestMCPGoModernClient(t *testing.T) {
	h := newHarness(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := principal(t, "a")
	tr, err := mcpgotransport.NewStreamableHTTP(h.ts.URL, mcpgotransport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + tok(p)}))
	if err != nil {
		t.Fatal(err)
	}
	c := mcpgoclient.NewClient(tr)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	init, err := c.Initialize(ctx, mcpgo.InitializeRequest{Params: mcpgo.InitializeParams{ClientInfo: mcpgo.Implementation{Name: "mcp-go-test", Version: "1"}}})
	if err != nil {
		t.Fatalf("discover: %v", err)
	}
	if init.ProtocolVersion != "2026-07-28" {
		t.Fatalf("negotiated %q", init.ProtocolVersion)
	}
	res, err := c.CallTool(ctx, mcpgo.CallToolRequest{Params: mcpgo.CallToolParams{Name: "transfer_funds", Arguments: transferArgs(acct(t, "ok"), 3)}})
	if err != nil || res.IsError {
		t.Fatalf("allowed call: %v %+v", err, res)
	}
	// mcp-go declares no tasks extension: a gated call degrades.
	deg, err := c.CallTool(ctx, mcpgo.CallToolRequest{Params: mcpgo.CallToolParams{Name: "transfer_funds", Arguments: transferArgs(acct(t, "deg"), 5000)}})
	if err != nil || !deg.IsError {
		t.Fatalf("degraded call: %v %+v", err, deg)
	}
}
