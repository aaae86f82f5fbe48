package app

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSlowBodiesThroughTheApp: the request limits as wired in startHTTP.
// Slow bodies to a made-up enrollment token and to /mcp are answered 408 or
// 503 in each endpoint's JSON shape and closed within the configured
// deadline, while a prompt request is served. (internal/abusetest runs the
// same attack at scale, under -race.)
func TestSlowBodiesThroughTheApp(t *testing.T) {
	const timeout = 2 * time.Second // slow readers need a slot after 1s
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, err := New(ctx, Config{DataDir: dir, Addr: freeAddr(t), SQLiteSync: "NORMAL",
		BodyReadTimeout: timeout, MaxSlowBodies: 4}, ModeDev, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown(context.Background())
	go a.Run(ctx)
	tok, err := os.ReadFile(filepath.Join(dir, AgentTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	agent := strings.TrimSpace(string(tok))

	const slow = 40
	paths := []string{"/approver/v1/enrollments/made-up-token/begin", "/mcp"}
	conns := make([]net.Conn, slow)
	for i := range conns {
		c, err := net.Dial("tcp", a.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{", paths[i%2], agent)
		conns[i] = c
	}
	start := time.Now()
	resp, err := http.Get("http://" + a.Addr() + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz during the attack: %v %v", resp, err)
	}
	resp.Body.Close()

	var mu sync.Mutex
	got := map[string]int{}
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			c.SetReadDeadline(time.Now().Add(timeout + 3*time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Errorf("slow client %d: %v", i, err)
				return
			}
			var body struct {
				Error   json.RawMessage `json:"error"`
				JSONRPC string          `json:"jsonrpc"`
			}
			b, _ := io.ReadAll(resp.Body)
			if err := json.Unmarshal(b, &body); err != nil || len(body.Error) == 0 || (paths[i%2] == "/mcp") != (body.JSONRPC == "2.0") {
				t.Errorf("%s: %d %s: not the endpoint's error shape", paths[i%2], resp.StatusCode, b)
			}
			if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
				t.Errorf("%s: 503 without Retry-After", paths[i%2])
			}
			mu.Lock()
			got[fmt.Sprint(paths[i%2], " ", resp.StatusCode)]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if d := time.Since(start); d > timeout+3*time.Second {
		t.Errorf("slow clients held %v", d)
	}
	for k := range got {
		if !strings.HasSuffix(k, " 408") && !strings.HasSuffix(k, " 503") {
			t.Errorf("unexpected answers: %v", got)
		}
	}
	t.Logf("%d slow bodies: %v in %v", slow, got, time.Since(start).Round(10*time.Millisecond))
}
