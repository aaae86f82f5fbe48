package mcpserver

import (
	"bytes"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/countersign/countersign/tasks"
)

// appendMember adds a member at the end of a message object, after the
// members of the same name that json.Marshal put first.
func appendMember(member string) func([]byte) []byte {
	return func(b []byte) []byte {
		return append(b[:len(b)-1:len(b)-1], ","+member+"}"...)
	}
}

// TestCaseVariantKeysDoNotDodgeTheInFlightCap: a "Method" member, which the
// SDK does not read, once made the HTTP layer budget a tools/call as
// tasks/result (a token, no in-flight slot): three concurrent awaits over a
// cap of one all ran. Now such a message is refused and nothing runs.
func TestCaseVariantKeysDoNotDodgeTheInFlightCap(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.MaxInFlightPerPrincipal = 1 })
	p := principal(t, "a")
	_, st := h.pendingCall(t, p, tasks.Era2025, acct(t, "held"))
	awaits := func(edit func([]byte) []byte) []rpc {
		out := make([]rpc, 3)
		var wg sync.WaitGroup
		for i := range out {
			wg.Go(func() {
				r, err := h.try(call{token: tok(p), era: tasks.Era2025, method: "tools/call", edit: edit,
					params: map[string]any{"name": ToolAwait, "arguments": map[string]any{"taskId": st.TaskID, "waitSeconds": 3}}})
				if err != nil {
					r.Body = []byte(err.Error())
				}
				out[i] = r
			})
		}
		wg.Wait()
		return out
	}

	refused := 0
	for _, r := range awaits(nil) {
		if r.Status == http.StatusTooManyRequests {
			refused++
		}
	}
	if refused != 2 {
		t.Fatalf("plain awaits: %d refused with 429, want 2", refused)
	}

	invalid := 0
	for _, r := range awaits(appendMember(`"Method":"tasks/result"`)) {
		switch {
		case r.Status == http.StatusTooManyRequests && r.Error != nil && r.Error.Code == CodeTooManyRequests:
		case r.Status == http.StatusBadRequest && r.Error != nil && r.Error.Code == codeInvalidRequest &&
			strings.Contains(r.Error.Message, "differs only in letter case from jsonrpc, id, method, params"):
			invalid++
		default:
			t.Errorf("await with a \"Method\" member: HTTP %d %s", r.Status, r.Body)
		}
	}
	if invalid == 0 {
		t.Error("no await with a \"Method\" member was refused as an invalid request")
	}
}

// TestCaseVariantKeysDoNotDodgeMcpName: a "TASKID" after params.taskId was
// once compared with Mcp-Name in its place, while the handler served the
// real taskId. Now such a message is refused and nothing runs.
func TestCaseVariantKeysDoNotDodgeMcpName(t *testing.T) {
	h := newHarness(t, nil)
	p := principal(t, "a")
	id := h.createTask(t, p, tasks.Era2026, acct(t, "x"))
	decoy := func(b []byte) []byte {
		return bytes.Replace(b, []byte(`"taskId":"`+id+`"`), []byte(`"taskId":"`+id+`","TASKID":"decoy"`), 1)
	}
	for _, m := range []string{"tasks/get", "tasks/update", "tasks/cancel"} {
		for _, name := range []string{"decoy", id} {
			r := h.do(t, call{token: tok(p), era: tasks.Era2026, tasks: true, method: m, edit: decoy,
				params: map[string]any{"taskId": id}, headers: map[string]string{"Mcp-Name": name}})
			r.fails(t, http.StatusBadRequest, codeInvalidRequest)
			if want := "differs only in letter case from _meta, taskId"; !strings.Contains(r.Error.Message, want) {
				t.Errorf("%s, Mcp-Name %s: message %q, want it to contain %q", m, name, r.Error.Message, want)
			}
		}
	}
	h.waitStatus(t, id, tasks.StatusWorking) // no cancel ran
}

// TestInspectReadsMembersAsTheSDK: the HTTP layer reads the member the SDK
// reads (exact names; of duplicates the last, escapes undone) and refuses a
// key that differs only in letter case from a name it reads.
func TestInspectReadsMembersAsTheSDK(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		refused    bool   // -32600, a case variant
		method     string // else the method read
		tool       string // and a tools/call's params.name
	}{
		{"Method after method", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"},"Method":"tasks/result"}`, true, "", ""},
		{"Method before method", `{"jsonrpc":"2.0","id":1,"Method":"tasks/result","method":"tools/call","params":{"name":"a"}}`, true, "", ""},
		{"ID", `{"jsonrpc":"2.0","ID":1,"id":2,"method":"ping"}`, true, "", ""},
		{"JSONRPC", `{"JSONRPC":"1.0","jsonrpc":"2.0","id":1,"method":"ping"}`, true, "", ""},
		{"Params", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"},"Params":{"name":"b"}}`, true, "", ""},
		{"NAME", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","NAME":"b"}}`, true, "", ""},
		{"Task", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","Task":{}}}`, true, "", ""},
		{"Kelvin sign", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","tas\u212a":{}}}`, true, "", ""},
		{"_META", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","_META":{"progressToken":1}}}`, true, "", ""},
		{"TaskID", `{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"a","TaskID":"b"}}`, true, "", ""},
		{"duplicate method", `{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"tasks/result","params":{"taskId":"t"}}`, false, "tasks/result", ""},
		{"escaped method", `{"jsonrpc":"2.0","id":1,"method":"tools/call","\u006dethod":"tasks/result","params":{"taskId":"t"}}`, false, "tasks/result", ""},
		{"duplicate name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","name":"b"}}`, false, "tools/call", "b"},
		{"Name in arguments", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"Name":"b"}}}`, false, "tools/call", "a"},
		{"Name in params not read", `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":"x","Name":"y"}}`, false, "tools/list", ""},
		{"method null", `{"jsonrpc":"2.0","id":1,"method":null}`, false, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var facts requestFacts
			_, rerr, status := inspect([]byte(tc.body), http.Header{}, &facts)
			if tc.refused {
				if rerr == nil || rerr.code != codeInvalidRequest || status != http.StatusBadRequest || !strings.Contains(rerr.msg, "letter case") {
					t.Fatalf("got %v (HTTP %d), want a -32600 for the case variant", rerr, status)
				}
				return
			}
			if rerr != nil {
				t.Fatalf("refused: %v", rerr)
			}
			if facts.method != tc.method || facts.tool != tc.tool {
				t.Errorf("read method %q tool %q, want %q %q", facts.method, facts.tool, tc.method, tc.tool)
			}
			if got := sdkMethod(t, []byte(tc.body)); got != facts.method {
				t.Errorf("the SDK reads method %q, the HTTP layer %q", got, facts.method)
			}
		})
	}
}

// sdkMethod is the method the SDK's JSON-RPC layer reads ("" for a
// response).
func sdkMethod(tb testing.TB, body []byte) string {
	tb.Helper()
	msg, err := jsonrpc.DecodeMessage(body)
	if err != nil {
		tb.Fatalf("the SDK refuses %s: %v", body, err)
	}
	if req, ok := msg.(*jsonrpc.Request); ok {
		return req.Method
	}
	return ""
}
