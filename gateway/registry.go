package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
)

// ErrUnknownTool is returned for a tool the registry does not have.
var ErrUnknownTool = errors.New("gateway: unknown tool")

// ErrNotSent is wrapped by a backend's error when the call certainly never
// reached the tool (an upstream that cannot be reached): it did not act, so
// the call ends as not run rather than with an unknown outcome.
var ErrNotSent = errors.New("gateway: the call was not sent")

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
	// Pin, when set, is the pin of the tool the call was made against
	// (tasks.Envelope.ToolPin): [Registry.Execute] runs the tool it finds
	// under the name only if that tool has this pin, and otherwise returns
	// [Registry.CheckPin]'s error. Checked on the tool that runs, it leaves
	// no gap in which the tool can change between a check and the run.
	Pin *tasks.ToolPin
	// ProgressFunc and LogFunc, when set, send notifications/progress and
	// notifications/message to the client for this call while it runs
	// (the MCP endpoint sets them for a call answered inline). Use
	// [Call.ReportProgress] and [Call.Log], which are safe when they are
	// nil.
	ProgressFunc func(progress, total float64, message string)
	LogFunc      func(level, message string)
}

// ReportProgress tells the client how far the call has come (progress of
// total; total 0 when unknown). It does nothing when the client cannot hear
// it (no progress token, no stream, a task run later by a workflow).
func (c Call) ReportProgress(progress, total float64, message string) {
	if c.ProgressFunc != nil {
		c.ProgressFunc(progress, total, message)
	}
}

// Log sends the client a log message at level ("debug", "info",
// "warning", "error"…), when it can hear one; otherwise nothing happens.
// Never put secrets or raw arguments in message.
func (c Call) Log(level, message string) {
	if c.LogFunc != nil {
		c.LogFunc(level, message)
	}
}

// Tool is a backend tool.
type Tool struct {
	Name         string
	Title        string
	Description  string
	InputSchema  json.RawMessage
	OutputSchema json.RawMessage
	// ReadOnly marks tools that never change anything. For an upstream
	// tool it is the upstream's readOnlyHint: a hint, not a guarantee.
	ReadOnly bool
	// Upstream and UpstreamTool name the MCP server a tool comes from and
	// the tool's name there; empty for Countersign's own tools.
	Upstream     string
	UpstreamTool string
	// Endpoint is where the upstream is reached, for the tool's [Tool.Pin];
	// zero for Countersign's own tools.
	Endpoint Endpoint
	// Annotations are the upstream's tool annotations (MCP ToolAnnotations
	// JSON), passed through to tools/list and to policy as untrusted hints.
	Annotations json.RawMessage
	// Approval is the upstream's configured approval override for policy:
	// "always", "never", or "" (policy decides). See pdp.Resource.
	Approval string
	// Describe renders the approver-facing display text of a call. It must
	// describe the arguments accurately: it is what the approver signs for.
	Describe func(args json.RawMessage) string
	Run      func(ctx context.Context, call Call) (tasks.CallToolResult, error)

	// pin is [Tool.Pin], computed once when the registry takes the tool.
	pin *tasks.ToolPin
}

// PolicyResource is the tool as policy sees it (pdp.Resource). Annotations
// that are not a JSON object are left out: an upstream's malformed hints
// must not make the call undecidable.
func (t Tool) PolicyResource() pdp.Resource {
	r := pdp.Resource{Type: "tool", ID: t.Name, Upstream: t.Upstream, Tool: t.UpstreamTool, Approval: t.Approval}
	if b := bytes.TrimSpace(t.Annotations); len(b) > 0 && b[0] == '{' && json.Valid(b) {
		r.Annotations = b
	}
	return r
}

type entry struct {
	tool   Tool
	schema *jsonschema.Resolved
	source string
}

// Registry is the set of tools Countersign serves: its own, fixed at
// construction, and those of each upstream, which [Registry.Replace] swaps as
// the upstream's list changes. Readers see one consistent snapshot per call.
type Registry struct {
	mu       sync.Mutex // serializes writers
	snap     atomic.Pointer[snapshot]
	onChange []func()
}

type snapshot struct {
	tools map[string]entry
	names []string
}

// NewRegistry compiles the tools' schemas. A tool without a name, a run
// function or a valid object schema is an error.
func NewRegistry(tools ...Tool) (*Registry, error) {
	snap := &snapshot{tools: make(map[string]entry, len(tools))}
	for _, t := range tools {
		e, err := compile(t)
		if err != nil {
			return nil, err
		}
		if _, dup := snap.tools[t.Name]; dup {
			return nil, fmt.Errorf("gateway: tool %q registered twice", t.Name)
		}
		snap.tools[t.Name] = e
	}
	snap.sortNames()
	r := &Registry{}
	r.snap.Store(snap)
	return r, nil
}

func compile(t Tool) (entry, error) {
	if t.Name == "" || t.Run == nil {
		return entry{}, fmt.Errorf("gateway: tool %q needs a name and a run function", t.Name)
	}
	var s jsonschema.Schema
	if err := json.Unmarshal(t.InputSchema, &s); err != nil {
		return entry{}, fmt.Errorf("gateway: tool %s: input schema: %w", t.Name, err)
	}
	if s.Type != "object" {
		return entry{}, fmt.Errorf("gateway: tool %s: input schema must have type object", t.Name)
	}
	rs, err := s.Resolve(nil)
	if err != nil {
		return entry{}, fmt.Errorf("gateway: tool %s: input schema: %w", t.Name, err)
	}
	if err := CheckSchemaCost(t.InputSchema); err != nil {
		return entry{}, fmt.Errorf("gateway: tool %s: input schema: %w", t.Name, err)
	}
	pin := t.Pin()
	t.pin = &pin
	return entry{tool: t, schema: rs}, nil
}

func (s *snapshot) sortNames() {
	s.names = s.names[:0]
	for n := range s.tools {
		s.names = append(s.names, n)
	}
	sort.Strings(s.names)
}

// Replace makes tools the whole tool set of source (an upstream's name; ""
// is Countersign's own and cannot be replaced). A tool that does not compile,
// or whose name another source already serves, is left out and named in the
// returned error; the others are served. Then every OnChange function runs.
func (r *Registry) Replace(source string, tools []Tool) error {
	if source == "" {
		return errors.New("gateway: Replace needs a source name")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.snap.Load()
	next := &snapshot{tools: make(map[string]entry, len(old.tools)+len(tools))}
	for n, e := range old.tools {
		if e.source != source {
			next.tools[n] = e
		}
	}
	var errs []error
	for _, t := range tools {
		if other, taken := next.tools[t.Name]; taken {
			errs = append(errs, fmt.Errorf("gateway: upstream %s: tool %q collides with one of %s; left out", source, t.Name, sourceName(other.source)))
			continue
		}
		e, err := compile(t)
		if err != nil {
			errs = append(errs, fmt.Errorf("upstream %s: %w; left out", source, err))
			continue
		}
		e.source = source
		next.tools[t.Name] = e
	}
	next.sortNames()
	r.snap.Store(next)
	for _, fn := range r.onChange {
		fn()
	}
	return errors.Join(errs...)
}

func sourceName(s string) string {
	if s == "" {
		return "Countersign's own tools"
	}
	return "upstream " + s
}

// OnChange registers fn to run after every change of the tool set (for
// tools/list and its list_changed notification). Register before serving.
func (r *Registry) OnChange(fn func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onChange = append(r.onChange, fn)
}

// Lookup returns a tool by name.
func (r *Registry) Lookup(name string) (Tool, bool) {
	e, ok := r.snap.Load().tools[name]
	return e.tool, ok
}

// List returns the tools sorted by name.
func (r *Registry) List() []Tool {
	snap := r.snap.Load()
	out := make([]Tool, 0, len(snap.names))
	for _, n := range snap.names {
		out = append(out, snap.tools[n].tool)
	}
	return out
}

// Validate checks args against the tool's input schema. Empty args count as
// the empty object.
func (r *Registry) Validate(name string, args json.RawMessage) error {
	e, ok := r.snap.Load().tools[name]
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
	e, ok := r.snap.Load().tools[name]
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

// Execute runs a tool once; with call.Pin set, only if the tool has that
// pin. See the package doc for what an error means.
func (r *Registry) Execute(ctx context.Context, name string, call Call) (tasks.CallToolResult, error) {
	e, ok := r.snap.Load().tools[name]
	if !ok {
		return tasks.CallToolResult{}, ErrUnknownTool
	}
	if call.IdempotencyKey == "" {
		return tasks.CallToolResult{}, errors.New("gateway: execution without an idempotency key")
	}
	if call.Pin != nil {
		if err := checkPin(name, e.tool, *call.Pin); err != nil {
			return tasks.CallToolResult{}, err
		}
	}
	return e.tool.Run(ctx, call)
}
