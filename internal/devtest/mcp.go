package devtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/countersign/countersign/tasks"
)

// --- MCP over raw HTTP, 2026-07-28 era -----------------------------------

var rpcID atomic.Int64

// RPCResponse is a JSON-RPC answer and its HTTP status.
type RPCResponse struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
	HTTPStatus int `json:"-"`
}

// Call2026 sends one stateless 2026-07-28 request. name is the Mcp-Name
// header (tool name or task ID). declareTasks sets the tasks extension in
// the per-request client capabilities.
func (s *Stack) Call2026(token, method, name string, params map[string]any, declareTasks bool) RPCResponse {
	s.T.Helper()
	caps := map[string]any{}
	if declareTasks {
		caps["extensions"] = map[string]any{tasks.ExtTasks: map[string]any{}}
	}
	if params == nil {
		params = map[string]any{}
	}
	meta := map[string]any{}
	if m, ok := params["_meta"].(map[string]any); ok {
		for k, v := range m {
			meta[k] = v // the call's own _meta members (a transaction token, SEP-2672 evidence)
		}
	}
	meta["io.modelcontextprotocol/protocolVersion"] = "2026-07-28"
	meta["io.modelcontextprotocol/clientCapabilities"] = caps
	meta["io.modelcontextprotocol/clientInfo"] = map[string]any{"name": s.clientName, "version": "1"}
	params = maps.Clone(params)
	params["_meta"] = meta
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": rpcID.Add(1), "method": method, "params": params})
	req, _ := http.NewRequest("POST", s.Base+"/mcp", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", method)
	if name != "" {
		req.Header.Set("Mcp-Name", name)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.T.Fatalf("%s: %v", method, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		raw = lastSSEData(raw)
	}
	var r RPCResponse
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &r); err != nil {
			s.T.Fatalf("%s: HTTP %d, undecodable %q", method, resp.StatusCode, raw)
		}
	}
	r.HTTPStatus = resp.StatusCode
	return r
}

func lastSSEData(raw []byte) []byte {
	var last []byte
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		if d, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:")); ok {
			last = append([]byte(nil), bytes.TrimSpace(d)...)
		}
	}
	return last
}

// CreateTask calls a tool as a tasks-declaring 2026 client and returns the
// CreateTaskResult; any other answer fails the test.
func (s *Stack) CreateTask(token, tool string, args map[string]any) tasks.Task {
	s.T.Helper()
	r := s.Call2026(token, "tools/call", tool, map[string]any{"name": tool, "arguments": args}, true)
	if r.Error != nil {
		s.T.Fatalf("tools/call %s: error %d %s", tool, r.Error.Code, r.Error.Message)
	}
	var ct struct {
		ResultType string `json:"resultType"`
		tasks.Task
	}
	if err := json.Unmarshal(r.Result, &ct); err != nil || ct.ResultType != "task" || ct.TaskID == "" {
		s.T.Fatalf("tools/call %s: want a CreateTaskResult, got %s", tool, r.Result)
	}
	return ct.Task
}

// DetailedTask is a tasks/get result.
type DetailedTask struct {
	ResultType string `json:"resultType"`
	tasks.DetailedTask
}

// Disposition is the terminal disposition carried in the task's result.
func Disposition(d DetailedTask) tasks.Disposition { return tasks.DispositionOf(d.Result) }

// GetTask calls tasks/get. The task is decoded only when the answer is not
// an error.
func (s *Stack) GetTask(token, taskID string) (DetailedTask, RPCResponse) {
	s.T.Helper()
	r := s.Call2026(token, "tasks/get", taskID, map[string]any{"taskId": taskID}, true)
	var d DetailedTask
	if r.Error == nil {
		if err := json.Unmarshal(r.Result, &d); err != nil {
			s.T.Fatalf("tasks/get: %v: %s", err, r.Result)
		}
	}
	return d, r
}

// WaitTerminal polls tasks/get until the task is terminal (30s at most).
func (s *Stack) WaitTerminal(token, taskID string) DetailedTask {
	s.T.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		d, r := s.GetTask(token, taskID)
		if r.Error != nil {
			s.T.Fatalf("tasks/get %s: %d %s", taskID, r.Error.Code, r.Error.Message)
		}
		if d.Status.Terminal() {
			return d
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.T.Fatalf("task %s not terminal after 30s", taskID)
	return DetailedTask{}
}

// RefOf finds the approval reference of a pending task through the admin
// API, as an approver would get it from the notification (10s at most): it
// returns once the approval page shows the request, which is when the
// workflow sends the notification.
func (s *Stack) RefOf(taskID string) string {
	s.T.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var list []struct {
			Ref    string `json:"ref"`
			TaskID string `json:"taskId"`
		}
		s.HTTPJSON("GET", "/admin/v1/approvals?status=pending", s.AdminToken, nil, &list)
		for _, a := range list {
			if a.TaskID == taskID {
				s.awaitRequested(a.Ref, deadline)
				return a.Ref
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.T.Fatalf("no pending approval for task %s", taskID)
	return ""
}

// awaitRequested waits until the approval page's timeline (read from the
// audit chain) shows the request.
func (s *Stack) awaitRequested(ref string, deadline time.Time) {
	for time.Now().Before(deadline) {
		var view struct {
			Timeline []struct {
				Kind string `json:"kind"`
			} `json:"timeline"`
		}
		s.HTTPJSON("GET", "/approver/v1/approvals/"+ref, "", nil, &view)
		for _, e := range view.Timeline {
			if e.Kind == "requested" {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}
