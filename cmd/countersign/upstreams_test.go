package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/internal/bench"
)

// startEcho starts an HTTP MCP upstream serving one read-only tool, echo,
// and returns its URL.
func startEcho(t *testing.T) string {
	t.Helper()
	echo, err := bench.StartEchoUpstream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { echo.Close() })
	return echo.URL
}

// writePolicy writes, in dir/name, a policy that denies every call with
// reason.
func writePolicy(t *testing.T, dir, name, reason string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(p, 0o700); err != nil {
		t.Fatal(err)
	}
	rego := "package countersign.authz\n\ndefault decision := {\"effect\": \"deny\", \"reason\": \"" + reason + "\"}\n"
	if err := os.WriteFile(filepath.Join(p, "policy.rego"), []byte(rego), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestUpstreamsListPolicy: upstreams list judges the tools with the policy
// `countersign dev` would load: --policy, else COUNTERSIGN_POLICY, else the
// configuration file's policy (a relative path from the file's directory),
// else the embedded default.
func TestUpstreamsListPolicy(t *testing.T) {
	unsetEnv(t, "COUNTERSIGN_CONFIG", "COUNTERSIGN_POLICY")
	url := startEcho(t)
	dir := t.TempDir()
	writePolicy(t, dir, "file-policy", "the file's policy")
	flagPolicy := writePolicy(t, dir, "flag-policy", "the flag's policy")
	envPolicy := writePolicy(t, dir, "env-policy", "the environment's policy")
	withPolicy := filepath.Join(dir, "countersign.yaml")
	if err := os.WriteFile(withPolicy, []byte("policy: file-policy\nupstreams:\n  - name: up\n    url: "+url+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	withoutPolicy := writeConfig(t, "upstreams:\n  - name: up\n    url: "+url+"\n")
	for _, tc := range []struct {
		name   string
		config string
		env    string
		args   []string
		want   string
	}{
		{name: "file", config: withPolicy, want: "deny: the file's policy"},
		{name: "flag over file", config: withPolicy, args: []string{"--policy", flagPolicy}, want: "deny: the flag's policy"},
		{name: "env over file", config: withPolicy, env: envPolicy, want: "deny: the environment's policy"},
		{name: "flag over env", config: withPolicy, env: envPolicy, args: []string{"--policy", flagPolicy}, want: "deny: the flag's policy"},
		{name: "embedded default", config: withoutPolicy, want: "allow: echo is read-only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("COUNTERSIGN_POLICY", tc.env)
			code, out, stderr := runCLI(append([]string{"upstreams", "list", "--config", tc.config, "--wait", "10s"}, tc.args...)...)
			if code != 0 {
				t.Fatalf("exit %d; out %q, err %q", code, out, stderr)
			}
			if !strings.Contains(out, "up__echo") || !strings.Contains(out, tc.want) {
				t.Errorf("output lacks up__echo with %q:\n%s", tc.want, out)
			}
		})
	}
}

// TestUpstreamsListConcurrent: the upstreams are checked at once, so five
// that are down take one --wait, not five; the output keeps the file's
// order.
func TestUpstreamsListConcurrent(t *testing.T) {
	unsetEnv(t, "COUNTERSIGN_CONFIG", "COUNTERSIGN_POLICY")
	cfg := "upstreams:\n"
	var names []string
	for i := range 6 {
		name := fmt.Sprintf("down%d", i)
		url := "http://127.0.0.1:1/mcp" // nothing listens there
		if i == 3 {
			name, url = "up", startEcho(t)
		}
		names = append(names, name)
		cfg += "  - name: " + name + "\n    url: " + url + "\n"
	}
	const wait = time.Second
	start := time.Now()
	_, out, stderr := runCLI("upstreams", "list", "--config", writeConfig(t, cfg), "--wait", wait.String())
	if took := time.Since(start); took > 7*wait/2 {
		t.Errorf("took %s for five upstreams down with --wait %s: checked one after another?", took, wait)
	}
	var got []string
	for line := range strings.Lines(out) {
		if !strings.HasPrefix(line, " ") {
			got = append(got, strings.Fields(line)[0])
		}
	}
	if !slices.Equal(got, names) {
		t.Errorf("upstreams in the output %v, want the file's order %v\n%s%s", got, names, out, stderr)
	}
	if !strings.Contains(out, "up__echo") {
		t.Errorf("the upstream that is up lacks its tool:\n%s", out)
	}
}

// TestUpstreamsListExitStatus: upstreams list exits 1 when an upstream is
// down, after printing every upstream, and 0 when all are up.
func TestUpstreamsListExitStatus(t *testing.T) {
	unsetEnv(t, "COUNTERSIGN_CONFIG", "COUNTERSIGN_POLICY")
	url := startEcho(t)
	up := "upstreams:\n  - name: up\n    url: " + url + "\n"
	code, out, stderr := runCLI("upstreams", "list", "--config", writeConfig(t, up))
	if code != 0 || stderr != "" || !strings.Contains(out, "up__echo") {
		t.Errorf("all up: exit %d, stderr %q, out %q; want 0, nothing and the tool", code, stderr, out)
	}
	down := "upstreams:\n  - name: gone\n    url: http://127.0.0.1:1/mcp\n" + strings.TrimPrefix(up, "upstreams:\n")
	code, out, stderr = runCLI("upstreams", "list", "--config", writeConfig(t, down), "--wait", "500ms")
	if code != 1 || !strings.Contains(stderr, "1 of 2 upstreams down") {
		t.Errorf("one down: exit %d, stderr %q; want 1 and how many are down", code, stderr)
	}
	if !strings.Contains(out, "gone  (") || !strings.Contains(out, "up__echo") {
		t.Errorf("one down: not every upstream printed:\n%s", out)
	}
}

// TestUpstreamsListStderr: under a stdio upstream that is down, the last
// five lines its process wrote to stderr, each cut to a few hundred
// characters; those of one attempt, though it was retried.
func TestUpstreamsListStderr(t *testing.T) {
	unsetEnv(t, "COUNTERSIGN_CONFIG", "COUNTERSIGN_POLICY")
	script := "echo 'starting 1' >&2; echo 'starting 2' >&2; printf '%0800d' 0 >&2; echo >&2; " +
		"echo 'detail a' >&2; echo 'detail b' >&2; echo 'fatal: missing API_KEY' >&2; exit 3"
	cfg := writeConfig(t, "upstreams:\n  - name: broken\n    command: [\"sh\", \"-c\", \""+script+"\"]\n")
	// 2 s: the upstream is retried a few times meanwhile.
	code, out, stderr := runCLI("upstreams", "list", "--config", cfg, "--wait", "2s")
	if code != 1 {
		t.Fatalf("exit %d; out %q, err %q", code, out, stderr)
	}
	want := []string{"  stderr: starting 2", "  stderr: " + strings.Repeat("0", 300) + "…",
		"  stderr: detail a", "  stderr: detail b", "  stderr: fatal: missing API_KEY"}
	var got []string
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "  stderr: ") {
			got = append(got, strings.TrimSuffix(line, "\n"))
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("stderr lines shown:\n%s\nwant:\n%s\nwhole output:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"), out)
	}
	if !strings.HasPrefix(out, "broken  (sh -c ") || !strings.Contains(out, "down: ") {
		t.Errorf("the upstream is not shown down:\n%s", out)
	}
}

// TestUpstreamsListLongError: an upstream's error is shown whole, up to
// its advice at the end, though it is longer than a line.
func TestUpstreamsListLongError(t *testing.T) {
	unsetEnv(t, "COUNTERSIGN_CONFIG", "COUNTERSIGN_POLICY")
	moved := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/"+strings.Repeat("elsewhere/", 20)+"mcp", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(moved.Close)
	cfg := writeConfig(t, "upstreams:\n  - name: moved\n    url: "+moved.URL+"/mcp\n")
	code, out, stderr := runCLI("upstreams", "list", "--config", cfg, "--wait", "500ms")
	if code != 1 {
		t.Fatalf("exit %d; out %q, err %q", code, out, stderr)
	}
	want := "Countersign does not follow redirects: configure the URL it points to"
	if !strings.Contains(out, want) {
		t.Errorf("the error lacks its end %q:\n%s", want, out)
	}
}

// TestUpstreamsListRefusedTools: a tool Countersign will not serve (a name
// MCP does not allow) is shown with the reason, not left out in silence:
// the log of `dev` was the only place that said so.
func TestUpstreamsListRefusedTools(t *testing.T) {
	unsetEnv(t, "COUNTERSIGN_CONFIG", "COUNTERSIGN_POLICY")
	s := mcp.NewServer(&mcp.Implementation{Name: "odd", Version: "1"}, &mcp.ServerOptions{Logger: slog.New(slog.DiscardHandler)})
	for _, name := range []string{"fine", "with space"} {
		s.AddTool(&mcp.Tool{Name: name, InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{}, nil
			})
	}
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(srv.Close)
	code, out, stderr := runCLI("upstreams", "list", "--config", writeConfig(t, "upstreams:\n  - name: odd\n    url: "+srv.URL+"\n"))
	if code != 0 || !strings.Contains(out, "odd__fine") {
		t.Fatalf("exit %d; out %q, err %q", code, out, stderr)
	}
	if want := `  refused: "with space": invalid tool name: name has the character ' '`; !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
}
