package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/gateway/conformance"
	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/internal/telemetry"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
)

// actionCall is the policy action of a tool call.
const actionCall = "tools/call"

// reasonEvalFailed is the denial reason the caller sees when policy could
// not be evaluated; the cause is logged, never sent.
const reasonEvalFailed = "the policy could not be evaluated."

// callTool is the policy enforcement point. Order matters: nothing runs and
// nothing is stored before the tool is known, the arguments validate and
// policy has decided. What becomes a task is the approval service's to
// create (dedup, limits, record, workflow); this package maps the protocol
// to it and its answer back.
func (s *Server) callTool(ctx context.Context, info *callInfo, p *mcp.CallToolParamsRaw) (mcp.Result, error) {
	if info.era == tasks.Era2025 && info.legacyTask && s.taskForbidden(p.Name) {
		// 2025-11-25 tools: a tool whose execution.taskSupport is
		// "forbidden" must not be invoked as a task, and the server
		// SHOULD answer -32601. Answering it at once instead ran the tool
		// and then failed a client that waits for a CreateTaskResult.
		return nil, &rpcError{code: codeMethodNotFound, msg: fmt.Sprintf("Tool %s cannot be called as a task (execution.taskSupport is \"forbidden\"); call it without params.task", p.Name)}
	}
	if isFollowUp(p.Name) {
		// Countersign's own tools: never gated, never policy's.
		return s.callFollowUp(ctx, info, p.Name, p.Arguments)
	}
	c, fx, err := s.decide(ctx, info, p)
	if err != nil {
		return nil, err
	}
	switch c.decision.Effect {
	case pdp.EffectRequestable:
		return s.requestApproval(ctx, c)
	case pdp.EffectVerify:
		return s.callVerified(ctx, c, p.Meta) // SEP-2672 in-band, see verified.go
	case pdp.EffectAllow:
		// SEP-2322 MRTR: the tool may need the client's answers first.
		// Only for allowed calls: the answers are not in the action hash.
		inputs, ask, err := s.gatherInputs(info, c, fx, p)
		if err != nil || ask != nil {
			return ask, err
		}
		c.inputs = inputs
		if fx.Async {
			return s.runAsync(ctx, c, fx)
		}
	}
	return s.answerNow(ctx, c, nil)
}

// decide checks the call and asks policy about it. It returns the call on
// its way, and the tool's conformance fixture: only conformance fixtures are
// asynchronous, require a task or ask for input; fx is the zero Fixture for
// every other tool.
func (s *Server) decide(ctx context.Context, info *callInfo, p *mcp.CallToolParamsRaw) (*gatedCall, conformance.Fixture, error) {
	var fx conformance.Fixture
	tool, ok := s.opts.Tools.Lookup(p.Name)
	if !ok {
		return nil, fx, invalidParams(fmt.Sprintf("Unknown tool: %q", p.Name))
	}
	// The arguments exactly as received: the action hash, the policy input
	// and the envelope all see these bytes, never a defaulted copy.
	args := p.Arguments
	if err := s.opts.Tools.Validate(tool.Name, args); err != nil {
		return nil, fx, err
	}
	fx, _ = s.opts.Fixtures.Lookup(tool.Name)
	if fx.TaskRequired && !clientHoldsTask(info, tool) {
		// The tool can only run as a task and this request cannot hold
		// one: an error before policy runs, nothing stored (SEP-2663 for
		// 2026-07-28; the 2025-11-25 tools text for taskSupport
		// "required").
		if info.era == tasks.Era2026 {
			return nil, fx, missingTasksCapability()
		}
		return nil, fx, &rpcError{code: codeMethodNotFound, msg: fmt.Sprintf("Tool %s must be called as a task (execution.taskSupport is \"required\")", tool.Name)}
	}
	if fx.RequiresCapability != "" && info.era == tasks.Era2026 && !info.declares(fx.RequiresCapability) {
		// SEP-2575: a server must not rely on a capability the request
		// did not declare.
		return nil, fx, missingCapability(fx.RequiresCapability)
	}
	now := s.now().UTC()
	hash, d, err := s.evaluate(ctx, info, actionCall, tool, args, now)
	if err != nil {
		return nil, fx, err
	}
	s.opts.Telemetry.M().GatedCall(string(d.Effect))
	trace.SpanFromContext(ctx).SetAttributes(attribute.String(telemetry.AttrTool, tool.Name), attribute.String(telemetry.AttrDecision, string(d.Effect)))
	s.log.InfoContext(ctx, "mcpserver: tools/call decided", "tool", tool.Name, "principal", info.principal,
		"action_hash", hash.String(), "decision", d.Effect, "policy_version", d.PolicyVersion)
	c := &gatedCall{info: info, tool: tool, args: args, hash: hash, decision: d, now: now}
	c.token, c.tokenPresent = tokenFrom(p.Meta)
	return c, fx, nil
}

// requestApproval turns a requestable denial into a task held for
// approval. An identical pending call of the same principal is answered
// with its task (SEP-2848 dedup, in the caller's era). A client that can
// hold a task gets it; any other client gets the same task behind an
// [approval-pending] tool result (see doc.go, "Clients without tasks"),
// after waiting up to Options.InlineWait for the decision.
func (s *Server) requestApproval(ctx context.Context, c *gatedCall) (mcp.Result, error) {
	call := s.approvalCall(c)
	call.Mode = tasks.ModeApproval
	if c.canHoldTask() {
		return s.open(ctx, c, call)
	}
	opened, err := s.opts.Approvals.Open(ctx, call)
	if err != nil {
		return refusal(c, err)
	}
	rec := opened.Task
	if s.opts.InlineWait > 0 && !rec.Status.Terminal() {
		if rec, err = s.waitFor(ctx, c.info, rec, s.opts.InlineWait); err != nil {
			// Gone: the client hung up, and the task goes on without it.
			return nil, err
		}
	}
	if rec.Status.Terminal() {
		return s.finalResult(c.info, rec)
	}
	out := s.pendingResult(c.info, rec)
	if len(c.tool.OutputSchema) > 0 {
		// The TypeScript SDK's Client.callTool (1.32) and the MCP
		// Inspector check structuredContent against the tool's
		// outputSchema even when isError is true, and would throw this
		// answer away, task ID and all: the ID stays in the text and in
		// _meta's related-task.
		out.StructuredContent = nil
	}
	return out, nil
}

// runAsync serves an allowed call to a long-running fixture: a task run by
// the workflow, without approvers, for a client that can hold one (see
// doc.go), else the call waits the fixture's delay (conformance.Fixture.Wait)
// and runs.
func (s *Server) runAsync(ctx context.Context, c *gatedCall, fx conformance.Fixture) (mcp.Result, error) {
	delay, requests := fx.Delay(c.args), fx.TaskInputRequests(c.args)
	if len(requests) > 0 && (c.info.era != tasks.Era2026 || !c.canHoldTask()) {
		// Only a 2026-07-28 task can ask its client for input (tasks/update).
		return nil, invalidParams(fmt.Sprintf("Tool %s runs as a task that asks for input: call it with the tasks extension (protocol 2026-07-28)", c.tool.Name))
	}
	if (delay > 0 || len(requests) > 0) && c.canHoldTask() {
		call := s.approvalCall(c)
		call.Mode, call.Delay, call.InputRequests = tasks.ModeUnattended, delay, requests
		// The answers gathered before the task (gatherInputs) reach the
		// tool through the envelope.
		call.Inputs = c.inputs
		return s.open(ctx, c, call)
	}
	return s.answerNow(ctx, c, fx.Wait)
}

// open hands a call that becomes a task to the approval service and answers
// with the task. A call a limit turns away gets a plain denial that says
// nothing ran, not a task (SEP-2848).
func (s *Server) open(ctx context.Context, c *gatedCall, call approvals.Call) (mcp.Result, error) {
	opened, err := s.opts.Approvals.Open(ctx, call)
	if err != nil {
		return refusal(c, err)
	}
	return s.createTaskResult(c.info, opened.Task), nil
}

// answerNow answers a call policy decided at once: an allowed tool runs once
// (after wait, for a long-running fixture that cannot be a task), a denial
// is a tool result (see doc.go).
//
// A 2025-11-25 client that asked for a task gets one even so: TypeScript
// SDK 1.x rejects anything but a CreateTaskResult once it has sent
// params.task. Such a task spends the principal's creation rate, charged
// before anything runs, since it is stored all the same.
func (s *Server) answerNow(ctx context.Context, c *gatedCall, wait func(context.Context, json.RawMessage) error) (mcp.Result, error) {
	asTask := c.legacyTaskAugmented()
	if asTask {
		if err := s.opts.Approvals.Charge(ctx, c.info.principal, c.now); err != nil {
			return refusal(c, err)
		}
	}
	if wait != nil {
		if err := wait(ctx, c.args); err != nil {
			return nil, err
		}
	}
	var result tasks.CallToolResult
	switch c.decision.Effect {
	case pdp.EffectAllow:
		result = s.execute(ctx, c)
		if c.protocolErr != nil {
			return nil, &rpcError{code: c.protocolErr.Code, msg: c.protocolErr.Message}
		}
	case pdp.EffectToken:
		var err error
		if result, err = s.runWithToken(ctx, c); err != nil {
			return nil, err
		}
		if c.protocolErr != nil {
			return nil, &rpcError{code: c.protocolErr.Code, msg: c.protocolErr.Message}
		}
	default:
		// A policy denial is a tool result, not a JSON-RPC error: see doc.go.
		result = tasks.Outcome(tasks.DeniedNotExecuted, c.tool.Name, "Denied by policy: "+c.decision.Reason, nil)
	}
	if !asTask {
		return newToolResult(c.info.era, result), nil
	}
	rec, err := s.opts.Approvals.Completed(ctx, s.approvalCall(c), result)
	if err != nil {
		// The call has been decided (and may have run): saying so beats
		// an error that invites a retry.
		s.log.ErrorContext(ctx, "mcpserver: store completed task; answering directly", "tool", c.tool.Name, "err", err)
		return newToolResult(c.info.era, result), nil
	}
	return s.createTaskResult(c.info, rec), nil
}

// approvalCall is the call as the approval service records it: the action
// hash, arguments and display text are computed here, from the bytes this
// endpoint received, and the tool is pinned as it was served to this call.
func (s *Server) approvalCall(c *gatedCall) approvals.Call {
	pin := c.tool.Pin()
	return approvals.Call{
		Principal:   c.info.principal,
		Subject:     c.info.subject,
		Era:         c.info.era,
		Tool:        c.tool.Name,
		Arguments:   c.args,
		ActionHash:  c.hash.String(),
		ServerID:    s.opts.ServerID,
		DisplayText: displayText(s.opts.Tools, c.tool.Name, c.args),
		Policy:      c.decision,
		ToolPin:     &pin,
		At:          c.now,
	}
}

// refusal maps a call the approval service turned away (a limit, or limits
// it could not check) to the denial the caller sees in its era; any other
// error is internal.
func refusal(c *gatedCall, err error) (mcp.Result, error) {
	var refused *approvals.Refused
	if errors.As(err, &refused) {
		return newToolResult(c.info.era, tasks.Outcome(tasks.DeniedNotExecuted, c.tool.Name, refused.Reason, nil)), nil
	}
	return nil, internal(err)
}

// gatedCall is one tools/call on its way through the pipeline.
type gatedCall struct {
	info     *callInfo
	tool     gateway.Tool
	args     json.RawMessage
	hash     canon.ActionHash
	decision pdp.Decision
	now      time.Time
	// protocolErr is set by execute when the tool failed with a protocol
	// error (it did not act): the caller gets a JSON-RPC error.
	protocolErr *gateway.ProtocolError
	// inputs are the client's answers to the tool's input requests.
	inputs json.RawMessage
	// token is the transaction token the call carried in its _meta
	// (tokenPresent: it carried the key at all).
	token        string
	tokenPresent bool
}

// gatherInputs returns the answers to a tool's input requests, or, when
// some are missing, the InputRequiredResult that asks for them (SEP-2322,
// 2026-07-28 only). A tool asks in rounds: the next round is asked once the
// last one is answered. A one-round tool keeps no state: a request is
// asked again until the call that answers it arrives. A tool that asks in
// declared rounds (conformance.Fixture.InputRounds) gets a requestState
// with each InputRequiredResult, carrying the answers so far, signed by
// this server and bound to the caller, the tool and the arguments; a
// requestState that fails that check is -32602 and nothing runs.
func (s *Server) gatherInputs(info *callInfo, c *gatedCall, fx conformance.Fixture, p *mcp.CallToolParamsRaw) (json.RawMessage, mcp.Result, error) {
	rounds, stateful := fx.InputRounds(c.args), true
	if len(rounds) == 0 {
		rounds, stateful = []map[string]json.RawMessage{fx.InputRequests(c.args)}, false
	}
	if len(rounds[0]) == 0 {
		return nil, nil, nil
	}
	if info.era != tasks.Era2026 {
		return nil, nil, invalidParams(fmt.Sprintf("Tool %s needs input from the client first (input requests, protocol 2026-07-28)", c.tool.Name))
	}
	st := inputState{Principal: info.principal, Tool: c.tool.Name, Hash: c.hash.String(), Answers: map[string]json.RawMessage{}}
	if stateful && p.RequestState != "" {
		prev, err := s.openInputState(p.RequestState, st, s.now())
		if err != nil {
			return nil, nil, err
		}
		st.Round, st.Answers = prev.Round, prev.Answers
	}
	if st.Round >= len(rounds) {
		return nil, nil, invalidParams("Invalid params: requestState is not for this call")
	}
	var unanswerable string
	for ; st.Round < len(rounds); st.Round++ {
		missing := map[string]json.RawMessage{}
		for id, req := range rounds[st.Round] {
			// Only what the request's client capabilities can answer is
			// asked (SEP-2322); the tool runs without the rest.
			if capability := inputCapability(req); capability != "" && !info.declares(capability) {
				unanswerable = capability
				continue
			}
			if r, ok := p.InputResponses[id]; ok && r != nil {
				b, err := json.Marshal(r)
				if err != nil {
					return nil, nil, invalidParams("Invalid params: inputResponses")
				}
				st.Answers[id] = b
			} else if _, ok := st.Answers[id]; !ok {
				missing[id] = req
			}
		}
		if len(missing) > 0 {
			ask := &inputRequiredResult{ResultType: resultTypeInputRequired, InputRequests: missing}
			if stateful {
				ask.RequestState = s.sealInputState(st, s.now())
			}
			return nil, ask, nil
		}
	}
	if len(st.Answers) == 0 && unanswerable != "" {
		// The client can answer none of the tool's questions.
		return nil, nil, missingCapability(unanswerable)
	}
	b, err := json.Marshal(st.Answers)
	if err != nil {
		return nil, nil, invalidParams("Invalid params: inputResponses")
	}
	return b, nil, nil
}

// inputCapability is the client capability an input request needs: its
// method's feature ("elicitation", "sampling", "roots"), or "" for a
// method this server does not know.
func inputCapability(req json.RawMessage) string {
	var r struct {
		Method string `json:"method"`
	}
	_ = json.Unmarshal(req, &r) // the fixture's own, well-formed requests
	switch r.Method {
	case "elicitation/create":
		return "elicitation"
	case "sampling/createMessage":
		return "sampling"
	case "roots/list":
		return "roots"
	}
	return ""
}

// clientHoldsTask reports whether the request can receive a task for tool,
// whatever policy decides.
func clientHoldsTask(info *callInfo, tool gateway.Tool) bool {
	c := &gatedCall{info: info, tool: tool}
	return c.canHoldTask()
}

// taskForbidden reports whether the 2025-11-25 tools/list shows the tool
// with execution.taskSupport "forbidden" whatever the caller: Countersign's
// own tools and read-only tools (see legacyToolList). An unknown tool is
// not: it is -32602, as in any call.
func (s *Server) taskForbidden(name string) bool {
	if isFollowUp(name) {
		return true
	}
	tool, ok := s.opts.Tools.Lookup(name)
	return ok && tool.ReadOnly
}

// legacyTaskAugmented reports a 2025-11-25 call that asked for a task on a
// tool whose execution.taskSupport is "optional".
func (c *gatedCall) legacyTaskAugmented() bool {
	return c.info.era == tasks.Era2025 && c.info.legacyTask && !c.tool.ReadOnly
}

// canHoldTask reports whether the caller can receive a task for this call.
func (c *gatedCall) canHoldTask() bool {
	if c.info.era == tasks.Era2026 {
		return c.info.tasksDeclared
	}
	return c.legacyTaskAugmented()
}

// execute runs an allowed call once. A gateway error means the outcome is
// unknown (the tool may have acted): the caller is told so, never invited
// to retry blindly.
func (s *Server) execute(ctx context.Context, c *gatedCall) (res tasks.CallToolResult) {
	defer func() {
		// A tool that panics may have acted before it did.
		if v := recover(); v != nil {
			s.log.ErrorContext(ctx, "mcpserver: tool panicked; outcome unknown", "tool", c.tool.Name, "action_hash", c.hash.String(), "panic", fmt.Sprint(v))
			res = tasks.Outcome(tasks.OutcomeUnknown, c.tool.Name, "", nil)
		}
	}()
	// Pinned to the tool policy decided on: if an upstream's new listing
	// replaced it since, nothing is sent.
	pin := c.tool.Pin()
	res, err := s.opts.Tools.Execute(ctx, c.tool.Name, gateway.Call{
		IdempotencyKey: tasks.NewID("call_"),
		Principal:      c.info.principal,
		Arguments:      c.args,
		Inputs:         c.inputs,
		Pin:            &pin,
		ProgressFunc: func(progress, total float64, message string) {
			s.progress(ctx, progress, total, message)
		},
		LogFunc: func(level, message string) {
			//lint:ignore SA1019 MCP logging (deprecated in 2026-07-28, SEP-2577) stays supported for 2025-11-25 clients and the conformance logging scenarios
			s.logToClient(ctx, mcp.LoggingLevel(level), message)
		},
	})
	var changed *gateway.ToolChangedError
	if errors.As(err, &changed) {
		// The tool changed between policy's decision and the run: nothing
		// was sent. A new call is decided on the tool as it is now.
		s.log.WarnContext(ctx, "mcpserver: tool changed after the decision; call not sent", "tool", c.tool.Name, "reason", changed.Reason)
		msg := changed.Error() + " Nothing was sent; call it again to have it decided on the tool as it is now."
		if c.decision.Effect == pdp.EffectToken {
			msg = changed.Error() + " Nothing was sent. The transaction token is spent: request a new token for the tool as it is now."
		}
		return tasks.Outcome(tasks.DeniedNotExecuted, c.tool.Name, msg, nil)
	}
	if errors.Is(err, gateway.ErrNotSent) {
		// Nothing reached the tool: say so, and that it is safe to retry
		// (with a new token in the token mode: this one is spent).
		s.log.WarnContext(ctx, "mcpserver: tool unreachable; call not sent", "tool", c.tool.Name, "err", err)
		msg := "Its server could not be reached, so nothing was sent; try again later."
		if c.decision.Effect == pdp.EffectToken {
			msg = "Its server could not be reached, so nothing was sent. The transaction token is spent: to try again later, request a new token for this call."
		}
		return tasks.Outcome(tasks.DeniedNotExecuted, c.tool.Name, msg, nil)
	}
	var pe *gateway.ProtocolError
	if errors.As(err, &pe) {
		s.log.WarnContext(ctx, "mcpserver: tool failed with a protocol error", "tool", c.tool.Name, "code", pe.Code)
		c.protocolErr = pe
		return tasks.CallToolResult{}
	}
	if err != nil {
		s.log.ErrorContext(ctx, "mcpserver: tool call outcome unknown", "tool", c.tool.Name, "action_hash", c.hash.String(), "err", err)
		return tasks.Outcome(tasks.OutcomeUnknown, c.tool.Name, "", nil)
	}
	return res
}

// createTaskResult renders a task creation in the caller's era, with a
// model-facing note that says whether the action has happened.
func (s *Server) createTaskResult(info *callInfo, rec tasks.Record) mcp.Result {
	note := immediateResponse(rec)
	if info.era == tasks.Era2026 {
		out := &createTaskResult{ResultType: resultTypeTask, Task: rec.Wire()}
		out.Meta = mcp.Meta{tasks.MetaImmediateResponse: note}
		return out
	}
	out := &legacyCreateTaskResult{Task: rec.Legacy()}
	out.Meta = mcp.Meta{tasks.MetaImmediateResponse: note}
	return out
}

func immediateResponse(rec tasks.Record) string {
	if rec.Status.Terminal() {
		return fmt.Sprintf("The call to %s has been decided. Read task %s for its result, which states whether the call ran.", rec.Tool, rec.TaskID)
	}
	if rec.Requirement.Quorum == 0 {
		return fmt.Sprintf("The call to %s runs asynchronously, without approval. Poll task %s for its result; do not repeat the call.", rec.Tool, rec.TaskID)
	}
	return fmt.Sprintf("The call to %s has NOT run. It is waiting for human approval (%s) and runs only if approved. Poll task %s for the outcome; do not repeat the call.",
		rec.Tool, rec.Requirement.Reason, rec.TaskID)
}
