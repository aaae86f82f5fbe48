package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/tasks"
)

// cancelSettle bounds how long a 2025-11-25 tasks/cancel waits for the
// workflow to write the cancelled status to the read model.
const cancelSettle = 5 * time.Second

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
	rec, err := s.opts.Store.GetOwned(ctx, id, info.principal)
	if errors.Is(err, tasks.ErrTaskNotFound) {
		return tasks.Record{}, taskNotFound()
	}
	if err != nil {
		return tasks.Record{}, internal(err)
	}
	if rec.Expired(s.now()) {
		return tasks.Record{}, invalidParams(msgTaskExpired)
	}
	return rec, nil
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
		if rec, err = s.opts.Store.WaitTerminal(wctx, p.TaskID, info.principal); err != nil {
			return nil, err
		}
	}
	related := mcp.Meta{tasks.MetaRelatedTask: map[string]string{"taskId": rec.TaskID}}
	if rec.Status == tasks.StatusFailed {
		e := rec.WireDetailed().Error
		return nil, &jsonrpc.Error{Code: e.Code, Message: e.Message}
	}
	raw := rec.Result
	if len(raw) == 0 {
		// A cancelled task never produced a result. Say so as a tool
		// result: the call did not run, and nothing failed.
		b, err := json.Marshal(tasks.CallToolResult{
			Content: []json.RawMessage{tasks.TextContent(fmt.Sprintf("[cancelled] The call to %s was cancelled before it ran. It did NOT run.", rec.Tool))},
			IsError: true,
		})
		if err != nil {
			return nil, internal(err)
		}
		raw = b
	}
	out := &storedResult{}
	if err := json.Unmarshal(raw, &out.fields); err != nil {
		return nil, internal(fmt.Errorf("mcpserver: stored result of %s: %w", rec.TaskID, err))
	}
	out.Meta = related
	return out, nil
}

// tasksUpdate is SEP-2663 tasks/update: answers for an input_required task
// (only unattended tasks ask their client for input; see doc.go) go to its
// workflow, which records them before this acknowledges, so the next
// tasks/get shows what is still pending. Answers to unknown request IDs, or
// for a task that no longer waits, are acknowledged and ignored.
func (s *Server) tasksUpdate(ctx context.Context, info *callInfo, p *taskParams) (mcp.Result, error) {
	rec, err := s.lookup(ctx, info, p.TaskID)
	if err != nil {
		return nil, err
	}
	var responses map[string]json.RawMessage
	if len(p.InputResponses) > 0 && string(p.InputResponses) != "null" {
		if err := json.Unmarshal(p.InputResponses, &responses); err != nil {
			return nil, invalidParams("Invalid params: inputResponses must be an object")
		}
	}
	if rec.Status == tasks.StatusInputRequired && len(responses) > 0 {
		_, err := s.opts.Orchestrator.ProvideInput(ctx, rec.TaskID, tasks.InputUpdate{Responses: responses})
		if err != nil && !cancelSettled(err) {
			return nil, internal(err)
		}
	}
	return &ackResult{ResultType: resultTypeComplete}, nil
}

func (s *Server) tasksCancel(ctx context.Context, info *callInfo, p *taskParams) (mcp.Result, error) {
	rec, err := s.lookup(ctx, info, p.TaskID)
	if err != nil {
		return nil, err
	}
	if info.era == tasks.Era2026 {
		// SEP-2663: an acknowledgement; the outcome shows in tasks/get.
		if !rec.Status.Terminal() {
			if _, err := s.opts.Orchestrator.Cancel(ctx, rec.TaskID); err != nil && !cancelSettled(err) {
				return nil, internal(err)
			}
		}
		return &ackResult{ResultType: resultTypeComplete}, nil
	}

	// 2025-11-25: the answer is the task, cancelled, or -32602 if it is
	// terminal (or can no longer be cancelled).
	if rec.Status.Terminal() {
		return nil, cannotCancel(rec.Status)
	}
	res, err := s.opts.Orchestrator.Cancel(ctx, rec.TaskID)
	if err != nil && !cancelSettled(err) {
		return nil, internal(err)
	}
	if err == nil && res.Cancelled {
		return &legacyTaskResult{LegacyTask: s.awaitCancelled(ctx, info, rec).Legacy()}, nil
	}
	// Too late: the call was claimed for execution or the task ended.
	if now, gerr := s.opts.Store.GetOwned(ctx, rec.TaskID, info.principal); gerr == nil && now.Status.Terminal() {
		return nil, cannotCancel(now.Status)
	}
	return nil, invalidParams("Cannot cancel task: its execution has already started")
}

// cancelSettled reports a cancel that failed only because the task is past
// cancelling: the workflow is gone or refused it.
func cancelSettled(err error) bool {
	var rejected *tasks.UpdateRejected
	return errors.Is(err, tasks.ErrWorkflowGone) || errors.As(err, &rejected)
}

func cannotCancel(st tasks.Status) *rpcError {
	return invalidParams(fmt.Sprintf("Cannot cancel task: already in terminal status '%s'", st))
}

// awaitCancelled waits briefly for the workflow to record the cancellation
// it has just accepted. The workflow's history is the source of truth, so
// if the read model lags the answer is still "cancelled".
func (s *Server) awaitCancelled(ctx context.Context, info *callInfo, rec tasks.Record) tasks.Record {
	wctx, cancel := context.WithTimeout(ctx, cancelSettle)
	defer cancel()
	final, err := s.opts.Store.WaitTerminal(wctx, rec.TaskID, info.principal)
	if err == nil && final.Status == tasks.StatusCancelled {
		return final
	}
	s.log.WarnContext(ctx, "mcpserver: read model has not caught up with an accepted cancel", "task_id", rec.TaskID, "err", err)
	rec.Status = tasks.StatusCancelled
	rec.StatusMessage = "Cancelled by the requester"
	rec.LastUpdatedAt = s.now().UTC()
	return rec
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
	if cursor != "" {
		// The cursor is the last task ID of the previous page: it must be
		// one of the caller's tasks.
		if _, err := s.opts.Store.GetOwned(ctx, cursor, info.principal); err != nil {
			if errors.Is(err, tasks.ErrTaskNotFound) {
				return nil, invalidParams("Invalid params: unknown cursor")
			}
			return nil, internal(err)
		}
	}
	page, next, err := s.opts.Store.List(ctx, info.principal, cursor, s.pageSize)
	if err != nil {
		return nil, internal(err)
	}
	out := &legacyListTasksResult{Tasks: make([]tasks.LegacyTask, 0, len(page)), NextCursor: next}
	for _, r := range page {
		out.Tasks = append(out.Tasks, r.Legacy())
	}
	return out, nil
}
