package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/tasks"
)

// upstreamServers locates the pinned upstream MCP servers scripts/upstreams.sh
// installs (the test command runs it first): node (22.19 or newer) and the
// node_modules holding @modelcontextprotocol/server-filesystem and
// server-everything. They are real servers no one here wrote; without them
// the test fails and says how to install them.
func upstreamServers(t *testing.T) (node, modules string) {
	t.Helper()
	node, modules = os.Getenv("COUNTERSIGN_TEST_NODE"), os.Getenv("COUNTERSIGN_TEST_UPSTREAMS")
	if node == "" || modules == "" {
		t.Fatal("COUNTERSIGN_TEST_NODE and COUNTERSIGN_TEST_UPSTREAMS are not set: run ./scripts/test.sh, or `eval $(./scripts/upstreams.sh)` before go test")
	}
	return node, modules
}

// writeConfig writes a configuration file gating the official filesystem
// server over stdio in front of dir.
func writeFSConfig(t *testing.T, node, modules, dir string) string {
	t.Helper()
	server := filepath.Join(modules, "@modelcontextprotocol", "server-filesystem", "dist", "index.js")
	cmd, _ := json.Marshal([]string{node, server, dir})
	path := filepath.Join(t.TempDir(), "countersign.yaml")
	cfg := "upstreams:\n  - name: fs\n    command: " + string(cmd) + "\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// waitTool waits until tools/list has tool (the upstream connects in the
// background).
func (s *stack) waitTool(t *testing.T, tool string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := s.Call2026(s.AgentToken, "tools/list", "", nil, true)
		if r.Error == nil && strings.Contains(string(r.Result), `"`+tool+`"`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("tool %s never appeared in tools/list: %s", tool, r.Result)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The official filesystem server behind Countersign: reads pass straight
// through, a write waits for a passkey approval and then happens exactly
// once with the exact content, a denied write never happens.
func TestUpstreamFilesystem(t *testing.T) {
	node, modules := upstreamServers(t)
	data := t.TempDir()
	if err := os.WriteFile(filepath.Join(data, "hello.txt"), []byte("hello from the upstream\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startStackConfig(t, app.Config{ConfigFile: writeFSConfig(t, node, modules, data)}, 0)
	alice := s.Enroll("alice", "approvers")
	s.waitTool(t, "fs__write_file")

	t.Run("read-only tool answers at once", func(t *testing.T) {
		r := s.Call2026(s.AgentToken, "tools/call", "fs__read_text_file",
			map[string]any{"name": "fs__read_text_file", "arguments": map[string]any{"path": filepath.Join(data, "hello.txt")}}, true)
		if r.Error != nil {
			t.Fatalf("read: %d %s", r.Error.Code, r.Error.Message)
		}
		if txt := resultText(t, r.Result); !strings.Contains(txt, "hello from the upstream") {
			t.Fatalf("read result: %s", r.Result)
		}
		if strings.Contains(string(r.Result), `"resultType":"task"`) {
			t.Fatalf("a read-only call became a task: %s", r.Result)
		}
	})

	t.Run("write is approved, then written exactly once", func(t *testing.T) {
		target := filepath.Join(data, "approved.txt")
		content := "line one\nline two with ünïcode\n"
		task := s.CreateTask(s.AgentToken, "fs__write_file", map[string]any{"path": target, "content": content})
		if _, err := os.Stat(target); !os.IsNotExist(err) {
			t.Fatalf("the file exists before approval (err %v)", err)
		}
		if res := s.Approve(alice, s.RefOf(task.TaskID), "approve"); !res.Accepted {
			t.Fatalf("approval rejected: %+v", res)
		}
		d := s.WaitTerminal(s.AgentToken, task.TaskID)
		if d.Status != tasks.StatusCompleted || disposition(d) != tasks.ApprovedExecuted {
			t.Fatalf("want approved-executed, got %s/%s: %s", d.Status, disposition(d), d.Result)
		}
		got, err := os.ReadFile(target)
		if err != nil || string(got) != content {
			t.Fatalf("file = %q (err %v), want %q", got, err, content)
		}
		txt := resultText(t, d.Result)
		if !strings.HasPrefix(txt, "[approved-executed]") || !strings.Contains(txt, "Successfully wrote") {
			t.Fatalf("result: disposition first, then the upstream's content; got %q", txt)
		}
	})

	t.Run("denied write never happens", func(t *testing.T) {
		target := filepath.Join(data, "denied.txt")
		task := s.CreateTask(s.AgentToken, "fs__write_file", map[string]any{"path": target, "content": "never"})
		if res := s.Approve(alice, s.RefOf(task.TaskID), "deny"); !res.Accepted {
			t.Fatalf("deny rejected: %+v", res)
		}
		d := s.WaitTerminal(s.AgentToken, task.TaskID)
		if disposition(d) != tasks.DeniedNotExecuted {
			t.Fatalf("want denied-not-executed, got %s: %s", disposition(d), d.Result)
		}
		if _, err := os.Stat(target); !os.IsNotExist(err) {
			t.Fatalf("a denied write happened (err %v)", err)
		}
	})
}
