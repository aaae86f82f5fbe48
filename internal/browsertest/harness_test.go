package browsertest

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
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/webauthn"
	"github.com/chromedp/chromedp"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/tasks"
)

// ---- the browser -----------------------------------------------------------

// chromiumPath finds Chromium, or fails the test with how to install it.
func chromiumPath(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("COUNTERSIGN_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("Chromium is required for the approver site's browser tests and was not found. " +
		"Install it (Debian/Ubuntu: `sudo apt-get install -y chromium`; .ci/run does this) " +
		"or set COUNTERSIGN_CHROMIUM to a Chrome or Chromium binary.")
	return ""
}

// newBrowser starts one headless Chromium for a test.
func newBrowser(t testing.TB) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.UserDataDir(t.TempDir()),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	// Start the browser now, so that a launch failure is reported here.
	if err := chromedp.Do(browser); err != nil {
		cancelBrowser()
		cancelAlloc()
		t.Fatalf("start Chromium: %v", err)
	}
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
	})
	return browser
}

// device is one approver's phone or laptop: its own browser profile (a
// browser context) and tab, with a virtual platform authenticator holding
// resident, user-verifying passkeys.
type device struct {
	t     testing.TB
	ctx   context.Context
	width int64
}

const (
	phoneW, phoneH     = 390, 844
	desktopW, desktopH = 1280, 900
)

func newDevice(t testing.TB, browser context.Context, phone bool) *device {
	t.Helper()
	ctx, cancel := chromedp.NewContext(browser, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	d := &device{t: t, ctx: ctx, width: desktopW}
	viewport := chromedp.EmulateViewport(desktopW, desktopH)
	if phone {
		d.width = phoneW
		viewport = chromedp.EmulateViewport(phoneW, phoneH, chromedp.EmulateMobile, chromedp.EmulateTouch, chromedp.EmulateScale(2))
	}
	addAuthenticator := chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		if _, err := chromedp.Call(ctx, webauthn.Enable, webauthn.EnableParams{EnableUI: new(false)}); err != nil {
			return fmt.Errorf("WebAuthn.enable: %w", err)
		}
		_, err := chromedp.Call(ctx, webauthn.AddVirtualAuthenticator, webauthn.AddVirtualAuthenticatorParams{
			Options: &webauthn.VirtualAuthenticatorOptions{
				Protocol:                    webauthn.AuthenticatorProtocolCtap2,
				Ctap2version:                webauthn.Ctap2versionCtap21,
				Transport:                   webauthn.AuthenticatorTransportInternal,
				HasResidentKey:              true,
				HasUserVerification:         true,
				IsUserVerified:              true,
				AutomaticPresenceSimulation: true,
			},
		})
		if err != nil {
			return fmt.Errorf("WebAuthn.addVirtualAuthenticator: %w", err)
		}
		return nil
	})
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank"), viewport, addAuthenticator); err != nil {
		t.Fatalf("set up device: %v", err)
	}
	return d
}

func (d *device) do(actions ...chromedp.Action[chromedp.Void]) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(d.ctx, 45*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		d.t.Fatalf("browser: %v\npage: %s", err, d.bodyText())
	}
}

func (d *device) bodyText() string {
	ctx, cancel := context.WithTimeout(d.ctx, 5*time.Second)
	defer cancel()
	s, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	return s
}

func (d *device) open(url string) {
	d.t.Helper()
	d.do(chromedp.Navigate(url), chromedp.WaitReady(chromedp.CSS("body")))
}

// click taps on a phone and clicks on a desktop.
func (d *device) click(sel string) {
	d.t.Helper()
	d.do(chromedp.WaitVisible(chromedp.CSS(sel)), chromedp.WaitEnabled(chromedp.CSS(sel)))
	if d.width == phoneW {
		d.do(chromedp.Tap(chromedp.CSS(sel)))
		return
	}
	d.do(chromedp.Click(chromedp.CSS(sel)))
}

// waitText waits until the element's text contains want. It survives
// navigations (a click on a link) while it waits.
func (d *device) waitText(sel, want string) {
	d.t.Helper()
	expr := fmt.Sprintf(`(function(){const e=document.querySelector(%q);return !!e && e.textContent.includes(%q);})()`, sel, want)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(d.ctx, 5*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("waiting for %q in %s: %v\npage: %s", want, sel, err, d.bodyText())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// in returns the device for use in (sub)test t.
func (d *device) in(t testing.TB) *device {
	c := *d
	c.t = t
	return &c
}

func (d *device) text(sel string) string {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(d.ctx, 10*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%q)||{}).textContent||""`, sel)))
	if err != nil {
		d.t.Fatalf("read %s: %v", sel, err)
	}
	return s
}

func (d *device) present(sel string) bool {
	d.t.Helper()
	ok, err := chromedp.Run(d.ctx, chromedp.Evaluate[bool](fmt.Sprintf(`(function(){const e=document.querySelector(%q);return !!e && !e.closest("[hidden]");})()`, sel)))
	if err != nil {
		d.t.Fatalf("query %s: %v", sel, err)
	}
	return ok
}

func (d *device) eval(expr string) []byte {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(d.ctx, 45*time.Second)
	defer cancel()
	b, err := chromedp.Run(ctx, chromedp.Evaluate[[]byte](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		d.t.Fatalf("evaluate: %v", err)
	}
	return b
}

// screenshot saves the page (or one element) as docs/screenshots/name.png
// when UPDATE_SCREENSHOTS=1; otherwise it does nothing.
func (d *device) screenshot(name, sel string) {
	d.t.Helper()
	if os.Getenv("UPDATE_SCREENSHOTS") != "1" {
		return
	}
	// Let transitions and the countdown settle, and hide the caret.
	d.do(chromedp.Evaluate[chromedp.Void](`document.activeElement && document.activeElement.blur()`), chromedp.Sleep(150*time.Millisecond))
	var shot chromedp.Action[[]byte]
	if sel == "" {
		shot = chromedp.FullScreenshot(100)
	} else {
		shot = chromedp.Screenshot(chromedp.CSS(sel))
	}
	ctx, cancel := context.WithTimeout(d.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, shot)
	if err != nil {
		d.t.Fatalf("screenshot %s: %v", name, err)
	}
	dir := filepath.Join(repoRoot(d.t), "docs", "screenshots")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		d.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		d.t.Fatal(err)
	}
	d.t.Logf("wrote docs/screenshots/%s.png (%d bytes)", name, len(png))
}

func repoRoot(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// ---- countersign dev -------------------------------------------------------

// stack is a running `countersign dev` on a temporary data dir.
type stack struct {
	t          testing.TB
	base       string
	agentToken string
	adminToken string
	app        *app.App
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

// startStack starts countersign dev, with the policy in policyDir when it
// is not empty.
func startStack(t testing.TB, policyDir string) *stack {
	t.Helper()
	dir := t.TempDir()
	port := freePort(t)
	cfg := app.Config{DataDir: dir, Addr: fmt.Sprintf("127.0.0.1:%d", port), PolicyDir: policyDir, SQLiteSync: "NORMAL"}
	ctx, cancel := context.WithCancel(context.Background())
	a, err := app.New(ctx, cfg, app.ModeDev, nil, io.Discard)
	if err != nil {
		cancel()
		t.Fatalf("start countersign dev: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("shutdown: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("countersign did not stop within 30s")
		}
	})
	s := &stack{t: t, base: fmt.Sprintf("http://localhost:%d", port), app: a}
	s.agentToken = readFile(t, filepath.Join(dir, app.AgentTokenFile))
	s.adminToken = readFile(t, filepath.Join(dir, app.AdminTokenFile))
	return s
}

func readFile(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func (s *stack) httpJSON(method, path, token string, body, out any) int {
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
			s.t.Fatalf("%s %s: HTTP %d, undecodable %q: %v", method, path, resp.StatusCode, b, err)
		}
	}
	return resp.StatusCode
}

// addApprover creates an approver and returns the enrollment URL.
func (s *stack) addApprover(name string) string {
	s.t.Helper()
	var added struct {
		EnrollURL string `json:"enrollUrl"`
	}
	if code := s.httpJSON("POST", "/admin/v1/approvers", s.adminToken, map[string]any{"name": name, "groups": []string{"approvers"}}, &added); code != http.StatusCreated {
		s.t.Fatalf("add approver %s: HTTP %d", name, code)
	}
	return added.EnrollURL
}

type approvalView struct {
	Status   string `json:"status"`
	Approved int    `json:"approved"`
	Needed   int    `json:"needed"`
	Timeline []struct {
		Kind   string `json:"kind"`
		Detail string `json:"detail"`
	} `json:"timeline"`
}

func (s *stack) approval(ref string) approvalView {
	s.t.Helper()
	var v approvalView
	if code := s.httpJSON("GET", "/approver/v1/approvals/"+ref, "", nil, &v); code != http.StatusOK {
		s.t.Fatalf("GET approval %s: HTTP %d", ref, code)
	}
	return v
}

func (s *stack) transfers() int {
	s.t.Helper()
	ts, err := s.app.Ledger.Transfers(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	return len(ts)
}

// ---- MCP over raw HTTP (2026-07-28) ----------------------------------------

var rpcID atomic.Int64

func (s *stack) mcp(method, name string, params map[string]any) json.RawMessage {
	s.t.Helper()
	params["_meta"] = map[string]any{
		"io.modelcontextprotocol/protocolVersion":    "2026-07-28",
		"io.modelcontextprotocol/clientCapabilities": map[string]any{"extensions": map[string]any{tasks.ExtTasks: map[string]any{}}},
		"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "browsertest", "version": "1"},
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": rpcID.Add(1), "method": method, "params": params})
	req, _ := http.NewRequest("POST", s.base+"/mcp", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", method)
	req.Header.Set("Mcp-Name", name)
	req.Header.Set("Authorization", "Bearer "+s.agentToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("%s: %v", method, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		sc := bufio.NewScanner(bytes.NewReader(raw))
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			if d, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:")); ok {
				raw = append([]byte(nil), bytes.TrimSpace(d)...)
			}
		}
	}
	var r struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		s.t.Fatalf("%s: HTTP %d, undecodable %q", method, resp.StatusCode, raw)
	}
	if r.Error != nil {
		s.t.Fatalf("%s: error %d %s", method, r.Error.Code, r.Error.Message)
	}
	return r.Result
}

// createTask makes the agent call a gated tool and returns the task ID.
func (s *stack) createTask(tool string, args map[string]any) string {
	s.t.Helper()
	var ct struct {
		ResultType string `json:"resultType"`
		TaskID     string `json:"taskId"`
	}
	res := s.mcp("tools/call", tool, map[string]any{"name": tool, "arguments": args})
	if err := json.Unmarshal(res, &ct); err != nil || ct.ResultType != "task" || ct.TaskID == "" {
		s.t.Fatalf("tools/call %s: want a task, got %s", tool, res)
	}
	return ct.TaskID
}

type taskResult struct {
	Status string          `json:"status"`
	Result json.RawMessage `json:"result"`
}

func (r taskResult) disposition() tasks.Disposition { return tasks.DispositionOf(r.Result) }

func (r taskResult) text() string {
	var res struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	_ = json.Unmarshal(r.Result, &res)
	var parts []string
	for _, c := range res.Content {
		parts = append(parts, c.Text)
	}
	return strings.Join(parts, "\n")
}

func (s *stack) getTask(taskID string) taskResult {
	s.t.Helper()
	var tr taskResult
	if err := json.Unmarshal(s.mcp("tasks/get", taskID, map[string]any{"taskId": taskID}), &tr); err != nil {
		s.t.Fatal(err)
	}
	return tr
}

func (s *stack) waitTerminal(taskID string) taskResult {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		tr := s.getTask(taskID)
		if tasks.Status(tr.Status).Terminal() {
			return tr
		}
		time.Sleep(25 * time.Millisecond)
	}
	s.t.Fatalf("task %s not terminal after 30s", taskID)
	return taskResult{}
}

// refOf finds a task's approval reference, as the notification carries it.
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
