package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/countersign/countersign/tasks"
)

// ErrUnknownTool is returned for a tool the registry does not have.
var ErrUnknownTool = errors.New("gateway: unknown tool")

// ArgumentError says why arguments do not fit a tool's input schema. Its
// message is safe to show to the client.
type ArgumentError struct {
	Tool   string
	Reason string
}

func (e *ArgumentError) Error() string {
	return fmt.Sprintf("invalid arguments for tool %s: %s", e.Tool, e.Reason)
}

// ProtocolError is a tool failure that is a protocol error, not a tool
// result: the tool refused before doing anything. A task that ends with one
// is "failed" with this JSON-RPC error (SEP-2663), not "completed".
type ProtocolError struct {
	Code    int64
	Message string
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("gateway: protocol error %d: %s", e.Code, e.Message)
}

// Call is one execution request.
type Call struct {
	// IdempotencyKey is unique per intended effect: the task ID for an
	// approved call, a fresh ID for a directly allowed one.
	IdempotencyKey string
	Principal      string
	Arguments      json.RawMessage
	// Inputs are the client's answers to InputRequests (a JSON object keyed
	// by request ID), or empty.
	Inputs json.RawMessage
}

// Tool is a backend tool.
type Tool struct {
	Name         string
	Title        string
	Description  string
	InputSchema  json.RawMessage
	OutputSchema json.RawMessage
	// ReadOnly marks tools that never change anything.
	ReadOnly bool
	// Describe renders the approver-facing display text of a call. It must
	// describe the arguments accurately: it is what the approver signs for.
	Describe func(args json.RawMessage) string
	Run      func(ctx context.Context, call Call) (tasks.CallToolResult, error)
}

type entry struct {
	tool   Tool
	schema *jsonschema.Resolved
}

// Registry is an immutable set of tools.
type Registry struct {
	tools map[string]entry
	names []string
}

// NewRegistry compiles the tools' schemas. A tool without a name, a run
// function or a valid object schema is an error.
func NewRegistry(tools ...Tool) (*Registry, error) {
	r := &Registry{tools: make(map[string]entry, len(tools))}
	for _, t := range tools {
		if t.Name == "" || t.Run == nil {
			return nil, fmt.Errorf("gateway: tool %q needs a name and a run function", t.Name)
		}
		if _, dup := r.tools[t.Name]; dup {
			return nil, fmt.Errorf("gateway: tool %q registered twice", t.Name)
		}
		var s jsonschema.Schema
		if err := json.Unmarshal(t.InputSchema, &s); err != nil {
			return nil, fmt.Errorf("gateway: tool %s: input schema: %w", t.Name, err)
		}
		if s.Type != "object" {
			return nil, fmt.Errorf("gateway: tool %s: input schema must have type object", t.Name)
		}
		rs, err := s.Resolve(nil)
		if err != nil {
			return nil, fmt.Errorf("gateway: tool %s: input schema: %w", t.Name, err)
		}
		r.tools[t.Name] = entry{tool: t, schema: rs}
		r.names = append(r.names, t.Name)
	}
	sort.Strings(r.names)
	return r, nil
}

// Lookup returns a tool by name.
func (r *Registry) Lookup(name string) (Tool, bool) {
	e, ok := r.tools[name]
	return e.tool, ok
}

// List returns the tools sorted by name.
func (r *Registry) List() []Tool {
	out := make([]Tool, 0, len(r.names))
	for _, n := range r.names {
		out = append(out, r.tools[n].tool)
	}
	return out
}

// Validate checks args against the tool's input schema. Empty args count as
// the empty object.
func (r *Registry) Validate(name string, args json.RawMessage) error {
	e, ok := r.tools[name]
	if !ok {
		return ErrUnknownTool
	}
	v, err := decodeObject(args)
	if err != nil {
		return &ArgumentError{Tool: name, Reason: err.Error()}
	}
	if err := e.schema.Validate(v); err != nil {
		return &ArgumentError{Tool: name, Reason: err.Error()}
	}
	return nil
}

func decodeObject(args json.RawMessage) (map[string]any, error) {
	if len(bytes.TrimSpace(args)) == 0 {
		return map[string]any{}, nil
	}
	var v any
	if err := json.Unmarshal(args, &v); err != nil {
		return nil, errors.New("arguments are not valid JSON")
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("arguments must be a JSON object")
	}
	return m, nil
}

// Describe returns the display text of a call.
func (r *Registry) Describe(name string, args json.RawMessage) string {
	e, ok := r.tools[name]
	if !ok {
		return ""
	}
	if e.tool.Describe == nil {
		return fmt.Sprintf("Run %s with %s", name, compact(args))
	}
	return e.tool.Describe(args)
}

func compact(args json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, args) != nil || b.Len() == 0 {
		return "{}"
	}
	return b.String()
}

// Execute runs a tool once. See the package doc for what an error means.
func (r *Registry) Execute(ctx context.Context, name string, call Call) (tasks.CallToolResult, error) {
	e, ok := r.tools[name]
	if !ok {
		return tasks.CallToolResult{}, ErrUnknownTool
	}
	if call.IdempotencyKey == "" {
		return tasks.CallToolResult{}, errors.New("gateway: execution without an idempotency key")
	}
	return e.tool.Run(ctx, call)
}
