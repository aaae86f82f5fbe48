package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// EchoUpstream is a minimal upstream MCP server over Streamable HTTP with
// one read-only tool, echo, which returns its arguments: what the gateway
// scenario calls when no other upstream is named (`countersign bench
// --dev`). Its cost is the go-sdk's, the same on both paths.
type EchoUpstream struct {
	URL string
	srv *http.Server
}

// StartEchoUpstream serves an EchoUpstream on a loopback port.
func StartEchoUpstream() (*EchoUpstream, error) {
	s := mcp.NewServer(&mcp.Implementation{Name: "countersign-bench-echo", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "echo", Description: "Returns its arguments.", InputSchema: json.RawMessage(`{"type":"object"}`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(req.Params.Arguments)}}}, nil
		})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("bench: echo upstream: %w", err)
	}
	u := &EchoUpstream{
		URL: "http://" + ln.Addr().String() + "/mcp",
		srv: &http.Server{Handler: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil), ReadHeaderTimeout: 5 * time.Second},
	}
	go func() { _ = u.srv.Serve(ln) }() // ends with Close

	return u, nil
}

// Close stops the server.
func (u *EchoUpstream) Close() error { return u.srv.Close() }
