package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/internal/app"
)

// BenchmarkUpstreamOverhead measures what Countersign adds in front of an
// allowed upstream call: the official server-everything's read-only echo
// over Streamable HTTP, called straight (go-sdk client, one session) and
// through Countersign's /mcp (policy allows it; no task), in the same run.
// It reports the median (p50-ms) of each, and their difference.
//
//	eval "$(./scripts/upstreams.sh)"
//	go test ./internal/e2e -run '^$' -bench UpstreamOverhead -benchtime 300x
func BenchmarkUpstreamOverhead(b *testing.B) {
	node, modules := os.Getenv("COUNTERSIGN_TEST_NODE"), os.Getenv("COUNTERSIGN_TEST_UPSTREAMS")
	if node == "" || modules == "" {
		b.Fatal("run eval \"$(./scripts/upstreams.sh)\" first")
	}
	url := startEverything(b, node, modules)
	path := filepath.Join(b.TempDir(), "countersign.yaml")
	if err := os.WriteFile(path, []byte("upstreams:\n  - name: everything\n    url: "+url+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	s := startStackConfig(b, app.Config{ConfigFile: path}, 0)
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := s.Call2026(s.AgentToken, "tools/call", "everything__echo",
			map[string]any{"name": "everything__echo", "arguments": map[string]any{"message": "warm"}}, true)
		if r.Error == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("everything__echo never answered: %d %s", r.Error.Code, r.Error.Message)
		}
		time.Sleep(100 * time.Millisecond)
	}
	ctx := context.Background()
	c := mcp.NewClient(&mcp.Implementation{Name: "bench-direct", Version: "1"}, nil)
	sess, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: http.DefaultClient}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer sess.Close()

	direct := make([]time.Duration, 0, b.N)
	through := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"message": "bench"}}); err != nil {
			b.Fatal(err)
		}
		direct = append(direct, time.Since(t0))
		t0 = time.Now()
		r := s.Call2026(s.AgentToken, "tools/call", "everything__echo",
			map[string]any{"name": "everything__echo", "arguments": map[string]any{"message": "bench"}}, true)
		if r.Error != nil {
			b.Fatalf("through Countersign: %d %s", r.Error.Code, r.Error.Message)
		}
		through = append(through, time.Since(t0))
	}
	b.StopTimer()
	pd, pt := median(direct), median(through)
	b.ReportMetric(float64(pd.Microseconds())/1000, "direct-p50-ms")
	b.ReportMetric(float64(pt.Microseconds())/1000, "countersign-p50-ms")
	b.ReportMetric(float64((pt-pd).Microseconds())/1000, "overhead-p50-ms")
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
