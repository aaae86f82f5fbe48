package mcpserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/tasks"
)

// The HTTP layer checks the params of the methods this server serves
// before the SDK decodes them. The SDK answers a member of the wrong type
// with -32602 (and initialize with code 0) and the decoder's text, which
// names Go types and fields ("cannot unmarshal … into Go struct field
// CallToolParamsRaw.name of type string"), and a missing params with a
// plain-text HTTP 400. Checked here, the answer names the member and what
// it must be, and nothing runs.
//
// The shapes are those of the MCP schema and of this package's own
// methods, for the members the SDK or a handler decodes into a Go type
// that can refuse them. Members are read by their exact names, as the SDK
// reads them; a null member counts as absent, as it does for the SDK.
// Members that no shape lists are ignored: no MCP request forbids them, and
// SEP-2322 says a server SHOULD ignore what it does not recognize.
// tools/call arguments are left to the tool's input schema (gateway),
// whose -32602 names the tool.

// jsonKind is the JSON type a member must have.
type jsonKind uint8

const (
	kindString jsonKind = iota + 1
	kindObject
	kindArray
	kindBoolean
	kindNumber
	kindStringOrNumber // a progress token
)

func (k jsonKind) String() string {
	switch k {
	case kindString:
		return "a string"
	case kindObject:
		return "an object"
	case kindArray:
		return "an array"
	case kindBoolean:
		return "a boolean"
	case kindNumber:
		return "a number"
	case kindStringOrNumber:
		return "a string or a number"
	}
	return "a JSON value"
}

// kindOf returns the JSON type of a value that is present (not null).
func kindOf(v json.RawMessage) jsonKind {
	switch bytes.TrimSpace(v)[0] {
	case '"':
		return kindString
	case '{':
		return kindObject
	case '[':
		return kindArray
	case 't', 'f':
		return kindBoolean
	}
	return kindNumber
}

func (k jsonKind) accepts(got jsonKind) bool {
	return k == got || (k == kindStringOrNumber && (got == kindString || got == kindNumber))
}

// member is one member of a params object: its name, its JSON type,
// whether it is required, and, for an object, the shapes of its members.
type member struct {
	name     string
	kind     jsonKind
	required bool
	members  []member
	// era, if set, is the only protocol era in which the member is read.
	era tasks.Era
}

// meta is the _meta member every params object may carry.
var meta = member{name: "_meta", kind: kindObject, members: []member{
	{name: "progressToken", kind: kindStringOrNumber},
}}

// methodParams are the params shapes of the methods served in every
// configuration. A method with a required member, or in needsParams,
// requires params. (countersign/transactionToken is served only with
// Options.Tokens; the SDK's answer to its params is reworded by
// answerWriter.)
var methodParams = map[string][]member{
	"tools/call": {
		meta,
		{name: "name", kind: kindString, required: true},
		{name: "task", kind: kindObject, era: tasks.Era2025, members: []member{{name: "ttl", kind: kindNumber}}},
		{name: "inputResponses", kind: kindObject},
		{name: "requestState", kind: kindString},
	},
	"tools/list":   {meta, {name: "cursor", kind: kindString}},
	"tasks/get":    {meta, {name: "taskId", kind: kindString, required: true}},
	"tasks/result": {meta, {name: "taskId", kind: kindString, required: true}},
	"tasks/cancel": {meta, {name: "taskId", kind: kindString, required: true}},
	"tasks/update": {meta, {name: "taskId", kind: kindString, required: true}, {name: "inputResponses", kind: kindObject}},
	"tasks/list":   {meta, {name: "cursor", kind: kindString}},
	"initialize": {
		meta,
		{name: "protocolVersion", kind: kindString},
		{name: "capabilities", kind: kindObject, members: []member{
			{name: "experimental", kind: kindObject},
			{name: "extensions", kind: kindObject},
			{name: "roots", kind: kindObject, members: []member{{name: "listChanged", kind: kindBoolean}}},
			{name: "sampling", kind: kindObject, members: []member{{name: "context", kind: kindObject}, {name: "tools", kind: kindObject}}},
			{name: "elicitation", kind: kindObject, members: []member{{name: "form", kind: kindObject}, {name: "url", kind: kindObject}}},
		}},
		{name: "clientInfo", kind: kindObject, members: implementation},
	},
	"ping":             {meta},
	"server/discover":  {meta},
	"logging/setLevel": {meta, {name: "level", kind: kindString, required: true}},
	methodListen: {meta, {name: "notifications", kind: kindObject, members: []member{
		{name: "toolsListChanged", kind: kindBoolean},
		{name: "promptsListChanged", kind: kindBoolean},
		{name: "resourcesListChanged", kind: kindBoolean},
		{name: "resourceSubscriptions", kind: kindArray},
		{name: "taskIds", kind: kindArray},
	}}},
}

// needsParams reports whether the SDK requires params for a method whose
// members are all optional (without them it answers a plain-text 400).
func needsParams(method string) bool {
	return method == "initialize" || method == methodListen
}

// implementation is the shape of an Implementation (clientInfo).
var implementation = []member{
	{name: "name", kind: kindString},
	{name: "title", kind: kindString},
	{name: "description", kind: kindString},
	{name: "version", kind: kindString},
	{name: "websiteUrl", kind: kindString},
	{name: "icons", kind: kindArray},
}

// notServed reports whether a method is one this server never serves
// (toolsOnly) or serves only in the other era: the HTTP layer answers it
// -32601 at once, before the SDK decodes (and refuses) its params.
func notServed(method string, era tasks.Era) bool {
	return toolsOnly(method) || slices.Contains(eraMethods[otherEra(era)], method)
}

// checkParams checks a request's params against its method's shape. It
// returns nil for a method without one, and for params that fit.
func checkParams(method string, era tasks.Era, raw json.RawMessage) *rpcError {
	shape, ok := methodParams[method]
	if !ok {
		return nil
	}
	if !present(raw) {
		if needsParams(method) {
			return invalidParams("Invalid params: params is required")
		}
		raw = json.RawMessage("{}")
	}
	if kindOf(raw) != kindObject {
		return invalidParams(fmt.Sprintf("Invalid params: params must be an object, not %s", kindOf(raw)))
	}
	return checkMembers("", raw, shape, era)
}

// checkMembers checks the members of the object raw; prefix is its path
// ("" for params, else "clientInfo." and so on).
func checkMembers(prefix string, raw json.RawMessage, shape []member, era tasks.Era) *rpcError {
	var m map[string]json.RawMessage
	_ = json.Unmarshal(raw, &m) // an object: the caller checked
	for _, mb := range shape {
		if mb.era != "" && mb.era != era {
			continue
		}
		v, ok := m[mb.name]
		if !ok || !present(v) {
			if mb.required {
				return invalidParams(fmt.Sprintf("Invalid params: %s%s is required", prefix, mb.name))
			}
			continue
		}
		if got := kindOf(v); !mb.kind.accepts(got) {
			return invalidParams(fmt.Sprintf("Invalid params: %s%s must be %s, not %s", prefix, mb.name, mb.kind, got))
		}
		if len(mb.members) > 0 {
			if err := checkMembers(prefix+mb.name+".", v, mb.members, era); err != nil {
				return err
			}
		}
	}
	return nil
}

// headerEra is the protocol era a request's Mcp-Protocol-Version header
// announces, which decides, as in the SDK, the HTTP status of its errors.
func headerEra(h http.Header) tasks.Era {
	if h.Get(headerProtocolVersion) >= modernVersion {
		return tasks.Era2026
	}
	return tasks.Era2025
}

// unknownMethodStatus and invalidParamsStatus are the HTTP statuses of a
// -32601 and a -32602 answered before the SDK, as the SDK answers them:
// from 2026-07-28 (by the Mcp-Protocol-Version header) 404 and 400, before
// it 200, the status of every 2025-11-25 JSON-RPC answer.
func invalidParamsStatus(h http.Header) int {
	if headerEra(h) == tasks.Era2026 {
		return http.StatusBadRequest
	}
	return http.StatusOK
}

func unknownMethodStatus(h http.Header) int {
	if headerEra(h) == tasks.Era2026 {
		return http.StatusNotFound
	}
	return http.StatusOK
}

// checkVersion refuses a request whose Mcp-Protocol-Version header names a
// version this server does not implement, with HTTP 400 and -32022
// UnsupportedProtocolVersion, its data naming the supported versions and
// echoing the requested one, as the 2026-07-28 transport requires. Before
// 2026-07-28 versions the SDK answered a plain-text 400, which no client
// reads as a JSON-RPC error and after which a modern client would fall
// back to initialize; later ones it answered as a request of that era.
// No header is 2025-03-26 (the transport lets a server assume it).
func checkVersion(h http.Header) *rpcError {
	v := h.Get(headerProtocolVersion)
	if v == "" || v == string(tasks.Era2025) || v == string(tasks.Era2026) {
		return nil
	}
	supported := mcp.SupportedProtocolVersions()
	if slices.Contains(supported, v) {
		return nil
	}
	data, _ := json.Marshal(mcp.UnsupportedProtocolVersionData{Supported: supported, Requested: v})
	return &rpcError{code: codeUnsupportedVersion, data: data, msg: fmt.Sprintf(
		"Unsupported protocol version: %q; this server supports %s", v, strings.Join(supported, ", "))}
}
