package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/tasks"
)

// JSON-RPC and MCP error codes this package emits.
const (
	codeParseError     = jsonrpc.CodeParseError     // -32700
	codeInvalidRequest = jsonrpc.CodeInvalidRequest // -32600
	codeMethodNotFound = jsonrpc.CodeMethodNotFound // -32601
	codeInvalidParams  = jsonrpc.CodeInvalidParams  // -32602
	codeInternal       = jsonrpc.CodeInternalError  // -32603
	codeHeaderMismatch = mcp.CodeHeaderMismatch     // -32020 (2026-07-28)
	// codeUnsupportedVersion (-32022, 2026-07-28) answers a protocol
	// version this server does not implement.
	codeUnsupportedVersion = mcp.CodeUnsupportedProtocolVersion
	codeMissingCapability  = mcp.CodeMissingRequiredClientCapabilities
	// CodeTooManyRequests answers a request refused for load, never for
	// what it asked: over the caller's request budget (HTTP 429) or while
	// the server sheds slow request bodies (HTTP 503), where Retry-After
	// says when to retry; or an approval/challenge/create while the
	// challenges bucket is full (passkey.ErrChallengeCapacity) or from a
	// caller over its challenge rate. Not -32001: SEP-2672 §4.10 keeps that
	// code for its approval-domain reasons, each from a fixed list that has
	// none for load. An application code (429, as in HTTP), outside
	// -32768 to -32000, which JSON-RPC reserves: MCP keeps -32020 to -32099
	// for codes its specification defines and forbids emitting any other
	// there, and allocates nothing new in -32000 to -32019.
	CodeTooManyRequests = -31029
)

// Fixed client-facing messages.
const (
	msgInternal          = "Internal error"
	msgTaskNotFound      = "Failed to retrieve task: Task not found"
	msgTaskExpired       = "Failed to retrieve task: Task has expired"
	msgMissingTasksCap   = "Missing required client capability"
	msgTooManyRequests   = "Too many requests: this caller is over its request budget; retry after the Retry-After delay"
	msgChallengeCapacity = "Server at capacity for approval challenges: no challenge was created; try again later"
	msgChallengeRate     = "Too many approval challenges from this caller: no challenge was created; try again later"
	msgEnrollmentClosed  = "In-band enrollment is closed on this server: ask an admin for an approver-site invite, for an approver mapped to this principal"
	msgNotFirstPasskey   = "This principal has a passkey already, and this server enrolls only a first passkey in-band: ask an admin for an approver-site invite to add another"
)

// missingTasksData is the data of a -32021 error: the client must declare
// the tasks extension on the request.
var missingTasksData = json.RawMessage(`{"requiredCapabilities":{"extensions":{"` + tasks.ExtTasks + `":{}}}}`)

// rpcError is a protocol failure: a JSON-RPC code and a message that is safe
// to send, plus the cause, which only the log sees.
type rpcError struct {
	code  int64
	msg   string
	data  json.RawMessage
	cause error
}

func (e *rpcError) Error() string {
	if e.cause != nil {
		return fmt.Sprintf("mcpserver: %d %s: %v", e.code, e.msg, e.cause)
	}
	return fmt.Sprintf("mcpserver: %d %s", e.code, e.msg)
}

func (e *rpcError) Unwrap() error { return e.cause }

// Is matches another *rpcError with the same code.
func (e *rpcError) Is(target error) bool {
	t, ok := target.(*rpcError)
	return ok && t.code == e.code
}

func invalidParams(msg string) *rpcError { return &rpcError{code: codeInvalidParams, msg: msg} }

func internal(cause error) *rpcError {
	return &rpcError{code: codeInternal, msg: msgInternal, cause: cause}
}

// methodNotFound is the -32601 answer to a method this server does not
// serve under era, worded alike in both eras whoever refuses it: this
// package's handlers, the HTTP layer, or the SDK (whose own texts the HTTP
// layer replaces: answerWriter). It names the method, and says why when
// the method exists elsewhere: in the other protocol era, or on a server
// with prompts, resources or completions.
func methodNotFound(method string, era tasks.Era) *rpcError {
	msg := "Method not found: " + method
	switch other := otherEra(era); {
	case toolsOnly(method):
		msg += " (this server has tools only)"
	case slices.Contains(eraMethods[other], method):
		msg += fmt.Sprintf(" is not available in protocol %s (only in %s)", era, other)
	}
	return &rpcError{code: codeMethodNotFound, msg: msg}
}

// eraMethods are the requests served in one protocol era only.
var eraMethods = map[tasks.Era][]string{
	tasks.Era2025: {"initialize", "ping", "logging/setLevel", "tasks/result", "tasks/list"},
	tasks.Era2026: {"server/discover", "tasks/update"},
}

func otherEra(era tasks.Era) tasks.Era {
	if era == tasks.Era2026 {
		return tasks.Era2025
	}
	return tasks.Era2026
}

// toolsOnly reports whether method belongs to a feature this server does
// not declare: it serves tools only, no prompts, resources or completions.
func toolsOnly(method string) bool {
	switch method {
	case "prompts/list", "prompts/get", "resources/list", "resources/read", "resources/templates/list",
		"resources/subscribe", "resources/unsubscribe", "completion/complete":
		return true
	}
	return false
}

// methodError carries a -32601 answer past the SDK unchanged. The SDK's
// JSON-RPC layer rewords every error that matches -32601 (errors.Is, which
// for a *jsonrpc.Error compares codes) as `method not found: "<method>"`,
// which for tools/call says nothing of the tool. This type is not a
// *jsonrpc.Error and has no Is, so the SDK keeps its message, and it
// yields the *jsonrpc.Error to errors.As, which is how the SDK finds its
// code (and, from 2026-07-28, its HTTP status, 404).
type methodError struct{ wire *jsonrpc.Error }

func (e *methodError) Error() string { return e.wire.Message }

func (e *methodError) As(target any) bool {
	if p, ok := target.(**jsonrpc.Error); ok {
		*p = e.wire
		return true
	}
	return false
}

func taskNotFound() *rpcError { return invalidParams(msgTaskNotFound) }

// missingCapability is -32021 for a client capability (such as "sampling")
// the request did not declare; data.requiredCapabilities names it as a
// ClientCapabilities object.
func missingCapability(capability string) *rpcError {
	data, _ := json.Marshal(map[string]any{"requiredCapabilities": map[string]any{capability: struct{}{}}})
	return &rpcError{code: codeMissingCapability, msg: msgMissingTasksCap, data: data}
}

func missingTasksCapability() *rpcError {
	return &rpcError{code: codeMissingCapability, msg: msgMissingTasksCap, data: missingTasksData}
}

// wireError is the one place where an error becomes what the client sees.
// Protocol and validation failures keep their code and fixed message;
// anything else is logged with its cause and answered with a bare -32603.
// Tool failures and policy denials never get here: they are CallToolResults.
func (s *Server) wireError(ctx context.Context, method string, err error) error {
	if err == nil {
		return nil
	}
	var (
		re     *rpcError
		argErr *gateway.ArgumentError
		wire   *jsonrpc.Error
	)
	switch {
	case errors.As(err, &re):
		if re.cause != nil {
			s.log.ErrorContext(ctx, "mcpserver: request failed", "method", method, "code", re.code, "err", re.cause)
		}
		wire := &jsonrpc.Error{Code: re.code, Message: re.msg, Data: re.data}
		if re.code == codeMethodNotFound {
			return &methodError{wire: wire}
		}
		return wire
	case errors.Is(err, tasks.ErrTaskNotFound):
		return &jsonrpc.Error{Code: codeInvalidParams, Message: msgTaskNotFound}
	case errors.Is(err, gateway.ErrUnknownTool):
		return &jsonrpc.Error{Code: codeInvalidParams, Message: "Unknown tool"}
	case errors.As(err, &argErr):
		// The gateway's message names the failing field; it echoes only
		// what the caller sent.
		return &jsonrpc.Error{Code: codeInvalidParams, Message: argErr.Error()}
	case errors.As(err, &wire):
		return wire // already a wire error, e.g. from the SDK
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		s.log.InfoContext(ctx, "mcpserver: request abandoned", "method", method, "err", err)
		return &jsonrpc.Error{Code: codeInternal, Message: "Request cancelled"}
	default:
		s.log.ErrorContext(ctx, "mcpserver: request failed", "method", method, "err", err)
		return &jsonrpc.Error{Code: codeInternal, Message: msgInternal}
	}
}
