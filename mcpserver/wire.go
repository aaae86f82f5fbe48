package mcpserver

import (
	"encoding/json"
	"maps"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/tasks"
)

// Result types this package puts on the wire. Each embeds mcp.ResultBase
// (the _meta field and the SDK's Result marker). The SDK stamps
// "resultType":"complete" only on its own result types, so ours set
// ResultType themselves where the 2026-07-28 wire needs it, and it leaves
// "task" alone.

const (
	resultTypeComplete      = "complete"
	resultTypeTask          = "task"
	resultTypeInputRequired = "input_required"
)

// inputRequiredResult is the SEP-2322 InputRequiredResult of a tools/call
// whose tool needs the client's answers first. RequestState is set only for
// a tool that asks in rounds (see Server.gatherInputs).
type inputRequiredResult struct {
	mcp.ResultBase
	ResultType    string                     `json:"resultType"`
	InputRequests map[string]json.RawMessage `json:"inputRequests"`
	RequestState  string                     `json:"requestState,omitempty"`
}

// toolResult is a CallToolResult in either era. Content blocks stay raw so
// a tool's result goes out exactly as the tool produced it.
type toolResult struct {
	mcp.ResultBase
	ResultType        string            `json:"resultType,omitempty"`
	Content           []json.RawMessage `json:"content"`
	StructuredContent json.RawMessage   `json:"structuredContent,omitempty"`
	IsError           bool              `json:"isError"`
}

func newToolResult(era tasks.Era, r tasks.CallToolResult) *toolResult {
	out := &toolResult{
		Content:           r.Content,
		StructuredContent: r.StructuredContent,
		IsError:           r.IsError,
	}
	if out.Content == nil {
		out.Content = []json.RawMessage{}
	}
	if len(r.Meta) > 0 {
		out.Meta = maps.Clone(r.Meta)
	}
	if era == tasks.Era2026 {
		out.ResultType = resultTypeComplete
	}
	return out
}

// createTaskResult is the SEP-2663 CreateTaskResult: the task, flat, with
// resultType "task".
type createTaskResult struct {
	mcp.ResultBase
	ResultType string `json:"resultType"`
	tasks.Task
}

// getTaskResult answers SEP-2663 tasks/get: the detailed task, with the
// CallToolResult inline once completed.
type getTaskResult struct {
	mcp.ResultBase
	ResultType string `json:"resultType"`
	tasks.DetailedTask
}

// ackResult answers SEP-2663 tasks/update and tasks/cancel.
type ackResult struct {
	mcp.ResultBase
	ResultType string `json:"resultType"`
}

// legacyCreateTaskResult is the 2025-11-25 CreateTaskResult: the task
// nested under "task".
type legacyCreateTaskResult struct {
	mcp.ResultBase
	Task tasks.LegacyTask `json:"task"`
}

// legacyTaskResult answers 2025-11-25 tasks/get and tasks/cancel: the task,
// flat.
type legacyTaskResult struct {
	mcp.ResultBase
	tasks.LegacyTask
}

// legacyListTasksResult answers 2025-11-25 tasks/list.
type legacyListTasksResult struct {
	mcp.ResultBase
	Tasks      []tasks.LegacyTask `json:"tasks"`
	NextCursor string             `json:"nextCursor,omitempty"`
}

// storedResult answers 2025-11-25 tasks/result: the stored CallToolResult,
// every member kept as stored, with ResultBase.Meta merged into its _meta.
type storedResult struct {
	mcp.ResultBase
	fields map[string]json.RawMessage
}

func (r *storedResult) MarshalJSON() ([]byte, error) {
	out := maps.Clone(r.fields)
	if out == nil {
		out = map[string]json.RawMessage{}
	}
	if len(r.Meta) > 0 {
		meta := map[string]any{}
		if raw, ok := out["_meta"]; ok {
			if err := json.Unmarshal(raw, &meta); err != nil || meta == nil {
				meta = map[string]any{}
			}
		}
		maps.Copy(meta, r.Meta)
		b, err := json.Marshal(meta)
		if err != nil {
			return nil, err
		}
		out["_meta"] = b
	}
	return json.Marshal(out)
}

// legacyTasksCapability is the 2025-11-25 server capability
// {list:{}, cancel:{}, requests:{tools:{call:{}}}}.
type legacyTasksCapability struct {
	List     struct{} `json:"list"`
	Cancel   struct{} `json:"cancel"`
	Requests struct {
		Tools struct {
			Call struct{} `json:"call"`
		} `json:"tools"`
	} `json:"requests"`
}

// legacyServerCapabilities adds "tasks" to the SDK's capabilities, which
// has no field for it.
type legacyServerCapabilities struct {
	*mcp.ServerCapabilities
	Tasks *legacyTasksCapability `json:"tasks,omitempty"`
}

// legacyInitializeResult is mcp.InitializeResult with the tasks capability.
type legacyInitializeResult struct {
	mcp.ResultBase
	Capabilities    legacyServerCapabilities `json:"capabilities"`
	Instructions    string                   `json:"instructions,omitempty"`
	ProtocolVersion string                   `json:"protocolVersion"`
	ServerInfo      *mcp.Implementation      `json:"serverInfo"`
}

// Values of execution.taskSupport (2025-11-25).
const (
	taskSupportForbidden = "forbidden"
	taskSupportOptional  = "optional"
	taskSupportRequired  = "required"
)

// legacyTool is mcp.Tool with execution.taskSupport, which 2025-11-25 has
// and the SDK does not model.
type legacyTool struct {
	*mcp.Tool
	Execution struct {
		TaskSupport string `json:"taskSupport"`
	} `json:"execution"`
}

// legacyListToolsResult is mcp.ListToolsResult with legacyTool entries.
type legacyListToolsResult struct {
	mcp.ResultBase
	Tools      []legacyTool `json:"tools"`
	NextCursor string       `json:"nextCursor,omitempty"`
}
