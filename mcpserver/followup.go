package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/tasks"
)

// The follow-up tools: Countersign's own tools, listed to every client, with
// which a client that does not speak MCP tasks follows the approval of a
// call it made (see doc.go, "Clients without tasks"). They are answered here,
// never gated, and never reach policy as tool calls.
const (
	ToolAwait   = "countersign_await"
	ToolCancel  = "countersign_cancel"
	ToolPending = "countersign_pending"
)

// Bounds of countersign_await's waitSeconds.
const (
	DefaultAwaitWait = 25 * time.Second
	MaxAwaitWait     = 55 * time.Second
)

// MaxInlineWait bounds Options.InlineWait.
const MaxInlineWait = 10 * time.Minute

// progressEvery is how often a waiting call reports progress to a client
// that gave a progress token (some clients reset their request timeout on
// progress).
const progressEvery = 5 * time.Second

// maxPendingListed bounds each of countersign_pending's two lists.
const maxPendingListed = 50

// recentlyEnded is how long after its end countersign_pending lists a
// task: an agent whose call was answered to nobody (it hung up during the
// inline wait, its client timed out) learns the task's ID there, and that
// the call was decided, instead of making it again.
const recentlyEnded = 24 * time.Hour

// prefixPending starts the first text block of every result that says a call
// is waiting for approval and has not run.
const prefixPending = "[approval-pending]"

// followUpTools are the follow-up tools as tools/list shows them. None has
// an outputSchema: countersign_await returns the gated tool's own result,
// whose structured content is that tool's.
func followUpTools() []*mcp.Tool {
	taskID := map[string]any{
		"type":        "string",
		"minLength":   1,
		"maxLength":   128,
		"description": "The taskId of an [approval-pending] result.",
	}
	return []*mcp.Tool{
		{
			Name:  ToolAwait,
			Title: "Wait for an approval's result",
			Description: "Waits for a gated tool call that is pending human approval (an [approval-pending] result gave its taskId) " +
				"and returns its final result: whether the call ran, and the tool's own output. Waits up to waitSeconds " +
				"(default 25, at most 55); if the call is still pending then, it says so and you may call this again.",
			InputSchema: map[string]any{
				"type": "object",
				"properties": map[string]any{
					"taskId": taskID,
					"waitSeconds": map[string]any{
						"type": "integer", "minimum": 0, "maximum": int(MaxAwaitWait / time.Second),
						"description": "How long to wait for the decision, in seconds (default 25).",
					},
				},
				"required":             []string{"taskId"},
				"additionalProperties": false,
			},
			Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: new(false)},
		},
		{
			Name:  ToolCancel,
			Title: "Withdraw a pending approval request",
			Description: "Withdraws a gated tool call that is pending human approval. A call withdrawn before it runs never runs; " +
				"a call whose execution has already started cannot be withdrawn, and the answer says so.",
			InputSchema: map[string]any{
				"type":                 "object",
				"properties":           map[string]any{"taskId": taskID},
				"required":             []string{"taskId"},
				"additionalProperties": false,
			},
			Annotations: &mcp.ToolAnnotations{DestructiveHint: new(false), IdempotentHint: true, OpenWorldHint: new(false)},
		},
		{
			Name:  ToolPending,
			Title: "List my pending approval requests",
			Description: "Lists your gated tool calls that are still waiting for approval, and those that ended in the last 24 hours " +
				"with how they ended (at most 50 of each, newest first), with their taskIds. Look here before making again a call " +
				"whose answer you never got: it may have been approved and run.",
			InputSchema: map[string]any{
				"type":                 "object",
				"properties":           map[string]any{},
				"additionalProperties": false,
			},
			Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: new(false)},
		},
	}
}

// isFollowUp reports whether name is one of the follow-up tools.
func isFollowUp(name string) bool {
	return name == ToolAwait || name == ToolCancel || name == ToolPending
}

// callFollowUp answers a call to a follow-up tool. Bad arguments are
// -32602, like a gated tool's schema failures; an unknown task, or another
// principal's, is a tool result that says so (the same for both).
func (s *Server) callFollowUp(ctx context.Context, info *callInfo, name string, args json.RawMessage) (mcp.Result, error) {
	switch name {
	case ToolAwait:
		var a struct {
			TaskID      string   `json:"taskId"`
			WaitSeconds *float64 `json:"waitSeconds"`
		}
		if err := decodeArgs(name, args, &a); err != nil {
			return nil, err
		}
		if err := checkTaskID(name, a.TaskID); err != nil {
			return nil, err
		}
		wait := DefaultAwaitWait
		if a.WaitSeconds != nil {
			n := *a.WaitSeconds
			if n != float64(int64(n)) || n < 0 || n > MaxAwaitWait.Seconds() {
				return nil, invalidParams(fmt.Sprintf("Invalid arguments for %s: waitSeconds must be a whole number from 0 to %d", name, int(MaxAwaitWait/time.Second)))
			}
			wait = time.Duration(n) * time.Second
		}
		return s.await(ctx, info, a.TaskID, wait)
	case ToolCancel:
		var a struct {
			TaskID string `json:"taskId"`
		}
		if err := decodeArgs(name, args, &a); err != nil {
			return nil, err
		}
		if err := checkTaskID(name, a.TaskID); err != nil {
			return nil, err
		}
		return s.cancelFollowUp(ctx, info, a.TaskID)
	default:
		var a struct{}
		if err := decodeArgs(name, args, &a); err != nil {
			return nil, err
		}
		return s.pendingFollowUp(ctx, info)
	}
}

// decodeArgs decodes a follow-up tool's arguments strictly: an object, no
// unknown members.
func decodeArgs(tool string, args json.RawMessage, into any) error {
	trimmed := bytes.TrimSpace(args)
	if len(trimmed) == 0 || string(trimmed) == "null" {
		trimmed = []byte("{}")
	}
	if trimmed[0] != '{' {
		return invalidParams(fmt.Sprintf("Invalid arguments for %s: must be an object", tool))
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		msg := err.Error()
		if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
			return invalidParams(fmt.Sprintf("Invalid arguments for %s: unknown argument %s", tool, f))
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return invalidParams(fmt.Sprintf("Invalid arguments for %s: %s has the wrong type", tool, te.Field))
		}
		return invalidParams(fmt.Sprintf("Invalid arguments for %s: not valid JSON", tool))
	}
	return nil
}

func checkTaskID(tool, id string) error {
	if id == "" || len(id) > 128 {
		return invalidParams(fmt.Sprintf("Invalid arguments for %s: taskId is required (1 to 128 characters)", tool))
	}
	return nil
}

// await answers countersign_await: the task's final result once it ends
// within wait, else a pending result.
func (s *Server) await(ctx context.Context, info *callInfo, taskID string, wait time.Duration) (mcp.Result, error) {
	rec, err := s.opts.Approvals.Get(ctx, info.principal, taskID)
	if err != nil {
		return s.ownerAnswer(info, taskID, err)
	}
	if !rec.Status.Terminal() && wait > 0 {
		if rec, err = s.waitFor(ctx, info, rec, wait); err != nil {
			return s.ownerAnswer(info, taskID, err)
		}
	}
	if rec.Status.Terminal() {
		return s.finalResult(info, rec)
	}
	return s.pendingResult(info, rec), nil
}

// waitFor waits up to d for rec's task to end and returns it as it then
// stands, reporting progress every few seconds when the request carries a
// progress token. The wait ends early, with an error, when the client hangs
// up; the task goes on.
func (s *Server) waitFor(ctx context.Context, info *callInfo, rec tasks.Record, d time.Duration) (tasks.Record, error) {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if info.httpCtx != nil {
		// The SDK detaches handler contexts from the HTTP request.
		stop := context.AfterFunc(info.httpCtx, cancel)
		defer stop()
	}
	// At shutdown the wait is over, as if its time were up (EndWaits).
	stopAtEnd := context.AfterFunc(s.waitsEnded, cancel)
	defer stopAtEnd()
	if info.notify != nil && info.notify.token != nil {
		start := s.now()
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		reporting := make(chan struct{})
		// Runs before the deferred cancel: the reporter is stopped and
		// gone before the answer is written, so no progress follows it.
		defer func() {
			cancel()
			<-reporting
		}()
		go func() {
			defer close(reporting)
			for {
				select {
				case <-wctx.Done():
					return
				case <-t.C:
					waited := s.now().Sub(start).Round(time.Second)
					s.progress(wctx, waited.Seconds(), d.Seconds(),
						fmt.Sprintf("Waiting for approval of %s (task %s): %s of at most %s", rec.Tool, rec.TaskID, waited, d))
				}
			}
		}()
	}
	final, err := s.opts.Approvals.Await(wctx, info.principal, rec.TaskID)
	switch {
	case err == nil:
		return final, nil
	case errors.Is(err, approvals.ErrNotFound):
		return tasks.Record{}, err
	case wctx.Err() != nil && ctx.Err() == nil && (info.httpCtx == nil || info.httpCtx.Err() == nil):
		// The wait is over and the task has not ended: answer with how it
		// stands now.
		return s.opts.Approvals.Get(ctx, info.principal, rec.TaskID)
	}
	return tasks.Record{}, err
}

// ownerAnswer maps the approval service's answer about a task to the
// follow-up tool's: a task that is unknown, another principal's or expired
// is an isError result that says so (the first two alike); anything else is
// an error.
func (s *Server) ownerAnswer(info *callInfo, taskID string, err error) (mcp.Result, error) {
	var text string
	switch {
	case errors.Is(err, approvals.ErrNotFound):
		text = fmt.Sprintf("[unknown-task] There is no task %q for you. Use the taskId of an [approval-pending] result, or call %s to list your pending requests.", taskID, ToolPending)
	case errors.Is(err, approvals.ErrExpired):
		text = fmt.Sprintf("[unknown-task] Task %q has expired and its result is no longer kept.", taskID)
	default:
		return nil, err
	}
	return newToolResult(info.era, tasks.CallToolResult{Content: []json.RawMessage{tasks.TextContent(text)}, IsError: true}), nil
}

// pendingState is the structured content of an [approval-pending] result.
type pendingState struct {
	TaskID     string       `json:"taskId"`
	Status     tasks.Status `json:"status"`
	Tool       string       `json:"tool,omitempty"`
	ApproveURL string       `json:"approveUrl,omitempty"`
	ExpiresAt  string       `json:"expiresAt,omitempty"`
}

func (s *Server) pendingState(rec tasks.Record) pendingState {
	p := pendingState{TaskID: rec.TaskID, Status: rec.Status, Tool: rec.Tool, ApproveURL: s.approveURL(rec)}
	if !rec.ExpiresAt.IsZero() {
		p.ExpiresAt = rec.ExpiresAt.UTC().Format(time.RFC3339)
	}
	return p
}

// approveURL is the approver's page of a task, "" without a public URL.
func (s *Server) approveURL(rec tasks.Record) string {
	if s.opts.PublicURL == "" || rec.ApprovalRef == "" {
		return ""
	}
	return strings.TrimSuffix(s.opts.PublicURL, "/") + "/approve/" + rec.ApprovalRef
}

// pendingResult is the answer to a client without tasks while its call
// waits for approval. isError is true so that no client narrates success;
// no disposition key is in _meta, since nothing is final. The answer to
// the gated call itself leaves structuredContent out when the tool has an
// outputSchema (requestApproval): some clients check it against that
// schema even when isError is true.
func (s *Server) pendingResult(info *callInfo, rec tasks.Record) *toolResult {
	st := s.pendingState(rec)
	var b strings.Builder
	fmt.Fprintf(&b, "%s The call to %s has NOT run. A human approver has been asked to approve it", prefixPending, rec.Tool)
	if r := rec.Requirement.Reason; r != "" {
		fmt.Fprintf(&b, " (%s)", strings.TrimSuffix(r, "."))
	}
	b.WriteString("; it runs at most once, and only if approved")
	if st.ExpiresAt != "" {
		fmt.Fprintf(&b, " before %s", st.ExpiresAt)
	}
	fmt.Fprintf(&b, ". Do not call %s again for this. To get the result, call %s with {\"taskId\": %q}; it waits for the decision. To withdraw the request, call %s.",
		rec.Tool, ToolAwait, rec.TaskID, ToolCancel)
	if st.ApproveURL != "" {
		fmt.Fprintf(&b, " Approver's page: %s", st.ApproveURL)
	}
	structured, _ := json.Marshal(st)
	out := newToolResult(info.era, tasks.CallToolResult{
		Content:           []json.RawMessage{tasks.TextContent(b.String())},
		StructuredContent: structured,
		IsError:           true,
	})
	out.Meta = mcp.Meta{tasks.MetaRelatedTask: map[string]string{"taskId": rec.TaskID}}
	return out
}

// finalResult is a terminal task's result as a tool result: for a completed
// task, exactly the CallToolResult tasks/get carries (the disposition block,
// then the tool's own content); for a cancelled or failed one, an isError
// result that says the call did not run.
func (s *Server) finalResult(info *callInfo, rec tasks.Record) (mcp.Result, error) {
	raw, err := terminalResult(rec)
	if err != nil {
		return nil, internal(err)
	}
	out := &storedResult{}
	if err := json.Unmarshal(raw, &out.fields); err != nil {
		return nil, internal(fmt.Errorf("mcpserver: stored result of %s: %w", rec.TaskID, err))
	}
	if info.era == tasks.Era2026 {
		out.fields["resultType"] = json.RawMessage(`"` + resultTypeComplete + `"`)
	}
	out.Meta = mcp.Meta{tasks.MetaRelatedTask: map[string]string{"taskId": rec.TaskID}}
	return out, nil
}

// terminalResult is the CallToolResult of a terminal task: the stored one
// when it completed; for a cancelled or failed task, which stored none, one
// that says the call did not run.
func terminalResult(rec tasks.Record) (json.RawMessage, error) {
	switch {
	case rec.Status == tasks.StatusFailed:
		e := rec.WireDetailed().Error
		return json.Marshal(tasks.CallToolResult{
			Content: []json.RawMessage{tasks.TextContent(fmt.Sprintf("[failed] The call to %s failed with a protocol error (%d: %s); the tool did not act.", rec.Tool, e.Code, e.Message))},
			IsError: true,
		})
	case len(rec.Result) == 0:
		return json.Marshal(tasks.CallToolResult{
			Content: []json.RawMessage{tasks.TextContent(fmt.Sprintf("[cancelled] The call to %s was cancelled before it ran. It did NOT run.", rec.Tool))},
			IsError: true,
		})
	}
	return rec.Result, nil
}

// cancelState is the structured content of countersign_cancel's answer.
type cancelState struct {
	TaskID    string       `json:"taskId"`
	Status    tasks.Status `json:"status"`
	Cancelled bool         `json:"cancelled"`
}

// cancelFollowUp answers countersign_cancel, with tasks/cancel's rules: a
// task cancelled before its call was claimed never runs; after the claim, or
// once it ended, the cancel is refused and the answer says why.
func (s *Server) cancelFollowUp(ctx context.Context, info *callInfo, taskID string) (mcp.Result, error) {
	rec, cancelled, err := s.opts.Approvals.Cancel(ctx, info.principal, taskID)
	if err != nil {
		return s.ownerAnswer(info, taskID, err)
	}
	var text string
	switch {
	case cancelled:
		text = fmt.Sprintf("[cancelled] The request to run %s (task %s) is withdrawn. The call did NOT run and will not run.", rec.Tool, rec.TaskID)
	case rec.Status.Terminal():
		text = fmt.Sprintf("[not-cancelled] Task %s had already ended (%s), so nothing was withdrawn. Call %s for its result.", rec.TaskID, rec.Status, ToolAwait)
	default:
		text = fmt.Sprintf("[not-cancelled] The approved call to %s (task %s) has already started running, so it cannot be withdrawn; it runs once. Call %s for its result.", rec.Tool, rec.TaskID, ToolAwait)
	}
	structured, _ := json.Marshal(cancelState{TaskID: rec.TaskID, Status: rec.Status, Cancelled: cancelled})
	out := newToolResult(info.era, tasks.CallToolResult{
		Content:           []json.RawMessage{tasks.TextContent(text)},
		StructuredContent: structured,
		IsError:           !cancelled,
	})
	out.Meta = mcp.Meta{tasks.MetaRelatedTask: map[string]string{"taskId": rec.TaskID}}
	return out, nil
}

// endedState is a task in countersign_pending's list of ended ones.
type endedState struct {
	TaskID      string            `json:"taskId"`
	Status      tasks.Status      `json:"status"`
	Tool        string            `json:"tool,omitempty"`
	Disposition tasks.Disposition `json:"disposition,omitempty"`
	EndedAt     string            `json:"endedAt"`
}

// pendingFollowUp answers countersign_pending: the caller's own tasks that
// have not ended, and those that ended within recentlyEnded, newest first.
func (s *Server) pendingFollowUp(ctx context.Context, info *callInfo) (mcp.Result, error) {
	open, ended := []pendingState{}, []endedState{}
	// The caller's recent tasks, newest first, until both lists are full;
	// bounded (tasks.Store.Recent), since finished tasks are kept a while.
	err := s.opts.Approvals.Recent(ctx, info.principal, s.now().Add(-recentlyEnded), func(rec tasks.Record) bool {
		switch {
		case !rec.Status.Terminal():
			if len(open) < maxPendingListed {
				open = append(open, s.pendingState(rec))
			}
		case len(ended) < maxPendingListed:
			ended = append(ended, endedState{TaskID: rec.TaskID, Status: rec.Status, Tool: rec.Tool,
				Disposition: rec.Disposition, EndedAt: rec.LastUpdatedAt.UTC().Format(time.RFC3339)})
		}
		return len(open) < maxPendingListed || len(ended) < maxPendingListed
	})
	if err != nil {
		return nil, internal(err)
	}
	var b strings.Builder
	if len(open) == 0 {
		b.WriteString("You have no calls waiting for approval.")
	} else {
		if len(open) == 1 {
			fmt.Fprintf(&b, "1 of your calls is waiting for approval; it has not run. Call %s with its taskId for its result:", ToolAwait)
		} else {
			fmt.Fprintf(&b, "%d of your calls are waiting for approval; none of them has run. Call %s with a taskId for its result:", len(open), ToolAwait)
		}
		for _, p := range open {
			fmt.Fprintf(&b, "\n- %s: %s (%s", p.TaskID, p.Tool, p.Status)
			if p.ExpiresAt != "" {
				fmt.Fprintf(&b, ", expires %s", p.ExpiresAt)
			}
			b.WriteString(")")
		}
	}
	if len(ended) > 0 {
		fmt.Fprintf(&b, "\n%d of your calls ended in the last %d hours; do not make one again before you know how it ended. Call %s with a taskId for its result, which says whether it ran:",
			len(ended), int(recentlyEnded/time.Hour), ToolAwait)
		for _, e := range ended {
			how := string(e.Disposition)
			if how == "" {
				how = string(e.Status)
			}
			fmt.Fprintf(&b, "\n- %s: %s (%s, ended %s)", e.TaskID, e.Tool, how, e.EndedAt)
		}
	}
	structured, _ := json.Marshal(struct {
		Tasks []pendingState `json:"tasks"`
		Ended []endedState   `json:"ended"`
	}{open, ended})
	return newToolResult(info.era, tasks.CallToolResult{
		Content:           []json.RawMessage{tasks.TextContent(b.String())},
		StructuredContent: structured,
	}), nil
}
