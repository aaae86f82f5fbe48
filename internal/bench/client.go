package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/countersign/countersign/tasks"
)

// benchClient speaks to the server as its clients do: MCP 2026-07-28 over
// raw HTTP for agents, the admin API and the approver API.
type benchClient struct {
	base  string
	agent string
	admin string
	http  *http.Client
	ids   atomic.Int64
}

func newClient(o Options) *benchClient {
	hc := o.HTTP
	if hc == nil {
		hc = &http.Client{
			Timeout:       2 * time.Minute,
			CheckRedirect: refuseRedirect,
			Transport: &http.Transport{
				Proxy:               nil,
				DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
				MaxIdleConns:        4096,
				MaxIdleConnsPerHost: 4096,
				IdleConnTimeout:     90 * time.Second,
			},
		}
	}
	return &benchClient{base: o.Server, agent: o.AgentToken, admin: o.AdminToken, http: hc}
}

// refuseRedirect is the bench client's CheckRedirect: it follows no
// redirect. Go forwards the Authorization header on a redirect to the same
// host whatever the scheme, so an https server redirecting to plain http
// would get the agent's and the admin's tokens in clear text; and a bench
// whose requests are redirected measures the redirect.
func refuseRedirect(req *http.Request, _ []*http.Request) error {
	return fmt.Errorf("bench: the server redirected to %s; give --server the URL it redirects to", req.URL.Redacted())
}

// check makes sure the server answers, the agent token is accepted and the
// tools the scenarios call are there.
func (c *benchClient) check(ctx context.Context, tools []string) error {
	var have []string
	cursor := ""
	for {
		var params map[string]any
		if cursor != "" {
			params = map[string]any{"cursor": cursor}
		}
		res, err := c.rpc(ctx, c.agent, "tools/list", "", params, true)
		if err != nil {
			var re *rpcError
			switch {
			case errors.As(err, &re) && (re.HTTPStatus == http.StatusUnauthorized || re.HTTPStatus == http.StatusForbidden):
				return fmt.Errorf("bench: %s/mcp refused the agent token (HTTP %d): check --agent-token", c.base, re.HTTPStatus)
			case errors.As(err, &re) && re.HTTPStatus == http.StatusNotFound:
				return fmt.Errorf("bench: %s/mcp: HTTP 404: is --server the Countersign base URL (without /mcp)?", c.base)
			case errors.As(err, &re) && re.Code == 0:
				return fmt.Errorf("bench: %s/mcp answered HTTP %d without JSON-RPC: is --server a Countersign server?", c.base, re.HTTPStatus)
			}
			return fmt.Errorf("bench: tools/list at %s/mcp: %w", c.base, err)
		}
		var page struct {
			Tools []struct {
				Name string `json:"name"`
			} `json:"tools"`
			NextCursor string `json:"nextCursor"`
		}
		if err := json.Unmarshal(res, &page); err != nil {
			return fmt.Errorf("bench: tools/list at %s/mcp: %w", c.base, err)
		}
		for _, t := range page.Tools {
			have = append(have, t.Name)
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	for _, t := range tools {
		if !slices.Contains(have, t) {
			return fmt.Errorf("bench: the server offers the agent no tool %q: the scenarios call the demo tools (transfer_funds, place_trade: demo_tools: true in the configuration file, the default policy) and the gateway tool you name", t)
		}
	}
	return nil
}

// rpcError is a JSON-RPC error answer, or an HTTP status without one.
type rpcError struct {
	HTTPStatus int
	Code       int
	Message    string
	Data       json.RawMessage
}

func (e *rpcError) Error() string {
	if e.Code == 0 {
		msg := e.Message
		if len(msg) > 200 {
			msg = msg[:200] + "…"
		}
		return strings.TrimSpace(fmt.Sprintf("HTTP %d %s", e.HTTPStatus, msg))
	}
	return fmt.Sprintf("HTTP %d: JSON-RPC error %d %s %s", e.HTTPStatus, e.Code, e.Message, e.Data)
}

// codeTooManyRequests is mcpserver.CodeTooManyRequests: the request budget
// and the task-creation rate.
const codeTooManyRequests = -31029

// errorKind names an error for a report: rate-limited, rpc-CODE, http-STATUS,
// timeout, transport or other.
func errorKind(err error) string {
	var re *rpcError
	var ne net.Error
	switch {
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.As(err, &re) && (re.HTTPStatus == http.StatusTooManyRequests || re.Code == codeTooManyRequests):
		return "rate-limited"
	case errors.As(err, &re) && re.Code != 0:
		return fmt.Sprintf("rpc%d", re.Code)
	case errors.As(err, &re):
		return fmt.Sprintf("http-%d", re.HTTPStatus)
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.As(err, &ne):
		return "transport"
	case strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "EOF"):
		return "transport"
	}
	var ue unexpectedError
	if errors.As(err, &ue) {
		return "unexpected-" + ue.kind
	}
	return "other"
}

// unexpectedError is an answer of the wrong shape (a CreateTaskResult where
// a result was due, a task that did not end as it should).
type unexpectedError struct{ kind, detail string }

func (e unexpectedError) Error() string { return e.kind + ": " + e.detail }

// rpc sends one stateless 2026-07-28 request as token and returns its result.
// name is the Mcp-Name header; declareTasks declares the tasks extension.
func (c *benchClient) rpc(ctx context.Context, token, method, name string, params map[string]any, declareTasks bool) (json.RawMessage, error) {
	caps := map[string]any{}
	if declareTasks {
		caps["extensions"] = map[string]any{tasks.ExtTasks: map[string]any{}}
	}
	meta := map[string]any{}
	if m, ok := params["_meta"].(map[string]any); ok {
		maps.Copy(meta, m)
	}
	meta["io.modelcontextprotocol/protocolVersion"] = "2026-07-28"
	meta["io.modelcontextprotocol/clientCapabilities"] = caps
	meta["io.modelcontextprotocol/clientInfo"] = map[string]any{"name": "countersign-bench", "version": "1"}
	p := maps.Clone(params)
	if p == nil {
		p = map[string]any{}
	}
	p["_meta"] = meta
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.ids.Add(1), "method": method, "params": p})
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/mcp", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", method)
	if name != "" {
		req.Header.Set("Mcp-Name", name)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, transportError(c.base, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		raw = lastSSEData(raw)
	}
	var r struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code    int             `json:"code"`
			Message string          `json:"message"`
			Data    json.RawMessage `json:"data"`
		} `json:"error"`
	}
	if len(raw) == 0 || json.Unmarshal(raw, &r) != nil {
		return nil, &rpcError{HTTPStatus: resp.StatusCode}
	}
	if r.Error != nil {
		return nil, &rpcError{HTTPStatus: resp.StatusCode, Code: r.Error.Code, Message: r.Error.Message, Data: r.Error.Data}
	}
	if resp.StatusCode/100 != 2 {
		return nil, &rpcError{HTTPStatus: resp.StatusCode}
	}
	return r.Result, nil
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

// callTool is tools/call.
func (c *benchClient) callTool(ctx context.Context, token, tool string, args, meta map[string]any, declareTasks bool) (json.RawMessage, error) {
	p := map[string]any{"name": tool, "arguments": args}
	if meta != nil {
		p["_meta"] = meta
	}
	return c.rpc(ctx, token, "tools/call", tool, p, declareTasks)
}

// createTask makes a gated call as a client that holds tasks and returns
// the task ID of its CreateTaskResult.
func (c *benchClient) createTask(ctx context.Context, token string, args map[string]any) (string, error) {
	res, err := c.callTool(ctx, token, "transfer_funds", args, nil, true)
	if err != nil {
		return "", err
	}
	var ct struct {
		ResultType string `json:"resultType"`
		TaskID     string `json:"taskId"`
		Status     string `json:"status"`
	}
	if err := json.Unmarshal(res, &ct); err != nil || ct.ResultType != "task" || ct.TaskID == "" {
		return "", unexpectedError{"not-a-task", string(res)}
	}
	return ct.TaskID, nil
}

// pendingCall makes a gated call as a client without tasks and returns the
// task ID and approval reference of its [approval-pending] answer.
func (c *benchClient) pendingCall(ctx context.Context, token string, args map[string]any) (taskID, ref string, err error) {
	res, err := c.callTool(ctx, token, "transfer_funds", args, nil, false)
	if err != nil {
		return "", "", err
	}
	var r struct {
		IsError    bool `json:"isError"`
		Structured struct {
			TaskID     string `json:"taskId"`
			ApproveURL string `json:"approveUrl"`
		} `json:"structuredContent"`
	}
	if err := json.Unmarshal(res, &r); err != nil || r.Structured.TaskID == "" || r.Structured.ApproveURL == "" {
		return "", "", unexpectedError{"not-pending", string(res)}
	}
	u := r.Structured.ApproveURL
	return r.Structured.TaskID, u[strings.LastIndexByte(u, '/')+1:], nil
}

// getTask is tasks/get; it returns the status and the disposition (empty
// until the task ends).
func (c *benchClient) getTask(ctx context.Context, token, taskID string) (status, disposition string, err error) {
	res, err := c.rpc(ctx, token, "tasks/get", taskID, map[string]any{"taskId": taskID}, true)
	if err != nil {
		return "", "", err
	}
	var d struct {
		TaskID string `json:"taskId"`
		Status string `json:"status"`
		Result struct {
			Meta map[string]any `json:"_meta"`
		} `json:"result"`
	}
	if err := json.Unmarshal(res, &d); err != nil || d.TaskID != taskID {
		return "", "", unexpectedError{"not-a-task", string(res)}
	}
	disp, _ := d.Result.Meta[tasks.MetaDisposition].(string)
	return d.Status, disp, nil
}

// cancelTask is tasks/cancel; a task that already ended is not an error.
func (c *benchClient) cancelTask(ctx context.Context, token, taskID string) error {
	_, err := c.rpc(ctx, token, "tasks/cancel", taskID, map[string]any{"taskId": taskID}, true)
	return err
}

// waitExecuted polls tasks/get until the task ends; it must end
// approved-executed.
func (c *benchClient) waitExecuted(ctx context.Context, token, taskID string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		status, disp, err := c.getTask(ctx, token, taskID)
		if err != nil {
			return err
		}
		if disp != "" {
			if disp != string(tasks.ApprovedExecuted) {
				return unexpectedError{"disposition", disp}
			}
			return nil
		}
		if tasks.Status(status).Terminal() {
			return unexpectedError{"status", status}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Microsecond):
		}
	}
}

// api sends a JSON request to the admin or approver API (token empty: no
// Authorization) and decodes a 2xx answer into out.
func (c *benchClient) api(ctx context.Context, method, path, token string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return transportError(c.base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return &rpcError{HTTPStatus: resp.StatusCode, Message: string(b)}
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// transportError names the server a request could not reach.
func transportError(base string, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) && !ue.Timeout() && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("cannot reach %s: %w", base, err)
	}
	return err
}

// addAgent adds an agent through the admin API and returns its token.
func (c *benchClient) addAgent(ctx context.Context, name string) (string, error) {
	var out struct {
		Token string `json:"token"`
	}
	if err := c.api(ctx, http.MethodPost, "/admin/v1/agents", c.admin, map[string]any{"name": name}, &out); err != nil {
		return "", fmt.Errorf("add agent %s: %w", name, err)
	}
	return out.Token, nil
}

// revoke revokes an agent (by name) or an approver (by ID) the run added,
// through the admin API (a revocation is audited, and permanent).
func (c *benchClient) revoke(ctx context.Context, kind, name string) error {
	return c.api(ctx, http.MethodPost, "/admin/v1/"+kind+"/"+url.PathEscape(name)+"/revoke", c.admin, struct{}{}, nil)
}
