package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/devtest"
	"github.com/countersign/countersign/tasks"
	"github.com/countersign/countersign/workflows"
)

// TestExecuteHeartbeat: the ExecuteTool attempt heartbeats while the tool
// runs, with a heartbeat timeout of 4 s here (app.Config
// .ExecuteHeartbeatTimeout; 30 s by default).
//
//   - A live worker's tool that takes 10 s, well past the heartbeat
//     timeout, is not cut off: the task ends approved-executed.
//   - When the whole `countersign dev` is killed (SIGKILL) while an
//     approved call is inside the tool, and restarted on the same data dir,
//     the task ends outcome-unknown within a minute of the kill, not after
//     the attempt's 5-minute start-to-close timeout (ExecuteTimeout), and
//     the call is not sent again.
func TestExecuteHeartbeat(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("inside the helper process")
	}
	const heartbeat = 4 * time.Second
	pidFile := filepath.Join(t.TempDir(), "pid")
	cmd, _ := json.Marshal([]string{os.Args[0], "-test.run=^TestHoldingUpstreamProcess$", "-test.count=1", "-test.timeout=0"})
	cfgPath := filepath.Join(t.TempDir(), "countersign.yaml")
	cfg := "upstreams:\n  - name: slow\n    command: " + string(cmd) + "\n    env: {HOLD_PID_FILE: \"" + pidFile + "\"}\n    timeout: 5m\n"
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	dir, port := t.TempDir(), devtest.FreePort(t)
	opts := crashChildOptions{dir: dir, port: port, configFile: cfgPath, heartbeat: heartbeat}
	c, err := launchCrashChild(t, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.stop() })
	s := &devtest.Stack{T: t, Dir: dir, Port: port, Base: fmt.Sprintf("http://localhost:%d", port),
		AgentToken: readFile(t, filepath.Join(dir, app.AgentTokenFile)), AdminToken: readFile(t, filepath.Join(dir, app.AdminTokenFile))}
	st := &stack{s}
	alice := s.Enroll("alice", "approvers")
	st.waitTool(t, "slow__work")

	// A live worker, a slow tool.
	task := s.CreateTask(s.AgentToken, "slow__work", map[string]any{"seconds": 10})
	if r := s.Approve(alice, s.RefOf(task.TaskID), "approve"); !r.Accepted {
		t.Fatalf("approval rejected: %+v", r)
	}
	d := waitTerminal(t, s, task.TaskID, 2*time.Minute)
	if disposition(d) != tasks.ApprovedExecuted || !strings.Contains(string(d.Result), "worked 10s") {
		t.Fatalf("a 10 s tool on a live worker (heartbeat timeout %v): want approved-executed with its result, got %s/%s: %s",
			heartbeat, d.Status, disposition(d), d.Result)
	}

	// A dead worker.
	task = s.CreateTask(s.AgentToken, "slow__hold", map[string]any{})
	if r := s.Approve(alice, s.RefOf(task.TaskID), "approve"); !r.Accepted {
		t.Fatalf("approval rejected: %+v", r)
	}
	holder := waitPID(t, pidFile)
	c.kill()
	killed := time.Now()
	_ = syscall.Kill(holder, syscall.SIGKILL) // the upstream would outlive its parent a moment
	_ = os.Remove(pidFile)
	if c, err = launchCrashChild(t, opts); err != nil {
		t.Fatal(err)
	}
	d = waitTerminal(t, s, task.TaskID, workflows.ExecuteTimeout)
	took := time.Since(killed)
	if d.Status != tasks.StatusCompleted || disposition(d) != tasks.OutcomeUnknown {
		t.Fatalf("want completed/outcome-unknown, got %s/%s: %s", d.Status, disposition(d), d.Result)
	}
	if took > time.Minute {
		t.Fatalf("the dead worker's call ended outcome-unknown %v after the kill; the heartbeat timeout is %v", took.Round(time.Second), heartbeat)
	}
	// The restarted upstream never gets the call again.
	st.waitTool(t, "slow__hold")
	time.Sleep(500 * time.Millisecond)
	if _, err := os.Stat(pidFile); !os.IsNotExist(err) {
		t.Fatal("the call was sent again after the restart")
	}
	t.Logf("a dead worker's call ended outcome-unknown %v after the kill (restart included; heartbeat timeout %v)", took.Round(100*time.Millisecond), heartbeat)
}

// waitPID waits until the holding upstream has the call and returns its
// process ID.
func waitPID(t *testing.T, pidFile string) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
				return pid
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the call never reached the upstream")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitTerminal polls tasks/get until the task is terminal.
func waitTerminal(t *testing.T, s *devtest.Stack, taskID string, within time.Duration) devtest.DetailedTask {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		d, r := s.GetTask(s.AgentToken, taskID)
		if r.Error == nil && d.Status.Terminal() {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s not terminal after %v: %s (%v)", taskID, within, d.Status, r.Error)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
