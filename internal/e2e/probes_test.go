package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/devtest"
	"github.com/countersign/countersign/internal/natsrv"
	"github.com/countersign/countersign/internal/telemetry"
)

// TestProbes: /readyz names each dependency that is not ready (an upstream
// that is down; NATS once it goes away) and answers 200 unless NATS or
// Temporal is down: an upstream that is not required does not take the
// replica out of service. countersign_upstream_up says which upstream is up.
// /healthz is the process alone and stays 200 through both.
func TestProbes(t *testing.T) {
	ns, err := natsrv.Start(natsrv.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	cfgFile := filepath.Join(t.TempDir(), "countersign.yaml")
	ghost := fmt.Sprintf("http://127.0.0.1:%d/mcp", freePort(t)) // nothing listens there
	live := mcp.NewServer(&mcp.Implementation{Name: "live", Version: "1"}, nil)
	live.AddTool(&mcp.Tool{Name: "echo", InputSchema: objectSchema}, pong)
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return live }, nil))
	t.Cleanup(ts.Close)
	conf := "upstreams:\n  - name: ghost\n    url: " + ghost + "\n  - name: live\n    url: " + ts.URL + "\n    required: true\n"
	if err := os.WriteFile(cfgFile, []byte(conf), 0o600); err != nil {
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

	code, body := waitReady("the ghost upstream down", func(_ int, b string) bool {
		return strings.Contains(b, "upstream ghost: down") && !strings.Contains(b, "live")
	})
	if code != http.StatusOK || strings.Contains(body, "nats") || strings.Contains(body, "temporal") || strings.Contains(body, "live") {
		t.Fatalf("/readyz with only an upstream that is not required down: %d %q, want 200 naming it", code, body)
	}
	mfs, err := s.App.Telemetry().Metrics.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	up := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != telemetry.MetricUpstreamUp {
			continue
		}
		for _, m := range mf.GetMetric() {
			up[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	if diff := cmp.Diff(map[string]float64{"ghost": 0, "live": 1}, up); diff != "" {
		t.Errorf("%s (-want +got):\n%s", telemetry.MetricUpstreamUp, diff)
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
