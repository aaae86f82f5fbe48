package tasks

import (
	"encoding/json"
	"fmt"
)

// Content is an MCP content block. Countersign produces text blocks; blocks a
// tool returns are kept as raw JSON in [CallToolResult.Extra].
type Content struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// CallToolResult is the MCP tools/call result as Countersign stores and
// serves it.
type CallToolResult struct {
	Content           []json.RawMessage `json:"content"`
	StructuredContent json.RawMessage   `json:"structuredContent,omitempty"`
	IsError           bool              `json:"isError"`
	Meta              map[string]any    `json:"_meta,omitempty"`
}

// TextContent returns a text content block.
func TextContent(text string) json.RawMessage {
	b, _ := json.Marshal(Content{Type: "text", Text: text})
	return b
}

// Outcome builds the result a task completes with. The disposition is stated
// in the body (first text block) as well as under both _meta keys, so a model
// that reads only content still learns whether the call ran (SEP-2848).
// toolResult is the tool's own result, nil when the tool did not run.
func Outcome(d Disposition, tool, detail string, toolResult *CallToolResult) CallToolResult {
	var head string
	switch d {
	case ApprovedExecuted:
		head = fmt.Sprintf("[%s] The approved call to %s ran once.", d, tool)
	case DeniedNotExecuted:
		head = fmt.Sprintf("[%s] The call to %s did NOT run.", d, tool)
	case ExecutionError:
		head = fmt.Sprintf("[%s] The approved call to %s ran once and returned an error.", d, tool)
	case OutcomeUnknown:
		head = fmt.Sprintf("[%s] The call to %s was started but its outcome is unknown: it may have taken effect. Do not retry automatically; check the target system.", d, tool)
	default:
		head = fmt.Sprintf("[%s] %s", d, tool)
	}
	if detail != "" {
		head += " " + detail
	}
	out := CallToolResult{
		Content: []json.RawMessage{TextContent(head)},
		IsError: d != ApprovedExecuted,
		Meta: map[string]any{
			MetaDisposition:        string(d),
			MetaDispositionAuthZEN: string(d),
		},
	}
	if toolResult != nil {
		out.Content = append(out.Content, toolResult.Content...)
		out.StructuredContent = toolResult.StructuredContent
	}
	return out
}

// DispositionOf reads the disposition from a stored result.
func DispositionOf(result json.RawMessage) Disposition {
	var r struct {
		Meta map[string]any `json:"_meta"`
	}
	if json.Unmarshal(result, &r) != nil {
		return ""
	}
	s, _ := r.Meta[MetaDisposition].(string)
	return Disposition(s)
}
