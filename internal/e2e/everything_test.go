package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/tasks"
)

// startEverything runs the official server-everything over Streamable HTTP
// (PORT=… node dist/index.js streamableHttp) and returns its /mcp URL.
func startEverything(t testing.TB, node, modules string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(node, filepath.Join(modules, "@modelcontextprotocol", "server-everything", "dist", "index.js"), "streamableHttp")
	cmd.Env = append(os.Environ(), fmt.Sprintf("PORT=%d", port))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			return url
		}
		if time.Now().After(deadline) {
			t.Fatal("server-everything did not start listening")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The official server-everything over Streamable HTTP behind Countersign:
// read-only tools pass straight through with their structured content
// exactly as the upstream gives it, a tool that may change something waits
// for an approval.
func TestUpstreamEverythingOverHTTP(t *testing.T) {
	node, modules := upstreamServers(t)
	url := startEverything(t, node, modules)
	path := filepath.Join(t.TempDir(), "countersign.yaml")
	cfg := "upstreams:\n  - name: everything\n    url: " + url + "\n    timeout: 30s\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startStackConfig(t, app.Config{ConfigFile: path}, 0)
	alice := s.Enroll("alice", "approvers")
	s.waitTool(t, "everything__toggle-simulated-logging")

	call := func(tool string, args map[string]any) (json.RawMessage, string) {
		r := s.Call2026(s.AgentToken, "tools/call", tool, map[string]any{"name": tool, "arguments": args}, true)
		if r.Error != nil {
			t.Fatalf("%s: %d %s", tool, r.Error.Code, r.Error.Message)
		}
		return r.Result, resultText(t, r.Result)
	}

	t.Run("echo passes through", func(t *testing.T) {
		res, txt := call("everything__echo", map[string]any{"message": "hi there"})
		if !strings.Contains(txt, "hi there") || strings.Contains(string(res), `"resultType":"task"`) {
			t.Fatalf("echo: %s", res)
		}
	})

	t.Run("structured content unchanged", func(t *testing.T) {
		args := map[string]any{"location": "New York"}
		res, _ := call("everything__get-structured-content", args)
		var ours struct {
			StructuredContent json.RawMessage `json:"structuredContent"`
		}
		if err := json.Unmarshal(res, &ours); err != nil || len(ours.StructuredContent) == 0 {
			t.Fatalf("no structuredContent: %s", res)
		}
		// The same call straight to the upstream.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c := mcp.NewClient(&mcp.Implementation{Name: "e2e-direct", Version: "1"}, nil)
		sess, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: http.DefaultClient}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		direct, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "get-structured-content", Arguments: args})
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(direct.StructuredContent)
		if !jsonEqual(t, ours.StructuredContent, want) {
			t.Fatalf("structuredContent through Countersign %s, straight from the upstream %s", ours.StructuredContent, want)
		}
	})

	t.Run("a tool that may change something is gated", func(t *testing.T) {
		task := s.CreateTask(s.AgentToken, "everything__toggle-simulated-logging", map[string]any{})
		if res := s.Approve(alice, s.RefOf(task.TaskID), "approve"); !res.Accepted {
			t.Fatalf("approval rejected: %+v", res)
		}
		d := s.WaitTerminal(s.AgentToken, task.TaskID)
		if disposition(d) != tasks.ApprovedExecuted {
			t.Fatalf("want approved-executed, got %s: %s", disposition(d), d.Result)
		}
		if txt := resultText(t, d.Result); !strings.Contains(strings.ToLower(txt), "logging") {
			t.Fatalf("the upstream's content is missing: %q", txt)
		}
	})
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}
