package app

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/tasks"
)

// TestStreamsOutliveServerTimeouts: the server's limits as wired in
// startHTTP (a 500 ms body deadline, so the http.Server's ReadTimeout is
// 5.5 s) do not cut the notification streams: a 2025-11-25 GET stream and a
// 2026-07-28 subscriptions/listen stream opened now still deliver a tool
// list change after the ReadTimeout has passed, and Shutdown ends them.
func TestStreamsOutliveServerTimeouts(t *testing.T) {
	const bodyTimeout = 500 * time.Millisecond
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, err := New(ctx, Config{DataDir: dir, Addr: freeAddr(t), SQLiteSync: "NORMAL", BodyReadTimeout: bodyTimeout}, ModeDev, nil, io.Discard)
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
	url := "http://" + a.Addr() + "/mcp"

	get, _ := http.NewRequest(http.MethodGet, url, nil)
	get.Header.Set("Accept", "text/event-stream")
	get.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen", "params": map[string]any{
		"notifications": map[string]any{"toolsListChanged": true},
		"_meta": map[string]any{
			"io.modelcontextprotocol/protocolVersion":    "2026-07-28",
			"io.modelcontextprotocol/clientCapabilities": map[string]any{},
			"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "app-test", "version": "1"},
		},
	}})
	listen, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(string(body)))
	listen.Header.Set("Content-Type", "application/json")
	listen.Header.Set("Accept", "application/json, text/event-stream")
	listen.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	listen.Header.Set("Mcp-Method", "subscriptions/listen")

	type stream struct {
		name  string
		lines chan string
	}
	var streams []stream
	for name, req := range map[string]*http.Request{"GET": get, "listen": listen} {
		req.Header.Set("Authorization", "Bearer "+agent)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("%s: HTTP %d %s", name, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		lines := make(chan string, 100)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		streams = append(streams, stream{name, lines})
	}
	time.Sleep(readHeaderTimeout + bodyTimeout + time.Second)

	err = a.Tools.Replace("late", []gateway.Tool{{Name: "late__tool", Upstream: "late", UpstreamTool: "tool",
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Run:         func(context.Context, gateway.Call) (tasks.CallToolResult, error) { return tasks.CallToolResult{}, nil }}})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range streams {
		deadline := time.After(10 * time.Second)
	read:
		for {
			select {
			case l, ok := <-s.lines:
				if !ok {
					t.Fatalf("%s: the stream ended before the change", s.name)
				}
				if strings.Contains(l, "notifications/tools/list_changed") {
					break read
				}
			case <-deadline:
				t.Fatalf("%s: no notifications/tools/list_changed", s.name)
			}
		}
	}

	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	start := time.Now()
	if err := a.Shutdown(sctx); err != nil {
		t.Fatalf("shutdown with open streams: %v", err)
	}
	for _, s := range streams {
		for range s.lines { // ends when the stream does
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("shutdown with open streams took %v", d)
	}
}
