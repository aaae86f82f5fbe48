package mcpserver

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/tasks"
)

// Clients without tasks: a gated call opens the task all the same and
// answers [approval-pending]; the follow-up tools take it from there. The
// approve and deny paths, which need passkeys and the real workflow, are in
// internal/e2e (TestPlainClients).

// pendingCall makes a gated call as a client without tasks and returns the
// [approval-pending] result.
func (h *harness) pendingCall(t *testing.T, p string, era tasks.Era, to string) (toolCallResult, pendingState) {
	t.Helper()
	r := h.do(t, call{token: tok(p), era: era, method: "tools/call", params: gatedArgs(to, 5000)})
	var res toolCallResult
	r.ok(t, &res)
	var st pendingState
	if err := json.Unmarshal(res.StructuredContent, &st); err != nil {
		t.Fatalf("structuredContent %s: %v", res.StructuredContent, err)
	}
	return res, st
}

// followUp calls a follow-up tool.
func (h *harness) followUp(t *testing.T, p string, era tasks.Era, tool string, args map[string]any) (toolCallResult, rpc) {
	t.Helper()
	r := h.do(t, call{token: tok(p), era: era, method: "tools/call", params: map[string]any{"name": tool, "arguments": args}})
	var res toolCallResult
	if r.Error == nil {
		r.ok(t, &res)
	}
	return res, r
}

func TestPlainClientPendingResult(t *testing.T) {
	h := newHarness(t, nil)
	for _, era := range eras {
		t.Run(string(era), func(t *testing.T) {
			p, to := principal(t, "a"), acct(t, "held")
			res, st := h.pendingCall(t, p, era, to)
			txt := res.text()
			if !res.IsError || !strings.HasPrefix(txt, prefixPending) || !strings.Contains(txt, "has NOT run") ||
				!strings.Contains(txt, ToolAwait) || !strings.Contains(txt, st.TaskID) {
				t.Fatalf("pending result: %+v", res)
			}
			if res.Meta[tasks.MetaDisposition] != nil || res.Meta[tasks.MetaDispositionAuthZEN] != nil {
				t.Errorf("a disposition in _meta before anything is final: %v", res.Meta)
			}
			if era == tasks.Era2026 && res.ResultType != resultTypeComplete {
				t.Errorf("resultType %q", res.ResultType)
			}
			if st.Status != tasks.StatusWorking || !strings.HasPrefix(st.ApproveURL, "http://countersign.test/approve/apr_") {
				t.Errorf("structuredContent %+v", st)
			}
			if exp, err := time.Parse(time.RFC3339, st.ExpiresAt); err != nil || time.Until(exp) < 23*time.Hour {
				t.Errorf("expiresAt %q: %v", st.ExpiresAt, err)
			}
			rec := h.waitStatus(t, st.TaskID, tasks.StatusWorking)
			if rec.Owner != p || h.srv.approveURL(rec) != st.ApproveURL {
				t.Errorf("record %+v", rec)
			}
			if n, _ := h.env.store.CountPending(context.Background(), p); n != 1 {
				t.Errorf("%d pending tasks, want 1", n)
			}
			// The same call again joins the same task (dedup): the model
			// that repeats itself does not ask twice.
			_, again := h.pendingCall(t, p, era, to)
			if again.TaskID != st.TaskID {
				t.Errorf("repeated call: task %s, want %s", again.TaskID, st.TaskID)
			}
			// Still pending: await with no wait says so, and nothing ran.
			aw, _ := h.followUp(t, p, era, ToolAwait, map[string]any{"taskId": st.TaskID, "waitSeconds": 0})
			if !aw.IsError || !strings.HasPrefix(aw.text(), prefixPending) {
				t.Errorf("await on a pending task: %+v", aw)
			}
			if n := h.transfersTo(t, to); n != 0 {
				t.Errorf("%d transfers", n)
			}
		})
	}
}

// TestPlainClientPendingOutputSchema: the [approval-pending] answer to a
// gated tool with an outputSchema carries no structuredContent. The
// TypeScript SDK's Client.callTool (1.32) and the MCP Inspector check
// structuredContent against the tool's outputSchema even when isError is
// true, and threw away the answer, task ID and all.
func TestPlainClientPendingOutputSchema(t *testing.T) {
	h, reg := newListHarness(t, nil)
	tool := upstreamTool("write")
	tool.OutputSchema = json.RawMessage(`{"type":"object","required":["content"],"properties":{"content":{"type":"string"}},"additionalProperties":false}`)
	if err := reg.Replace("up", []gateway.Tool{tool}); err != nil {
		t.Fatal(err)
	}
	for _, era := range eras {
		t.Run(string(era), func(t *testing.T) {
			p := principal(t, "a")
			var res toolCallResult
			h.do(t, call{token: tok(p), era: era, method: "tools/call",
				params: map[string]any{"name": "up__write", "arguments": map[string]any{}}}).ok(t, &res)
			if !res.IsError || !strings.HasPrefix(res.text(), prefixPending) {
				t.Fatalf("want an [approval-pending] result, got %+v", res)
			}
			if res.StructuredContent != nil {
				t.Errorf("structuredContent %s, which the tool's outputSchema refuses", res.StructuredContent)
			}
			related, _ := res.Meta[tasks.MetaRelatedTask].(map[string]any)
			id, _ := related["taskId"].(string)
			if id == "" || !strings.Contains(res.text(), id) {
				t.Fatalf("the task ID is not in _meta and the text: %+v", res)
			}
			if _, _, err := h.approvals.Cancel(context.Background(), p, id); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestPlainClientCancel(t *testing.T) {
	h := newHarness(t, nil)
	for _, era := range eras {
		t.Run(string(era), func(t *testing.T) {
			p, to := principal(t, "a"), acct(t, "cxl")
			_, st := h.pendingCall(t, p, era, to)
			// Another principal cannot cancel it, and learns nothing.
			other, _ := h.followUp(t, principal(t, "b"), era, ToolCancel, map[string]any{"taskId": st.TaskID})
			if !other.IsError || !strings.HasPrefix(other.text(), "[unknown-task]") {
				t.Fatalf("foreign cancel: %+v", other)
			}
			h.waitStatus(t, st.TaskID, tasks.StatusWorking)

			res, _ := h.followUp(t, p, era, ToolCancel, map[string]any{"taskId": st.TaskID})
			var cs cancelState
			if err := json.Unmarshal(res.StructuredContent, &cs); err != nil || !cs.Cancelled || res.IsError ||
				!strings.HasPrefix(res.text(), "[cancelled]") {
				t.Fatalf("cancel: %+v (%v)", res, err)
			}
			h.waitStatus(t, st.TaskID, tasks.StatusCancelled)
			aw, _ := h.followUp(t, p, era, ToolAwait, map[string]any{"taskId": st.TaskID})
			if !aw.IsError || !strings.HasPrefix(aw.text(), "[cancelled]") || !strings.Contains(aw.text(), "did NOT run") {
				t.Errorf("await after cancel: %+v", aw)
			}
			// A second cancel is refused and says why.
			again, _ := h.followUp(t, p, era, ToolCancel, map[string]any{"taskId": st.TaskID})
			if !again.IsError || !strings.HasPrefix(again.text(), "[not-cancelled]") {
				t.Errorf("second cancel: %+v", again)
			}
			if n := h.transfersTo(t, to); n != 0 {
				t.Errorf("%d transfers", n)
			}
		})
	}
}

// TestPlainClientUnknownTask: a task of another principal answers exactly
// as an unknown one.
func TestPlainClientUnknownTask(t *testing.T) {
	h := newHarness(t, nil)
	p := principal(t, "a")
	_, st := h.pendingCall(t, p, tasks.Era2026, acct(t, "mine"))
	unknown := tasks.NewID("tsk_")
	for _, tool := range []string{ToolAwait, ToolCancel} {
		foreign, _ := h.followUp(t, principal(t, "b"), tasks.Era2025, tool, map[string]any{"taskId": st.TaskID})
		missing, _ := h.followUp(t, principal(t, "b"), tasks.Era2025, tool, map[string]any{"taskId": unknown})
		if !foreign.IsError || !strings.HasPrefix(foreign.text(), "[unknown-task]") {
			t.Fatalf("%s on a foreign task: %+v", tool, foreign)
		}
		if strings.ReplaceAll(foreign.text(), st.TaskID, "X") != strings.ReplaceAll(missing.text(), unknown, "X") ||
			len(foreign.StructuredContent) != 0 || len(missing.StructuredContent) != 0 {
			t.Errorf("%s: foreign %q and unknown %q differ", tool, foreign.text(), missing.text())
		}
	}
	h.waitStatus(t, st.TaskID, tasks.StatusWorking)
}

func TestPlainClientPendingList(t *testing.T) {
	h := newHarness(t, nil)
	p, q := principal(t, "a"), principal(t, "b")
	_, st1 := h.pendingCall(t, p, tasks.Era2026, acct(t, "one"))
	_, st2 := h.pendingCall(t, p, tasks.Era2025, acct(t, "two"))
	_, other := h.pendingCall(t, q, tasks.Era2025, acct(t, "three"))
	_, cancelled := h.pendingCall(t, p, tasks.Era2025, acct(t, "four"))
	h.followUp(t, p, tasks.Era2025, ToolCancel, map[string]any{"taskId": cancelled.TaskID})
	h.waitStatus(t, cancelled.TaskID, tasks.StatusCancelled)

	res, _ := h.followUp(t, p, tasks.Era2026, ToolPending, nil)
	var list struct{ Tasks []pendingState }
	if err := json.Unmarshal(res.StructuredContent, &list); err != nil || res.IsError {
		t.Fatalf("pending: %+v (%v)", res, err)
	}
	got := map[string]bool{}
	for _, x := range list.Tasks {
		got[x.TaskID] = true
	}
	if len(got) != 2 || !got[st1.TaskID] || !got[st2.TaskID] || got[other.TaskID] || got[cancelled.TaskID] {
		t.Errorf("listed %v, want %s and %s", got, st1.TaskID, st2.TaskID)
	}
	if !strings.Contains(res.text(), st1.TaskID) || !strings.Contains(res.text(), "none of them has run") {
		t.Errorf("text %q", res.text())
	}
	empty, _ := h.followUp(t, principal(t, "c"), tasks.Era2025, ToolPending, map[string]any{})
	if !strings.Contains(empty.text(), "no calls waiting") {
		t.Errorf("empty: %q", empty.text())
	}
}

func TestFollowUpBadArguments(t *testing.T) {
	h := newHarness(t, nil)
	p := principal(t, "a")
	for _, tc := range []struct {
		tool string
		args any
		want string
	}{
		{ToolAwait, map[string]any{}, "taskId is required"},
		{ToolAwait, map[string]any{"taskId": ""}, "taskId is required"},
		{ToolAwait, map[string]any{"taskId": strings.Repeat("x", 129)}, "taskId is required"},
		{ToolAwait, map[string]any{"taskId": 7}, "taskId has the wrong type"},
		{ToolAwait, map[string]any{"taskId": "tsk_x", "waitSeconds": 56}, "waitSeconds must be a whole number from 0 to 55"},
		{ToolAwait, map[string]any{"taskId": "tsk_x", "waitSeconds": -1}, "waitSeconds"},
		{ToolAwait, map[string]any{"taskId": "tsk_x", "waitSeconds": 2.5}, "waitSeconds"},
		{ToolAwait, map[string]any{"taskId": "tsk_x", "waitSeconds": "10"}, "waitSeconds has the wrong type"},
		{ToolAwait, map[string]any{"taskId": "tsk_x", "extra": 1}, `unknown argument "extra"`},
		{ToolAwait, []any{"tsk_x"}, "must be an object"},
		{ToolCancel, map[string]any{"id": "tsk_x"}, `unknown argument "id"`},
		{ToolPending, map[string]any{"all": true}, `unknown argument "all"`},
	} {
		r := h.do(t, call{token: tok(p), era: tasks.Era2026, method: "tools/call", params: map[string]any{"name": tc.tool, "arguments": tc.args}})
		if r.Error == nil || r.Error.Code != codeInvalidParams {
			t.Fatalf("%s %v: want -32602, got HTTP %d %s", tc.tool, tc.args, r.Status, r.Body)
		}
		if !strings.Contains(r.Error.Message, tc.want) || !strings.Contains(r.Error.Message, tc.tool) {
			t.Errorf("%s %v: message %q, want it to contain %q", tc.tool, tc.args, r.Error.Message, tc.want)
		}
	}
}

// TestAwaitLongPoll: an await that is waiting returns as soon as the task
// ends, not when its wait is over; one whose wait ends first says pending.
func TestAwaitLongPoll(t *testing.T) {
	h := newHarness(t, nil)
	p := principal(t, "a")
	_, st := h.pendingCall(t, p, tasks.Era2025, acct(t, "lp"))

	start := time.Now()
	res, _ := h.followUp(t, p, tasks.Era2025, ToolAwait, map[string]any{"taskId": st.TaskID, "waitSeconds": 1})
	if el := time.Since(start); !strings.HasPrefix(res.text(), prefixPending) || el < time.Second || el > 5*time.Second {
		t.Fatalf("await that timed out after %v: %+v", el, res)
	}

	done := make(chan rpc, 1)
	start = time.Now()
	go func() {
		r, err := h.try(call{token: tok(p), era: tasks.Era2025, method: "tools/call",
			params: map[string]any{"name": ToolAwait, "arguments": map[string]any{"taskId": st.TaskID, "waitSeconds": 30}}})
		if err != nil {
			r.Body = []byte(err.Error())
		}
		done <- r
	}()
	time.Sleep(300 * time.Millisecond)
	if _, err := h.env.workflow.Cancel(context.Background(), st.TaskID); err != nil {
		t.Fatal(err)
	}
	select {
	case raw := <-done:
		var r toolCallResult
		raw.ok(t, &r)
		if !strings.HasPrefix(r.text(), "[cancelled]") || time.Since(start) > 10*time.Second {
			t.Errorf("await: %+v after %v", r, time.Since(start))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("await did not return when the task ended")
	}
}

// TestInlineWait: with Options.InlineWait, a client without tasks is held
// for the decision; a decision inside the window is the call's own answer,
// and a client that hangs up loses nothing.
func TestInlineWait(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.InlineWait = 1500 * time.Millisecond })
	p := principal(t, "a")

	t.Run("times out pending", func(t *testing.T) {
		start := time.Now()
		res, st := h.pendingCall(t, p, tasks.Era2026, acct(t, "slow"))
		if el := time.Since(start); el < 1500*time.Millisecond || !strings.HasPrefix(res.text(), prefixPending) {
			t.Fatalf("after %v: %+v", el, res)
		}
		h.waitStatus(t, st.TaskID, tasks.StatusWorking)
	})

	t.Run("decided inside the window", func(t *testing.T) {
		// A window of its own, far longer than the decision takes, so a
		// busy machine cannot close it first. A decision that never reaches
		// the waiting call still fails the test, after 30 s.
		h := newHarness(t, func(o *Options) { o.InlineWait = 30 * time.Second })
		p, to := principal(t, "f"), acct(t, "fast")
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The task appears, then is cancelled while the call waits. Its
			// record is written before its workflow starts: a cancel in
			// between finds no workflow (ErrWorkflowGone) and is sent again.
			// (CI met that gap once: the cancel was dropped, the call
			// answered [approval-pending] when its window closed.)
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				recs, _, _ := h.env.store.List(context.Background(), p, "", 50)
				for _, r := range recs {
					if r.Status != tasks.StatusWorking {
						continue
					}
					if _, err := h.env.workflow.Cancel(context.Background(), r.TaskID); err == nil {
						return
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Error("the task was never cancelled")
		}()
		r := h.do(t, call{token: tok(p), era: tasks.Era2025, method: "tools/call", params: gatedArgs(to, 5000)})
		wg.Wait()
		var res toolCallResult
		r.ok(t, &res)
		if !strings.HasPrefix(res.text(), "[cancelled]") {
			t.Fatalf("inline result: %+v", res)
		}
	})

	t.Run("client hangs up", func(t *testing.T) {
		q, to := principal(t, "q"), acct(t, "gone")
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": gatedArgs(to, 5000)})
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.ts.URL, strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", string(tasks.Era2025))
		req.Header.Set("Authorization", "Bearer "+tok(q))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			t.Fatalf("the call answered before the inline wait ended: %d", resp.StatusCode)
		}
		// The task goes on, and the follow-up tool finds it.
		res, _ := h.followUp(t, q, tasks.Era2025, ToolPending, nil)
		var list struct{ Tasks []pendingState }
		if err := json.Unmarshal(res.StructuredContent, &list); err != nil || len(list.Tasks) != 1 {
			t.Fatalf("pending after hang-up: %+v (%v)", res, err)
		}
		id := list.Tasks[0].TaskID
		h.waitStatus(t, id, tasks.StatusWorking)
		if n := h.transfersTo(t, to); n != 0 {
			t.Errorf("%d transfers", n)
		}

		// The task ends while the agent is away (here a cancel stands in
		// for the approver's decision). The agent never got the task's
		// ID, and the task no longer waits: the follow-up tool lists it
		// among the calls that ended, so the agent learns how it ended
		// instead of making the call again.
		if _, err := h.env.workflow.Cancel(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		h.waitStatus(t, id, tasks.StatusCancelled)
		res, _ = h.followUp(t, q, tasks.Era2025, ToolPending, nil)
		var after struct {
			Tasks []pendingState
			Ended []endedState
		}
		if err := json.Unmarshal(res.StructuredContent, &after); err != nil {
			t.Fatal(err)
		}
		if len(after.Tasks) != 0 || len(after.Ended) != 1 || after.Ended[0].TaskID != id || after.Ended[0].Status != tasks.StatusCancelled {
			t.Fatalf("pending after the end: %s", res.StructuredContent)
		}
		if txt := res.text(); !strings.Contains(txt, id) || !strings.Contains(txt, "ended in the last 24 hours") {
			t.Errorf("text %q", txt)
		}
		final, _ := h.followUp(t, q, tasks.Era2025, ToolAwait, map[string]any{"taskId": id})
		if !strings.HasPrefix(final.text(), "[cancelled]") {
			t.Errorf("await: %+v", final)
		}
	})
}

// TestEndWaits: EndWaits (the HTTP server shutting down) ends the waits
// for a decision that would hold the shutdown: an inline wait answers with
// how its task stands ([approval-pending]) and tasks/result with an error
// to send it again; one that starts after answers at once. The tasks go on.
func TestEndWaits(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.InlineWait = MaxInlineWait })
	p := principal(t, "a")
	id := h.createTask(t, p, tasks.Era2025, acct(t, "held"))
	inline, result := make(chan rpc, 1), make(chan rpc, 1)
	go func() {
		inline <- h.do(t, call{token: tok(p), era: tasks.Era2025, method: "tools/call", params: gatedArgs(acct(t, "waiting"), 5000)})
	}()
	go func() {
		result <- h.do(t, call{token: tok(p), era: tasks.Era2025, method: "tasks/result", params: map[string]any{"taskId": id}})
	}()
	// Both are waiting: the inline call's task exists, and neither answered.
	deadline := time.Now().Add(10 * time.Second)
	for {
		recs, _, _ := h.env.store.List(context.Background(), p, "", 50)
		if len(recs) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the inline call's task never appeared: %d tasks", len(recs))
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case r := <-inline:
		t.Fatalf("the inline call answered before EndWaits: %s", r.Body)
	case r := <-result:
		t.Fatalf("tasks/result answered before EndWaits: %s", r.Body)
	case <-time.After(300 * time.Millisecond):
	}

	h.srv.EndWaits()
	h.srv.EndWaits() // idempotent
	for name, ch := range map[string]chan rpc{"inline call": inline, "tasks/result": result} {
		select {
		case r := <-ch:
			if name == "tasks/result" {
				r.fails(t, http.StatusOK, codeInternal)
				if !strings.Contains(r.Error.Message, "shutting down") {
					t.Errorf("tasks/result: %s", r.Body)
				}
				continue
			}
			var res toolCallResult
			r.ok(t, &res)
			if !strings.HasPrefix(res.text(), prefixPending) {
				t.Errorf("inline call: %+v", res)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s still waits after EndWaits", name)
		}
	}
	start := time.Now()
	res, st := h.pendingCall(t, p, tasks.Era2025, acct(t, "after"))
	if el := time.Since(start); el > 5*time.Second || !strings.HasPrefix(res.text(), prefixPending) {
		t.Errorf("a call after EndWaits: after %v: %+v", el, res)
	}
	h.waitStatus(t, st.TaskID, tasks.StatusWorking)
	h.waitStatus(t, id, tasks.StatusWorking)
}

func TestInlineWaitBounds(t *testing.T) {
	env := sharedEnv(t)
	svc, err := approvals.New(approvals.Options{Store: env.store, Engine: env.workflow})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Duration{-time.Second, MaxInlineWait + time.Second} {
		_, err := New(Options{ServerID: "x", Approvals: svc, PDP: env.engine, Tools: env.tools, NoAuth: true, InlineWait: d})
		if err == nil || !strings.Contains(err.Error(), "InlineWait") {
			t.Errorf("InlineWait %v: %v", d, err)
		}
	}
}

// TestInlineWaitProgress: a client that gave a progress token hears from
// the call while it is held, on the call's own response stream.
func TestInlineWaitProgress(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.InlineWait = 2*progressEvery + time.Second })
	p := principal(t, "a")
	var mu sync.Mutex
	var got []*mcp.ProgressNotificationParams
	c := mcp.NewClient(&mcp.Implementation{Name: "go-sdk-progress", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, req.Params)
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: h.ts.URL, HTTPClient: &http.Client{Transport: clientShim{token: tok(p)}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	params := &mcp.CallToolParams{Name: "transfer_funds", Arguments: transferArgs(acct(t, "prog"), 5000)}
	params.SetProgressToken("wait-1")
	res, err := cs.CallTool(ctx, params)
	if err != nil || !res.IsError || !strings.HasPrefix(textOf(res), prefixPending) {
		t.Fatalf("call: %v %+v", err, res)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) < 2 {
		t.Fatalf("%d progress notifications during a %v wait, want at least 2", len(got), 2*progressEvery+time.Second)
	}
	for i, n := range got {
		if n.ProgressToken != "wait-1" || n.Total != (2*progressEvery+time.Second).Seconds() ||
			!strings.Contains(n.Message, "Waiting for approval of transfer_funds") || (i > 0 && n.Progress <= got[i-1].Progress) {
			t.Errorf("notification %d: %+v", i, n)
		}
	}
}
