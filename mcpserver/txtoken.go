package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/internal/telemetry"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
	"github.com/countersign/countersign/txtoken"
)

// MethodTransactionToken is the custom method an agent's client calls to
// obtain a single-use transaction token for one exact call (phase 1 of the
// Zero-Trust MCP Handshake RFC). Registered only when Options.Tokens is set.
const MethodTransactionToken = "countersign/transactionToken"

// ExtTransactionTokens is the server capability extension advertised when
// transaction tokens are served: {"method": MethodTransactionToken,
// "metaKey": txtoken.MetaKey}.
const ExtTransactionTokens = "io.countersign/transaction-tokens"

// CodeTokenRefused answers a transaction-token request policy does not
// allow: its data is the RFC's error_handling object (error_type
// "permission_denied", reason "policy"). An application code outside
// JSON-RPC's reserved range, like CodeTooManyRequests.
const CodeTokenRefused = -31030

// MetaTokenError is the _meta key of a tools/call result whose token was
// rejected: the RFC's error_handling object plus the specific reason.
const MetaTokenError = "io.countersign/transaction-token-error"

// reasonMissingToken is the reason of a token-mode call that carried none.
const reasonMissingToken = "missing_token"

// tokenParams are the params of countersign/transactionToken: the call the
// token is for, named as tools/call names it.
type tokenParams struct {
	mcp.ParamsBase
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// tokenResult is the issued token. The token goes, unchanged, in the
// tools/call's params._meta under txtoken.MetaKey.
type tokenResult struct {
	mcp.ResultBase
	ResultType string `json:"resultType,omitempty"`
	txtoken.Issued
	MetaKey string `json:"metaKey"`
}

func (s *Server) registerTokenMethod() error {
	if s.opts.Tokens == nil {
		return nil
	}
	err := mcp.AddReceivingCustomMethod(s.mcp, MethodTransactionToken,
		func(ctx context.Context, _ *mcp.ServerSession, p *tokenParams) (mcp.Result, error) {
			info, err := infoFrom(ctx)
			var res mcp.Result
			if err == nil {
				res, err = s.issueToken(ctx, info, p)
			}
			if err != nil {
				return nil, s.wireError(ctx, MethodTransactionToken, err)
			}
			return res, nil
		})
	if err != nil {
		return fmt.Errorf("mcpserver: register %s: %w", MethodTransactionToken, err)
	}
	return nil
}

// issueToken checks the call as tools/call would (known tool, arguments
// that validate, the action hash over the bytes received), asks policy
// whether this principal may obtain a token for it (action
// pdp.ActionIssueToken: only allow issues), and issues.
func (s *Server) issueToken(ctx context.Context, info *callInfo, p *tokenParams) (mcp.Result, error) {
	if p == nil || p.Name == "" {
		return nil, invalidParams("Invalid params: name is required")
	}
	tool, ok := s.opts.Tools.Lookup(p.Name)
	if !ok || isFollowUp(p.Name) {
		return nil, invalidParams(fmt.Sprintf("Unknown tool: %q", p.Name))
	}
	if err := s.opts.Tools.Validate(tool.Name, p.Arguments); err != nil {
		return nil, err
	}
	_, d, err := s.evaluate(ctx, info, pdp.ActionIssueToken, tool, p.Arguments, s.now().UTC())
	if err != nil {
		return nil, err
	}
	if d.Effect != pdp.EffectAllow {
		s.log.InfoContext(ctx, "mcpserver: transaction token refused by policy", "tool", tool.Name, "principal", info.principal, "decision", d.Effect)
		data, _ := json.Marshal(txtoken.Error{StatusCode: 403, ErrorType: txtoken.TypePermissionDenied, Reason: "policy",
			Message: "Policy does not let this principal obtain a token for this call: " + d.Reason})
		return nil, &rpcError{code: CodeTokenRefused, msg: "Transaction token refused by policy", data: data}
	}
	is, err := s.opts.Tokens.Issue(ctx, txtoken.Request{
		Principal: info.principal, Tool: tool.Name, Arguments: p.Arguments,
		IssuedBy: "agent:" + info.principal, PolicyVersion: d.PolicyVersion,
	})
	if err != nil {
		return nil, internal(err)
	}
	out := &tokenResult{Issued: is, MetaKey: txtoken.MetaKey}
	if info.era == tasks.Era2026 {
		out.ResultType = resultTypeComplete
	}
	return out, nil
}

// tokenFrom reads the token a tools/call carries in params._meta. A
// present value that is not a string is passed on as "" (malformed).
func tokenFrom(meta mcp.Meta) (raw string, present bool) {
	v, ok := meta[txtoken.MetaKey]
	if !ok {
		return "", false
	}
	raw, _ = v.(string)
	return raw, true
}

// runWithToken serves a call policy put in the token mode: the token is
// verified and its jti consumed (txtoken.Service.Redeem), and only then
// does the call run, once, on the same path as an allowed call. A missing
// or rejected token is an isError result saying the call did NOT run, with
// the RFC's error object under MetaTokenError.
//
// A consumed token's call runs to its end and its result is recorded even
// if ctx is cancelled (the SDK cancels it for notifications/cancelled, or
// when the connection fails): the call was authorized and the token is
// spent, so cutting it half-way would leave an outcome nobody knows and a
// token nobody can use again. An approved task's run is the same: its
// activity does not stop when the agent goes away. The run is bounded by
// the tool's own limit (an upstream's per-call timeout).
func (s *Server) runWithToken(ctx context.Context, c *gatedCall) (tasks.CallToolResult, error) {
	if s.opts.Tokens == nil {
		return tasks.Outcome(tasks.DeniedNotExecuted, c.tool.Name,
			"Denied by policy: "+c.decision.Reason+" (transaction tokens are not enabled on this server).", nil), nil
	}
	if !c.tokenPresent {
		s.opts.Telemetry.M().VerificationFailed(telemetry.VerifyTxToken, reasonMissingToken)
		return tokenRejected(c, &txtoken.Error{StatusCode: 401, ErrorType: txtoken.TypePermissionDenied, Reason: reasonMissingToken, RetryAllowed: true,
			Message: fmt.Sprintf("This call needs a single-use transaction token: request one with %s for this tool and these exact arguments, and send it in params._meta[%q].", MethodTransactionToken, txtoken.MetaKey)}), nil
	}
	red, err := s.opts.Tokens.Redeem(ctx, c.token, txtoken.Expect{Principal: c.info.principal, Tool: c.tool.Name, ActionHash: c.hash.String()})
	var rej *txtoken.Error
	if errors.As(err, &rej) {
		s.opts.Telemetry.M().VerificationFailed(telemetry.VerifyTxToken, rej.Reason)
		return tokenRejected(c, rej), nil
	}
	if err != nil {
		// The token store or the audit log failed: nothing ran.
		return tasks.CallToolResult{}, internal(err)
	}
	res := s.execute(context.WithoutCancel(ctx), c)
	disposition := "executed"
	switch d, _ := res.Meta[tasks.MetaDisposition].(string); {
	case c.protocolErr != nil:
		disposition = "failed"
	case d != "":
		disposition = d
	case res.IsError:
		disposition = string(tasks.ExecutionError)
	}
	red.Finish(ctx, disposition, res)
	s.opts.Telemetry.M().Execution(disposition)
	return res, nil
}

// tokenRejected is the answer to a call whose token was missing or
// rejected: nothing ran.
func tokenRejected(c *gatedCall, e *txtoken.Error) tasks.CallToolResult {
	out := tasks.Outcome(tasks.DeniedNotExecuted, c.tool.Name,
		fmt.Sprintf("Transaction token rejected (%s: %s): %s", e.ErrorType, e.Reason, e.Message), nil)
	out.Meta[MetaTokenError] = e
	return out
}
