package browsertest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/webauthn"
	"github.com/chromedp/chromedp"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/devtest"
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

// ---- countersign dev (internal/devtest) ------------------------------------

// stack is a running `countersign dev` on a temporary data dir.
type stack struct{ *devtest.Stack }

// startStack starts countersign dev, with the policy in policyDir when it
// is not empty, and the app's own rate limits.
func startStack(t testing.TB, policyDir string) *stack {
	t.Helper()
	return &stack{devtest.Start(t, devtest.Options{Config: app.Config{PolicyDir: policyDir}, AppLimits: true, ClientName: "browsertest"})}
}

// addApprover creates an approver and returns the enrollment URL.
func (s *stack) addApprover(name string) string {
	s.T.Helper()
	var added struct {
		EnrollURL string `json:"enrollUrl"`
	}
	if code := s.HTTPJSON("POST", "/admin/v1/approvers", s.AdminToken, map[string]any{"name": name, "groups": []string{"approvers"}}, &added); code != http.StatusCreated {
		s.T.Fatalf("add approver %s: HTTP %d", name, code)
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
	s.T.Helper()
	var v approvalView
	if code := s.HTTPJSON("GET", "/approver/v1/approvals/"+ref, "", nil, &v); code != http.StatusOK {
		s.T.Fatalf("GET approval %s: HTTP %d", ref, code)
	}
	return v
}

// createTask makes the agent call a gated tool and returns the task ID.
func (s *stack) createTask(tool string, args map[string]any) string {
	s.T.Helper()
	return s.CreateTask(s.AgentToken, tool, args).TaskID
}

type taskResult struct{ devtest.DetailedTask }

func (r taskResult) disposition() tasks.Disposition { return devtest.Disposition(r.DetailedTask) }

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

// getTask gets the agent's task; an error answer fails the test.
func (s *stack) getTask(taskID string) taskResult {
	s.T.Helper()
	d, r := s.GetTask(s.AgentToken, taskID)
	if r.Error != nil {
		s.T.Fatalf("tasks/get: error %d %s", r.Error.Code, r.Error.Message)
	}
	return taskResult{d}
}

// waitTerminal polls the agent's task until it is terminal.
func (s *stack) waitTerminal(taskID string) taskResult {
	s.T.Helper()
	return taskResult{s.WaitTerminal(s.AgentToken, taskID)}
}
