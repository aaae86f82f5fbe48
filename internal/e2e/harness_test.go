package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/descope/virtualwebauthn"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/tasks"
)

// stack is a running `countersign dev` on a temporary data dir.
type stack struct {
	t          testing.TB
	dir        string
	port       int
	base       string
	agentToken string
	adminToken string
	app        *app.App
	cancel     context.CancelFunc
	done       chan error
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startStack starts countersign dev on dir (a fresh temp dir when empty) and
// port (a free one when 0).
func startStack(t testing.TB, dir string, port int) *stack {
	t.Helper()
	return startStackConfig(t, app.Config{DataDir: dir}, port)
}

// startStackWithPolicy starts a stack that loads the policy in dir.
func startStackWithPolicy(t testing.TB, dir string) *stack {
	t.Helper()
	return startStackConfig(t, app.Config{PolicyDir: dir}, 0)
}

func startStackConfig(t testing.TB, cfg app.Config, port int) *stack {
	t.Helper()
	dir := cfg.DataDir
	if dir == "" {
		dir = t.TempDir()
	}
	if port == 0 {
		port = freePort(t)
	}
	s := &stack{t: t, dir: dir, port: port, base: fmt.Sprintf("http://localhost:%d", port)}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	cfg.DataDir = dir
	cfg.Addr = fmt.Sprintf("127.0.0.1:%d", port)
	if cfg.SQLiteSync == "" {
		cfg.SQLiteSync = "NORMAL" // tests: durable against a process crash, faster
	}
	// The suite makes many approval requests as one agent; the limits have
	// tests of their own in mcpserver.
	if cfg.RatePerMinute == 0 {
		cfg.RatePerMinute, cfg.RateBurst, cfg.MaxPendingPerPrincipal = 1_000_000, 1_000_000, 1_000_000
	}
	a, err := app.New(ctx, cfg, app.ModeDev, nil, io.Discard)
	if err != nil {
		cancel()
		t.Fatalf("start countersign dev: %v", err)
	}
	s.app = a
	s.done = make(chan error, 1)
	go func() { s.done <- a.Run(ctx) }()
	s.agentToken = readFile(t, filepath.Join(dir, app.AgentTokenFile))
	s.adminToken = readFile(t, filepath.Join(dir, app.AdminTokenFile))
	t.Cleanup(s.stop)
	return s
}

func (s *stack) stop() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	select {
	case err := <-s.done:
		if err != nil {
			s.t.Errorf("shutdown: %v", err)
		}
	case <-time.After(30 * time.Second):
		s.t.Error("countersign did not stop within 30s")
	}
	s.cancel = nil
}

func readFile(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// httpJSON sends a JSON request and decodes the JSON answer.
func (s *stack) httpJSON(method, path, token string, body any, out any) int {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, s.base+path, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			s.t.Fatalf("%s %s: HTTP %d, undecodable body %q: %v", method, path, resp.StatusCode, b, err)
		}
	}
	return resp.StatusCode
}

// approver is a person with a software passkey.
type approver struct {
	name string
	id   string
	auth virtualwebauthn.Authenticator
	cred virtualwebauthn.Credential
	rp   virtualwebauthn.RelyingParty
}

func (s *stack) enroll(name string, groups ...string) *approver {
	s.t.Helper()
	var added struct {
		ApproverID string `json:"approverId"`
		EnrollURL  string `json:"enrollUrl"`
	}
	if code := s.httpJSON("POST", "/admin/v1/approvers", s.adminToken, map[string]any{"name": name, "groups": groups}, &added); code != 200 && code != 201 {
		s.t.Fatalf("add approver: HTTP %d", code)
	}
	token := added.EnrollURL[strings.LastIndexByte(added.EnrollURL, '/')+1:]
	var begin struct {
		Options json.RawMessage `json:"options"`
	}
	if code := s.httpJSON("POST", "/approver/v1/enrollments/"+token+"/begin", "", struct{}{}, &begin); code != 200 {
		s.t.Fatalf("enroll begin: HTTP %d", code)
	}
	opts, err := virtualwebauthn.ParseAttestationOptions(string(begin.Options))
	if err != nil {
		s.t.Fatalf("parse creation options: %v", err)
	}
	a := &approver{name: name, id: added.ApproverID, rp: virtualwebauthn.RelyingParty{ID: "localhost", Name: "Countersign", Origin: s.base}}
	// ParseAttestationOptions has already decoded user.id.
	a.auth = virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(opts.UserID)})
	a.cred = testpasskey.NewEC2Credential()
	a.auth.AddCredential(a.cred)
	resp := virtualwebauthn.CreateAttestationResponse(a.rp, a.auth, a.cred, *opts)
	var fin struct {
		CredentialID string `json:"credentialId"`
	}
	if code := s.httpJSON("POST", "/approver/v1/enrollments/"+token+"/finish", "", map[string]any{"response": json.RawMessage(resp)}, &fin); code != 200 && code != 201 {
		s.t.Fatalf("enroll finish: HTTP %d", code)
	}
	return a
}

type challenge struct {
	ChallengeID    string          `json:"challengeId"`
	DisplayText    string          `json:"displayText"`
	RequestOptions json.RawMessage `json:"requestOptions"`
}

type decisionResult struct {
	Accepted bool   `json:"accepted"`
	Reason   string `json:"reason"`
	Status   string `json:"status"`
	Approved int    `json:"approved"`
	Needed   int    `json:"needed"`
	Error    string `json:"error"`
}

func (s *stack) challenge(ref, decision string) challenge {
	s.t.Helper()
	var c challenge
	if code := s.httpJSON("POST", "/approver/v1/approvals/"+ref+"/challenge", "", map[string]any{"decision": decision}, &c); code != 200 && code != 201 {
		s.t.Fatalf("challenge for %s: HTTP %d", ref, code)
	}
	return c
}

// sign makes the approver's assertion over a challenge.
func (a *approver) sign(t testing.TB, c challenge) json.RawMessage {
	t.Helper()
	opts, err := virtualwebauthn.ParseAssertionOptions(string(c.RequestOptions))
	if err != nil {
		t.Fatalf("parse request options: %v", err)
	}
	a.cred.Counter++
	a.auth.Credentials[0].Counter = a.cred.Counter
	return json.RawMessage(virtualwebauthn.CreateAssertionResponse(a.rp, a.auth, a.cred, *opts))
}

func (s *stack) decide(ref string, c challenge, decision string, resp json.RawMessage) decisionResult {
	s.t.Helper()
	var r decisionResult
	s.httpJSON("POST", "/approver/v1/approvals/"+ref+"/decision", "", map[string]any{
		"challengeId": c.ChallengeID, "decision": decision, "response": resp,
	}, &r)
	return r
}

// approve runs the whole ceremony: challenge, sign, decide.
func (s *stack) approve(a *approver, ref, decision string) decisionResult {
	s.t.Helper()
	c := s.challenge(ref, decision)
	return s.decide(ref, c, decision, a.sign(s.t, c))
}

// --- MCP over raw HTTP, 2026-07-28 era -----------------------------------

var rpcID atomic.Int64

type rpcResponse struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
	HTTPStatus int `json:"-"`
}

// call2026 sends one stateless 2026-07-28 request. name is the Mcp-Name
// header (tool name or task ID). declareTasks sets the tasks extension in
// the per-request client capabilities.
func (s *stack) call2026(token, method, name string, params map[string]any, declareTasks bool) rpcResponse {
	s.t.Helper()
	caps := map[string]any{}
	if declareTasks {
		caps["extensions"] = map[string]any{tasks.ExtTasks: map[string]any{}}
	}
	if params == nil {
		params = map[string]any{}
	}
	params["_meta"] = map[string]any{
		"io.modelcontextprotocol/protocolVersion":    "2026-07-28",
		"io.modelcontextprotocol/clientCapabilities": caps,
		"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "e2e", "version": "1"},
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": rpcID.Add(1), "method": method, "params": params})
	req, _ := http.NewRequest("POST", s.base+"/mcp", bytes.NewReader(body))
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
		s.t.Fatalf("%s: %v", method, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		raw = lastSSEData(raw)
	}
	var r rpcResponse
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &r); err != nil {
			s.t.Fatalf("%s: HTTP %d, undecodable %q", method, resp.StatusCode, raw)
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

// createTask calls a tool as a tasks-declaring 2026 client and returns the
// CreateTaskResult.
func (s *stack) createTask(token, tool string, args map[string]any) tasks.Task {
	s.t.Helper()
	r := s.call2026(token, "tools/call", tool, map[string]any{"name": tool, "arguments": args}, true)
	if r.Error != nil {
		s.t.Fatalf("tools/call %s: error %d %s", tool, r.Error.Code, r.Error.Message)
	}
	var ct struct {
		ResultType string `json:"resultType"`
		tasks.Task
	}
	if err := json.Unmarshal(r.Result, &ct); err != nil || ct.ResultType != "task" || ct.TaskID == "" {
		s.t.Fatalf("tools/call %s: want a CreateTaskResult, got %s", tool, r.Result)
	}
	return ct.Task
}

type detailedTask struct {
	ResultType string `json:"resultType"`
	tasks.DetailedTask
}

func (s *stack) getTask(token, taskID string) (detailedTask, rpcResponse) {
	s.t.Helper()
	r := s.call2026(token, "tasks/get", taskID, map[string]any{"taskId": taskID}, true)
	var d detailedTask
	if r.Error == nil {
		if err := json.Unmarshal(r.Result, &d); err != nil {
			s.t.Fatalf("tasks/get: %v: %s", err, r.Result)
		}
	}
	return d, r
}

// waitTerminal polls tasks/get until the task is terminal.
func (s *stack) waitTerminal(token, taskID string) detailedTask {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		d, r := s.getTask(token, taskID)
		if r.Error != nil {
			s.t.Fatalf("tasks/get %s: %d %s", taskID, r.Error.Code, r.Error.Message)
		}
		if d.Status.Terminal() {
			return d
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.t.Fatalf("task %s not terminal after 30s", taskID)
	return detailedTask{}
}

// refOf finds the approval reference of a task through the admin API, as an
// approver would get it from the notification.
func (s *stack) refOf(taskID string) string {
	s.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var list []struct {
			Ref    string `json:"ref"`
			TaskID string `json:"taskId"`
		}
		s.httpJSON("GET", "/admin/v1/approvals?status=pending", s.adminToken, nil, &list)
		for _, a := range list {
			if a.TaskID == taskID {
				return a.Ref
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.t.Fatalf("no pending approval for task %s", taskID)
	return ""
}

func (s *stack) transfers() int {
	s.t.Helper()
	ts, err := s.app.Ledger.Transfers(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	return len(ts)
}

func disposition(d detailedTask) tasks.Disposition { return tasks.DispositionOf(d.Result) }
