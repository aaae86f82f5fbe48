package mcpserver

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-webauthn/webauthn/protocol"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/internal/telemetry"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
)

// SEP-2672 (per-call passkey verified approval) wire names.
const (
	// MetaVerifiedApproval is the _meta key of the tool annotation in
	// tools/list and of the evidence in tools/call.
	MetaVerifiedApproval = "io.modelcontextprotocol/verified-approval"
	// ExtVerifiedApproval is the capability key under extensions.
	ExtVerifiedApproval = "verifiedApproval"
	// CodeApproval is the JSON-RPC code of every approval-domain rejection;
	// data.reason says which (passkey.Reason*).
	CodeApproval = -32001

	methodEnrollBegin     = "approval/enroll/begin"
	methodEnrollFinish    = "approval/enroll/finish"
	methodChallengeCreate = "approval/challenge/create"
)

// Passkeys is what the endpoint needs of the passkey service
// (*passkey.Service) for in-band verified approval: the caller's own
// passkeys, bound to its bearer principal.
type Passkeys interface {
	BeginPrincipalEnrollment(ctx context.Context, principal string) (*protocol.CredentialCreation, error)
	FinishPrincipalEnrollment(ctx context.Context, principal string, response []byte) (string, time.Time, error)
	IssueChallenge(ctx context.Context, req passkey.ChallengeRequest) (passkey.Challenge, error)
	Verify(ctx context.Context, req passkey.VerifyRequest) (passkey.Verified, error)
}

var _ Passkeys = (*passkey.Service)(nil)

// approvalError is a SEP-2672 §4.10 rejection: code -32001, the reason's
// fixed message, data.reason. The cause goes to the log only.
func approvalError(reason string, cause error) *rpcError {
	data, _ := json.Marshal(map[string]string{"reason": reason})
	return &rpcError{code: CodeApproval, msg: passkey.MessageOf(reason), data: data, cause: cause}
}

// fromPasskey maps a passkey service error: a rejection keeps its reason
// (-32001; its cause stays in the passkey service's log); anything else is
// internal.
func fromPasskey(err error) error {
	if reason := passkey.ReasonOf(err); reason != "" {
		return approvalError(reason, nil)
	}
	if errors.Is(err, passkey.ErrChallengeCapacity) {
		return &rpcError{code: CodeTooManyRequests, msg: msgChallengeCapacity, cause: err}
	}
	return internal(err)
}

// registerApprovalMethods adds the SEP-2672 methods. They work only when
// the endpoint has a passkey service, and so does the capability: without
// it they answer -32601 (Method not found), as the SEP requires.
func (s *Server) registerApprovalMethods() error {
	if err := mcp.AddReceivingCustomMethod(s.mcp, methodEnrollBegin, s.approvalHandler(methodEnrollBegin, s.enrollBegin)); err != nil {
		return fmt.Errorf("mcpserver: register %s: %w", methodEnrollBegin, err)
	}
	if err := mcp.AddReceivingCustomMethod(s.mcp, methodEnrollFinish, s.approvalHandler(methodEnrollFinish, s.enrollFinish)); err != nil {
		return fmt.Errorf("mcpserver: register %s: %w", methodEnrollFinish, err)
	}
	if err := mcp.AddReceivingCustomMethod(s.mcp, methodChallengeCreate, s.approvalHandler(methodChallengeCreate, s.challengeCreate)); err != nil {
		return fmt.Errorf("mcpserver: register %s: %w", methodChallengeCreate, err)
	}
	return nil
}

// approvalParams are the params of the approval/* methods, kept raw: each
// method reads its own members (approval/enroll/begin reads none, and must
// ignore whatever is there).
type approvalParams struct {
	mcp.ParamsBase
	raw json.RawMessage
}

// UnmarshalJSON keeps the params as sent and never fails on their shape.
func (p *approvalParams) UnmarshalJSON(b []byte) error {
	p.raw = append(json.RawMessage(nil), b...)
	var m struct {
		Meta mcp.Meta `json:"_meta"`
	}
	if json.Unmarshal(b, &m) == nil {
		p.Meta = m.Meta
	}
	return nil
}

func (s *Server) approvalHandler(method string, h func(context.Context, *callInfo, json.RawMessage) (mcp.Result, error)) func(context.Context, *mcp.ServerSession, *approvalParams) (mcp.Result, error) {
	return func(ctx context.Context, _ *mcp.ServerSession, p *approvalParams) (mcp.Result, error) {
		info, err := infoFrom(ctx)
		if err != nil {
			return nil, s.wireError(ctx, method, err)
		}
		if s.opts.Passkeys == nil {
			return nil, s.wireError(ctx, method, &rpcError{code: codeMethodNotFound,
				msg: "Method not found: " + method + " (verified approval is not enabled on this server)"})
		}
		var raw json.RawMessage
		if p != nil {
			raw = p.raw
		}
		res, err := h(ctx, info, raw)
		if err != nil {
			return nil, s.wireError(ctx, method, err)
		}
		return res, nil
	}
}

// jsonResult is a method result: v's members, plus, on the 2026-07-28
// wire, resultType "complete" and the _meta the SDK sets on the result (the
// server's io.modelcontextprotocol/serverInfo, as on every other result).
type jsonResult struct {
	mcp.ResultBase
	v   any
	era tasks.Era
}

func (r *jsonResult) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(r.v)
	if err != nil || r.era != tasks.Era2026 {
		return b, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	m["resultType"] = json.RawMessage(`"` + resultTypeComplete + `"`)
	if len(r.Meta) > 0 {
		meta, err := json.Marshal(r.Meta)
		if err != nil {
			return nil, err
		}
		m["_meta"] = meta
	}
	return json.Marshal(m)
}

// enrollBegin answers approval/enroll/begin (§4.4.1): the WebAuthn creation
// options for a passkey bound to the caller's principal.
func (s *Server) enrollBegin(ctx context.Context, info *callInfo, _ json.RawMessage) (mcp.Result, error) {
	creation, err := s.opts.Passkeys.BeginPrincipalEnrollment(ctx, info.principal)
	if err != nil {
		switch {
		case errors.Is(err, passkey.ErrEnrollmentClosed):
			return nil, invalidParams(msgEnrollmentClosed)
		case errors.Is(err, passkey.ErrNotFirstPasskey):
			return nil, invalidParams(msgNotFirstPasskey)
		case errors.Is(err, passkey.ErrInvalidArgument):
			return nil, invalidParams("This principal cannot enroll a passkey")
		}
		return nil, fromPasskey(err)
	}
	b, err := json.Marshal(creation.Response)
	if err != nil {
		return nil, internal(err)
	}
	var options map[string]any
	if err := json.Unmarshal(b, &options); err != nil {
		return nil, internal(err)
	}
	if _, ok := options["excludeCredentials"]; !ok {
		// The SEP wants the array even when empty; the library omits it.
		options["excludeCredentials"] = []any{}
	}
	return &jsonResult{v: map[string]any{"options": options}, era: info.era}, nil
}

// enrollFinish answers approval/enroll/finish (§4.4.2).
func (s *Server) enrollFinish(ctx context.Context, info *callInfo, raw json.RawMessage) (mcp.Result, error) {
	var p struct {
		Response json.RawMessage `json:"response"`
	}
	_ = json.Unmarshal(raw, &p) // a malformed response fails verification below
	id, at, err := s.opts.Passkeys.FinishPrincipalEnrollment(ctx, info.principal, p.Response)
	if err != nil {
		return nil, fromPasskey(err)
	}
	return &jsonResult{v: map[string]any{"success": true, "credentialId": id, "createdAt": at}, era: info.era}, nil
}

// challengeCreate answers approval/challenge/create (§4.4.3): policy must
// decide "verify" for this exact call (else tool_not_approved_required),
// and the principal must be within its challenge rate (else
// CodeTooManyRequests); the challenge binds the action hash of the arguments as received and
// lists the caller's passkeys that the tool's authenticator class allows
// (none: no_eligible_credential).
func (s *Server) challengeCreate(ctx context.Context, info *callInfo, raw json.RawMessage) (mcp.Result, error) {
	var p struct {
		ToolName  string          `json:"toolName"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal(raw, &p); err != nil || p.ToolName == "" {
		return nil, invalidParams("Invalid params: toolName is required")
	}
	if !isJSONObject(p.Arguments) {
		return nil, invalidParams("Invalid params: arguments must be an object")
	}
	tool, ok := s.opts.Tools.Lookup(p.ToolName)
	if !ok || isFollowUp(p.ToolName) {
		return nil, approvalError(passkey.ReasonToolNotApprovalRequired, nil)
	}
	if err := s.opts.Tools.Validate(tool.Name, p.Arguments); err != nil {
		return nil, err
	}
	hash, d, err := s.evaluate(ctx, info, actionCall, tool, p.Arguments, s.now().UTC())
	if err != nil {
		return nil, err
	}
	if d.Effect != pdp.EffectVerify {
		return nil, approvalError(passkey.ReasonToolNotApprovalRequired, nil)
	}
	// Every challenge stays stored, answered or not, until it ages out
	// (well after its lifetime): this bounds what one agent can store.
	allowed, err := s.challengeRate.Allow(ctx, info.principal, s.now())
	if err != nil {
		return nil, internal(fmt.Errorf("mcpserver: in-band challenge rate of %s: %w", info.principal, err))
	}
	if !allowed {
		s.log.WarnContext(ctx, "mcpserver: in-band challenge rate limit reached", "principal", info.principal)
		return nil, &rpcError{code: CodeTooManyRequests, msg: msgChallengeRate}
	}
	ch, err := s.opts.Passkeys.IssueChallenge(ctx, passkey.ChallengeRequest{
		Tool:               tool.Name,
		ActionHash:         hash,
		Principal:          info.principal,
		AuthenticatorClass: d.AuthenticatorClass,
		DisplayText:        displayText(s.opts.Tools, tool.Name, p.Arguments),
		Asker:              passkey.AskerAgent,
	})
	if err != nil {
		return nil, fromPasskey(err)
	}
	return &jsonResult{v: ch, era: info.era}, nil
}

// displayText is the call's description, within the passkey service's
// bounds (1–4096 bytes of UTF-8).
func displayText(r *gateway.Registry, tool string, args json.RawMessage) string {
	t := r.Describe(tool, args)
	if t == "" {
		t = "Run " + tool
	}
	return passkey.ClipDisplayText(t)
}

func isJSONObject(b json.RawMessage) bool {
	var m map[string]json.RawMessage
	return len(b) > 0 && json.Unmarshal(b, &m) == nil && m != nil
}

// evaluate asks policy about a call: action is "tools/call", or
// pdp.ActionIssueToken for a token request. The action hash binds the
// arguments exactly as received, at now. An evaluation error is a deny (the
// cause logged, a generic reason sent); only arguments that are not JSON,
// or that hold a number the action hash cannot bind exactly
// (canon.ErrInexactNumber), are an error: -32602, nothing stored.
func (s *Server) evaluate(ctx context.Context, info *callInfo, action string, tool gateway.Tool, args json.RawMessage, now time.Time) (canon.ActionHash, pdp.Decision, error) {
	hash, err := canon.Hash(tool.Name, args, s.opts.ServerID)
	if errors.Is(err, canon.ErrInexactNumber) {
		// Like a schema failure: -32602 naming the number (wireError).
		return hash, pdp.Decision{}, &gateway.ArgumentError{Tool: tool.Name, Reason: strings.TrimPrefix(err.Error(), "canon: ")}
	}
	if err != nil {
		return hash, pdp.Decision{}, invalidParams("Invalid arguments: not valid JSON")
	}
	d, err := s.opts.PDP.Evaluate(ctx, pdp.Input{
		Subject:  pdp.Entity{Type: "agent", ID: info.principal, Properties: info.subject},
		Action:   pdp.Action{Name: action},
		Resource: tool.PolicyResource(),
		Context:  pdp.Context{Arguments: args, ActionHash: hash.String(), Time: now},
	})
	if err != nil {
		s.log.ErrorContext(ctx, "mcpserver: policy evaluation failed; denying", "action", action, "tool", tool.Name, "action_hash", hash.String(), "err", err)
		d = pdp.Decision{Effect: pdp.EffectDeny, Reason: reasonEvalFailed}
	}
	return hash, d, nil
}

// verifyFailed counts a SEP-2672 rejection (-32001) by its reason and
// returns err unchanged.
func (s *Server) verifyFailed(err error) error {
	var re *rpcError
	if errors.As(err, &re) && re.code == CodeApproval {
		var d struct {
			Reason string `json:"reason"`
		}
		if json.Unmarshal(re.data, &d) == nil && d.Reason != "" {
			s.opts.Telemetry.M().VerificationFailed(telemetry.VerifySEP2672, d.Reason)
		}
	}
	return err
}

// evidence is the tools/call _meta evidence (§4.5) after the shape checks.
type evidence struct {
	method      string
	challengeID string
	response    json.RawMessage
}

// parseEvidence applies §4.8 steps 1–3 to params._meta: evidence present
// (missing_evidence), an object with a string method, a string challengeId
// and a response (missing_evidence), method "webauthn"
// (unsupported_method). The response's own shape is the passkey service's
// to check (missing_evidence there too).
func parseEvidence(meta mcp.Meta) (evidence, error) {
	v, ok := meta[MetaVerifiedApproval]
	if !ok || v == nil {
		return evidence{}, approvalError(passkey.ReasonMissingEvidence, errors.New("no evidence"))
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return evidence{}, approvalError(passkey.ReasonMissingEvidence, errors.New("evidence is not an object"))
	}
	method, okM := obj["method"].(string)
	challengeID, okC := obj["challengeId"].(string)
	response, okR := obj["response"]
	if !okM || !okC || !okR || response == nil || challengeID == "" {
		return evidence{}, approvalError(passkey.ReasonMissingEvidence, errors.New("evidence lacks method, challengeId or response"))
	}
	if method != passkey.MethodWebAuthn {
		return evidence{}, approvalError(passkey.ReasonUnsupportedMethod, nil)
	}
	raw, err := json.Marshal(response)
	if err != nil {
		return evidence{}, approvalError(passkey.ReasonMissingEvidence, err)
	}
	return evidence{method: method, challengeID: challengeID, response: raw}, nil
}

// callVerified serves a call policy decided "verify" (SEP-2672 in-band):
// the evidence is checked in the SEP's order and, only when every check
// passes, the challenge is consumed (passkey.Service.Verify: verify before
// consume, compare-and-set, single use across replicas). Any rejection is
// -32001 with data.reason, and nothing is stored or run.
//
// Exactly once. The verified call then runs through the same workflow as
// an approved task, started in tasks.ModeVerified with the approval in its
// input: it records the approval with the assertion, re-evaluates policy,
// takes the execution claim and runs the tool once, and writes the same
// audit records. A workflow, rather than a claim written to NATS here,
// because the workflow's history is what makes the approval path
// crash-safe already: once the start is acknowledged, the call runs exactly
// once whatever crashes (worker, this process), and its outcome is in the
// read model. The consume comes first and is single-use, and the task's ID
// is derived from the challenge (verifiedTaskID), created only if absent:
// two calls with one challenge open at most one task, whatever replica they
// reach, and the second gets challenge_consumed. A crash between the
// consume and the task record is recovered by the client's retry of the
// same signed call: the consume was under a key derived from that evidence
// (verifiedConsumerKey), so the retry is its own consumer and opens the
// task; any other evidence is challenge_consumed. A crash between the task
// record and the workflow start is recovered the same way
// (approvals.Service resumes a verified task whose workflow never
// started). A client that never retries leaves, at worst, a signed call
// that did not run and that it was never told ran. The answer is sent only
// from the task's terminal record, so a client is never told a call ran
// that did not, and a call that ran is never lost from the read model and
// the audit chain. internal/e2e TestCrashVerified kills the process around
// the call and checks this.
func (s *Server) callVerified(ctx context.Context, c *gatedCall, meta mcp.Meta) (mcp.Result, error) {
	if s.opts.Passkeys == nil {
		// Policy asks for verified approval on an endpoint that cannot do
		// it: deny, never run.
		return newToolResult(c.info.era, tasks.Outcome(tasks.DeniedNotExecuted, c.tool.Name,
			"Denied: this call needs verified approval, which this server does not offer", nil)), nil
	}
	ev, err := parseEvidence(meta)
	if err != nil {
		return nil, s.verifyFailed(err)
	}
	v, err := s.opts.Passkeys.Verify(ctx, passkey.VerifyRequest{
		ChallengeID:        ev.challengeID,
		Tool:               c.tool.Name,
		ActionHash:         c.hash,
		Principal:          c.info.principal,
		AuthenticatorClass: c.decision.AuthenticatorClass,
		ConsumerKey:        verifiedConsumerKey(ev),
		Method:             ev.method,
		Response:           ev.response,
	})
	if err != nil {
		if passkey.ReasonOf(err) == passkey.ReasonChallengeConsumed {
			return nil, s.verifyFailed(s.consumedError(ctx, c.info.principal, ev.challengeID))
		}
		return nil, s.verifyFailed(fromPasskey(err))
	}
	s.log.InfoContext(ctx, "mcpserver: verified approval accepted", "tool", c.tool.Name, "principal", c.info.principal,
		"action_hash", c.hash.String(), "challenge_id", v.ChallengeID, "credential_id", v.CredentialID)
	call := s.approvalCall(c)
	call.Mode = tasks.ModeVerified
	call.TaskID = verifiedTaskID(ev.challengeID)
	call.Verified = &tasks.VerifiedApproval{
		ApproverID: v.ApproverID, ApproverName: v.ApproverName, CredentialID: v.CredentialID,
		ChallengeID: v.ChallengeID, PublicKey: v.PublicKey, AuthenticatorData: v.AuthenticatorData,
		ClientDataJSON: v.ClientDataJSON, Signature: v.Signature, SignCount: v.SignCount, At: c.now,
	}
	opened, err := s.opts.Approvals.Open(ctx, call)
	if errors.Is(err, tasks.ErrTaskExists) {
		// The challenge's task was opened already: this is a second
		// submission of the same evidence, by the challenge's own
		// principal (Verify passed under this evidence's consumer key).
		return nil, s.verifyFailed(consumedWithTask(call.TaskID))
	}
	if err != nil {
		return refusal(c, err)
	}
	// The call runs now; wait for its end even if the client hangs up (the
	// task goes on regardless), bounded by the execution timeout.
	rec, err := s.opts.Approvals.Await(ctx, c.info.principal, opened.Task.TaskID)
	if err != nil {
		if errors.Is(err, approvals.ErrNotFound) {
			return nil, internal(err)
		}
		return nil, err
	}
	return s.finalResult(c.info, rec)
}

// consumedError answers challenge_consumed for a call of principal with
// challengeID, naming the challenge's task when it was opened (consumedWithTask).
// Only the challenge's own principal gets this far (another one's call is
// challenge_unknown), and only its own task is found.
func (s *Server) consumedError(ctx context.Context, principal, challengeID string) *rpcError {
	id := verifiedTaskID(challengeID)
	if _, err := s.opts.Approvals.Get(ctx, principal, id); err == nil {
		return consumedWithTask(id)
	}
	return approvalError(passkey.ReasonChallengeConsumed, nil)
}

// consumedWithTask is SEP-2672's challenge_consumed with data.taskId naming
// the task the challenge opened, so a client whose first answer was lost (a
// crash, a dropped connection) reads the outcome with tasks/get or
// countersign_await instead of guessing.
func consumedWithTask(taskID string) *rpcError {
	e := approvalError(passkey.ReasonChallengeConsumed, nil)
	e.data, _ = json.Marshal(map[string]string{"reason": passkey.ReasonChallengeConsumed, "taskId": taskID})
	return e
}

// verifiedTaskID is the task a challenge's verified call runs as: derived
// from the challenge, so one challenge opens at most one task.
func verifiedTaskID(challengeID string) string {
	sum := sha256.Sum256([]byte("countersign verified call\x00" + challengeID))
	return "tsk_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:20]))
}

// verifiedConsumerKey consumes a challenge under a key derived from the
// whole evidence (challenge and assertion bytes): the exact same signed call
// sent again finds its own consume and goes on to open the challenge's task
// (which recovers a call whose first attempt died between the consume and
// the task), while anything else, a forged assertion over a known
// challenge id included, is challenge_consumed.
func verifiedConsumerKey(ev evidence) string {
	h := sha256.New()
	h.Write([]byte(ev.challengeID))
	h.Write([]byte{0})
	h.Write(ev.response)
	return "inband-" + hex.EncodeToString(h.Sum(nil))
}

// cacheScopePrivate is the 2026-07-28 cacheScope of an answer that depends
// on the caller: only the caller's own client may cache it.
const cacheScopePrivate = "private"

// annotateVerified adds the SEP-2672 annotation to the tools that policy
// puts under verified approval for this caller: those whose decision, for
// the caller and empty arguments, is "verify". (Policy decides per call;
// a call whose decision is "verify" needs evidence whatever tools/list
// said.) Tools are copied, never changed in place: the SDK shares them.
//
// The list then depends on who asks, so its 2026-07-28 cacheScope is
// "private" (SEP-2549: "public" lets a shared intermediary serve one
// caller's answer to another); the SDK's default is "public".
func (s *Server) annotateVerified(ctx context.Context, info *callInfo, list *mcp.ListToolsResult) *mcp.ListToolsResult {
	if s.opts.Passkeys == nil {
		return list
	}
	out := *list
	out.CacheScope = cacheScopePrivate
	out.Tools = make([]*mcp.Tool, 0, len(list.Tools))
	for _, t := range list.Tools {
		gt, ok := s.opts.Tools.Lookup(t.Name)
		if ok && !isFollowUp(t.Name) {
			if _, d, err := s.evaluate(ctx, info, actionCall, gt, json.RawMessage(`{}`), s.now().UTC()); err == nil && d.Effect == pdp.EffectVerify {
				cp := *t
				cp.Meta = mcp.Meta{}
				for k, v := range t.Meta {
					cp.Meta[k] = v
				}
				cp.Meta[MetaVerifiedApproval] = map[string]any{"required": "verified", "authenticatorClass": d.AuthenticatorClass}
				t = &cp
			}
		}
		out.Tools = append(out.Tools, t)
	}
	return &out
}
