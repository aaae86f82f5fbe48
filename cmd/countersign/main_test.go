package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/devtest"
)

// startDev starts countersign dev (with its own rate limits) and returns
// its data dir.
func startDev(t *testing.T) string {
	t.Helper()
	return devtest.Start(t, devtest.Options{AppLimits: true}).Dir
}

func runCLI(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestAdminCommands(t *testing.T) {
	dir := startDev(t)

	code, out, stderr := runCLI("approvers", "add", "carol", "--group", "approvers", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "/enroll/") {
		t.Fatalf("approvers add: exit %d, out %q, err %q", code, out, stderr)
	}
	code, out, stderr = runCLI("approvers", "add", "Carol Jones", "--group", "approvers", "--principal", "ci-bot", "--principal", "carol", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "acts as ci-bot, carol") {
		t.Fatalf("approvers add --principal: exit %d, out %q, err %q", code, out, stderr)
	}
	// A look-alike name ("аlice", with a Cyrillic "а") is refused.
	code, _, stderr = runCLI("approvers", "add", "\u0430lice", "--group", "approvers", "--data-dir", dir)
	if code != 1 || !strings.Contains(stderr, "Cyrillic and Latin") {
		t.Fatalf("look-alike approver: exit %d, err %q", code, stderr)
	}
	code, out, stderr = runCLI("agents", "add", "ci-bot", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "csag_") {
		t.Fatalf("agents add: exit %d, out %q, err %q", code, out, stderr)
	}
	// The same agent name twice is refused with the server's reason.
	code, _, stderr = runCLI("agents", "add", "ci-bot", "--data-dir", dir)
	if code != 1 || stderr == "" {
		t.Fatalf("duplicate agent: exit %d, err %q", code, stderr)
	}
	// An operator's transaction token for the dev agent's exact call.
	code, out, stderr = runCLI("transaction-tokens", "issue", "transfer_funds", "--principal", "dev-agent",
		"--arguments", `{"to":"acct-cli","amount":5000,"currency":"EUR"}`, "--data-dir", dir)
	if code != 0 || !strings.Contains(out, `"token":"ey`) || !strings.Contains(out, `"jti":"txt_`) {
		t.Fatalf("transaction-tokens issue: exit %d, out %q, err %q", code, out, stderr)
	}
	code, _, stderr = runCLI("transaction-tokens", "issue", "transfer_funds", "--principal", "dev-agent", "--arguments", `{"amount":"lots"}`, "--data-dir", dir)
	if code != 1 || !strings.Contains(stderr, "invalid_request") {
		t.Fatalf("transaction-tokens issue, bad arguments: exit %d, err %q", code, stderr)
	}
	code, _, stderr = runCLI("transaction-tokens", "issue", "transfer_funds", "--data-dir", dir)
	if code != 2 {
		t.Fatalf("transaction-tokens issue without --principal: exit %d, err %q", code, stderr)
	}
	code, out, stderr = runCLI("transaction-tokens", "rotate-key", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "signed with ed25519-") {
		t.Fatalf("transaction-tokens rotate-key: exit %d, out %q, err %q", code, out, stderr)
	}
	code, out, _ = runCLI("approvals", "list", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "No pending approvals") {
		t.Fatalf("approvals list: exit %d, out %q", code, out)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no command", nil, 2, "Usage"},
		{"unknown command", []string{"frobnicate"}, 2, "unknown command"},
		// An admin command that does not exist is named as such, before
		// the admin token is looked for or the server URL checked.
		{"unknown admin command", []string{"approvers", "ad", "x", "--data-dir", t.TempDir()}, 2, `unknown command "approvers ad"`},
		{"admin command without its verb", []string{"agents", "--data-dir", t.TempDir()}, 2, `unknown command "agents --data-dir"`},
		{"unknown admin command to a plain http server", []string{"approvals", "lsit", "--server", "http://example.com"}, 2, `unknown command "approvals lsit"`},
		{"approver without group", []string{"approvers", "add", "x", "--data-dir", t.TempDir()}, 1, "admin token"},
		{"no admin token", []string{"approvals", "list", "--data-dir", t.TempDir()}, 1, "admin token"},
		{"bad flag", []string{"dev", "--no-such-flag"}, 2, "flag provided but not defined"},
		{"stray argument", []string{"dev", "extra"}, 2, "unexpected argument"},
		{"non-loopback conformance", []string{"dev", "--conformance", "--addr", "0.0.0.0:0", "--data-dir", t.TempDir()}, 1, "loopback"},
		{"insecure public url", []string{"dev", "--public-url", "http://example.com", "--data-dir", t.TempDir()}, 1, "https"},
		{"server url without scheme", []string{"approvals", "list", "--server", "127.0.0.1:8080", "--data-dir", t.TempDir()}, 2, "with its scheme, e.g. http://127.0.0.1:8080"},
		{"dev-only flag on server", []string{"server", "--sqlite-sync", "NORMAL"}, 2, "flag provided but not defined: -sqlite-sync"},
		{"dev-only flag on worker", []string{"worker", "--conformance"}, 2, "flag provided but not defined: -conformance"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, stderr := runCLI(tc.args...)
			if code != tc.code || !strings.Contains(out+stderr, tc.want) {
				t.Fatalf("exit %d (want %d), output %q, want it to mention %q", code, tc.code, out+stderr, tc.want)
			}
		})
	}
}

func TestApproversAddNeedsGroup(t *testing.T) {
	dir := startDev(t)
	code, _, stderr := runCLI("approvers", "add", "dave", "--data-dir", dir)
	if code != 2 || !strings.Contains(stderr, "--group") {
		t.Fatalf("exit %d, err %q", code, stderr)
	}
}

// TestTakenPortFailsFirst: dev on a taken address says so and stops before
// it starts the embedded services or writes its data dir.
func TestTakenPortFailsFirst(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir := filepath.Join(t.TempDir(), "data")
	start := time.Now()
	code, out, stderr := runCLI("dev", "--addr", ln.Addr().String(), "--data-dir", dir)
	if code != 1 || !strings.Contains(stderr, "listen on "+ln.Addr().String()) || !strings.Contains(stderr, "--addr") {
		t.Fatalf("exit %d, out %q, err %q", code, out, stderr)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("data dir %s was made (stat: %v)", dir, err)
	}
	if strings.Count(stderr, "\n") > 2 {
		t.Errorf("more than the one error line:\n%s", stderr)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %s: it started something before failing", d)
	}
}

// TestUsageListsEverySubcommand: the top-level usage names every audit
// subcommand that `countersign audit` takes.
func TestUsageListsEverySubcommand(t *testing.T) {
	for _, line := range strings.Split(auditUsage, "\n") {
		_, cmd, ok := strings.Cut(strings.TrimSpace(line), "countersign audit ")
		if !ok {
			continue
		}
		sub, _, _ := strings.Cut(cmd, " ")
		if !strings.Contains(usage, "countersign audit "+sub) {
			t.Errorf("usage does not list `countersign audit %s`", sub)
		}
	}
}

// TestVersion: `countersign version` and `--version` print the build on one
// line and exit 0, before anything starts.
func TestVersion(t *testing.T) {
	for _, arg := range []string{"version", "--version"} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{arg}, &stdout, &stderr); code != 0 {
			t.Fatalf("%s: exit %d, stderr %q", arg, code, stderr.String())
		}
		want := fmt.Sprintf(" %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
		if out := stdout.String(); !strings.HasPrefix(out, "countersign ") || !strings.HasSuffix(out, want) || strings.Count(out, "\n") != 1 {
			t.Errorf("%s printed %q, want \"countersign VERSION%s\"", arg, out, want)
		}
	}
}
