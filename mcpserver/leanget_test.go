package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/proccpu"
	"github.com/countersign/countersign/tasks"
)

// leanRequest is one raw tasks/get for TestLeanTaskGetMatchesSDK.
type leanRequest struct {
	name    string
	body    string
	headers map[string]string // "" deletes
	host    string
	lean    bool // the lean path must answer it
}

// settled waits until a new task's first workflow task has written its
// first facts (the request notice's outcome is the last of them), so that
// the record does not change between two reads being compared.
func settled(tb testing.TB, h *harness, id string) {
	tb.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		rec, err := h.env.store.Get(context.Background(), id)
		if err == nil && slices.ContainsFunc(rec.Timeline, func(e tasks.Event) bool {
			return e.Kind == tasks.EventNotified || e.Kind == tasks.EventNotifyFailed
		}) {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("task %s: the first facts were not written in 15 s (%v)", id, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sendRaw posts body with the default MCP headers adjusted by headers.
func sendRaw(t *testing.T, h *harness, token string, q leanRequest) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.ts.URL, strings.NewReader(q.body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	for k, v := range q.headers {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	if q.host != "" {
		req.Host = q.host
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, body
}

// TestLeanTaskGetMatchesSDK sends the same tasks/gets to an endpoint with
// the lean path and to one that sends every tasks/get through the SDK, over
// the same store: the answers must be the same bytes, with the same status
// and headers. The requests the lean path must answer are counted, so the
// test fails if it quietly stopped answering; the rest (odd headers,
// mismatched versions, keys the SDK reads case-sensitively, errors) must
// reach the SDK.
func TestLeanTaskGetMatchesSDK(t *testing.T) {
	unlimited := func(o *Options) { o.RequestsPerSecond, o.RequestBurst = 1e6, 1e6 }
	lean := newHarness(t, unlimited)
	sdk := newHarness(t, unlimited)
	sdk.srv.sdkTaskGet = true
	p := principal(t, "a")
	pending := lean.createTask(t, p, tasks.Era2026, acct(t, "pending"))
	legacy := lean.createTask(t, p, tasks.Era2025, acct(t, "legacy"))
	done := lean.createTask(t, p, tasks.Era2026, acct(t, "done"))
	settled(t, lean, pending)
	settled(t, lean, legacy)
	settled(t, lean, done)
	lean.do(t, call{token: tok(p), era: tasks.Era2026, tasks: true, method: "tasks/cancel", params: map[string]any{"taskId": done}})
	lean.waitStatus(t, done, tasks.StatusCancelled)

	modern := func(id string, extraMeta string) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%%s,"method":"tasks/get","params":{"taskId":%q,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"extensions":{%q:{}}}%s}}}`, id, tasks.ExtTasks, extraMeta)
	}
	modernHeaders := func(id string) map[string]string {
		return map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tasks/get", "Mcp-Name": id}
	}
	with := func(m map[string]string, k, v string) map[string]string {
		out := map[string]string{}
		for a, b := range m {
			out[a] = b
		}
		out[k] = v
		return out
	}
	old := func(id string) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%%s,"method":"tasks/get","params":{"taskId":%q}}`, id)
	}
	v2025 := map[string]string{"Mcp-Protocol-Version": "2025-11-25"}
	reqs := []leanRequest{
		{name: "2026 pending", body: modern(pending, ""), headers: modernHeaders(pending), lean: true},
		{name: "2026 cancelled", body: modern(done, ""), headers: modernHeaders(done), lean: true},
		{name: "2026 client info and charset", body: modern(pending, `,"io.modelcontextprotocol/clientInfo":{"name":"a<b>&c","version":"1"}`),
			headers: with(modernHeaders(pending), "Content-Type", "application/json; charset=utf-8"), lean: true},
		{name: "2026 bad clientInfo", body: modern(pending, `,"io.modelcontextprotocol/clientInfo":{"name":5}`), headers: modernHeaders(pending)},
		{name: "2026 clientInfo null", body: modern(pending, `,"io.modelcontextprotocol/clientInfo":null`), headers: modernHeaders(pending)},
		{name: "2026 no capabilities", body: strings.Replace(modern(pending, ""), `"io.modelcontextprotocol/clientCapabilities"`, `"x"`, 1), headers: modernHeaders(pending)},
		{name: "2026 capabilities not an object", body: strings.Replace(modern(pending, ""), `"extensions":{`, `"extensions":5,"x":{`, 1), headers: modernHeaders(pending)},
		{name: "2026 roots", body: strings.Replace(modern(pending, ""), `"extensions":{`, `"roots":{"listChanged":true},"extensions":{`, 1), headers: modernHeaders(pending), lean: true},
		{name: "2025 pending", body: old(legacy), headers: v2025, lean: true},
		{name: "2025 2026-era task", body: old(pending), headers: v2025, lean: true},
		{name: "2025 cancelled", body: old(done), headers: v2025, lean: true},
		{name: "2025 no version header", body: old(legacy), lean: true},
		{name: "2025-06-18", body: old(legacy), headers: map[string]string{"Mcp-Protocol-Version": "2025-06-18"}, lean: true},
		{name: "2025 TypeScript task member", body: strings.Replace(old(legacy), `"params":{`, `"params":{"task":{"ttl":1},`, 1), headers: v2025, lean: true},

		{name: "unknown task", body: old("tsk_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"), headers: v2025},
		{name: "2026 unknown task", body: modern("tsk_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", ""), headers: modernHeaders("tsk_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")},
		{name: "2026 tasks not declared", body: strings.Replace(modern(pending, ""), tasks.ExtTasks, "other", 1), headers: modernHeaders(pending)},
		{name: "2026 no Mcp-Method", body: modern(pending, ""), headers: with(modernHeaders(pending), "Mcp-Method", "")},
		{name: "2026 wrong Mcp-Method", body: modern(pending, ""), headers: with(modernHeaders(pending), "Mcp-Method", "tasks/cancel")},
		{name: "2026 no version header", body: modern(pending, ""), headers: with(modernHeaders(pending), "Mcp-Protocol-Version", "")},
		{name: "2026 body, 2025 header", body: modern(pending, ""), headers: with(modernHeaders(pending), "Mcp-Protocol-Version", "2025-11-25")},
		{name: "2026 header, no _meta version", body: old(pending), headers: modernHeaders(pending)},
		{name: "future version header", body: old(legacy), headers: map[string]string{"Mcp-Protocol-Version": "2099-01-01"}},
		{name: "unsupported version header", body: old(legacy), headers: map[string]string{"Mcp-Protocol-Version": "2023-01-01"}},
		{name: "case-variant key", body: strings.Replace(old(legacy), `"taskId"`, `"TaskId"`, 1), headers: v2025},
		{name: "both spellings", body: strings.Replace(old(legacy), `"params":{`, `"params":{"TASKID":"tsk_x",`, 1), headers: v2025},
		{name: "case-variant method key", body: strings.Replace(old(legacy), `"method"`, `"Method"`, 1), headers: v2025},
		{name: "taskId not a string", body: `{"jsonrpc":"2.0","id":%s,"method":"tasks/get","params":{"taskId":7}}`, headers: v2025},
		{name: "_meta not an object", body: strings.Replace(old(legacy), `"params":{`, `"params":{"_meta":"x",`, 1), headers: v2025},
		{name: "Accept */*", body: old(legacy), headers: with(v2025, "Accept", "*/*")},
		{name: "Accept json only", body: old(legacy), headers: with(v2025, "Accept", "application/json")},
		{name: "Content-Type text/plain", body: old(legacy), headers: with(v2025, "Content-Type", "text/plain")},
		{name: "Last-Event-ID", body: old(legacy), headers: with(v2025, "Last-Event-ID", "1")},
		{name: "DNS rebinding Host", body: old(legacy), headers: v2025, host: "evil.example"},
	}
	ids := []struct {
		raw  string
		lean bool
	}{{`1`, true}, {`"a<b>&\u0041"`, true}, {`7.9`, false}, {`-3`, true}, {`null`, false}, {`{}`, false}} // 7.9: refused before either path (checkID)
	for _, q := range reqs {
		for _, id := range ids {
			q := q
			q.body = strings.Replace(q.body, "%s", id.raw, 1)
			q.lean = q.lean && id.lean
			t.Run(q.name+" id "+id.raw, func(t *testing.T) {
				before := lean.srv.leanGets.Load()
				ls, lh, lb := sendRaw(t, lean, tok(p), q)
				answered := lean.srv.leanGets.Load() - before
				ss, sh, sb := sendRaw(t, sdk, tok(p), q)
				if sdk.srv.leanGets.Load() != 0 {
					t.Fatal("the SDK-only endpoint answered on the lean path")
				}
				if ls != ss || !bytes.Equal(lb, sb) {
					t.Errorf("lean: %d %s\nSDK:  %d %s", ls, lb, ss, sb)
				}
				for _, k := range []string{"Content-Type", "Cache-Control"} {
					if lh.Get(k) != sh.Get(k) {
						t.Errorf("%s: lean %q, SDK %q", k, lh.Get(k), sh.Get(k))
					}
				}
				if want := int64(0); q.lean {
					want = 1
					if answered != want {
						t.Errorf("the lean path answered %d times, want %d (status %d: %s)", answered, want, ls, lb)
					}
				} else if answered != 0 {
					t.Errorf("the lean path answered a request the SDK must (status %d: %s)", ls, lb)
				}
				if q.lean {
					var r struct {
						Result json.RawMessage `json:"result"`
					}
					if json.Unmarshal(lb, &r) != nil || len(r.Result) == 0 {
						t.Errorf("want a result: %s", lb)
					}
				}
			})
		}
	}

	t.Run("another principal's task", func(t *testing.T) {
		q := leanRequest{body: strings.Replace(old(legacy), "%s", "1", 1), headers: v2025}
		before := lean.srv.leanGets.Load()
		ls, _, lb := sendRaw(t, lean, tok(principal(t, "b")), q)
		ss, _, sb := sendRaw(t, sdk, tok(principal(t, "b")), q)
		if lean.srv.leanGets.Load() != before || ls != ss || !bytes.Equal(lb, sb) || !bytes.Contains(lb, []byte(`"error"`)) {
			t.Errorf("lean: %d %s\nSDK:  %d %s", ls, lb, ss, sb)
		}
	})
}

// BenchmarkTaskGet polls one pending task over HTTP (client and server in
// this process), on the lean path and through the SDK, in both eras;
// cpu-µs/op counts both sides.
func BenchmarkTaskGet(b *testing.B) {
	unlimited := func(o *Options) { o.RequestsPerSecond, o.RequestBurst, o.MaxInFlightPerPrincipal = 1e9, 1e9, 1e6 }
	h := newHarness(b, unlimited)
	p := "bench-agent"
	id := h.createTask(b, p, tasks.Era2026, "bench-held")
	settled(b, h, id)
	for _, path := range []string{"lean", "sdk"} {
		for _, era := range []tasks.Era{tasks.Era2026, tasks.Era2025} {
			b.Run(path+"/"+string(era), func(b *testing.B) {
				h.srv.sdkTaskGet = path == "sdk"
				c := call{token: tok(p), era: era, tasks: true, method: "tasks/get", params: map[string]any{"taskId": id}}
				b.ReportAllocs()
				start := proccpu.Used()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						r, err := h.try(c)
						if err != nil || r.Status != http.StatusOK || len(r.Result) == 0 {
							b.Errorf("tasks/get: %v %d %s", err, r.Status, r.Body)
							return
						}
					}
				})
				// The whole process's: the HTTP client's side too.
				b.ReportMetric(proccpu.PerOp(start, b.N), "cpu-µs/op")
			})
		}
	}
	h.srv.sdkTaskGet = false
}

// FuzzLeanTaskGet sends arbitrary tasks/get bodies, under either era's
// headers, to an endpoint with the lean path and to one without: the
// answers must be the same bytes. Bodies that might name another method
// (more than one "method" key, escapes) are skipped, so that no request
// changes the tasks between the two sends.
func FuzzLeanTaskGet(f *testing.F) {
	unlimited := func(o *Options) { o.RequestsPerSecond, o.RequestBurst = 1e9, 1e9 }
	lean := newHarness(f, unlimited)
	sdk := newHarness(f, unlimited)
	sdk.srv.sdkTaskGet = true
	p := "fuzz-lean-agent"
	pending := lean.createTask(f, p, tasks.Era2026, "fuzz-lean-held")
	settled(f, lean, pending)
	meta := fmt.Sprintf(`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"extensions":{%q:{}}},"io.modelcontextprotocol/clientInfo":{"name":"f","version":"1"}}`, tasks.ExtTasks)
	for _, s := range []string{
		fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":%q}}`, pending),
		fmt.Sprintf(`{"jsonrpc":"2.0","id":"x","method":"tasks/get","params":{"taskId":%q,%s}}`, pending, meta),
		fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":"tasks/get","params":{"taskId":%q,"task":{"ttl":1},"inputResponses":{}}}`, pending),
		`{"jsonrpc":"2.0","id":3,"method":"tasks/get","params":{"taskId":"tsk_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}}`,
		`{"jsonrpc":"2.0","id":4,"method":"tasks/get","params":null}`,
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, body string, modern bool) {
		lower := strings.ToLower(body)
		if strings.Contains(body, `\`) || strings.Count(lower, `"method"`) != 1 || !strings.Contains(body, `"method":"tasks/get"`) {
			t.Skip("may name another method")
		}
		q := leanRequest{body: body, headers: map[string]string{"Mcp-Protocol-Version": "2025-11-25"}}
		if modern {
			q.headers = map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tasks/get", "Mcp-Name": pending}
		}
		ls, lh, lb := sendRaw(t, lean, tok(p), q)
		ss, sh, sb := sendRaw(t, sdk, tok(p), q)
		if ls != ss || !bytes.Equal(lb, sb) || lh.Get("Content-Type") != sh.Get("Content-Type") {
			t.Errorf("lean: %d %s %s\nSDK:  %d %s %s", ls, lh.Get("Content-Type"), lb, ss, sh.Get("Content-Type"), sb)
		}
	})
}
