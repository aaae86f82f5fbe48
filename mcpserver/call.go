package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
)

// startTimeout bounds the creation of a task (record write plus durable
// workflow start) so that an unreachable Temporal fails the call instead of
// hanging it.
const startTimeout = 30 * time.Second

// Client-facing texts. They state plainly whether the call ran.
const (
	reasonEvalFailed   = "the policy could not be evaluated."
	reasonRateLimited  = "Too many approval requests from this caller; try again later. No approval was requested."
	reasonTaskRate     = "Too many task requests from this caller; try again later."
	reasonPendingCap   = "This caller has too many approval requests waiting; wait for them to finish. No approval was requested."
	reasonLimitUnknown = "The approval request limits could not be checked, so the call is denied. No approval was requested."
)

// callTool is the policy enforcement point. Order matters: nothing runs and
// nothing is stored before the tool is known, the arguments validate and
// policy has decided.
func (s *Server) callTool(ctx context.Context, info *callInfo, p *mcp.CallToolParamsRaw) (mcp.Result, error) {
	tool, ok := s.opts.Tools.Lookup(p.Name)
	if !ok {
		return nil, invalidParams(fmt.Sprintf("Unknown tool: %q", p.Name))
	}
	// The arguments exactly as received: the action hash, the policy input
	// and the envelope all see these bytes, never a defaulted copy.
	args := p.Arguments
	if err := s.opts.Tools.Validate(tool.Name, args); err != nil {
		return nil, err
	}
	// Only conformance fixtures are asynchronous, require a task or ask
	// for input; fx is the zero Fixture for every other tool.
	fx, _ := s.opts.Fixtures.Lookup(tool.Name)
	if fx.TaskRequired && !clientHoldsTask(info, tool) {
		// The tool can only run as a task and this request cannot hold
		// one: an error before policy runs, nothing stored (SEP-2663 for
		// 2026-07-28; the 2025-11-25 tools text for taskSupport
		// "required").
		if info.era == tasks.Era2026 {
			return nil, missingTasksCapability()
		}
		return nil, &rpcError{code: codeMethodNotFound, msg: fmt.Sprintf("Tool %s must be called as a task (execution.taskSupport is \"required\")", tool.Name)}
	}
	hash, err := canon.Hash(tool.Name, args, s.opts.ServerID)
	if err != nil {
		return nil, invalidParams("Invalid arguments: not valid JSON")
	}
	now := s.now().UTC()
	d, err := s.opts.PDP.Evaluate(ctx, pdp.Input{
		Subject:  pdp.Entity{Type: "agent", ID: info.principal},
		Action:   pdp.Action{Name: "tools/call"},
		Resource: pdp.Entity{Type: "tool", ID: tool.Name},
		Context:  pdp.Context{Arguments: args, ActionHash: hash.String(), Time: now},
	})
	if err != nil {
		s.log.ErrorContext(ctx, "mcpserver: policy evaluation failed; denying", "tool", tool.Name, "action_hash", hash.String(), "err", err)
		d = pdp.Decision{Effect: pdp.EffectDeny, Reason: reasonEvalFailed}
	}
	s.log.InfoContext(ctx, "mcpserver: tools/call decided", "tool", tool.Name, "principal", info.principal,
		"action_hash", hash.String(), "decision", d.Effect, "policy_version", d.PolicyVersion)

	c := &gatedCall{info: info, tool: tool, args: args, hash: hash, decision: d, now: now}
	if d.Effect == pdp.EffectAllow {
		// SEP-2322 MRTR: the tool may need the client's answers first.
		// Only for allowed calls: the answers are not in the action hash.
		inputs, ask, err := gatherInputs(info, tool.Name, fx.InputRequests(args), p.InputResponses)
		if err != nil || ask != nil {
			return ask, err
		}
		c.inputs = inputs
	}
	if d.Effect == pdp.EffectRequestable {
		return s.requestApproval(ctx, c)
	}
	// A long-running fixture: a task run by the workflow for a client that
	// can hold one (see doc.go), else the call waits the fixture's delay
	// (conformance.Fixture.Wait) and runs.
	async := d.Effect == pdp.EffectAllow && fx.Async
	if async {
		delay := fx.Delay(args)
		c.taskInputs = fx.TaskInputRequests(args)
		if len(c.taskInputs) > 0 && (info.era != tasks.Era2026 || !c.canHoldTask()) {
			return nil, invalidParams(fmt.Sprintf("Tool %s runs as a task that asks for input: call it with the tasks extension (protocol 2026-07-28)", tool.Name))
		}
		if (delay > 0 || len(c.taskInputs) > 0) && c.canHoldTask() {
			msg := "Running: " + tool.Name + " starts in " + delay.String()
			if len(c.taskInputs) > 0 {
				msg = fmt.Sprintf("Waiting for the client's input (%d request(s))", len(c.taskInputs))
			}
			return s.startTask(ctx, c, asyncRequirement(delay), msg)
		}
	}
	// A 2025-11-25 client that asked for a task gets one even for a call
	// decided at once: TypeScript SDK 1.x rejects anything but a
	// CreateTaskResult once it has sent params.task.
	if c.legacyTaskAugmented() && !s.limiter.Allow(info.principal, now) {
		s.log.WarnContext(ctx, "mcpserver: task creation rate limit reached", "principal", info.principal)
		return newToolResult(info.era, tasks.Outcome(tasks.DeniedNotExecuted, tool.Name, reasonTaskRate, nil)), nil
	}
	var result tasks.CallToolResult
	if async {
		if err := fx.Wait(ctx, args); err != nil {
			return nil, err
		}
	}
	if d.Effect == pdp.EffectAllow {
		result = s.execute(ctx, c)
		if c.protocolErr != nil {
			return nil, &rpcError{code: c.protocolErr.Code, msg: c.protocolErr.Message}
		}
	} else {
		// A policy denial is a tool result, not a JSON-RPC error: see doc.go.
		result = tasks.Outcome(tasks.DeniedNotExecuted, tool.Name, "Denied by policy: "+d.Reason, nil)
	}
	if c.legacyTaskAugmented() {
		return s.completedTask(ctx, c, result), nil
	}
	return newToolResult(info.era, result), nil
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
	// taskInputs are the input requests the call's task asks first.
	taskInputs map[string]json.RawMessage
}

// gatherInputs returns the answers to a tool's input requests, or, when
// some are missing, the InputRequiredResult that asks for them (SEP-2322,
// 2026-07-28 only). Countersign keeps no requestState: a request is asked
// again until the call that answers it arrives.
func gatherInputs(info *callInfo, tool string, requests map[string]json.RawMessage, got mcp.InputResponseMap) (json.RawMessage, mcp.Result, error) {
	if len(requests) == 0 {
		return nil, nil, nil
	}
	if info.era != tasks.Era2026 {
		return nil, nil, invalidParams(fmt.Sprintf("Tool %s needs input from the client first (input requests, protocol 2026-07-28)", tool))
	}
	missing := map[string]json.RawMessage{}
	answers := map[string]mcp.InputResponse{}
	for id, req := range requests {
		if r, ok := got[id]; ok && r != nil {
			answers[id] = r
		} else {
			missing[id] = req
		}
	}
	if len(missing) > 0 {
		return nil, &inputRequiredResult{ResultType: resultTypeInputRequired, InputRequests: missing}, nil
	}
	b, err := json.Marshal(answers)
	if err != nil {
		return nil, nil, invalidParams("Invalid params: inputResponses")
	}
	return b, nil, nil
}

// clientHoldsTask reports whether the request can receive a task for tool,
// whatever policy decides.
func clientHoldsTask(info *callInfo, tool gateway.Tool) bool {
	c := &gatedCall{info: info, tool: tool}
	return c.canHoldTask()
}

// asyncRequirement is the requirement of an allowed call to an Async
// fixture, started in tasks.ModeUnattended: no approver group and quorum 0;
// the workflow waits until its start (now + delay), cancellably, then
// re-evaluates policy and runs the call. Policy can never ask for this (pdp
// rejects quorum 0); only an allowed call to an Async fixture gets it.
func asyncRequirement(delay time.Duration) tasks.Requirement {
	return tasks.Requirement{
		Quorum: 0,
		TTL:    delay,
		Reason: "allowed by policy; runs asynchronously without approval",
	}
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
	res, err := s.opts.Tools.Execute(ctx, c.tool.Name, gateway.Call{
		IdempotencyKey: tasks.NewID("call_"),
		Principal:      c.info.principal,
		Arguments:      c.args,
		Inputs:         c.inputs,
	})
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

// requestApproval turns a requestable denial into a task held for approval,
// or into a denial the caller can act on when no task is possible.
func (s *Server) requestApproval(ctx context.Context, c *gatedCall) (mcp.Result, error) {
	info, name := c.info, c.tool.Name
	if !c.canHoldTask() {
		return newToolResult(info.era, degraded(name, c.decision.Reason, info.era)), nil
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()

	taskID := tasks.NewID("tsk_")
	dedupKey := tasks.DedupKey(info.principal, c.hash.String())
	existing, err := s.opts.Store.ClaimDedup(ctx, dedupKey, taskID)
	if err != nil {
		return nil, internal(err)
	}
	if existing != "" {
		// The same principal already asked for exactly this call and it
		// is still pending: answer with that task (SEP-2848 dedup).
		rec, err := s.opts.Store.GetOwned(ctx, existing, info.principal)
		if err != nil {
			return nil, internal(fmt.Errorf("mcpserver: dedup slot names task %s: %w", existing, err))
		}
		s.log.InfoContext(ctx, "mcpserver: identical call joined pending task", "task_id", rec.TaskID, "tool", name)
		return s.createTaskResult(info, rec), nil
	}
	if reason, ok := s.admitTask(ctx, info.principal, taskID, c.now); !ok {
		s.opts.Store.ReleaseDedup(ctx, dedupKey, taskID)
		return newToolResult(info.era, tasks.Outcome(tasks.DeniedNotExecuted, name, reason, nil)), nil
	}

	d := c.decision
	req := tasks.Requirement{
		Group:              d.ApproverGroup,
		Quorum:             d.Quorum,
		TTL:                d.ApprovalTTL,
		AuthenticatorClass: d.AuthenticatorClass,
		Reason:             d.Reason,
		SlackChannel:       d.SlackChannel,
	}
	return s.createTask(ctx, c, taskID, dedupKey, tasks.ModeApproval, req, "Awaiting approval: "+d.Reason)
}

// startTask creates a task for an allowed call to an Async tool: no dedup
// (two identical jobs are two jobs), the same limits, record and workflow as
// an approval.
func (s *Server) startTask(ctx context.Context, c *gatedCall, req tasks.Requirement, statusMessage string) (mcp.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	taskID := tasks.NewID("tsk_")
	if reason, ok := s.admitTask(ctx, c.info.principal, taskID, c.now); !ok {
		return newToolResult(c.info.era, tasks.Outcome(tasks.DeniedNotExecuted, c.tool.Name, reason, nil)), nil
	}
	return s.createTask(ctx, c, taskID, "", tasks.ModeUnattended, req, statusMessage)
}

// createTask writes the task record, then starts its workflow in mode. On
// failure the record and the dedup slot (if any) are released.
func (s *Server) createTask(ctx context.Context, c *gatedCall, taskID, dedupKey string, mode tasks.Mode, req tasks.Requirement, statusMessage string) (mcp.Result, error) {
	info, name, d := c.info, c.tool.Name, c.decision
	env := tasks.Envelope{
		Version:       tasks.EnvelopeVersion,
		TaskID:        taskID,
		Tool:          name,
		Arguments:     c.args,
		ActionHash:    c.hash.String(),
		Principal:     info.principal,
		Resource:      "tool:" + name,
		ServerID:      s.opts.ServerID,
		PolicyVersion: d.PolicyVersion,
		CreatedAt:     c.now,
		// Only unattended tasks have inputs (see gatherInputs).
		InputResponses: c.inputs,
	}
	status := tasks.StatusWorking
	if len(c.taskInputs) > 0 {
		status = tasks.StatusInputRequired
	}
	rec := tasks.Record{
		InputRequests: c.taskInputs,
		TaskID:        taskID,
		Owner:         info.principal,
		Era:           info.era,
		Status:        status,
		StatusMessage: statusMessage,
		CreatedAt:     c.now,
		LastUpdatedAt: c.now,
		TTL:           req.TTL + s.opts.ResultRetention,
		PollInterval:  s.opts.PollInterval,
		Tool:          name,
		Arguments:     c.args,
		ActionHash:    c.hash.String(),
		DisplayText:   s.opts.Tools.Describe(name, c.args),
		ApprovalRef:   tasks.NewID("apr_"),
		Requirement:   req,
		ExpiresAt:     c.now.Add(req.TTL),
		ApprovalState: tasks.ApprovalPending,
		// The timeline starts with the workflow's first step ("requested"),
		// written with its audit record.
		DedupKey: dedupKey,
	}
	// The record exists before the workflow, so a tasks/get for the ID we
	// return always resolves (SEP-2663 strong consistency at creation).
	if err := s.opts.Store.Create(ctx, rec); err != nil {
		s.releasePending(ctx, info.principal, taskID)
		if dedupKey != "" {
			s.opts.Store.ReleaseDedup(ctx, dedupKey, taskID)
		}
		return nil, internal(err)
	}
	in := tasks.ApprovalInput{
		Version:     tasks.ApprovalInputVersion,
		Envelope:    env,
		Requirement: req,
		ApprovalRef: rec.ApprovalRef,
		DisplayText: rec.DisplayText,
		ExpiresAt:   rec.ExpiresAt,
		Mode:        mode,
		// Only unattended tasks ask for input (see doc.go).
		InputRequests: c.taskInputs,
	}
	if mode == tasks.ModeUnattended {
		// It runs when its wait ends (after its input requests, if any,
		// are answered: then it waits req.TTL again).
		in.StartAt = rec.ExpiresAt
	}
	err := s.opts.Orchestrator.Start(ctx, in)
	if err != nil {
		switch s.startOutcome(ctx, taskID, err) {
		case startedNot:
			if derr := s.opts.Store.Delete(context.WithoutCancel(ctx), rec); derr != nil {
				s.log.ErrorContext(ctx, "mcpserver: could not undo task record after failed start", "task_id", taskID, "err", derr)
			}
			return nil, internal(err)
		case startedUnknown:
			return nil, internal(err) // the record stays; see startOutcome
		}
	}
	s.log.InfoContext(ctx, "mcpserver: approval requested", "task_id", taskID, "tool", name, "principal", info.principal,
		"action_hash", c.hash.String(), "approver_group", req.Group, "quorum", req.Quorum)
	return s.createTaskResult(info, rec), nil
}

// admitTask applies the per-principal pending cap and creation rate. The
// cap is a reservation for taskID (tasks.Store.ReservePending), exact under
// concurrency; once admitted, the task's record holds it until the task
// ends, and createTask gives it back if the record is never written. An
// error checking the cap denies: the limits exist to protect the service.
func (s *Server) admitTask(ctx context.Context, principal, taskID string, now time.Time) (string, bool) {
	err := s.opts.Store.ReservePending(ctx, principal, taskID, s.opts.MaxPendingPerPrincipal)
	if errors.Is(err, tasks.ErrPendingCapReached) {
		s.log.WarnContext(ctx, "mcpserver: pending task cap reached", "principal", principal, "cap", s.opts.MaxPendingPerPrincipal)
		return reasonPendingCap, false
	}
	if err != nil {
		s.log.ErrorContext(ctx, "mcpserver: reserve a pending task", "err", err)
		return reasonLimitUnknown, false
	}
	if !s.limiter.Allow(principal, now) {
		s.log.WarnContext(ctx, "mcpserver: task creation rate limit reached", "principal", principal)
		s.releasePending(ctx, principal, taskID)
		return reasonRateLimited, false
	}
	return "", true
}

// completedTask stores an already-decided call as a completed task for a
// 2025-11-25 client that asked for a task. If the record cannot be written
// the result is returned directly: the call has been decided (and may have
// run), and saying so beats an error that invites a retry.
func (s *Server) completedTask(ctx context.Context, c *gatedCall, result tasks.CallToolResult) mcp.Result {
	raw, err := json.Marshal(result)
	if err != nil {
		s.log.ErrorContext(ctx, "mcpserver: encode tool result", "tool", c.tool.Name, "err", err)
		return newToolResult(c.info.era, result)
	}
	msg := "The call ran; the task holds its result."
	if result.IsError {
		msg = "The call ended with an error or was denied; the task holds the result."
	}
	rec := tasks.Record{
		TaskID:        tasks.NewID("tsk_"),
		Owner:         c.info.principal,
		Era:           c.info.era,
		Status:        tasks.StatusCompleted,
		StatusMessage: msg,
		CreatedAt:     c.now,
		LastUpdatedAt: s.now().UTC(),
		TTL:           s.opts.ResultRetention,
		PollInterval:  s.opts.PollInterval,
		Result:        raw,
		Disposition:   tasks.DispositionOf(raw),
		Tool:          c.tool.Name,
		Arguments:     c.args,
		ActionHash:    c.hash.String(),
		DisplayText:   s.opts.Tools.Describe(c.tool.Name, c.args),
	}
	if err := s.opts.Store.Create(context.WithoutCancel(ctx), rec); err != nil {
		s.log.ErrorContext(ctx, "mcpserver: store completed task; answering directly", "tool", c.tool.Name, "err", err)
		return newToolResult(c.info.era, result)
	}
	return s.createTaskResult(c.info, rec)
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

// degraded is the SEP-2848 answer to a client that cannot hold a task: a
// denial that says approval is required and how to get it.
func degraded(tool, reason string, era tasks.Era) tasks.CallToolResult {
	how := fmt.Sprintf("declares the %q extension in the request's client capabilities", tasks.ExtTasks)
	if era == tasks.Era2025 {
		how = "sends params.task with the call (experimental tasks, protocol 2025-11-25)"
	}
	return tasks.Outcome(tasks.DeniedNotExecuted, tool, fmt.Sprintf(
		"Human approval is required (%s), and an approval is delivered as an MCP task, which this request did not accept, so no approval was requested. Retry from a client that %s.",
		reason, how), nil)
}

// What became of a workflow start that returned an error.
const (
	startedNot     = iota // Temporal has never heard of the workflow
	startedAnyway         // the start took effect (a timeout or lost answer after the commit)
	startedUnknown        // Temporal cannot tell right now
)

// startOutcome finds out whether a failed workflow start took effect all the
// same. Only a workflow Temporal has never heard of may have its record
// deleted: deleting the record of a running workflow would hide a task that
// can still run its tool. When Temporal cannot tell, the record stays and
// the caller gets an error: an identical retry joins the task through the
// dedup slot, and tasks.Reconcile fails the record later if the workflow
// really never started.
func (s *Server) startOutcome(ctx context.Context, taskID string, startErr error) int {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	running, err := s.opts.Orchestrator.Running(cctx, taskID)
	switch {
	case err != nil:
		s.log.ErrorContext(ctx, "mcpserver: workflow start failed and its state is unknown; keeping the task record", "task_id", taskID, "start_err", startErr, "err", err)
		return startedUnknown
	case running:
		s.log.WarnContext(ctx, "mcpserver: workflow start reported an error but the workflow exists", "task_id", taskID, "start_err", startErr)
		return startedAnyway
	}
	return startedNot
}

// releasePending gives back a pending reservation whose task was not
// created; the caller may have hung up, the release must still happen.
func (s *Server) releasePending(ctx context.Context, principal, taskID string) {
	if err := s.opts.Store.ReleasePending(context.WithoutCancel(ctx), principal, taskID); err != nil {
		s.log.ErrorContext(ctx, "mcpserver: release pending reservation", "task_id", taskID, "err", err)
	}
}
