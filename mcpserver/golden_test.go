package mcpserver

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/countersign/countersign/tasks"
)

var update = flag.Bool("update", false, "rewrite testdata/golden/*.json")

var (
	reTaskID = regexp.MustCompile(`tsk_[a-z2-7]{32}`)
	reRef    = regexp.MustCompile(`apr_[a-z2-7]{32}`)
	reTime   = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$`)
	// reTimeIn is a timestamp inside a text.
	reTimeIn = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
)

// normalize replaces the values that change from run to run.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = normalize(e)
		}
	case []any:
		for i, e := range x {
			x[i] = normalize(e)
		}
	case string:
		if reTime.MatchString(x) {
			return "<time>"
		}
		x = reTaskID.ReplaceAllString(x, "<taskId>")
		x = reRef.ReplaceAllString(x, "<approvalRef>")
		return reTimeIn.ReplaceAllString(x, "<time>")
	}
	return v
}

// golden compares an exchange with testdata/golden/<name>.json.
func golden(t *testing.T, name string, r rpc, volatileStatus bool) {
	t.Helper()
	var body any
	if err := json.Unmarshal(r.Body, &body); err != nil {
		t.Fatalf("%s: %v: %s", name, err, r.Body)
	}
	if volatileStatus {
		// The workflow rewrites the status message as it goes.
		if res, ok := body.(map[string]any)["result"].(map[string]any); ok && res["statusMessage"] != nil {
			res["statusMessage"] = "<statusMessage>"
		}
	}
	got, err := json.MarshalIndent(map[string]any{"status": r.Status, "body": normalize(body)}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	path := filepath.Join("testdata", "golden", name+".json")
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run TestGolden -update)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", name, diff)
	}
}

// TestGolden pins the wire shapes of both eras.
func TestGolden(t *testing.T) {
	h := newHarness(t, nil)
	p := "golden-agent"
	id := h.createTask(t, p, tasks.Era2026, "golden-held")
	for _, tc := range []struct {
		name     string
		c        call
		volatile bool
	}{
		{"2026_discover", call{era: tasks.Era2026, method: "server/discover"}, false},
		{"2026_tools_list", call{era: tasks.Era2026, method: "tools/list"}, false},
		{"2026_create_task", call{era: tasks.Era2026, tasks: true, method: "tools/call", params: gatedArgs("golden-fresh-2026", 5000)}, false},
		{"2026_tasks_get", call{era: tasks.Era2026, tasks: true, method: "tasks/get", params: map[string]any{"taskId": id}}, true},
		{"2026_tasks_get_unknown", call{era: tasks.Era2026, tasks: true, method: "tasks/get", params: map[string]any{"taskId": "tsk_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}}, false},
		{"2026_tasks_get_undeclared", call{era: tasks.Era2026, method: "tasks/get", params: map[string]any{"taskId": id}}, false},
		{"2026_tasks_get_bad_name", call{era: tasks.Era2026, tasks: true, method: "tasks/get", params: map[string]any{"taskId": id}, headers: map[string]string{"Mcp-Name": "nope"}}, false},
		{"2026_tasks_result", call{era: tasks.Era2026, tasks: true, method: "tasks/result", params: map[string]any{"taskId": id}}, false},
		{"2026_approval_pending", call{era: tasks.Era2026, method: "tools/call", params: gatedArgs("golden-held", 5000)}, false},
		{"2026_denied", call{era: tasks.Era2026, tasks: true, method: "tools/call", params: gatedArgs("golden-denied", 2_000_000)}, false},
		{"2025_initialize", call{method: "initialize", headers: map[string]string{"Mcp-Protocol-Version": ""}, params: map[string]any{
			"protocolVersion": "2025-11-25", "capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "golden", "version": "1"}}}, false},
		{"2025_tools_list", call{era: tasks.Era2025, method: "tools/list"}, false},
		{"2025_create_task", call{era: tasks.Era2025, method: "tools/call", params: map[string]any{
			"name": "transfer_funds", "arguments": transferArgs("golden-fresh-2025", 5000), "task": map[string]any{"ttl": 60000}}}, false},
		{"2025_tasks_get", call{era: tasks.Era2025, method: "tasks/get", params: map[string]any{"taskId": id}}, true},
		{"2025_approval_pending", call{era: tasks.Era2025, method: "tools/call", params: gatedArgs("golden-held", 5000)}, false},
		{"2025_unknown_tool", call{era: tasks.Era2025, method: "tools/call", params: map[string]any{"name": "nope"}}, false},
		{"parse_error", call{raw: []byte(`{"jsonrpc":`)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.c.token = tok(p)
			r := h.do(t, tc.c)
			r.ID = nil
			var body map[string]any
			if json.Unmarshal(r.Body, &body) == nil {
				delete(body, "id") // request ids differ by run order
				r.Body, _ = json.Marshal(body)
			}
			r.Body = bytes.TrimSpace(r.Body)
			golden(t, tc.name, r, tc.volatile)
		})
	}
}
