package mcpserver

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/countersign/countersign/tasks"
)

// FuzzJSONRPC feeds arbitrary bodies to the endpoint, in both eras. Whatever
// arrives, the answer is a 4xx or a JSON-RPC response, never a 5xx or a
// panic.
func FuzzJSONRPC(f *testing.F) {
	seeds := []string{
		``, `{`, `[]`, `null`, `"x"`, `{}`, `[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]`,
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"f","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"transfer_funds","arguments":{"to":"fz","amount":5,"currency":"EUR"}}}`,
		`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"transfer_funds","arguments":{"to":"fz","amount":5000,"currency":"EUR"},"task":{"ttl":1}}}`,
		`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"transfer_funds","arguments":[1,2]}}`,
		`{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"nope","arguments":null}}`,
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":"x"}`,
		`{"jsonrpc":"2.0","id":8,"method":"tasks/get","params":{"taskId":"tsk_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}}`,
		`{"jsonrpc":"2.0","id":9,"method":"tasks/result","params":{"taskId":"../x","task":{}}}`,
		`{"jsonrpc":"2.0","id":10,"method":"tasks/list","params":{"cursor":"\u0000"}}`,
		`{"jsonrpc":"2.0","id":11,"method":"tasks/cancel","params":null}`,
		`{"jsonrpc":"2.0","id":12,"method":"tasks/update","params":{"taskId":7}}`,
		`{"jsonrpc":"2.0","id":13,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`,
		`{"jsonrpc":"2.0","id":14,"method":"tools/call","params":{"name":"transfer_funds","arguments":{"to":"fz","amount":5000,"currency":"EUR"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}}}`,
		`{"jsonrpc":"2.0","id":15,"method":"tasks/get","params":{"taskId":"x","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":"bad"}}}`,
		`{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":16,"result":{}}`,
		`{"jsonrpc":"2.0","id":17,"method":"ping"}`,
		strings.Repeat(`{"a":`, 2000) + strings.Repeat(`}`, 2000),
		// Keys that differ only in letter case from a member the HTTP layer
		// reads, and keys the SDK reads as that member.
		`{"jsonrpc":"2.0","id":18,"method":"tools/call","params":{"name":"countersign_await","arguments":{"taskId":"tsk_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","waitSeconds":1}},"Method":"tasks/result"}`,
		`{"jsonrpc":"2.0","id":19,"Method":"tasks/result","method":"tools/call","params":{"name":"transfer_funds","arguments":{}}}`,
		`{"JSONRPC":"2.0","jsonrpc":"2.0","ID":20,"id":20,"method":"ping","PARAMS":{}}`,
		`{"jsonrpc":"2.0","id":21,"method":"tasks/get","params":{"taskId":"tsk_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","TASKID":"decoy"}}`,
		`{"jsonrpc":"2.0","id":22,"method":"tasks/cancel","params":{"taskId":"decoy","TaskId":"tsk_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","_META":{}}}`,
		`{"jsonrpc":"2.0","id":23,"method":"tools/call","params":{"name":"transfer_funds","NAME":"x","Task":{"ttl":1},"tas\u212a":{}}}`,
		`{"jsonrpc":"2.0","id":24,"method":"tools/call","\u006dethod":"tasks/result","method":"ping"}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s), false, "")
		f.Add([]byte(s), true, "tsk_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")
	}
	h := newHarness(f, func(o *Options) { o.MaxBodyBytes = 64 << 10 })
	handler := h.srv.Handler()
	f.Fuzz(func(t *testing.T, body []byte, modern bool, name string) {
		h.log.Reset()
		req := httptest.NewRequest(http.MethodPost, "/mcp", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+tok("fuzzer"))
		if modern {
			req.Header.Set("Mcp-Protocol-Version", string(tasks.Era2026))
			req.Header.Set("Mcp-Method", methodOf(body))
			req.Header.Set("Mcp-Name", name)
		}
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("HTTP %d for %q: %s", rec.Code, body, rec.Body)
		}
		if logs := h.log.String(); strings.Contains(logs, "panic") {
			t.Fatalf("panic logged for %q:\n%s", body, logs)
		}
		// The HTTP layer reads the method the SDK reads, or refuses the
		// message.
		var facts requestFacts
		if _, rerr, _ := inspect(body, http.Header{}, &facts); rerr == nil {
			if msg, err := jsonrpc.DecodeMessage(body); err == nil {
				sdk := ""
				if req, ok := msg.(*jsonrpc.Request); ok {
					sdk = req.Method
				}
				if sdk != facts.method {
					t.Fatalf("for %q the SDK reads method %q, the HTTP layer %q", body, sdk, facts.method)
				}
			}
		}
	})
}

// methodOf guesses the method so that modern requests pass the SDK's
// Mcp-Method check often enough to reach the handlers.
func methodOf(body []byte) string {
	for _, m := range []string{"tools/call", "tools/list", "tasks/get", "tasks/update", "tasks/cancel", "tasks/result", "tasks/list", "server/discover"} {
		if bytes.Contains(body, []byte(`"`+m+`"`)) {
			return m
		}
	}
	return "x"
}
