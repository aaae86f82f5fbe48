// Package devtest starts a real `countersign dev` (app.New in ModeDev on a
// temporary data dir and a free port) for tests, and drives it the way its
// clients do: the admin API, approvers with software passkeys
// (virtualwebauthn), and MCP 2026-07-28 over raw HTTP.
//
// It is shared by the end-to-end tests (internal/e2e), the browser tests
// (internal/browsertest) and the CLI tests (cmd/countersign).
package devtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/app"
)

// Options say how to start a stack. The zero value is a fresh temp dir, a
// free port, the built-in policy, SQLite synchronous=NORMAL and the rate and
// pending limits lifted.
type Options struct {
	// Config is passed to app.New. DataDir (a fresh temp dir when empty),
	// PolicyDir, SQLiteSync ("NORMAL" when empty: durable against a process
	// crash, faster), the limits and the notifier settings are read from it;
	// Addr is set from Port.
	Config app.Config
	// Port to listen on; a free one when 0.
	Port int
	// AppLimits keeps the app's own rate and pending limits when
	// Config.RatePerMinute is 0, and its request budget when
	// Config.RequestsPerSecond is 0. By default they are lifted: a suite
	// makes many approval requests as one agent, and the limits have tests
	// of their own in mcpserver, internal/ratelimit and internal/abusetest.
	AppLimits bool
	// ClientName is the MCP clientInfo name ("e2e" when empty).
	ClientName string
	// Logger receives the process's logs; nil discards them.
	Logger *slog.Logger
}

// Stack is a running `countersign dev`. It stops when the test ends.
type Stack struct {
	T          testing.TB
	Dir        string // data dir
	Port       int
	Base       string // http://localhost:Port
	AgentToken string // the dev agent's bearer token
	AdminToken string
	App        *app.App

	clientName string
	cancel     context.CancelFunc
	done       chan error
}

// FreePort returns a TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start starts countersign dev and reads its tokens.
func Start(t testing.TB, o Options) *Stack {
	t.Helper()
	cfg := o.Config
	dir := cfg.DataDir
	if dir == "" {
		dir = t.TempDir()
	}
	port := o.Port
	if port == 0 {
		port = FreePort(t)
	}
	s := &Stack{T: t, Dir: dir, Port: port, Base: fmt.Sprintf("http://localhost:%d", port), clientName: o.ClientName}
	if s.clientName == "" {
		s.clientName = "e2e"
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	cfg.DataDir = dir
	cfg.Addr = fmt.Sprintf("127.0.0.1:%d", port)
	if cfg.SQLiteSync == "" {
		cfg.SQLiteSync = "NORMAL"
	}
	if cfg.RatePerMinute == 0 && !o.AppLimits {
		cfg.RatePerMinute, cfg.RateBurst, cfg.MaxPendingPerPrincipal = 1_000_000, 1_000_000, 1_000_000
	}
	if cfg.RequestsPerSecond == 0 && !o.AppLimits {
		cfg.RequestsPerSecond, cfg.RequestBurst, cfg.MaxInFlightPerPrincipal = 1_000_000, 1_000_000, 1_000_000
	}
	a, err := app.New(ctx, cfg, app.ModeDev, o.Logger, io.Discard)
	if err != nil {
		cancel()
		t.Fatalf("start countersign dev: %v", err)
	}
	s.App = a
	s.done = make(chan error, 1)
	go func() { s.done <- a.Run(ctx) }()
	s.AgentToken = ReadFile(t, filepath.Join(dir, app.AgentTokenFile))
	s.AdminToken = ReadFile(t, filepath.Join(dir, app.AdminTokenFile))
	t.Cleanup(s.Stop)
	return s
}

// Stop stops the stack and reports a failed shutdown; it runs at the end of
// the test and may be called earlier (to restart on the same dir and port).
func (s *Stack) Stop() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	select {
	case err := <-s.done:
		if err != nil {
			s.T.Errorf("shutdown: %v", err)
		}
	case <-time.After(30 * time.Second):
		s.T.Error("countersign did not stop within 30s")
	}
	s.cancel = nil
}

// ReadFile returns the file's content without surrounding space.
func ReadFile(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// HTTPJSON sends a JSON request (no body when body is nil) and decodes the
// JSON answer into out (when not nil). It returns the HTTP status.
func (s *Stack) HTTPJSON(method, path, token string, body, out any) int {
	s.T.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, s.Base+path, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.T.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			s.T.Fatalf("%s %s: HTTP %d, undecodable body %q: %v", method, path, resp.StatusCode, b, err)
		}
	}
	return resp.StatusCode
}

// Transfers counts the transfers in the demo ledger.
func (s *Stack) Transfers() int {
	s.T.Helper()
	ts, err := s.App.Ledger.Transfers(context.Background())
	if err != nil {
		s.T.Fatal(err)
	}
	return len(ts)
}
