//go:build linux

package upstream

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// When Countersign is PID 1 (a container with no init) or a child
// subreaper, a wrapper's children become its own when the wrapper dies.
// Ending the upstream's group must also reap them: a zombie left behind
// stays one for good, one more with every restart. The test process makes
// itself a subreaper to stand where PID 1 stands.
func TestStdioGroupReaped(t *testing.T) {
	const prSetChildSubreaper = 36
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		t.Fatalf("prctl(PR_SET_CHILD_SUBREAPER): %v", errno)
	}
	_, logs, _ := startWrapped(t)
	sleep := grandchild(t, logs, 0)
	server := pidOf(t, logs.wait(t, "start line", stderrLine("helper started")))
	// The server (the exec'd wrapper) dies: its sleep becomes this
	// process's child, and the group is ended.
	if err := syscall.Kill(server, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat("/proc/" + strconv.Itoa(sleep)); os.IsNotExist(err) {
			break // ended and reaped: not even a zombie is left
		}
		if time.Now().After(deadline) {
			stat, _ := os.ReadFile("/proc/" + strconv.Itoa(sleep) + "/stat")
			t.Fatalf("the grandchild (pid %d) is still in the process table: %s", sleep, stat)
		}
	}
}

// A stdio upstream runs as Countersign's user, so it could read
// /proc/PPID/environ (every secret childEnv leaves out) and the process's
// memory, unless Countersign is non-dumpable by the time the child starts.
func TestStdioParentNotDumpable(t *testing.T) {
	ch := make(changes, 100)
	u := Start(context.Background(), Options{Name: "helper", Command: []string{os.Args[0]},
		Env: map[string]string{helperEnv: "server"}, Logger: slog.New(slog.DiscardHandler), OnChange: ch.onChange})
	t.Cleanup(func() { u.Close() })
	ch.wait(t, "tools", has("helper__env"))
	dumpable, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_GET_DUMPABLE, 0, 0)
	if errno != 0 {
		t.Fatalf("prctl(PR_GET_DUMPABLE): %v", errno)
	}
	if dumpable != 0 {
		t.Fatalf("the process is dumpable (%d) with a stdio upstream running: the child can read /proc/%d/environ", dumpable, os.Getpid())
	}
}
