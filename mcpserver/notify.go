package mcpserver

import (
	"context"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// notifier sends the notifications that belong to one tools/call
// (notifications/progress and notifications/message) on that request's
// response stream. A request is served as a stream (text/event-stream)
// only when it can use one (see [Server.answersAsStream]); for any other request
// the SDK refuses the write and the notification is dropped, so callers
// never need to know which kind of request they serve.
//
// It is safe for concurrent use. Progress values it sends strictly
// increase, as MCP requires: a value not above the last one sent is
// dropped. Once the response has been written the SDK refuses further
// writes for the request, so nothing trails the result.
type notifier struct {
	session *mcp.ServerSession
	// token is the request's _meta.progressToken; nil when the client asked
	// for no progress.
	token any
	mu    sync.Mutex
	sent  bool
	last  float64
}

// progress sends notifications/progress for the request in ctx: progress
// of total (0 when the total is unknown), with an optional message. It is
// a no-op when the request carries no progress token, has no stream, or
// is not a tools/call being answered, and when progress does not exceed
// the last value sent. Errors are logged at debug and dropped: progress is
// advisory and must never fail the call.
//
// Any code on the tools/call path may call it with the handler's context
// (or one derived from it), including from several goroutines; a tool
// reaches it through gateway.Call.ReportProgress.
func (s *Server) progress(ctx context.Context, progress, total float64, message string) {
	info, _ := ctx.Value(callInfoKey{}).(*callInfo)
	if info == nil || info.notify == nil {
		return
	}
	n := info.notify
	if n.token == nil || n.session == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.sent && progress <= n.last {
		return
	}
	err := n.session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
		ProgressToken: n.token, Progress: progress, Total: total, Message: message,
	})
	if err != nil {
		s.log.DebugContext(ctx, "mcpserver: progress notification not sent", "err", err)
		return
	}
	n.sent, n.last = true, progress
}

// logToClient sends notifications/message for the request in ctx, when the
// client asked for messages at this level and the request has a stream.
// The level is the request's _meta log level in 2026-07-28; a 2025-11-25
// session's logging/setLevel cannot outlive its request on a stateless
// server, so a streamed 2025-11-25 tools/call gets messages at info and
// above (the middleware sets that level on the request's session; MCP lets
// the server choose when no level was set). Like progress, it never fails
// the call.
//
//lint:ignore SA1019 MCP logging (deprecated in 2026-07-28, SEP-2577) stays supported for 2025-11-25 clients and the conformance logging scenarios
func (s *Server) logToClient(ctx context.Context, level mcp.LoggingLevel, message string) {
	info, _ := ctx.Value(callInfoKey{}).(*callInfo)
	if info == nil || info.notify == nil || info.notify.session == nil {
		return
	}
	n := info.notify
	n.mu.Lock()
	defer n.mu.Unlock()
	//lint:ignore SA1019 MCP logging (deprecated in 2026-07-28, SEP-2577) stays supported for 2025-11-25 clients and the conformance logging scenarios
	params := &mcp.LoggingMessageParams{Level: level, Data: message, Logger: ImplementationName}
	//lint:ignore SA1019 MCP logging (deprecated in 2026-07-28, SEP-2577) stays supported for 2025-11-25 clients and the conformance logging scenarios
	if err := n.session.Log(ctx, params); err != nil {
		s.log.DebugContext(ctx, "mcpserver: log notification not sent", "err", err)
	}
}

// notifierFor builds the notifier of a tools/call.
func notifierFor(req mcp.Request, p *mcp.CallToolParamsRaw) *notifier {
	ss, _ := req.GetSession().(*mcp.ServerSession)
	if ss == nil {
		return nil
	}
	return &notifier{session: ss, token: p.GetProgressToken()}
}
