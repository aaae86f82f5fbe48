package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/devtest"
)

// runMainEnv makes the test binary run countersign itself (TestMain), so
// that a test can send the process signals.
const runMainEnv = "COUNTERSIGN_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// process is a `countersign` started as its own process.
type process struct {
	cmd  *exec.Cmd
	base string
	out  *lockedBuffer
	done chan error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startProcess starts `countersign dev` with args and the environment
// variables env in a process of its own and waits until its /readyz answers
// 200.
func startProcess(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", devtest.FreePort(t))
	args = append([]string{"dev", "--addr", addr, "--data-dir", filepath.Join(t.TempDir(), "data")}, args...)
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), runMainEnv+"=1"), env...)
	p := &process{cmd: cmd, base: "http://" + addr, out: &lockedBuffer{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	deadline := time.Now().Add(90 * time.Second)
	for {
		if code, _, err := p.get("/readyz"); err == nil && code == http.StatusOK {
			return p
		}
		select {
		case err := <-p.done:
			t.Fatalf("countersign dev exited before it was ready: %v\n%s", err, p.out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("countersign dev not ready after 90s\n%s", p.out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (p *process) get(path string) (int, string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(p.base + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

func (p *process) signal(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
}

// wait is the process's exit status once it exits, within limit.
func (p *process) wait(t *testing.T, limit time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(limit):
		t.Fatalf("still running %v after the signal\n%s", limit, p.out)
		return -1
	}
}

// On SIGTERM with a shutdown delay (COUNTERSIGN_SHUTDOWN_DELAY), /readyz answers 503 "shutting down" at
// once while the process keeps serving for the delay; then it stops and
// exits 0.
func TestShutdownDelay(t *testing.T) {
	const delay = 3 * time.Second
	p := startProcess(t, []string{"COUNTERSIGN_SHUTDOWN_DELAY=" + delay.String()})
	p.signal(t)
	sent := time.Now()
	var flipped time.Duration
	for {
		code, body, err := p.get("/readyz")
		elapsed := time.Since(sent)
		if err != nil {
			t.Fatalf("/readyz refused %v after SIGTERM, within the %v delay: %v", elapsed.Round(time.Millisecond), delay, err)
		}
		if code == http.StatusServiceUnavailable && strings.Contains(body, "shutting down") {
			flipped = elapsed
			break
		}
		if elapsed > time.Second {
			t.Fatalf("/readyz still %d %q %v after SIGTERM, want 503 shutting down at once", code, body, elapsed)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Still serving (the agents' port answers) until the delay is nearly up.
	for time.Since(sent) < delay-500*time.Millisecond {
		if code, _, err := p.get("/healthz"); err != nil || code != http.StatusOK {
			t.Fatalf("/healthz %v after SIGTERM, within the %v delay: %d %v", time.Since(sent).Round(time.Millisecond), delay, code, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code := p.wait(t, delay+30*time.Second); code != 0 {
		t.Fatalf("exit status %d after a clean stop, want 0\n%s", code, p.out)
	}
	if took := time.Since(sent); took < delay {
		t.Errorf("exited %v after SIGTERM, before the %v delay ended", took, delay)
	}
	t.Logf("/readyz 503 after %v; exited after %v", flipped.Round(time.Millisecond), time.Since(sent).Round(time.Millisecond))
}

// A second SIGTERM during the shutdown delay exits at once.
func TestSecondSignalExits(t *testing.T) {
	p := startProcess(t, nil, "--shutdown-delay", "2m")
	p.signal(t)
	deadline := time.Now().Add(10 * time.Second)
	for { // the first signal has been taken once /readyz says so
		code, body, err := p.get("/readyz")
		if err == nil && code == http.StatusServiceUnavailable && strings.Contains(body, "shutting down") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never said shutting down: %d %q %v", code, body, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.signal(t)
	if code := p.wait(t, 5*time.Second); code != 1 {
		t.Errorf("exit status %d after a second signal, want 1\n%s", code, p.out)
	}
	if !strings.Contains(p.out.String(), "again: exiting without finishing the shutdown") {
		t.Errorf("no word of the forced exit in the output:\n%s", p.out)
	}
}
