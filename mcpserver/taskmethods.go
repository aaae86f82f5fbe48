package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/tasks"
)

// listPageSize is the tasks/list page size.
const listPageSize = 50

// taskParams are the params of tasks/get, tasks/result, tasks/update and
// tasks/cancel. Other members (the TypeScript SDK sends "task" inside
// tasks/get and tasks/result) are ignored.
type taskParams struct {
	mcp.ParamsBase
	TaskID string `json:"taskId"`
	// InputResponses answer an input_required task (tasks/update).
	InputResponses json.RawMessage `json:"inputResponses,omitempty"`
}

// listParams are the params of tasks/list.
type listParams struct {
	mcp.ParamsBase
	Cursor string `json:"cursor,omitempty"`
}

// registerTaskMethods registers tasks/* as custom methods. Their result
// type is the mcp.Result interface, so one handler can answer in either
// era's shape.
func (s *Server) registerTaskMethods() error {
	for method, h := range map[string]func(context.Context, *callInfo, *taskParams) (mcp.Result, error){
		"tasks/get":    s.tasksGet,
		"tasks/result": s.tasksResult,
		"tasks/update": s.tasksUpdate,
		"tasks/cancel": s.tasksCancel,
	} {
		if err := mcp.AddReceivingCustomMethod(s.mcp, method, s.taskHandler(method, h)); err != nil {
			return fmt.Errorf("mcpserver: register %s: %w", method, err)
		}
	}
	err := mcp.AddReceivingCustomMethod(s.mcp, "tasks/list",
		func(ctx context.Context, _ *mcp.ServerSession, p *listParams) (mcp.Result, error) {
			info, err := infoFrom(ctx)
			if err != nil {
				return nil, s.wireError(ctx, "tasks/list", err)
			}
			res, err := s.tasksList(ctx, info, p)
			if err != nil {
				return nil, s.wireError(ctx, "tasks/list", err)
			}
			return res, nil
		})
	if err != nil {
		return fmt.Errorf("mcpserver: register tasks/list: %w", err)
	}
	return nil
}

// taskHandler adapts h to the SDK's custom-method signature: caller facts
// from the context in, errors through the one mapper out.
func (s *Server) taskHandler(method string, h func(context.Context, *callInfo, *taskParams) (mcp.Result, error)) func(context.Context, *mcp.ServerSession, *taskParams) (mcp.Result, error) {
	return func(ctx context.Context, _ *mcp.ServerSession, p *taskParams) (mcp.Result, error) {
		info, err := infoFrom(ctx)
		switch {
		case err != nil:
		case info.era == tasks.Era2026 && method == "tasks/result":
			err = methodNotFound(method, info.era) // SEP-2663 removed it
		case info.era == tasks.Era2025 && method == "tasks/update":
			err = methodNotFound(method, info.era) // SEP-2663 added it
		case info.era == tasks.Era2026 && !info.tasksDeclared:
			err = missingTasksCapability() // SEP-2663: -32021, not a task answer
		case p == nil || p.TaskID == "":
			err = invalidParams("Invalid params: taskId is required")
		}
		var res mcp.Result
		if err == nil {
			res, err = h(ctx, info, p)
		}
		if err != nil {
			return nil, s.wireError(ctx, method, err)
		}
		return res, nil
	}
}

// lookup returns the caller's task. A task owned by someone else is
// answered exactly as an unknown one.
func (s *Server) lookup(ctx context.Context, info *callInfo, id string) (tasks.Record, error) {
	rec, err := s.opts.Approvals.Get(ctx, info.principal, id)
	if err != nil {
		return tasks.Record{}, ownerError(err)
	}
	return rec, nil
}

// ownerError maps the approval service's answer to a task's owner to the
// wire: an unknown task (or another principal's) and an expired one are
// -32602 with fixed texts; anything else is internal.
func ownerError(err error) error {
	switch {
	case errors.Is(err, approvals.ErrNotFound):
		return taskNotFound()
	case errors.Is(err, approvals.ErrExpired):
		return invalidParams(msgTaskExpired)
	}
	return internal(err)
}

func (s *Server) tasksGet(ctx context.Context, info *callInfo, p *taskParams) (mcp.Result, error) {
	rec, err := s.lookup(ctx, info, p.TaskID)
	if err != nil {
		return nil, err
	}
	if info.era == tasks.Era2026 {
		return &getTaskResult{ResultType: resultTypeComplete, DetailedTask: rec.WireDetailed()}, nil
	}
	return &legacyTaskResult{LegacyTask: rec.Legacy()}, nil
}

// tasksResult is 2025-11-25 only: it blocks until the task is terminal and
// returns what the call itself would have returned.
func (s *Server) tasksResult(ctx context.Context, info *callInfo, p *taskParams) (mcp.Result, error) {
	rec, err := s.lookup(ctx, info, p.TaskID)
	if err != nil {
		return nil, err
	}
	if !rec.Status.Terminal() {
		// The SDK detaches handler contexts from the HTTP request; tie the
		// wait to it so a client that hangs up stops waiting.
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		if info.httpCtx != nil {
			stop := context.AfterFunc(info.httpCtx, cancel)
			defer stop()
		}
		stopAtEnd := context.AfterFunc(s.waitsEnded, cancel)
		defer stopAtEnd()
		if rec, err = s.opts.Approvals.Await(wctx, info.principal, p.TaskID); err != nil {
			if errors.Is(err, approvals.ErrNotFound) {
				return nil, taskNotFound()
			}
			if s.waitsEnded.Err() != nil && ctx.Err() == nil && (info.httpCtx == nil || info.httpCtx.Err() == nil) {
				return nil, &rpcError{code: codeInternal, msg: msgShuttingDown}
			}
			return nil, err // a client that hung up: see wireError
		}
	}
	if rec.Status == tasks.StatusFailed {
		e := rec.WireDetailed().Error
		return nil, &jsonrpc.Error{Code: e.Code, Message: e.Message}
	}
	// What the call itself would have returned; a cancelled task, which
	// never produced a result, says so as a tool result.
	return s.finalResult(info, rec)
}

// tasksUpdate is SEP-2663 tasks/update: answers for an input_required task
// (only unattended tasks ask their client for input; see doc.go) go to its
// workflow, which records them before this acknowledges, so the next
// tasks/get shows what is still pending. Answers to unknown request IDs, or
// for a task that no longer waits, are acknowledged and ignored.
func (s *Server) tasksUpdate(ctx context.Context, info *callInfo, p *taskParams) (mcp.Result, error) {
	var responses map[string]json.RawMessage
	if len(p.InputResponses) > 0 && string(p.InputResponses) != "null" {
		if err := json.Unmarshal(p.InputResponses, &responses); err != nil {
			// An unknown or expired task is the answer before malformed
			// params are.
			if _, lerr := s.lookup(ctx, info, p.TaskID); lerr != nil {
				return nil, lerr
			}
			return nil, invalidParams("Invalid params: inputResponses must be an object")
		}
	}
	if err := s.opts.Approvals.ProvideInput(ctx, info.principal, p.TaskID, responses); err != nil {
		return nil, ownerError(err)
	}
	return &ackResult{ResultType: resultTypeComplete}, nil
}

func (s *Server) tasksCancel(ctx context.Context, info *callInfo, p *taskParams) (mcp.Result, error) {
	rec, cancelled, err := s.opts.Approvals.Cancel(ctx, info.principal, p.TaskID)
	if err != nil {
		return nil, ownerError(err)
	}
	if info.era == tasks.Era2026 {
		// SEP-2663: an acknowledgement, whatever became of the request;
		// the outcome shows in tasks/get.
		return &ackResult{ResultType: resultTypeComplete}, nil
	}
	// 2025-11-25: the answer is the task, cancelled, or -32602 if it is
	// terminal or can no longer be cancelled.
	switch {
	case cancelled:
		return &legacyTaskResult{LegacyTask: rec.Legacy()}, nil
	case rec.Status.Terminal():
		return nil, cannotCancel(rec.Status)
	}
	// Too late: the call was claimed for execution.
	return nil, invalidParams("Cannot cancel task: its execution has already started")
}

func cannotCancel(st tasks.Status) *rpcError {
	return invalidParams(fmt.Sprintf("Cannot cancel task: already in terminal status '%s'", st))
}

// tasksList is 2025-11-25 only: the caller's tasks, newest first.
func (s *Server) tasksList(ctx context.Context, info *callInfo, p *listParams) (mcp.Result, error) {
	if info.era == tasks.Era2026 {
		return nil, methodNotFound("tasks/list", info.era)
	}
	cursor := ""
	if p != nil {
		cursor = p.Cursor
	}
	// The cursor is the last task ID of the previous page: it must be one
	// of the caller's tasks.
	page, next, err := s.opts.Approvals.List(ctx, info.principal, cursor, s.pageSize)
	if errors.Is(err, approvals.ErrUnknownCursor) {
		return nil, invalidParams("Invalid params: unknown cursor")
	}
	if err != nil {
		return nil, internal(err)
	}
	out := &legacyListTasksResult{Tasks: make([]tasks.LegacyTask, 0, len(page)), NextCursor: next}
	for _, r := range page {
		out.Tasks = append(out.Tasks, r.Legacy())
	}
	return out, nil
}
