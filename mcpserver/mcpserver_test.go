package mcpserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

// acct is an account name unique to the test (the schema caps it at 64).
func acct(tb testing.TB, suffix string) string {
	sum := sha256.Sum256([]byte(tb.Name() + "/" + suffix))
	return "acct-" + hex.EncodeToString(sum[:8])
}

func tok(p string) string { return "tok:" + p }

func base64Std(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

var eras = []tasks.Era{tasks.Era2026, tasks.Era2025}

// gatedArgs returns tools/call params that the default policy holds for approval.
func gatedArgs(to string, amount float64) map[string]any {
	return map[string]any{"name": "transfer_funds", "arguments": transferArgs(to, amount)}
}

// createTask makes a pending task in the era and returns its ID.
func (h *harness) createTask(tb testing.TB, p string, era tasks.Era, to string) string {
	tb.Helper()
	c := call{token: tok(p), era: era, tasks: true, method: "tools/call", params: gatedArgs(to, 5000)}
	if era == tasks.Era2025 {
		c.params["task"] = map[string]any{"ttl": 60000}
	}
	r := h.do(tb, c)
	if era == tasks.Era2026 {
		var res taskResult2026
		r.ok(tb, &res)
		if res.ResultType != "task" || res.TaskID == "" {
			tb.Fatalf("want a task, got %s", r.Result)
		}
		return res.TaskID
	}
	var res struct {
		Task legacyTask `json:"task"`
	}
	r.ok(tb, &res)
	if res.Task.TaskID == "" {
		tb.Fatalf("want a task, got %s", r.Result)
	}
	return res.Task.TaskID
}

func TestDiscover(t *testing.T) {
	h := newHarness(t, nil)
	r := h.do(t, call{token: tok(principal(t, "a")), era: tasks.Era2026, method: "server/discover"})
	var res struct {
		ResultType        string   `json:"resultType"`
		SupportedVersions []string `json:"supportedVersions"`
		Capabilities      struct {
			Extensions map[string]map[string]any `json:"extensions"`
			Tools      map[string]any            `json:"tools"`
		} `json:"capabilities"`
	}
	r.ok(t, &res)
	if res.ResultType != "complete" {
		t.Errorf("resultType = %q", res.ResultType)
	}
	for _, v := range []string{"2026-07-28", "2025-11-25"} {
		if !strings.Contains(strings.Join(res.SupportedVersions, ","), v) {
			t.Errorf("supportedVersions %v lacks %s", res.SupportedVersions, v)
		}
	}
	want := map[string]map[string]any{
		"io.modelcontextprotocol/tasks":         {},
		"io.modelcontextprotocol/tool-approval": {},
		"net.openid.authzen/tool-approval":      {"version": "0.1"},
	}
	if diff := cmp.Diff(want, res.Capabilities.Extensions); diff != "" {
		t.Errorf("extensions (-want +got):\n%s", diff)
	}
	if res.Capabilities.Tools == nil {
		t.Error("tools capability missing")
	}
}

func TestInitializeAdvertisesLegacyTasks(t *testing.T) {
	h := newHarness(t, nil)
	r := h.do(t, call{token: tok(principal(t, "a")), method: "initialize", params: map[string]any{
		"protocolVersion": "2025-11-25",
		"capabilities":    map[string]any{"tasks": map[string]any{}},
		"clientInfo":      map[string]any{"name": "raw", "version": "1"},
	}, headers: map[string]string{"Mcp-Protocol-Version": ""}})
	var res struct {
		ProtocolVersion string                     `json:"protocolVersion"`
		Capabilities    map[string]json.RawMessage `json:"capabilities"`
		ServerInfo      struct{ Name string }      `json:"serverInfo"`
	}
	r.ok(t, &res)
	if res.ProtocolVersion != "2025-11-25" || res.ServerInfo.Name != ImplementationName {
		t.Errorf("protocolVersion %q, serverInfo %q", res.ProtocolVersion, res.ServerInfo.Name)
	}
	var got any
	if err := json.Unmarshal(res.Capabilities["tasks"], &got); err != nil {
		t.Fatalf("capabilities.tasks: %v (%s)", err, r.Result)
	}
	want := map[string]any{"list": map[string]any{}, "cancel": map[string]any{}, "requests": map[string]any{"tools": map[string]any{"call": map[string]any{}}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("capabilities.tasks (-want +got):\n%s", diff)
	}
	if _, ok := res.Capabilities["tools"]; !ok {
		t.Error("tools capability missing")
	}
}

func TestToolsListTaskSupport(t *testing.T) {
	h := newHarness(t, nil)
	p := principal(t, "a")
	type tool struct {
		Name      string `json:"name"`
		Execution *struct {
			TaskSupport string `json:"taskSupport"`
		} `json:"execution"`
	}
	var legacy struct{ Tools []tool }
	h.do(t, call{token: tok(p), era: tasks.Era2025, method: "tools/list"}).ok(t, &legacy)
	got := map[string]string{}
	for _, tl := range legacy.Tools {
		if tl.Execution == nil {
			t.Fatalf("tool %s has no execution in 2025-11-25", tl.Name)
		}
		got[tl.Name] = tl.Execution.TaskSupport
	}
	want := map[string]string{"transfer_funds": "optional", "deploy_service": "optional", "delete_records": "optional", "list_transfers": "forbidden",
		// Without a passkey service nothing is under verified approval.
		"place_trade": "optional",
		// The follow-up tools are never gated: never a task.
		ToolAwait: "forbidden", ToolCancel: "forbidden", ToolPending: "forbidden"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("taskSupport (-want +got):\n%s", diff)
	}

	var modern struct {
		ResultType string `json:"resultType"`
		Tools      []tool
	}
	h.do(t, call{token: tok(p), era: tasks.Era2026, method: "tools/list"}).ok(t, &modern)
	if modern.ResultType != "complete" || len(modern.Tools) != 8 {
		t.Fatalf("2026 tools/list: %+v", modern)
	}
	for _, tl := range modern.Tools {
		if tl.Execution != nil {
			t.Errorf("2026 tool %s carries execution.taskSupport", tl.Name)
		}
	}
}

func TestAllowedCallRuns(t *testing.T) {
	h := newHarness(t, nil)
	for _, era := range eras {
		t.Run(string(era), func(t *testing.T) {
			to := acct(t, "allowed")
			r := h.do(t, call{token: tok(principal(t, "a")), era: era, method: "tools/call",
				params: map[string]any{"name": "transfer_funds", "arguments": transferArgs(to, 250)}})
			var res toolCallResult
			r.ok(t, &res)
			if res.IsError || !strings.Contains(res.text(), "Transferred 250") || len(res.StructuredContent) == 0 {
				t.Errorf("result: %s", r.Result)
			}
			if want := map[tasks.Era]string{tasks.Era2026: "complete", tasks.Era2025: ""}[era]; res.ResultType != want {
				t.Errorf("resultType %q, want %q", res.ResultType, want)
			}
			if n := h.transfersTo(t, to); n != 1 {
				t.Errorf("%d transfers, want 1", n)
			}
		})
	}
}

func TestDeniedCallIsErrorResult(t *testing.T) {
	h := newHarness(t, nil)
	for _, era := range eras {
		t.Run(string(era), func(t *testing.T) {
			to := acct(t, "denied")
			r := h.do(t, call{token: tok(principal(t, "a")), era: era, tasks: true, method: "tools/call",
				params: map[string]any{"name": "transfer_funds", "arguments": transferArgs(to, 2_000_000)}})
			var res toolCallResult
			r.ok(t, &res)
			if !res.IsError {
				t.Fatalf("want isError: %s", r.Result)
			}
			for _, k := range []string{tasks.MetaDisposition, tasks.MetaDispositionAuthZEN} {
				if res.Meta[k] != string(tasks.DeniedNotExecuted) {
					t.Errorf("_meta[%s] = %v", k, res.Meta[k])
				}
			}
			if txt := res.text(); !strings.Contains(txt, "did NOT run") || !strings.Contains(txt, "never allowed") {
				t.Errorf("text: %q", txt)
			}
			if n := h.transfersTo(t, to); n != 0 {
				t.Errorf("%d transfers, want 0", n)
			}
		})
	}
}

// TestResultRetentionSetsTTL: a configured retention, not the default, is
// added to a new task's approval window.
func TestResultRetentionSetsTTL(t *testing.T) {
	const retention = 36 * time.Hour
	h := newHarness(t, nil, func(o *approvals.Options) { o.ResultRetention = retention })
	p, to := principal(t, "a"), acct(t, "kept")
	r := h.do(t, call{token: tok(p), era: tasks.Era2026, tasks: true, method: "tools/call",
		params: map[string]any{"name": "transfer_funds", "arguments": map[string]any{"currency": "EUR", "to": to, "amount": 5000}}})
	var res taskResult2026
	r.ok(t, &res)
	if want := (24*time.Hour + retention).Milliseconds(); res.TTLMs == nil || *res.TTLMs != want {
		t.Errorf("ttlMs %v, want %d", res.TTLMs, want)
	}
}

func TestRequestableBecomesTask2026(t *testing.T) {
	h := newHarness(t, nil)
	p, to := principal(t, "a"), acct(t, "held")
	raw := json.RawMessage(`{ "currency":"EUR", "to":"` + to + `",  "amount": 5000.0 }`)
	r := h.do(t, call{token: tok(p), era: tasks.Era2026, tasks: true, method: "tools/call",
		params: map[string]any{"name": "transfer_funds", "arguments": raw}})
	var res taskResult2026
	r.ok(t, &res)
	if res.ResultType != "task" || res.Status != "working" || res.StatusMessage == "" {
		t.Fatalf("CreateTaskResult: %s", r.Result)
	}
	if want := (24*time.Hour + approvals.DefaultResultRetention).Milliseconds(); res.TTLMs == nil || *res.TTLMs != want {
		t.Errorf("ttlMs %v, want %d", res.TTLMs, want)
	}
	if res.PollIntervalMs == nil || *res.PollIntervalMs != 2000 {
		t.Errorf("pollIntervalMs %v", res.PollIntervalMs)
	}
	if note, _ := res.Meta[tasks.MetaImmediateResponse].(string); !strings.Contains(note, "NOT run") {
		t.Errorf("model-immediate-response %q", note)
	}
	if n := h.transfersTo(t, to); n != 0 {
		t.Errorf("%d transfers before approval", n)
	}

	rec, err := h.env.store.Get(context.Background(), res.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	hash, _ := canon.Hash("transfer_funds", raw, "countersign-test")
	if rec.Owner != p || rec.Era != tasks.Era2026 || rec.ActionHash != hash.String() ||
		!strings.HasPrefix(rec.ApprovalRef, "apr_") || rec.DisplayText == "" || rec.ApprovalState != tasks.ApprovalPending {
		t.Errorf("record: %+v", rec)
	}
	if rec.ExpiresAt.Sub(rec.CreatedAt) != 24*time.Hour || rec.Requirement.Group != "approvers" || rec.Requirement.Quorum != 1 {
		t.Errorf("requirement %+v, expires %v", rec.Requirement, rec.ExpiresAt)
	}

	var got taskResult2026
	h.do(t, call{token: tok(p), era: tasks.Era2026, tasks: true, method: "tasks/get", params: map[string]any{"taskId": res.TaskID}}).ok(t, &got)
	if got.ResultType != "complete" || got.TaskID != res.TaskID || got.Status != "working" || got.Result != nil {
		t.Errorf("tasks/get: %+v", got)
	}
}

func TestRequestableBecomesTaskLegacy(t *testing.T) {
	h := newHarness(t, nil)
	p := principal(t, "a")
	r := h.do(t, call{token: tok(p), era: tasks.Era2025, method: "tools/call", params: map[string]any{
		"name": "transfer_funds", "arguments": transferArgs(acct(t, "held"), 5000), "task": map[string]any{"ttl": 60000}}})
	var res struct {
		Task legacyTask     `json:"task"`
		Meta map[string]any `json:"_meta"`
	}
	r.ok(t, &res)
	if res.Task.Status != "working" || res.Task.TTL == nil || res.Task.PollInterval == nil || res.Task.CreatedAt == "" || res.Task.StatusMessage == "" {
		t.Fatalf("legacy CreateTaskResult: %s", r.Result)
	}
	if note, _ := res.Meta[tasks.MetaImmediateResponse].(string); !strings.Contains(note, "has NOT run") {
		t.Errorf("model-immediate-response %q", note)
	}
	if strings.Contains(string(r.Result), "resultType") {
		t.Errorf("legacy result carries resultType: %s", r.Result)
	}

	var got legacyTask
	// The TypeScript SDK sends a "task" member inside tasks/get: ignored.
	h.do(t, call{token: tok(p), era: tasks.Era2025, method: "tasks/get",
		params: map[string]any{"taskId": res.Task.TaskID, "task": map[string]any{"ttl": 1}}}).ok(t, &got)
	// The workflow may already have refreshed the status message and
	// lastUpdatedAt; the task's identity and lifetime are what must match.
	ignore := cmpopts.IgnoreFields(legacyTask{}, "StatusMessage", "LastUpdatedAt")
	if diff := cmp.Diff(res.Task, got, ignore); diff != "" {
		t.Errorf("tasks/get differs from creation (-create +get):\n%s", diff)
	}
	if !strings.HasPrefix(got.StatusMessage, "Awaiting approval") {
		t.Errorf("tasks/get status message %q", got.StatusMessage)
	}
}

func TestForeignTaskIsUnknown(t *testing.T) {
	h := newHarness(t, nil)
	alice, bob := principal(t, "alice"), principal(t, "bob")
	for _, era := range eras {
		t.Run(string(era), func(t *testing.T) {
			id := h.createTask(t, alice, era, acct(t, "x"))
			methods := []string{"tasks/get", "tasks/cancel"}
			if era == tasks.Era2025 {
				methods = append(methods, "tasks/result")
			} else {
				methods = append(methods, "tasks/update")
			}
			for _, m := range methods {
				foreign := h.do(t, call{token: tok(bob), era: era, tasks: true, method: m, params: map[string]any{"taskId": id}})
				unknown := h.do(t, call{token: tok(bob), era: era, tasks: true, method: m, params: map[string]any{"taskId": tasks.NewID("tsk_")}})
				garbage := h.do(t, call{token: tok(bob), era: era, tasks: true, method: m, params: map[string]any{"taskId": "../../etc"}})
				status := map[tasks.Era]int{tasks.Era2026: http.StatusBadRequest, tasks.Era2025: http.StatusOK}[era]
				for _, r := range []rpc{foreign, unknown, garbage} {
					r.fails(t, status, codeInvalidParams)
					if r.Error.Message != "Failed to retrieve task: Task not found" || r.Error.Data != nil {
						t.Errorf("%s: %s", m, r.Body)
					}
				}
			}
			if rec := h.waitStatus(t, id, tasks.StatusWorking); rec.Owner != alice {
				t.Errorf("owner %q", rec.Owner)
			}
		})
	}
}

func TestMcpNameMustMatchTaskID(t *testing.T) {
	h := newHarness(t, nil)
	p := principal(t, "a")
	id := h.createTask(t, p, tasks.Era2026, acct(t, "x"))
	for _, m := range []string{"tasks/get", "tasks/update", "tasks/cancel"} {
		for _, name := range []string{"tsk_other", ""} {
			r := h.do(t, call{token: tok(p), era: tasks.Era2026, tasks: true, method: m,
				params: map[string]any{"taskId": id}, headers: map[string]string{"Mcp-Name": name}})
			r.fails(t, http.StatusBadRequest, codeHeaderMismatch)
		}
	}
	// Mcp-Method must name the body's method (checked by the SDK).
	h.do(t, call{token: tok(p), era: tasks.Era2026, tasks: true, method: "tasks/cancel",
		params: map[string]any{"taskId": id}, headers: map[string]string{"Mcp-Method": "tasks/get"}}).
		fails(t, http.StatusBadRequest, codeHeaderMismatch)
	h.waitStatus(t, id, tasks.StatusWorking) // no cancel ran
	// Base64-encoded header values (SEP-2243) are decoded before comparing.
	r := h.do(t, call{token: tok(p), era: tasks.Era2026, tasks: true, method: "tasks/get", params: map[string]any{"taskId": id},
		headers: map[string]string{"Mcp-Name": "=?base64?" + base64Std(id) + "?="}})
	r.ok(t, nil)
}

func TestClientWithoutTasks(t *testing.T) {
	h := newHarness(t, nil)
	p := principal(t, "a")
	t.Run("tasks/* is -32021", func(t *testing.T) {
		id := h.createTask(t, p, tasks.Era2026, acct(t, "x"))
		for _, m := range []string{"tasks/get", "tasks/update", "tasks/cancel"} {
			r := h.do(t, call{token: tok(p), era: tasks.Era2026, tasks: false, method: m, params: map[string]any{"taskId": id}})
			r.fails(t, http.StatusBadRequest, codeMissingCapability)
			var data any
			if err := json.Unmarshal(r.Error.Data, &data); err != nil {
				t.Fatal(err)
			}
			want := map[string]any{"requiredCapabilities": map[string]any{"extensions": map[string]any{tasks.ExtTasks: map[string]any{}}}}
			if diff := cmp.Diff(want, data); diff != "" {
				t.Errorf("%s data (-want +got):\n%s", m, diff)
			}
		}
		h.waitStatus(t, id, tasks.StatusWorking)
	})
}

func TestOversizeBody(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.MaxBodyBytes = 512 })
	p, to := principal(t, "a"), acct(t, "big")
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
		"params": map[string]any{"name": "transfer_funds", "arguments": transferArgs(to, 10)}})
	body = append(body[:len(body)-1], []byte(strings.Repeat(" ", 600)+"}")...)
	r := h.do(t, call{token: tok(p), era: tasks.Era2025, method: "tools/call", raw: body})
	r.fails(t, http.StatusRequestEntityTooLarge, codeInvalidRequest)
	// The same body without a declared length (chunked): refused at the
	// cap while it is read.
	req, _ := http.NewRequest(http.MethodPost, h.ts.URL, io.MultiReader(bytes.NewReader(body)))
	req.Header.Set("Authorization", "Bearer "+tok(p))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", string(tasks.Era2025))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "exceeds 512 bytes") {
		t.Errorf("chunked oversize body: HTTP %d %s", resp.StatusCode, b)
	}
	if n := h.transfersTo(t, to); n != 0 {
		t.Errorf("%d transfers", n)
	}
}

func TestMalformedJSONRPC(t *testing.T) {
	h := newHarness(t, nil)
	p := tok(principal(t, "a"))
	for _, tc := range []struct {
		name string
		body string
		code int64
		id   string
	}{
		{"truncated", `{"jsonrpc":"2.0","id":1,"method":`, codeParseError, "null"},
		{"not json", `hello`, codeParseError, "null"},
		{"empty", ``, codeInvalidRequest, "null"},
		{"batch", `[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]`, codeInvalidRequest, "null"},
		{"string", `"tools/list"`, codeInvalidRequest, "null"},
		{"wrong version", `{"jsonrpc":"1.0","id":7,"method":"tools/list"}`, codeInvalidRequest, "7"},
		{"method not string", `{"jsonrpc":"2.0","id":"x","method":5}`, codeInvalidRequest, `"x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.do(t, call{token: p, raw: []byte(tc.body)})
			r.fails(t, http.StatusBadRequest, tc.code)
			if string(r.ID) != tc.id {
				t.Errorf("id %s, want %s", r.ID, tc.id)
			}
		})
	}
}

// An id is answered exactly as sent, or refused before anything runs. The
// SDK reads a numeric id as a float64 and answers with its int64
// conversion, so an id it cannot hold exactly came back as another id,
// after the call had run.
func TestRequestIDs(t *testing.T) {
	h := newHarness(t, nil)
	p := principal(t, "a")
	for _, era := range eras {
		for _, id := range []string{`0`, `-1`, `9007199254740991`, `-9007199254740991`, `""`, `"9007199254740993"`, `"é\u0000"`} {
			t.Run("echoed/"+string(era)+"/"+id, func(t *testing.T) {
				for _, method := range []string{"tools/list", "tasks/get"} {
					r := h.do(t, call{token: tok(p), era: era, tasks: true, method: method, params: map[string]any{"taskId": "tsk_unknown"},
						edit: func(b []byte) []byte { return setID(t, b, id) }})
					if r.Status == http.StatusBadRequest && r.Error != nil && r.Error.Code == codeInvalidRequest {
						t.Fatalf("%s: refused: %s", method, r.Body)
					}
					if string(r.ID) != id {
						t.Errorf("%s: id %s, want %s: %s", method, r.ID, id, r.Body)
					}
				}
			})
		}
		for _, tc := range []struct{ name, id, echo string }{
			{"2^53", `9007199254740992`, `9007199254740992`},
			{"2^53+1", `9007199254740993`, `9007199254740993`},
			{"beyond int64", `12345678901234567890123`, `12345678901234567890123`},
			{"negative", `-9007199254740993`, `-9007199254740993`},
			{"fraction", `1.5`, `1.5`},
			{"out of range", `1e400`, `1e400`},
			{"null", `null`, `null`},
			{"bool", `true`, `null`},
			{"object", `{"n":1}`, `null`},
			{"array", `[1]`, `null`},
		} {
			t.Run("refused/"+string(era)+"/"+tc.name, func(t *testing.T) {
				to := acct(t, "id")
				r := h.do(t, call{token: tok(p), era: era, tasks: true, method: "tools/call",
					params: map[string]any{"name": "transfer_funds", "arguments": transferArgs(to, 5)},
					edit:   func(b []byte) []byte { return setID(t, b, tc.id) }})
				r.fails(t, http.StatusBadRequest, codeInvalidRequest)
				if string(r.ID) != tc.echo {
					t.Errorf("id %s, want %s", r.ID, tc.echo)
				}
				if n := h.transfersTo(t, to); n != 0 {
					t.Errorf("%d transfers", n)
				}
			})
		}
	}
}

// A notification with an id is refused as JSON-RPC, with the id, not in
// the SDK's plain text.
func TestNotificationWithID(t *testing.T) {
	h := newHarness(t, nil)
	p := principal(t, "a")
	for _, era := range eras {
		t.Run(string(era), func(t *testing.T) {
			r := h.do(t, call{token: tok(p), era: era, method: "notifications/cancelled", params: map[string]any{"requestId": 1}})
			r.fails(t, http.StatusBadRequest, codeInvalidRequest)
			if string(r.ID) == "null" {
				t.Errorf("id null, want the request's: %s", r.Body)
			}
		})
	}
}

// A request for a method the server does not serve is JSON-RPC -32601 in
// both eras. Before 2026-07-28 the SDK answered it with a plain-text HTTP
// 400, which breaks a Go SDK client's connection (it keeps one only after
// a JSON-RPC error body); other plain-text answers are left as they are.
func TestUnknownMethod(t *testing.T) {
	h := newHarness(t, nil)
	p := tok(principal(t, "a"))
	for _, method := range []string{"foo/bar", "countersign/transactionToken"} {
		for _, era := range eras {
			t.Run(method+"/"+string(era), func(t *testing.T) {
				r := h.do(t, call{token: p, era: era, method: method, params: map[string]any{}, edit: func(b []byte) []byte { return setID(t, b, `"q-7"`) }})
				r.fails(t, map[tasks.Era]int{tasks.Era2026: http.StatusNotFound, tasks.Era2025: http.StatusOK}[era], codeMethodNotFound)
				if string(r.ID) != `"q-7"` || r.Error.Message != "Method not found: "+method {
					t.Errorf("id %s, message %q", r.ID, r.Error.Message)
				}
			})
		}
	}
	t.Run("plain-text answers pass through", func(t *testing.T) {
		r := h.do(t, call{token: p, era: tasks.Era2025, method: "tools/list", headers: map[string]string{"Accept": "application/json"}})
		if r.Status != http.StatusBadRequest || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/plain") || !strings.Contains(string(r.Body), "Accept") {
			t.Errorf("HTTP %d %q: %s", r.Status, r.Header.Get("Content-Type"), r.Body)
		}
	})
}

// setID replaces the id of a request body with raw.
func setID(tb testing.TB, body []byte, raw string) []byte {
	tb.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		tb.Fatal(err)
	}
	m["id"] = json.RawMessage(raw)
	b, err := json.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func TestUnknownToolAndInvalidArguments(t *testing.T) {
	h := newHarness(t, nil)
	p := principal(t, "a")
	for _, era := range eras {
		status := map[tasks.Era]int{tasks.Era2026: http.StatusBadRequest, tasks.Era2025: http.StatusOK}[era]
		t.Run("unknown tool/"+string(era), func(t *testing.T) {
			r := h.do(t, call{token: tok(p), era: era, tasks: true, method: "tools/call", params: map[string]any{"name": "launch_missiles", "arguments": map[string]any{}}})
			r.fails(t, status, codeInvalidParams)
			if !strings.Contains(r.Error.Message, "launch_missiles") {
				t.Errorf("message %q", r.Error.Message)
			}
		})
		for _, tc := range []struct {
			name string
			args map[string]any
			want string
		}{
			{"missing currency", map[string]any{"to": acct(t, "inv1"), "amount": 5000}, "currency"},
			{"amount is a string", map[string]any{"to": acct(t, "inv2"), "amount": "5000", "currency": "EUR"}, "amount"},
			{"extra member", map[string]any{"to": acct(t, "inv3"), "amount": 5, "currency": "EUR", "sudo": true}, "sudo"},
		} {
			t.Run(tc.name+"/"+string(era), func(t *testing.T) {
				r := h.do(t, call{token: tok(p), era: era, tasks: true, method: "tools/call", params: map[string]any{"name": "transfer_funds", "arguments": tc.args}})
				r.fails(t, status, codeInvalidParams)
				if !strings.Contains(r.Error.Message, tc.want) || !strings.Contains(r.Error.Message, "transfer_funds") {
					t.Errorf("message %q should name %q", r.Error.Message, tc.want)
				}
				if n := h.transfersTo(t, tc.args["to"].(string)); n != 0 {
					t.Errorf("%d transfers", n)
				}
			})
		}
	}
	if n, _ := h.env.store.CountPending(context.Background(), p); n != 0 {
		t.Errorf("%d pending tasks after invalid calls", n)
	}
}

// A number JCS would round (2^53+1 rounds to 2^53) gives the action hash of
// another value: every tools/call refuses it as invalid arguments, before
// policy, and nothing is stored or run (canon.Hash).
func TestInexactNumberRefused(t *testing.T) {
	h := newHarness(t, nil)
	p := principal(t, "a")
	for _, era := range eras {
		status := map[tasks.Era]int{tasks.Era2026: http.StatusBadRequest, tasks.Era2025: http.StatusOK}[era]
		for _, tc := range []struct{ name, amount, nearest string }{
			{"held for approval", "5000.000000000000000001", "5000"},
			{"allowed", "250.00000000000000001", "250"},
			{"2^53+1", "9007199254740993", "9007199254740992"},
		} {
			t.Run(tc.name+"/"+string(era), func(t *testing.T) {
				to := acct(t, "inexact")
				args := json.RawMessage(`{"to":"` + to + `","amount":` + tc.amount + `,"currency":"EUR"}`)
				c := call{token: tok(p), era: era, tasks: true, method: "tools/call", params: map[string]any{"name": "transfer_funds", "arguments": args}}
				if era == tasks.Era2025 {
					c.params["task"] = map[string]any{"ttl": 60000}
				}
				r := h.do(t, c)
				r.fails(t, status, codeInvalidParams)
				want := `invalid arguments for tool transfer_funds: number ` + tc.amount + ` at "/amount" is not exactly representable as an IEEE-754 double (nearest: ` + tc.nearest + `)`
				if r.Error.Message != want {
					t.Errorf("message %q, want %q", r.Error.Message, want)
				}
				if n := h.transfersTo(t, to); n != 0 {
					t.Errorf("%d transfers", n)
				}
			})
		}
	}
	if n, _ := h.env.store.CountPending(context.Background(), p); n != 0 {
		t.Errorf("%d pending tasks after refused calls", n)
	}
	if strings.Contains(h.log.String(), "tools/call decided") {
		t.Errorf("a refused call reached policy:\n%s", h.log.String())
	}
}

func TestDedupReturnsSameTask(t *testing.T) {
	h := newHarness(t, nil)
	p, to := principal(t, "a"), acct(t, "dup")
	first := h.createTask(t, p, tasks.Era2026, to)
	second := h.createTask(t, p, tasks.Era2026, to)
	legacy := h.createTask(t, p, tasks.Era2025, to) // same call, other era: same task
	if first != second || first != legacy {
		t.Errorf("task IDs %s, %s, %s: want one task", first, second, legacy)
	}
	other := h.createTask(t, principal(t, "b"), tasks.Era2026, to) // another principal: its own task
	if other == first {
		t.Error("dedup crossed principals")
	}
	if n, _ := h.env.store.CountPending(context.Background(), p); n != 1 {
		t.Errorf("%d pending tasks, want 1", n)
	}
}

func TestLimitsDenyInsteadOfTask(t *testing.T) {
	t.Run("rate", func(t *testing.T) {
		h := newHarness(t, nil, func(o *approvals.Options) { o.RatePerMinute, o.Burst = 1, 1 })
		p := principal(t, "a")
		h.createTask(t, p, tasks.Era2026, acct(t, "r1"))
		// An identical call joins its task without spending the rate.
		h.createTask(t, p, tasks.Era2026, acct(t, "r1"))
		r := h.do(t, call{token: tok(p), era: tasks.Era2026, tasks: true, method: "tools/call", params: gatedArgs(acct(t, "r2"), 5000)})
		var res toolCallResult
		r.ok(t, &res)
		if res.ResultType != "complete" || !res.IsError || !strings.Contains(res.text(), "Too many approval requests") ||
			res.Meta[tasks.MetaDisposition] != string(tasks.DeniedNotExecuted) {
			t.Errorf("over the rate: %s", r.Result)
		}
		if n, _ := h.env.store.CountPending(context.Background(), p); n != 1 {
			t.Errorf("%d pending, want 1", n)
		}
	})
	t.Run("pending cap", func(t *testing.T) {
		h := newHarness(t, nil, func(o *approvals.Options) { o.MaxPendingPerPrincipal = 2 })
		p := principal(t, "a")
		h.createTask(t, p, tasks.Era2026, acct(t, "c1"))
		h.createTask(t, p, tasks.Era2025, acct(t, "c2"))
		for _, era := range eras {
			c := call{token: tok(p), era: era, tasks: true, method: "tools/call", params: gatedArgs(acct(t, "c3"), 5000)}
			if era == tasks.Era2025 {
				c.params["task"] = map[string]any{}
			}
			var res toolCallResult
			h.do(t, c).ok(t, &res)
			if !res.IsError || !strings.Contains(res.text(), "too many approval requests waiting") {
				t.Errorf("%s over the cap: %+v", era, res)
			}
		}
	})
}

func TestAuthentication(t *testing.T) {
	h := newHarness(t, nil)
	for _, tc := range []struct {
		name, auth, wantChallenge string
	}{
		{"no token", "", `Bearer realm="countersign"`},
		{"basic", "Basic dXNlcjpwYXNz", `Bearer realm="countersign"`},
		{"unknown token", "Bearer nope", `Bearer realm="countersign", error="invalid_token"`},
		{"failing verifier", "Bearer " + errToken, `Bearer realm="countersign", error="invalid_token"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.do(t, call{era: tasks.Era2026, method: "tools/list", headers: map[string]string{"Authorization": tc.auth}})
			if r.Status != http.StatusUnauthorized || r.Header.Get("WWW-Authenticate") != tc.wantChallenge {
				t.Errorf("HTTP %d, WWW-Authenticate %q", r.Status, r.Header.Get("WWW-Authenticate"))
			}
			if strings.Contains(string(r.Body), "secret") {
				t.Errorf("cause leaked: %s", r.Body)
			}
		})
	}
	// An unknown or wrong token is told only that it is invalid; the
	// valid token of a disabled agent, that the agent is disabled.
	for token, disabled := range map[string]bool{"nope": false, errToken: false, "tok:": false, disabledToken: true} {
		r := h.do(t, call{era: tasks.Era2026, method: "tools/list", headers: map[string]string{"Authorization": "Bearer " + token}})
		www := r.Header.Get("WWW-Authenticate")
		says := strings.Contains(string(r.Body), "this agent is disabled at Countersign")
		if r.Status != http.StatusUnauthorized || says != disabled ||
			strings.Contains(www, `error_description="this agent is disabled at Countersign"`) != disabled ||
			strings.Contains(string(r.Body), "unknown or revoked") == disabled {
			t.Errorf("%s: HTTP %d, WWW-Authenticate %q, body %q", token, r.Status, www, r.Body)
		}
	}
	t.Run("token store unavailable", func(t *testing.T) {
		r := h.do(t, call{era: tasks.Era2026, method: "tools/list", headers: map[string]string{"Authorization": "Bearer " + unavailableToken}})
		if r.Status != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" || r.Header.Get("WWW-Authenticate") != "" {
			t.Errorf("HTTP %d, headers %v: want 503 with Retry-After and no challenge", r.Status, r.Header)
		}
		if strings.Contains(string(r.Body), "secret") || strings.Contains(string(r.Body), "nats") {
			t.Errorf("cause leaked: %s", r.Body)
		}
	})
	t.Run("NoAuth", func(t *testing.T) {
		h := newHarness(t, func(o *Options) { o.NoAuth, o.Authenticate = true, nil })
		r := h.do(t, call{era: tasks.Era2026, tasks: true, method: "tools/call", params: gatedArgs(acct(t, "anon"), 5000)})
		var res taskResult2026
		r.ok(t, &res)
		if rec, err := h.env.store.Get(context.Background(), res.TaskID); err != nil || rec.Owner != AnonymousPrincipal {
			t.Errorf("owner %q, err %v", rec.Owner, err)
		}
		if !strings.Contains(h.log.String(), "authentication is disabled") {
			t.Error("NoAuth did not log a warning")
		}
	})
}

func TestCancel(t *testing.T) {
	h := newHarness(t, nil)
	p := principal(t, "a")
	t.Run("2026 acknowledges", func(t *testing.T) {
		id := h.createTask(t, p, tasks.Era2026, acct(t, "x"))
		cancel := call{token: tok(p), era: tasks.Era2026, tasks: true, method: "tasks/cancel", params: map[string]any{"taskId": id}}
		var ack map[string]any
		h.do(t, cancel).ok(t, &ack)
		if ack["resultType"] != "complete" {
			t.Errorf("ack %v", ack)
		}
		h.waitStatus(t, id, tasks.StatusCancelled)
		var got taskResult2026
		h.do(t, call{token: tok(p), era: tasks.Era2026, tasks: true, method: "tasks/get", params: map[string]any{"taskId": id}}).ok(t, &got)
		if got.Status != "cancelled" {
			t.Errorf("tasks/get after cancel: %+v", got)
		}
		h.do(t, cancel).ok(t, &ack) // a terminal task is acknowledged too
	})
	t.Run("2025 returns the cancelled task", func(t *testing.T) {
		id := h.createTask(t, p, tasks.Era2025, acct(t, "y"))
		cancel := call{token: tok(p), era: tasks.Era2025, method: "tasks/cancel", params: map[string]any{"taskId": id}}
		var got legacyTask
		h.do(t, cancel).ok(t, &got)
		if got.TaskID != id || got.Status != "cancelled" {
			t.Errorf("cancel answered %+v", got)
		}
		r := h.do(t, cancel)
		r.fails(t, http.StatusOK, codeInvalidParams)
		if !strings.Contains(r.Error.Message, "terminal status 'cancelled'") {
			t.Errorf("second cancel: %s", r.Body)
		}
		var res toolCallResult
		h.do(t, call{token: tok(p), era: tasks.Era2025, method: "tasks/result", params: map[string]any{"taskId": id}}).ok(t, &res)
		if !res.IsError || !strings.Contains(res.text(), "did NOT run") || relatedTask(res.Meta) != id {
			t.Errorf("tasks/result of a cancelled task: %+v", res)
		}
	})
}

func relatedTask(meta map[string]any) string {
	m, _ := meta[tasks.MetaRelatedTask].(map[string]any)
	id, _ := m["taskId"].(string)
	return id
}

func TestLegacyTaskAugmentedDecidedCalls(t *testing.T) {
	h := newHarness(t, nil)
	p := principal(t, "a")
	for _, tc := range []struct {
		name    string
		amount  float64
		isError bool
		runs    int
	}{
		{"allowed", 300, false, 1},
		{"denied", 5_000_000, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			to := acct(t, tc.name)
			r := h.do(t, call{token: tok(p), era: tasks.Era2025, method: "tools/call", params: map[string]any{
				"name": "transfer_funds", "arguments": transferArgs(to, tc.amount), "task": map[string]any{}}})
			var created struct{ Task legacyTask }
			r.ok(t, &created)
			if created.Task.TaskID == "" || created.Task.Status != "completed" {
				t.Fatalf("CreateTaskResult: %s", r.Result)
			}
			if n := h.transfersTo(t, to); n != tc.runs {
				t.Errorf("%d transfers, want %d", n, tc.runs)
			}
			var res toolCallResult
			h.do(t, call{token: tok(p), era: tasks.Era2025, method: "tasks/result", params: map[string]any{"taskId": created.Task.TaskID}}).ok(t, &res)
			if res.IsError != tc.isError || relatedTask(res.Meta) != created.Task.TaskID {
				t.Errorf("tasks/result: %+v", res)
			}
			// A 2026 client reads the same task with the result inline.
			var got taskResult2026
			h.do(t, call{token: tok(p), era: tasks.Era2026, tasks: true, method: "tasks/get", params: map[string]any{"taskId": created.Task.TaskID}}).ok(t, &got)
			var inline toolCallResult
			if err := json.Unmarshal(got.Result, &inline); err != nil || got.ResultType != "complete" || got.Status != "completed" || inline.IsError != tc.isError {
				t.Errorf("2026 tasks/get: %+v (%v)", got, err)
			}
		})
	}
}

// A 2025-11-25 tools/call with params.task on a tool listed with
// execution.taskSupport "forbidden" is -32601 and does not run; without
// params.task, and in 2026-07-28 (where params.task is ignored), the tool
// answers as usual.
func TestLegacyTaskOnForbiddenTool(t *testing.T) {
	h := newHarness(t, nil)
	p := principal(t, "a")
	for _, name := range []string{"list_transfers", ToolPending, ToolAwait} {
		t.Run(name, func(t *testing.T) {
			args := map[string]any{}
			if name == ToolAwait {
				args["taskId"] = "tsk_unknown"
			}
			r := h.do(t, call{token: tok(p), era: tasks.Era2025, method: "tools/call", params: map[string]any{"name": name, "arguments": args, "task": map[string]any{"ttl": 60000}}})
			// The SDK rewords every -32601 as `method not found:
			// "tools/call"`; this one keeps its own words (methodError).
			r.fails(t, http.StatusOK, codeMethodNotFound)
			if want := "Tool " + name + " cannot be called as a task"; !strings.HasPrefix(r.Error.Message, want) {
				t.Errorf("message %q, want it to start %q", r.Error.Message, want)
			}
			if name == ToolAwait {
				return // it answers an unknown task as such, without params.task too
			}
			var res toolCallResult
			h.do(t, call{token: tok(p), era: tasks.Era2025, method: "tools/call", params: map[string]any{"name": name, "arguments": args}}).ok(t, &res)
			if res.IsError {
				t.Errorf("without params.task: %+v", res)
			}
			h.do(t, call{token: tok(p), era: tasks.Era2026, tasks: true, method: "tools/call", params: map[string]any{"name": name, "arguments": args, "task": map[string]any{"ttl": 60000}}}).ok(t, &res)
			if res.IsError || res.ResultType != "complete" {
				t.Errorf("2026-07-28 with params.task: %+v", res)
			}
		})
	}
	t.Run("unknown tool", func(t *testing.T) {
		r := h.do(t, call{token: tok(p), era: tasks.Era2025, method: "tools/call", params: map[string]any{"name": "launch_missiles", "arguments": map[string]any{}, "task": map[string]any{}}})
		r.fails(t, http.StatusOK, codeInvalidParams)
	})
}

func TestLegacyTasksResultBlocksUntilTerminal(t *testing.T) {
	h := newHarness(t, nil)
	p := principal(t, "a")
	id := h.createTask(t, p, tasks.Era2025, acct(t, "wait"))
	done := make(chan rpc, 1)
	go func() {
		done <- h.do(t, call{token: tok(p), era: tasks.Era2025, method: "tasks/result", params: map[string]any{"taskId": id}})
	}()
	select {
	case r := <-done:
		t.Fatalf("tasks/result returned before the task ended: %s", r.Body)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := h.env.workflow.Cancel(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		var res toolCallResult
		r.ok(t, &res)
		if relatedTask(res.Meta) != id || !res.IsError {
			t.Errorf("tasks/result: %s", r.Result)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("tasks/result did not return after the task ended")
	}
}

func TestEraSpecificMethods(t *testing.T) {
	h := newHarness(t, nil)
	p := principal(t, "a")
	id := h.createTask(t, p, tasks.Era2026, acct(t, "x"))
	h.do(t, call{token: tok(p), era: tasks.Era2026, tasks: true, method: "tasks/result", params: map[string]any{"taskId": id}}).
		fails(t, http.StatusNotFound, codeMethodNotFound)
	h.do(t, call{token: tok(p), era: tasks.Era2026, tasks: true, method: "tasks/list", params: map[string]any{}}).
		fails(t, http.StatusNotFound, codeMethodNotFound)
	h.do(t, call{token: tok(p), era: tasks.Era2025, method: "tasks/update", params: map[string]any{"taskId": id}}).
		fails(t, http.StatusOK, codeMethodNotFound)
	var ack map[string]any
	h.do(t, call{token: tok(p), era: tasks.Era2026, tasks: true, method: "tasks/update",
		params: map[string]any{"taskId": id, "inputResponses": map[string]any{"x": map[string]any{"action": "accept"}}}}).ok(t, &ack)
	if ack["resultType"] != "complete" {
		t.Errorf("tasks/update ack %v", ack)
	}
	h.waitStatus(t, id, tasks.StatusWorking)
}

func TestLegacyTasksList(t *testing.T) {
	h := newHarness(t, nil)
	h.srv.pageSize = 2
	p := principal(t, "a")
	var ids []string
	for i := range 3 {
		ids = append(ids, h.createTask(t, p, tasks.Era2025, acct(t, string(rune('a'+i)))))
	}
	h.createTask(t, principal(t, "other"), tasks.Era2025, acct(t, "z"))
	seen := map[string]bool{}
	cursor := ""
	for page := 0; ; page++ {
		params := map[string]any{}
		if cursor != "" {
			params["cursor"] = cursor
		}
		var res struct {
			Tasks      []legacyTask `json:"tasks"`
			NextCursor string       `json:"nextCursor"`
		}
		h.do(t, call{token: tok(p), era: tasks.Era2025, method: "tasks/list", params: params}).ok(t, &res)
		if len(res.Tasks) > 2 {
			t.Fatalf("page of %d", len(res.Tasks))
		}
		for _, tk := range res.Tasks {
			seen[tk.TaskID] = true
		}
		if cursor = res.NextCursor; cursor == "" || page > 5 {
			break
		}
	}
	want := map[string]bool{ids[0]: true, ids[1]: true, ids[2]: true}
	if diff := cmp.Diff(want, seen); diff != "" {
		t.Errorf("listed tasks (-want +got):\n%s", diff)
	}
	h.do(t, call{token: tok(p), era: tasks.Era2025, method: "tasks/list", params: map[string]any{"cursor": "bogus"}}).
		fails(t, http.StatusOK, codeInvalidParams)
}

func TestHandlerOutsideServeRefuses(t *testing.T) {
	// The middleware fails closed when the HTTP layer's facts are missing.
	h := newHarness(t, nil)
	if _, err := h.srv.middleware(nil)(context.Background(), "tools/list", nil); err == nil {
		t.Fatal("want an error without request facts")
	}
}

// A gated call's display text is bounded as a verified call's is: an
// upstream tool's display text is its arguments' JSON, and one past the
// passkey service's 4096 bytes made every challenge of the approval an
// internal error, so that no approver could approve or deny it with a
// passkey.
func TestGatedCallDisplayTextIsBounded(t *testing.T) {
	plain := gateway.Tool{ // no Describe: the display text shows the arguments
		Name:        "transfer_funds", // requestable above 1,000
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Run:         func(context.Context, gateway.Call) (tasks.CallToolResult, error) { return tasks.CallToolResult{}, nil },
	}
	reg, err := gateway.NewRegistry(plain)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *Options) { o.Tools = reg }, func(o *approvals.Options) { o.Passkeys = sharedEnv(t).passkeys })
	args := transferArgs("acct-long", 5000)
	args["memo"] = strings.Repeat("€", 3000) // 9000 bytes
	r := h.do(t, call{token: tok(principal(t, "a")), era: tasks.Era2026, tasks: true, method: "tools/call",
		params: map[string]any{"name": "transfer_funds", "arguments": args}})
	var res taskResult2026
	r.ok(t, &res)
	if res.TaskID == "" {
		t.Fatalf("want a task, got %s", r.Result)
	}
	rec, err := h.env.store.Get(context.Background(), res.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(rec.DisplayText); n == 0 || n > 4096 || !utf8.ValidString(rec.DisplayText) || !strings.HasSuffix(rec.DisplayText, "…") {
		t.Errorf("display text of %d bytes (valid UTF-8: %t), want 1-4096 ending in an ellipsis", n, utf8.ValidString(rec.DisplayText))
	}
	// The approval takes a challenge (or says no approver has a passkey),
	// never an internal error.
	if _, err := h.approvals.Challenge(context.Background(), rec.ApprovalRef, tasks.DecisionDeny); err != nil && passkey.ReasonOf(err) == "" {
		t.Errorf("challenge: %v", err)
	}
}

func TestPanicsBecomeInternalErrors(t *testing.T) {
	t.Run("in the tool", func(t *testing.T) {
		boom := gateway.Tool{
			Name:        "transfer_funds", // the default policy allows small amounts
			InputSchema: json.RawMessage(`{"type":"object"}`),
			Run: func(context.Context, gateway.Call) (tasks.CallToolResult, error) {
				panic("tool exploded: secret detail")
			},
		}
		reg, err := gateway.NewRegistry(boom)
		if err != nil {
			t.Fatal(err)
		}
		h := newHarness(t, func(o *Options) { o.Tools = reg })
		r := h.do(t, call{token: tok(principal(t, "a")), era: tasks.Era2026, method: "tools/call",
			params: map[string]any{"name": "transfer_funds", "arguments": map[string]any{"amount": 1}}})
		var res toolCallResult
		r.ok(t, &res)
		if !res.IsError || res.Meta[tasks.MetaDisposition] != string(tasks.OutcomeUnknown) || strings.Contains(string(r.Body), "secret") {
			t.Errorf("a panicking tool: %s", r.Body)
		}
	})
	t.Run("in the MCP handler", func(t *testing.T) {
		boom := gateway.Tool{
			Name:        "transfer_funds", // requestable above 1,000
			InputSchema: json.RawMessage(`{"type":"object"}`),
			Describe:    func(json.RawMessage) string { panic("describe exploded: secret detail") },
			Run:         func(context.Context, gateway.Call) (tasks.CallToolResult, error) { return tasks.CallToolResult{}, nil },
		}
		reg, err := gateway.NewRegistry(boom)
		if err != nil {
			t.Fatal(err)
		}
		h := newHarness(t, func(o *Options) { o.Tools = reg })
		for _, era := range eras {
			c := call{token: tok(principal(t, "a")), era: era, tasks: true, method: "tools/call",
				params: map[string]any{"name": "transfer_funds", "arguments": map[string]any{"amount": 5000}}}
			if era == tasks.Era2025 {
				c.params["task"] = map[string]any{}
			}
			r := h.do(t, c)
			r.fails(t, http.StatusOK, codeInternal)
			if r.Error.Message != msgInternal || strings.Contains(string(r.Body), "secret") || strings.Contains(string(r.Body), "goroutine") {
				t.Errorf("%s: %s", era, r.Body)
			}
		}
		if !strings.Contains(h.log.String(), "panic while handling a request") {
			t.Error("panic not logged")
		}
	})
	t.Run("in the HTTP layer", func(t *testing.T) {
		h := newHarness(t, func(o *Options) {
			o.Authenticate = func(context.Context, string) (string, error) { panic("verifier exploded: secret detail") }
		})
		r := h.do(t, call{token: "tok:x", era: tasks.Era2026, method: "tools/list"})
		r.fails(t, http.StatusInternalServerError, codeInternal)
		if strings.Contains(string(r.Body), "secret") {
			t.Errorf("cause leaked: %s", r.Body)
		}
	})
}

func TestLegacyImmediateTasksSpendTheRate(t *testing.T) {
	h := newHarness(t, nil, func(o *approvals.Options) { o.RatePerMinute, o.Burst = 1, 1 })
	p, to := principal(t, "a"), acct(t, "imm")
	send := func() rpc {
		return h.do(t, call{token: tok(p), era: tasks.Era2025, method: "tools/call", params: map[string]any{
			"name": "transfer_funds", "arguments": transferArgs(to, 20), "task": map[string]any{}}})
	}
	var created struct{ Task legacyTask }
	send().ok(t, &created)
	if created.Task.Status != "completed" {
		t.Fatalf("first call: %+v", created)
	}
	var denied toolCallResult
	send().ok(t, &denied)
	if !denied.IsError || !strings.Contains(denied.text(), "Too many task requests") {
		t.Errorf("second call: %+v", denied)
	}
	if n := h.transfersTo(t, to); n != 1 {
		t.Errorf("%d transfers, want 1", n)
	}
}

func TestNewValidatesOptions(t *testing.T) {
	e := sharedEnv(t)
	svc, err := approvals.New(approvals.Options{Store: e.store, Engine: e.workflow})
	if err != nil {
		t.Fatal(err)
	}
	base := Options{ServerID: "s", Approvals: svc, PDP: e.engine, Tools: e.tools, Authenticate: testAuth}
	for name, tweak := range map[string]func(*Options){
		"no server id":        func(o *Options) { o.ServerID = "" },
		"no approvals":        func(o *Options) { o.Approvals = nil },
		"no pdp":              func(o *Options) { o.PDP = nil },
		"no tools":            func(o *Options) { o.Tools = nil },
		"no auth":             func(o *Options) { o.Authenticate = nil },
		"negative limit":      func(o *Options) { o.RequestBurst = -1 },
		"negative body":       func(o *Options) { o.MaxBodyBytes = -1 },
		"negative streams":    func(o *Options) { o.MaxStreamsPerPrincipal = -1 },
		"negative keep-alive": func(o *Options) { o.KeepAlive = -time.Second },
	} {
		o := base
		tweak(&o)
		if _, err := New(o); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
	if _, err := New(base); err != nil {
		t.Errorf("valid options: %v", err)
	}
}

// A tool whose input schema is not exactly {"type":"object", …} is left out
// of tools/list: strict clients refuse a whole listing over one such tool.
// Keys are matched exactly (encoding/json would take "tYpe" for "type").
func TestCheckObjectSchema(t *testing.T) {
	for _, tc := range []struct {
		schema string
		ok     bool
	}{
		{`{"type":"object"}`, true},
		{`{"type":"object","properties":{"a":{"type":"string"}}}`, true},
		{`{"tYpe":"object"}`, false},
		{`{"TYPE":"object"}`, false},
		{`{"type":"string"}`, false},
		{`{"type":["object"]}`, false},
		{`{}`, false},
		{`null`, false},
		{`[]`, false},
		{`"object"`, false},
	} {
		if err := checkObjectSchema(json.RawMessage(tc.schema)); (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", tc.schema, err, tc.ok)
		}
	}
}
