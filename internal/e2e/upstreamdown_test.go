package e2e

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/app"
)

// An upstream that is down at startup does not stop Countersign: its tools
// are missing, the other tools work, and /readyz says which upstream is down;
// this one is required, so /readyz answers 503 (TestProbes has one that is
// not).
func TestUpstreamDownAtStartup(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String() + "/mcp"
	ln.Close() // nothing listens there
	path := filepath.Join(t.TempDir(), "countersign.yaml")
	if err := os.WriteFile(path, []byte("upstreams:\n  - name: gone\n    url: "+url+"\n    required: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startStackConfig(t, app.Config{ConfigFile: path}, 0)

	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get(s.Base + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(body), "upstream gone: down") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d %q, want 503 naming the required upstream", resp.StatusCode, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	r := s.Call2026(s.AgentToken, "tools/list", "", nil, true)
	if r.Error != nil || strings.Contains(string(r.Result), "gone__") || !strings.Contains(string(r.Result), "transfer_funds") {
		t.Fatalf("tools/list: %s", r.Result)
	}
	// A call to a tool of the down upstream is an unknown tool, not a hang.
	r = s.Call2026(s.AgentToken, "tools/call", "gone__anything", map[string]any{"name": "gone__anything", "arguments": map[string]any{}}, true)
	if r.Error == nil || !strings.Contains(r.Error.Message, "Unknown tool") {
		t.Fatalf("call to a down upstream's tool: %+v %s", r.Error, r.Result)
	}
	// The demo tools still work.
	r = s.Call2026(s.AgentToken, "tools/call", "list_transfers", map[string]any{"name": "list_transfers", "arguments": map[string]any{}}, true)
	if r.Error != nil {
		t.Fatalf("list_transfers: %d %s", r.Error.Code, r.Error.Message)
	}
}
