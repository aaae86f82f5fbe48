package devtest

import (
	"bytes"
	"io"
	"net/http"
)

// MCPAuth sends one tools/list with token and returns the HTTP status and
// the WWW-Authenticate header: 200 and "" for an accepted token; 401 and
// `Bearer realm="countersign", error="invalid_token"` for a rejected one.
func (s *Stack) MCPAuth(token string) (int, string) {
	s.T.Helper()
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"auth-probe","version":"1"}}}}`)
	req, _ := http.NewRequest("POST", s.Base+"/mcp", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "tools/list")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.T.Fatalf("tools/list: %v", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate")
}
