package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/countersign/countersign/tasks"
)

// goWords are fragments of Go's and the SDK's internals that no answer may
// carry.
var goWords = []string{"Go struct", "Go value", "json:", "unmarshal", "interface {}", "map[", "mcp.", "mcpserver."}

// TestMalformedRequestsAnswers sweeps malformed requests through the real
// handler in both eras: every method served with each member of a wrong
// type, a required member or params missing, a method not served (or not
// in this era), an unsupported Mcp-Protocol-Version. Each answer is a
// JSON-RPC error with the spec's code and HTTP status, the request's id,
// and a message that names what is wrong without Go internals; and none of
// them changes anything. Members the spec does not define are ignored.
func TestMalformedRequestsAnswers(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.RequestBurst = 1000 })
	p := principal(t, "a")
	to := acct(t, "held")
	taskID := map[tasks.Era]string{}
	for _, era := range eras {
		taskID[era] = h.createTask(t, p, era, acct(t, "task-"+string(era)))
	}
	type sweep struct {
		name    string
		method  string
		params  map[string]any // nil: no params member
		raw     string         // params as raw JSON, instead of params
		headers map[string]string
		code    int64
		status  map[tasks.Era]int
		want    string // the message contains it
	}
	invalid := map[tasks.Era]int{tasks.Era2026: http.StatusBadRequest, tasks.Era2025: http.StatusOK}
	notFound := map[tasks.Era]int{tasks.Era2026: http.StatusNotFound, tasks.Era2025: http.StatusOK}
	badRequest := map[tasks.Era]int{tasks.Era2026: http.StatusBadRequest, tasks.Era2025: http.StatusBadRequest}
	gated := func(extra map[string]any) map[string]any {
		params := map[string]any{"name": "transfer_funds", "arguments": transferArgs(to, 5000)}
		for k, v := range extra {
			params[k] = v
		}
		return params
	}
	wrongTypes := map[string]any{"a number": 42, "an object": map[string]any{}, "an array": []any{}, "a boolean": true, "a string": "x"}
	member := func(era tasks.Era, method, name, kind string, base map[string]any) []sweep {
		var out []sweep
		for got, v := range wrongTypes {
			if got == kind {
				continue
			}
			params := map[string]any{}
			for k, bv := range base {
				params[k] = bv
			}
			params[name] = v
			want := fmt.Sprintf("Invalid params: %s must be %s, not %s", name, kind, got)
			if name == "_meta" {
				if era == tasks.Era2026 {
					continue // the harness sends its own _meta
				}
				// A progress token may also be a number.
				if got == "a number" {
					continue
				}
			}
			out = append(out, sweep{name: method + " " + name + " " + got, method: method, params: params, code: codeInvalidParams, status: invalid, want: want})
		}
		return out
	}
	for _, era := range eras {
		t.Run(string(era), func(t *testing.T) {
			id := taskID[era]
			var cases []sweep
			cases = append(cases, member(era, "tools/call", "name", "a string", gated(nil))...)
			cases = append(cases, member(era, "tools/call", "inputResponses", "an object", gated(nil))...)
			cases = append(cases, member(era, "tools/call", "requestState", "a string", gated(nil))...)
			cases = append(cases, member(era, "tools/call", "_meta", "an object", gated(nil))...)
			cases = append(cases, member(era, "tools/list", "cursor", "a string", nil)...)
			cases = append(cases, member(era, "subscriptions/listen", "notifications", "an object", nil)...)
			taskMethods := []string{"tasks/get", "tasks/cancel"}
			if era == tasks.Era2026 {
				taskMethods = append(taskMethods, "tasks/update")
				cases = append(cases, member(era, "tasks/update", "inputResponses", "an object", map[string]any{"taskId": id})...)
			} else {
				taskMethods = append(taskMethods, "tasks/result")
				cases = append(cases, member(era, "tools/call", "task", "an object", gated(nil))...)
				cases = append(cases, member(era, "tasks/list", "cursor", "a string", nil)...)
				cases = append(cases, member(era, "logging/setLevel", "level", "a string", nil)...)
				cases = append(cases, member(era, "initialize", "protocolVersion", "a string", map[string]any{"capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "x", "version": "1"}})...)
				cases = append(cases, member(era, "initialize", "capabilities", "an object", map[string]any{"protocolVersion": "2025-11-25", "clientInfo": map[string]any{"name": "x", "version": "1"}})...)
				cases = append(cases, member(era, "initialize", "clientInfo", "an object", map[string]any{"protocolVersion": "2025-11-25", "capabilities": map[string]any{}})...)
				cases = append(cases,
					sweep{name: "tools/call task.ttl", method: "tools/call", params: gated(map[string]any{"task": map[string]any{"ttl": "1m"}}), code: codeInvalidParams, status: invalid, want: "Invalid params: task.ttl must be a number, not a string"},
					sweep{name: "tools/call _meta.progressToken", method: "tools/call", params: gated(map[string]any{"_meta": map[string]any{"progressToken": map[string]any{}}}), code: codeInvalidParams, status: invalid, want: "Invalid params: _meta.progressToken must be a string or a number, not an object"},
					sweep{name: "initialize clientInfo.name", method: "initialize", params: map[string]any{"protocolVersion": "2025-11-25", "capabilities": map[string]any{}, "clientInfo": map[string]any{"name": 5, "version": "1"}}, code: codeInvalidParams, status: invalid, want: "Invalid params: clientInfo.name must be a string, not a number"},
					sweep{name: "initialize capabilities.roots.listChanged", method: "initialize", params: map[string]any{"protocolVersion": "2025-11-25", "capabilities": map[string]any{"roots": map[string]any{"listChanged": "yes"}}, "clientInfo": map[string]any{"name": "x", "version": "1"}}, code: codeInvalidParams, status: invalid, want: "Invalid params: capabilities.roots.listChanged must be a boolean, not a string"},
					sweep{name: "initialize without params", method: "initialize", code: codeInvalidParams, status: invalid, want: "Invalid params: params is required"},
					sweep{name: "ping params array", method: "ping", raw: `[1]`, code: codeInvalidParams, status: invalid, want: "Invalid params: params must be an object, not an array"},
				)
			}
			for _, m := range taskMethods {
				cases = append(cases, member(era, m, "taskId", "a string", nil)...)
				cases = append(cases, sweep{name: m + " taskId missing", method: m, params: map[string]any{}, code: codeInvalidParams, status: invalid, want: "Invalid params: taskId is required"})
			}
			cases = append(cases,
				sweep{name: "tools/call name missing", method: "tools/call", params: map[string]any{"arguments": transferArgs(to, 5000)}, code: codeInvalidParams, status: invalid, want: "Invalid params: name is required"},
				sweep{name: "tools/call without params", method: "tools/call", code: codeInvalidParams, status: invalid, want: "Invalid params: name is required"},
				sweep{name: "tools/call params array", method: "tools/call", raw: `[{"name":"transfer_funds"}]`, code: codeInvalidParams, status: invalid, want: "Invalid params: params must be an object, not an array"},
				sweep{name: "tools/call params string", method: "tools/call", raw: `"transfer_funds"`, code: codeInvalidParams, status: invalid, want: "Invalid params: params must be an object, not a string"},
				sweep{name: "subscriptions/listen without params", method: "subscriptions/listen", code: codeInvalidParams, status: invalid, want: "Invalid params: params is required"},
				sweep{name: "subscriptions/listen notifications.taskIds", method: "subscriptions/listen", params: map[string]any{"notifications": map[string]any{"taskIds": id}}, code: codeInvalidParams, status: invalid, want: "Invalid params: notifications.taskIds must be an array, not a string"},
				sweep{name: "unknown method", method: "foo/bar", params: map[string]any{}, code: codeMethodNotFound, status: notFound, want: "Method not found: foo/bar"},
				sweep{name: "prompts/get without params", method: "prompts/get", code: codeMethodNotFound, status: notFound, want: "Method not found: prompts/get (this server has tools only)"},
				sweep{name: "resources/subscribe", method: "resources/subscribe", params: map[string]any{"uri": "x"}, code: codeMethodNotFound, status: notFound, want: "Method not found: resources/subscribe (this server has tools only)"},
			)
			for _, v := range []string{"2024-01-01", "1900-01-01", "2099-01-01"} {
				cases = append(cases, sweep{name: "Mcp-Protocol-Version " + v, method: "tools/call", params: gated(nil),
					headers: map[string]string{"Mcp-Protocol-Version": v}, code: codeUnsupportedVersion, status: badRequest,
					want: fmt.Sprintf("Unsupported protocol version: %q; this server supports 2026-07-28, 2025-11-25", v)})
			}
			other := tasks.Era2025
			if era == tasks.Era2025 {
				other = tasks.Era2026
			}
			for _, m := range eraMethods[other] {
				cases = append(cases, sweep{name: m + " in the other era", method: m, params: map[string]any{"taskId": 5, "protocolVersion": 5}, code: codeMethodNotFound, status: notFound,
					want: fmt.Sprintf("Method not found: %s is not available in protocol %s (only in %s)", m, era, other)})
			}

			for i, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					reqID := fmt.Sprintf(`"q-%d"`, i)
					c := call{token: tok(p), era: era, tasks: true, method: tc.method, params: tc.params, headers: tc.headers,
						edit: func(b []byte) []byte {
							b = setID(t, b, reqID)
							var msg map[string]json.RawMessage
							if err := json.Unmarshal(b, &msg); err != nil {
								t.Fatal(err)
							}
							switch {
							case tc.raw != "":
								msg["params"] = json.RawMessage(tc.raw)
							case tc.params == nil:
								delete(msg, "params")
							}
							out, _ := json.Marshal(msg)
							return out
						}}
					r := h.do(t, c)
					r.fails(t, tc.status[era], tc.code)
					if !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
						t.Errorf("Content-Type %q", r.Header.Get("Content-Type"))
					}
					if string(r.ID) != reqID {
						t.Errorf("id %s, want the request's %s", r.ID, reqID)
					}
					if !strings.Contains(r.Error.Message, tc.want) {
						t.Errorf("message %q, want it to contain %q", r.Error.Message, tc.want)
					}
					for _, w := range goWords {
						if strings.Contains(r.Error.Message, w) {
							t.Errorf("message %q shows Go internals (%q)", r.Error.Message, w)
						}
					}
					if tc.code == codeUnsupportedVersion {
						var data struct {
							Supported []string `json:"supported"`
							Requested string   `json:"requested"`
						}
						if err := json.Unmarshal(r.Error.Data, &data); err != nil || data.Requested != tc.headers["Mcp-Protocol-Version"] ||
							!slices.Contains(data.Supported, string(tasks.Era2025)) || !slices.Contains(data.Supported, string(tasks.Era2026)) {
							t.Errorf("data %s (%v)", r.Error.Data, err)
						}
					}
				})
			}
		})
	}
	// Nothing changed: no transfer ran, no task was opened, and the tasks
	// are still working (no cancel ran).
	if n := h.transfersTo(t, to); n != 0 {
		t.Errorf("%d transfers ran", n)
	}
	if n, _ := h.env.store.CountPending(context.Background(), p); n != len(eras) {
		t.Errorf("%d pending tasks, want the %d created before", n, len(eras))
	}
	for _, id := range taskID {
		h.waitStatus(t, id, tasks.StatusWorking)
	}

	// Members no shape lists are ignored, in both eras.
	for _, era := range eras {
		var res toolCallResult
		h.do(t, call{token: tok(p), era: era, tasks: true, method: "tools/call",
			params: map[string]any{"name": "list_transfers", "arguments": map[string]any{}, "extra": []any{1}, "requestStateX": 5}}).ok(t, &res)
		if res.IsError {
			t.Errorf("%s tools/call with unknown members: %+v", era, res)
		}
		h.do(t, call{token: tok(p), era: era, tasks: true, method: "tasks/get", params: map[string]any{"taskId": taskID[era], "extra": map[string]any{}}}).ok(t, nil)
	}
}
