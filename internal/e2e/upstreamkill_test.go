package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/tasks"
)

// TestHoldingUpstreamProcess is not a test: run by TestUpstreamKilledMidCall
// as its upstream (the test binary over stdio), it serves one tool, "hold",
// that writes the process ID to $HOLD_PID_FILE and never answers, and one,
// "work", that answers after the seconds it is given.
func TestHoldingUpstreamProcess(t *testing.T) {
	pidFile := os.Getenv("HOLD_PID_FILE")
	if pidFile == "" {
		return // run as a test: nothing to do
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "holding-upstream", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "hold", Description: "Starts an effect and never reports back"},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			_ = os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())), 0o600)
			<-ctx.Done()
			select {} // killed before it ever answers
		})
	mcp.AddTool(s, &mcp.Tool{Name: "work", Description: "Works for the given seconds, then reports"},
		func(ctx context.Context, _ *mcp.CallToolRequest, in struct {
			Seconds float64 `json:"seconds"`
		}) (*mcp.CallToolResult, any, error) {
			select {
			case <-time.After(time.Duration(in.Seconds * float64(time.Second))):
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("worked %gs", in.Seconds)}}}, nil, nil
		})
	_ = s.Run(context.Background(), &mcp.StdioTransport{})
	os.Exit(0)
}

// An upstream process killed while an approved call runs on it: the task
// ends outcome-unknown (the effect may have happened; the call is never
// sent again), and the upstream is restarted.
func TestUpstreamKilledMidCall(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	cmd, _ := json.Marshal([]string{os.Args[0], "-test.run=^TestHoldingUpstreamProcess$", "-test.count=1", "-test.timeout=0"})
	path := filepath.Join(t.TempDir(), "countersign.yaml")
	cfg := "upstreams:\n  - name: slow\n    command: " + string(cmd) + "\n    env: {HOLD_PID_FILE: \"" + pidFile + "\"}\n    timeout: 5m\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startStackConfig(t, app.Config{ConfigFile: path}, 0)
	alice := s.Enroll("alice", "approvers")
	s.waitTool(t, "slow__hold")

	task := s.CreateTask(s.AgentToken, "slow__hold", map[string]any{})
	if res := s.Approve(alice, s.RefOf(task.TaskID), "approve"); !res.Accepted {
		t.Fatalf("approval rejected: %+v", res)
	}
	var pid int
	deadline := time.Now().Add(30 * time.Second)
	for pid == 0 {
		if b, err := os.ReadFile(pidFile); err == nil {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		if time.Now().After(deadline) {
			t.Fatal("the call never reached the upstream")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	d := s.WaitTerminal(s.AgentToken, task.TaskID)
	if d.Status != tasks.StatusCompleted || disposition(d) != tasks.OutcomeUnknown {
		t.Fatalf("want completed/outcome-unknown, got %s/%s: %s", d.Status, disposition(d), d.Result)
	}
	// The upstream comes back (a new process) and the call was not re-sent.
	_ = os.Remove(pidFile)
	s.waitTool(t, "slow__hold")
	time.Sleep(500 * time.Millisecond)
	if _, err := os.Stat(pidFile); !os.IsNotExist(err) {
		t.Fatal("the call was sent again to the restarted upstream")
	}
}
