package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/devtest"
	"github.com/countersign/countersign/internal/natsrv"
)

// TestProbes: /readyz names each dependency that is not ready (an upstream
// that is down; NATS once it goes away) and answers 200 only when all are;
// /healthz is the process alone and stays 200 through both.
func TestProbes(t *testing.T) {
	ns, err := natsrv.Start(natsrv.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	cfgFile := filepath.Join(t.TempDir(), "countersign.yaml")
	ghost := fmt.Sprintf("http://127.0.0.1:%d/mcp", freePort(t)) // nothing listens there
	if err := os.WriteFile(cfgFile, []byte("upstreams:\n  - name: ghost\n    url: "+ghost+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := devtest.Start(t, devtest.Options{Config: app.Config{NATSURL: ns.URL(), ConfigFile: cfgFile}})
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(s.Base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// waitReady polls /readyz until its body satisfies ok.
	waitReady := func(what string, ok func(code int, body string) bool) (int, string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			code, body := get("/readyz")
			if ok(code, body) {
				return code, body
			}
			if time.Now().After(deadline) {
				t.Fatalf("/readyz never showed %s: %d %q", what, code, body)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	code, body := waitReady("the ghost upstream down", func(_ int, b string) bool { return strings.Contains(b, "upstream ghost: down") })
	if code != http.StatusServiceUnavailable || strings.Contains(body, "nats") || strings.Contains(body, "temporal") {
		t.Fatalf("/readyz with only the upstream down: %d %q", code, body)
	}
	if code, body := get("/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz with an upstream down: %d %q", code, body)
	}

	ns.Shutdown()
	code, body = waitReady("NATS not connected", func(_ int, b string) bool { return strings.Contains(b, "nats: not connected") })
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "upstream ghost: down") {
		t.Fatalf("/readyz with NATS gone: %d %q", code, body)
	}
	if code, body := get("/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz with NATS gone: %d %q (liveness must not depend on NATS)", code, body)
	}
}
