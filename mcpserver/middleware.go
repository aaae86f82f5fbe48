package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/tasks"
)

// callInfo is what every handler needs to know about the request.
type callInfo struct {
	principal string
	era       tasks.Era
	// tasksDeclared: a 2026-07-28 client declared the tasks extension in
	// this request's _meta.
	tasksDeclared bool
	// legacyTask: a 2025-11-25 tools/call carried params.task.
	legacyTask bool
	httpCtx    context.Context
	// progress, when the request carries a progress token, sends
	// notifications/progress for it (a client that hung up or a stream
	// that cannot carry it is no error); nil otherwise.
	progress func(ctx context.Context, progress, total float64, message string)
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
		info := &callInfo{principal: facts.principal, era: eraOf(req), httpCtx: facts.httpCtx}
		if info.era == tasks.Era2026 {
			info.tasksDeclared = declaresTasks(req)
		} else {
			info.legacyTask = facts.legacyTask
		}
		ctx = context.WithValue(ctx, callInfoKey{}, info)

		switch method {
		case "tools/call":
			call, ok := req.(*mcp.CallToolRequest)
			if !ok || call.Params == nil {
				return nil, s.wireError(ctx, method, invalidParams("Invalid params: name is required"))
			}
			info.progress = progressFunc(call)
			res, err := s.callTool(ctx, info, call.Params)
			if err != nil {
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

// progressFunc returns what sends progress for call, or nil when the call
// gave no progress token.
func progressFunc(call *mcp.CallToolRequest) func(context.Context, float64, float64, string) {
	token := call.Params.GetProgressToken()
	if token == nil || call.Session == nil {
		return nil
	}
	return func(ctx context.Context, progress, total float64, message string) {
		_ = call.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
			ProgressToken: token, Progress: progress, Total: total, Message: message,
		})
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
	if !hasParams(req) {
		return false // no _meta, so no per-request capabilities
	}
	r, ok := req.(interface {
		ClientCapabilities() *mcp.ClientCapabilities
	})
	if !ok {
		return false
	}
	caps := r.ClientCapabilities()
	if caps == nil {
		return false
	}
	_, ok = caps.Extensions[tasks.ExtTasks]
	return ok
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
