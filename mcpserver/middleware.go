package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/countersign/countersign/tasks"
)

// callInfo is what every handler needs to know about the request.
type callInfo struct {
	principal string
	// subject is the principal's policy subject properties (see
	// OAuth.Authenticate); nil for a static agent token.
	subject map[string]any
	era     tasks.Era
	// tasksDeclared: a 2026-07-28 client declared the tasks extension in
	// this request's _meta.
	tasksDeclared bool
	// legacyTask: a 2025-11-25 tools/call carried params.task.
	legacyTask bool
	// clientCaps are a 2026-07-28 tools/call's _meta client capabilities
	// as sent (nil when absent, and in 2025-11-25).
	clientCaps map[string]any
	httpCtx    context.Context
	// streamed: the HTTP layer serves this request as a stream
	// (text/event-stream), which can carry its notifications.
	streamed bool
	// notify sends this tools/call's notifications; nil for other methods.
	notify *notifier
}

type callInfoKey struct{}

// infoFrom returns the callInfo the middleware put in ctx. Its absence means
// the request did not come through [Server.Handler]: fail closed.
func infoFrom(ctx context.Context) (*callInfo, error) {
	info, _ := ctx.Value(callInfoKey{}).(*callInfo)
	if info == nil {
		return nil, internal(errors.New("mcpserver: request context lacks caller facts"))
	}
	return info, nil
}

// middleware is the receiving middleware, outermost in the SDK's chain. It
// resolves who is calling under which era, answers tools/call itself (the
// policy enforcement point), and adds the 2025-11-25 task fields the SDK
// does not model to initialize and tools/list.
func (s *Server) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (res mcp.Result, err error) {
		defer func() {
			if v := recover(); v != nil {
				s.log.ErrorContext(ctx, "mcpserver: panic while handling a request", "method", method, "panic", fmt.Sprint(v))
				res, err = nil, &jsonrpc.Error{Code: codeInternal, Message: msgInternal}
			}
		}()
		facts := factsFrom(ctx)
		if facts == nil {
			return nil, s.wireError(ctx, method, internal(errors.New("mcpserver: request did not pass through Server.Handler")))
		}
		info := &callInfo{principal: facts.principal, subject: facts.subject, era: eraOf(req), httpCtx: facts.httpCtx, streamed: facts.stream}
		if info.era == tasks.Era2026 {
			info.tasksDeclared = declaresTasks(req)
		} else {
			info.legacyTask = facts.legacyTask
		}
		ctx = context.WithValue(ctx, callInfoKey{}, info)

		if toolsOnly(method) {
			// Countersign serves tools only and declares no prompts,
			// resources or completions capability: the SDK would answer
			// these with empty lists or its own errors, as if it had them.
			return nil, s.wireError(ctx, method, methodNotFound(method, info.era))
		}
		switch method {
		case "tools/call":
			call, ok := req.(*mcp.CallToolRequest)
			if !ok || call.Params == nil {
				return nil, s.wireError(ctx, method, invalidParams("Invalid params: name is required"))
			}
			info.notify = notifierFor(req, call.Params)
			if info.era == tasks.Era2026 {
				info.clientCaps, _ = call.Params.GetMeta()[metaClientCapabilities].(map[string]any)
			}
			if info.streamed && info.era == tasks.Era2025 && info.notify != nil {
				// The client's logging/setLevel went to another request's
				// session, which a stateless server forgets: with no level
				// set, MCP lets the server choose; a streamed call gets
				// messages at info and above (see logToClient).
				//lint:ignore SA1019 MCP logging (deprecated in 2026-07-28, SEP-2577) stays supported for 2025-11-25 clients and the conformance logging scenarios
				if _, err := next(ctx, "logging/setLevel", &mcp.ServerRequest[*mcp.SetLoggingLevelParams]{Session: info.notify.session, Params: &mcp.SetLoggingLevelParams{Level: "info"}}); err != nil {
					s.log.DebugContext(ctx, "mcpserver: log level for a streamed call not set", "err", err)
				}
			}
			ctx, span := s.opts.Telemetry.StartSpan(ctx, "tools/call", trace.SpanKindServer)
			defer span.End()
			res, err := s.callTool(ctx, info, call.Params)
			if err != nil {
				span.SetStatus(codes.Error, "error answer")
				return nil, s.wireError(ctx, method, err)
			}
			return res, nil
		case "initialize":
			res, err := next(ctx, method, req)
			if init, ok := res.(*mcp.InitializeResult); ok && err == nil {
				return legacyInitialize(init), nil
			}
			return res, err
		case "tools/list":
			res, err := next(ctx, method, req)
			list, ok := res.(*mcp.ListToolsResult)
			if !ok || err != nil {
				return res, err
			}
			list = s.annotateVerified(ctx, info, list)
			if info.era == tasks.Era2025 {
				return s.legacyToolList(list), nil
			}
			return list, nil
		}
		return next(ctx, method, req)
	}
}

// eraOf reads the request's protocol version: the per-request _meta
// version in 2026-07-28, the session's (in stateless mode, the
// Mcp-Protocol-Version header's) before.
func eraOf(req mcp.Request) tasks.Era {
	version := ""
	if hasParams(req) {
		if r, ok := req.(interface{ ProtocolVersion() string }); ok {
			version = r.ProtocolVersion()
		}
	} else if ss, ok := req.GetSession().(*mcp.ServerSession); ok && ss != nil {
		if ip := ss.InitializeParams(); ip != nil {
			version = ip.ProtocolVersion
		}
	}
	if version >= modernVersion {
		return tasks.Era2026
	}
	return tasks.Era2025
}

// hasParams reports whether the request carries params. The SDK hands a
// custom method a typed nil for "params": null or no params, and its
// per-request accessors (ProtocolVersion, ClientCapabilities) dereference
// it through the embedded ParamsBase, so they must not be called then.
func hasParams(req mcp.Request) bool {
	if req == nil {
		return false
	}
	v := reflect.ValueOf(req.GetParams())
	return v.IsValid() && !(v.Kind() == reflect.Pointer && v.IsNil())
}

// declaresTasks reports whether the request's client capabilities declare
// the tasks extension.
func declaresTasks(req mcp.Request) bool {
	caps := clientCapabilities(req)
	if caps == nil {
		return false
	}
	_, ok := caps.Extensions[tasks.ExtTasks]
	return ok
}

// metaClientCapabilities is the _meta key of a 2026-07-28 request's client
// capabilities.
const metaClientCapabilities = mcp.MetaKeyClientCapabilities

// declares reports whether a tools/call declared a client capability
// ("sampling", "elicitation", "roots").
func (info *callInfo) declares(capability string) bool {
	_, ok := info.clientCaps[capability]
	return ok
}

// clientCapabilities returns the request's _meta client capabilities, or
// nil.
func clientCapabilities(req mcp.Request) *mcp.ClientCapabilities {
	if !hasParams(req) {
		return nil // no _meta, so no per-request capabilities
	}
	r, ok := req.(interface {
		ClientCapabilities() *mcp.ClientCapabilities
	})
	if !ok {
		return nil
	}
	return r.ClientCapabilities()
}

// legacyInitialize adds capabilities.tasks for clients that negotiated
// 2025-11-25 (older versions have no tasks).
func legacyInitialize(r *mcp.InitializeResult) *legacyInitializeResult {
	out := &legacyInitializeResult{
		Capabilities:    legacyServerCapabilities{ServerCapabilities: r.Capabilities},
		Instructions:    r.Instructions,
		ProtocolVersion: r.ProtocolVersion,
		ServerInfo:      r.ServerInfo,
	}
	out.Meta = r.Meta
	if r.ProtocolVersion >= string(tasks.Era2025) {
		out.Capabilities.Tasks = &legacyTasksCapability{}
	}
	return out
}

// legacyToolList marks each tool with execution.taskSupport: "optional" if
// policy may gate it, "forbidden" for read-only tools, which are never held
// for approval, and for tools under verified approval (SEP-2672), whose
// calls answer at once.
func (s *Server) legacyToolList(r *mcp.ListToolsResult) *legacyListToolsResult {
	out := &legacyListToolsResult{Tools: make([]legacyTool, 0, len(r.Tools)), NextCursor: r.NextCursor}
	out.Meta = r.Meta
	for _, t := range r.Tools {
		lt := legacyTool{Tool: t}
		lt.Execution.TaskSupport = taskSupportOptional
		if gt, ok := s.opts.Tools.Lookup(t.Name); !ok || gt.ReadOnly {
			lt.Execution.TaskSupport = taskSupportForbidden
		} else if _, verified := t.Meta[MetaVerifiedApproval]; verified {
			// SEP-2672 in-band: the call itself carries its approval and
			// answers at once; it never becomes the client's task.
			lt.Execution.TaskSupport = taskSupportForbidden
		} else if fx, _ := s.opts.Fixtures.Lookup(t.Name); fx.TaskRequired {
			lt.Execution.TaskSupport = taskSupportRequired
		}
		out.Tools = append(out.Tools, lt)
	}
	return out
}
