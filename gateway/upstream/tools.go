package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/internal/telemetry"
	"github.com/countersign/countersign/tasks"
)

// Tool is a gateway tool backed by an upstream tool. Its gateway.Tool has
// Upstream set to [Options.Name], UpstreamTool to the tool's name upstream,
// Endpoint to [Options.URL] or [Options.Command] (never Headers or Env), and
// Annotations to the upstream's tool annotations as JSON (readOnlyHint,
// destructiveHint, idempotentHint, openWorldHint, title; nil if none).
// Approval is left for the caller.
type Tool struct {
	gateway.Tool
}

// MaxToolNameLen is the longest valid MCP tool name.
const MaxToolNameLen = 128

// CheckToolName says why name is not a valid MCP tool name: 1 to 128 of
// A-Z a-z 0-9 _ - ., or returns nil. Use it to check a configured prefix:
// Prefix + "__" + name must be valid too.
func CheckToolName(name string) error {
	if name == "" {
		return errors.New("empty name")
	}
	if len(name) > MaxToolNameLen {
		return fmt.Errorf("name is %d characters, more than %d", len(name), MaxToolNameLen)
	}
	for _, c := range name {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return fmt.Errorf("name has the character %q; only A-Z a-z 0-9 _ - . are allowed", c)
		}
	}
	return nil
}

// convert turns listed tools into gateway tools, logging and dropping those
// that cannot be exposed. A name listed more than once is dropped every
// time: which of its definitions the upstream runs is unknown, so no call
// could be checked, approved or pinned against the right one.
func (u *Upstream) convert(list []*mcp.Tool) []Tool {
	out := make([]Tool, 0, len(list))
	listed := make(map[string]int, len(list))
	for _, t := range list {
		if t != nil {
			listed[t.Name]++
		}
	}
	refusals := make(map[string]bool)
	defer func() { u.refusals = refusals }()
	for _, t := range list {
		if t == nil {
			continue
		}
		var tool Tool
		err := fmt.Errorf("listed %d times", listed[t.Name])
		if listed[t.Name] == 1 {
			tool, err = u.convertOne(t)
		}
		if err != nil {
			name := t.Name
			if len(name) > 200 {
				name = name[:200] + "…"
			}
			key := name + "\x00" + err.Error()
			if !u.refusals[key] {
				u.log.Error("upstream tool refused", "tool", name, "error", err)
			}
			refusals[key] = true
			continue
		}
		out = append(out, tool)
	}
	return out
}

func (u *Upstream) convertOne(t *mcp.Tool) (Tool, error) {
	if err := CheckToolName(t.Name); err != nil {
		return Tool{}, fmt.Errorf("invalid tool name: %w", err)
	}
	name := u.opts.Prefix + "__" + t.Name
	if err := CheckToolName(name); err != nil {
		return Tool{}, fmt.Errorf("invalid prefixed name %s: %w", name, err)
	}
	in, err := inputSchema(t.InputSchema)
	if err != nil {
		return Tool{}, fmt.Errorf("input schema: %w", err)
	}
	var outSchema json.RawMessage
	if t.OutputSchema != nil {
		if outSchema, err = json.Marshal(t.OutputSchema); err != nil {
			return Tool{}, fmt.Errorf("output schema: %w", err)
		}
	}
	var ann json.RawMessage
	readOnly := false
	title := t.Title
	if a := t.Annotations; a != nil {
		if ann, err = json.Marshal(a); err != nil {
			return Tool{}, fmt.Errorf("annotations: %w", err)
		}
		readOnly = a.ReadOnlyHint
		if title == "" {
			title = a.Title
		}
	}
	upName, toolName := u.opts.Name, t.Name
	gt := gateway.Tool{
		Name:         name,
		Title:        title,
		Description:  t.Description,
		InputSchema:  in,
		OutputSchema: outSchema,
		ReadOnly:     readOnly,
		Describe: func(args json.RawMessage) string {
			return fmt.Sprintf("%s: %s(%s)", upName, toolName, compact(args))
		},
		Upstream:     upName,
		UpstreamTool: toolName,
		Endpoint:     gateway.Endpoint{URL: u.opts.URL, Command: u.opts.Command},
		Annotations:  ann,
	}
	pin := gt.Pin()
	gt.Run = func(ctx context.Context, call gateway.Call) (tasks.CallToolResult, error) {
		return u.call(ctx, toolName, pin, call)
	}
	return Tool{Tool: gt}, nil
}

// inputSchema encodes s and checks it the way gateway.NewRegistry does: a
// JSON object with type "object" that resolves.
func inputSchema(s any) (json.RawMessage, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(b, &obj) != nil || obj == nil {
		return nil, errors.New("not a JSON object")
	}
	// The key exactly: encoding/json matches struct fields without regard
	// to case, so {"tYpe":"object"} decodes as a Schema of type object,
	// yet clients that check the listing see no "type" and may refuse the
	// whole tools/list.
	var typ string
	if json.Unmarshal(obj["type"], &typ) != nil || typ != "object" {
		return nil, errors.New(`type is not "object"`)
	}
	var js jsonschema.Schema
	if err := json.Unmarshal(b, &js); err != nil {
		return nil, err
	}
	if _, err := js.Resolve(nil); err != nil {
		return nil, err
	}
	if err := gateway.CheckSchemaCost(b); err != nil {
		return nil, err
	}
	return b, nil
}

func compact(args json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, args) != nil || b.Len() == 0 {
		return "{}"
	}
	return b.String()
}

// call runs one tool call; see the package doc for what it returns. pin is
// the tool's as listed when the caller got it.
func (u *Upstream) call(ctx context.Context, tool string, pin tasks.ToolPin, call gateway.Call) (out tasks.CallToolResult, err error) {
	args := json.RawMessage(bytes.TrimSpace(call.Arguments))
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	if !json.Valid(args) {
		return tasks.CallToolResult{}, &gateway.ProtocolError{Code: jsonrpc.CodeInvalidParams, Message: "arguments are not valid JSON"}
	}
	ctx, cancel := context.WithTimeout(ctx, u.opts.Timeout)
	defer cancel()
	ctx, span := u.opts.Telemetry.StartSpan(ctx, "upstream tools/call", trace.SpanKindClient,
		attribute.String(telemetry.AttrUpstream, u.opts.Name), attribute.String(telemetry.AttrTool, tool))
	start := time.Now()
	defer func() {
		result := telemetry.UpstreamOK
		switch {
		case errors.Is(err, ErrNotSent):
			result = telemetry.UpstreamNotSent
		case err != nil:
			result = telemetry.UpstreamError
		case out.IsError:
			result = telemetry.UpstreamToolError
		}
		u.opts.Telemetry.M().UpstreamCall(u.opts.Name, result, time.Since(start))
		if err != nil {
			span.SetStatus(codes.Error, result)
		}
		span.SetAttributes(attribute.String("countersign.result", result))
		span.End()
	}()

	res, err := u.callOnce(ctx, tool, pin, args)
	if err != nil {
		if errors.Is(err, ErrNotSent) {
			return tasks.CallToolResult{}, err
		}
		var werr *jsonrpc.Error
		if errors.As(err, &werr) && !sdkCode(werr.Code) {
			text := tasks.TextContent(fmt.Sprintf("upstream error %d: %s", werr.Code, werr.Message))
			if len(text) > u.opts.MaxResultBytes {
				return u.overCap(tool, len(text)), nil
			}
			return tasks.CallToolResult{Content: []json.RawMessage{text}, IsError: true}, nil
		}
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
			return tasks.CallToolResult{}, fmt.Errorf("upstream %s: %s: no answer in time, outcome unknown: %w", u.opts.Name, tool, err)
		}
		return tasks.CallToolResult{}, fmt.Errorf("upstream %s: %s: outcome unknown: %w", u.opts.Name, tool, err)
	}
	return u.result(tool, res), nil
}

// sdkCode reports whether code is one the go-sdk uses for its own errors
// on a call: -32003 and -32004 (the connection is closing) and -32005
// (rejected by the transport: the HTTP request failed or was not answered
// 2xx). An error with such a code is not known to be the upstream's answer,
// so it does not become the tool's error result.
func sdkCode(code int64) bool {
	return code == -32003 || code == -32004 || code == -32005
}

// callOnce sends the call and returns the upstream's answer; see the
// package doc. It waits, until ctx is done, for a session to send it on: when
// there is none, and when a send certainly did not reach the upstream
// because the session is gone (HTTP 404, the connection closed) or the
// upstream could not be reached (the connection was refused). A session that
// is gone is replaced first. The call is sent on a new session only if that
// session lists the tool with the same pin. An error of a call that
// certainly never reached the upstream wraps [ErrNotSent] and names the
// upstream; any other is the call's own.
func (u *Upstream) callOnce(ctx context.Context, tool string, pin tasks.ToolPin, args json.RawMessage) (*mcp.CallToolResult, error) {
	sess, tools := u.current()
	wait := sess == nil
	if !wait {
		// The session may have listed the tool again since the caller
		// got it (list_changed): what it lists now is what runs.
		if err := u.checkListed(tools, tool, pin, "now"); err != nil {
			return nil, err
		}
	}
	var retry time.Duration // after a refused connection: when to try sess again
	for try := 1; ; try++ {
		if wait {
			old := sess
			next, tools, err := u.awaitSession(ctx, old, retry)
			if err != nil {
				return nil, fmt.Errorf("%w: upstream %s is not connected: %v", ErrNotSent, u.opts.Name, err)
			}
			if next != old {
				if err := u.checkListed(tools, tool, pin, "after reconnecting"); err != nil {
					return nil, err
				}
			}
			sess = next
		}
		res, out, err := u.send(ctx, sess, tool, args)
		switch out {
		case sent:
			return res, err
		case notSentFinal:
			return nil, fmt.Errorf("%w: upstream %s: %v", ErrNotSent, u.opts.Name, err)
		case sessionGone:
			u.log.Warn("upstream session lost; waiting for a new one before sending the call", "tool", tool, "error", err)
			u.kickSession(sess)
			wait, retry = true, 0
		case refused:
			u.log.Warn("upstream unreachable; waiting for it before sending the call", "tool", tool, "error", err)
			wait, retry = true, backoff(try)
		}
	}
}

// checkListed returns an error wrapping [ErrNotSent] unless tools (a
// session's listing) has tool with pin, and also a
// [*gateway.ToolChangedError] when the listing has the tool with another
// pin; when says when the listing was made, for the error.
func (u *Upstream) checkListed(tools map[string]Tool, tool string, pin tasks.ToolPin, when string) error {
	cur, listed := tools[tool]
	switch {
	case !listed:
		return fmt.Errorf("%w: upstream %s no longer lists %s %s", ErrNotSent, u.opts.Name, tool, when)
	case cur.Pin() != pin:
		changed := &gateway.ToolChangedError{Tool: tool, Reason: fmt.Sprintf("upstream %s lists %s with another input schema %s", u.opts.Name, tool, when)}
		return fmt.Errorf("%w: %w", ErrNotSent, changed)
	}
	return nil
}

// sendOutcome is what became of one send of a call.
type sendOutcome int

const (
	// sent: the call may have reached the upstream; the error, if any, is
	// the call's.
	sent sendOutcome = iota
	// notSentFinal: the call certainly did not reach the upstream, for a
	// reason a new session would not change.
	notSentFinal
	// sessionGone: the call certainly did not reach the upstream because
	// the session is gone (HTTP 404, the connection closed).
	sessionGone
	// refused: the call certainly did not reach the upstream because a
	// connection to it was refused (an HTTP dial failed).
	refused
)

// send sends the call once.
//
// Whether the call was sent is what the tracker saw leave, never what the
// error says: the SDK reports an upstream's JSON-RPC error answer with code
// -32003 or -32004 as [mcp.ErrConnectionClosed], exactly as it reports a
// call it refused to write because the connection was closing.
func (u *Upstream) send(ctx context.Context, sess *mcp.ClientSession, tool string, args json.RawMessage) (*mcp.CallToolResult, sendOutcome, error) {
	tr := &tracker{}
	res, err := sess.CallTool(withTracker(ctx, tr), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err == nil {
		return res, sent, nil
	}
	delivered, notFound, dialFailed := tr.result()
	switch {
	case delivered:
		return nil, sent, err
	case notFound || errors.Is(err, mcp.ErrSessionMissing) || errors.Is(err, mcp.ErrConnectionClosed):
		return nil, sessionGone, err
	case dialFailed:
		return nil, refused, err
	}
	return nil, notSentFinal, err
}

// countersignMeta are the _meta keys with which Countersign states what it
// decided about a call and the task that holds it. An upstream's result
// must not carry them: on an allowed call, whose result goes to the agent
// as the upstream sent it, a disposition the upstream wrote would read as
// Countersign's (a "denied-not-executed" on a call that ran invites the
// agent to make it again).
var countersignMeta = []string{tasks.MetaDisposition, tasks.MetaDispositionAuthZEN, tasks.MetaRelatedTask, tasks.MetaImmediateResponse}

// countersignNamespace prefixes Countersign's own _meta keys (the audit
// receipt io.countersign/audit, io.countersign/transaction-token-error):
// an upstream's result must not carry them either. A receipt on an
// allowed call's result, for which Countersign writes no audit record,
// would read as Countersign's record of the call.
const countersignNamespace = "io.countersign/"

// ownMeta is meta without the keys of countersignMeta and of
// countersignNamespace, which it logs.
func (u *Upstream) ownMeta(tool string, meta mcp.Meta) map[string]any {
	out, cloned := map[string]any(meta), false
	for k := range meta {
		if !slices.Contains(countersignMeta, k) && !strings.HasPrefix(k, countersignNamespace) {
			continue
		}
		if !cloned {
			out, cloned = maps.Clone(out), true
		}
		delete(out, k)
		u.log.Warn("upstream result's _meta holds a key of Countersign's own; dropped", "tool", tool, "key", k)
	}
	return out
}

// result converts an upstream result, capping the encoded size of its
// content, structuredContent and _meta together.
func (u *Upstream) result(tool string, res *mcp.CallToolResult) tasks.CallToolResult {
	if res.NeedsInput() {
		return tasks.CallToolResult{
			Content: []json.RawMessage{tasks.TextContent(fmt.Sprintf("upstream %s: %s asked for more input, which Countersign does not support", u.opts.Name, tool))},
			IsError: true,
		}
	}
	out := tasks.CallToolResult{Content: make([]json.RawMessage, 0, len(res.Content)), IsError: res.IsError}
	size := 0
	fail := func(err error) tasks.CallToolResult {
		return tasks.CallToolResult{
			Content: []json.RawMessage{tasks.TextContent(fmt.Sprintf("upstream %s: the result of %s could not be encoded: %v", u.opts.Name, tool, err))},
			IsError: true,
		}
	}
	for _, c := range res.Content {
		b, err := json.Marshal(c)
		if err != nil {
			return fail(err)
		}
		size += len(b)
		out.Content = append(out.Content, b)
	}
	if res.StructuredContent != nil {
		b, err := json.Marshal(res.StructuredContent)
		if err != nil {
			return fail(err)
		}
		size += len(b)
		out.StructuredContent = b
	}
	if meta := u.ownMeta(tool, res.Meta); len(meta) > 0 {
		b, err := json.Marshal(meta)
		if err != nil {
			return fail(err)
		}
		size += len(b)
		out.Meta = meta
	}
	if size > u.opts.MaxResultBytes {
		return u.overCap(tool, size)
	}
	return out
}

// overCap is the error result that replaces a result (or an error answer)
// of size bytes, over the cap.
func (u *Upstream) overCap(tool string, size int) tasks.CallToolResult {
	u.log.Warn("upstream result over the size cap", "tool", tool, "bytes", size, "cap", u.opts.MaxResultBytes)
	return tasks.CallToolResult{
		Content: []json.RawMessage{tasks.TextContent(fmt.Sprintf(
			"upstream %s: the result of %s was %d bytes, over the %d-byte cap; it was discarded.",
			u.opts.Name, tool, size, u.opts.MaxResultBytes))},
		IsError: true,
	}
}
