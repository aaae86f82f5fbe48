package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/countersign/countersign/tasks"
)

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

// MaxSlowComputeSeconds bounds slow_compute's delay.
const MaxSlowComputeSeconds = 3600

// failingJobDelay is how long failing_job and protocol_error_job wait
// before they fail ("after ~1s" in the conformance suite).
const failingJobDelay = time.Second

// inputTaskDelay is how long test_tool_with_task's task waits before it runs.
const inputTaskDelay = 500 * time.Millisecond

// ConformanceTools are the fixture tools the MCP conformance suite
// (@modelcontextprotocol/conformance 0.2.0-alpha.12, SEP-2663 tasks-*
// scenarios) expects. They are served only by `countersign dev
// --conformance`, and the conformance policy (pdp.WriteConformancePolicy)
// allows them. The asynchronous ones run through the same task machinery as
// a gated tool: a task record, the approval workflow (with no approvers: it
// waits Delay, cancellably, then re-evaluates policy and runs the tool once)
// and the same wire mapping.
//
//   - greet {name}: synchronous, "Hello, {name}!".
//   - slow_compute {seconds, label}: task-supporting; waits seconds then
//     returns a result; seconds 0 answers at once without a task; a
//     tasks/cancel while it waits ends the task cancelled.
//   - failing_job {}: task required; after ~1 s returns a tool execution
//     error (the task completes with result.isError).
//   - protocol_error_job {}: task-supporting; after ~1 s fails with a
//     protocol error (the task ends failed with an error object).
//   - confirm_delete {filename}: task required; the task waits in
//     input_required for one answer (tasks/update), then reports whether
//     the file would be deleted (nothing is).
//   - multi_input {}: task required; the task asks two questions at once
//     and stays input_required until both are answered.
//   - test_tool_with_task {}: task required; the first call answers with an
//     input request for user_name (SEP-2322 MRTR), the call that carries
//     the answer becomes a task whose result greets that name.
func ConformanceTools() []Tool {
	return []Tool{
		{
			Name:        "greet",
			Title:       "Greet",
			Description: "Conformance fixture: returns \"Hello, {name}!\" at once.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"name":{"type":"string","maxLength":200}},"required":["name"],"additionalProperties":false}`),
			ReadOnly:    true,
			Describe: func(args json.RawMessage) string {
				var a struct{ Name string }
				_ = json.Unmarshal(args, &a)
				return fmt.Sprintf("Greet %q", a.Name)
			},
			Run: func(_ context.Context, call Call) (tasks.CallToolResult, error) {
				var a struct{ Name string }
				if err := json.Unmarshal(call.Arguments, &a); err != nil {
					return tasks.CallToolResult{}, &ArgumentError{Tool: "greet", Reason: "arguments are not valid JSON"}
				}
				return tasks.CallToolResult{Content: []json.RawMessage{tasks.TextContent("Hello, " + a.Name + "!")}}, nil
			},
		},
		{
			Name:        "slow_compute",
			Title:       "Slow compute",
			Description: "Conformance fixture: waits `seconds` (0 = at once) and returns a result; runs as a task for clients that hold tasks; cancellable while it waits.",
			InputSchema: json.RawMessage(fmt.Sprintf(`{"type":"object","properties":{"seconds":{"type":"number","minimum":0,"maximum":%d},"label":{"type":"string","maxLength":200}},"required":["seconds"],"additionalProperties":false}`, MaxSlowComputeSeconds)),
			Async:       true,
			Delay: func(args json.RawMessage) time.Duration {
				a := slowComputeArgs(args)
				return time.Duration(math.Ceil(a.Seconds*1000)) * time.Millisecond
			},
			Describe: func(args json.RawMessage) string {
				a := slowComputeArgs(args)
				return fmt.Sprintf("Compute %q for %gs", a.Label, a.Seconds)
			},
			Run: func(_ context.Context, call Call) (tasks.CallToolResult, error) {
				a := slowComputeArgs(call.Arguments)
				text := fmt.Sprintf("Computed %s after %gs", a.Label, a.Seconds)
				return tasks.CallToolResult{
					Content:           []json.RawMessage{tasks.TextContent(text)},
					StructuredContent: mustJSON(map[string]any{"label": a.Label, "seconds": a.Seconds}),
				}, nil
			},
		},
		{
			Name:         "failing_job",
			Title:        "Failing job",
			Description:  "Conformance fixture: a task-only job that reports a tool execution error after about a second.",
			InputSchema:  json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`),
			Async:        true,
			TaskRequired: true,
			Delay:        func(json.RawMessage) time.Duration { return failingJobDelay },
			Run: func(context.Context, Call) (tasks.CallToolResult, error) {
				return tasks.CallToolResult{
					Content: []json.RawMessage{tasks.TextContent("failing_job failed: the job reported an error (by design).")},
					IsError: true,
				}, nil
			},
		},
		{
			Name:         "test_tool_with_task",
			Title:        "Tool with input, then a task",
			Description:  "Conformance fixture: asks the client for user_name (an input request), then runs as a task whose result greets that name.",
			InputSchema:  json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`),
			Async:        true,
			TaskRequired: true,
			Delay:        func(json.RawMessage) time.Duration { return inputTaskDelay },
			InputRequests: func(json.RawMessage) map[string]json.RawMessage {
				return map[string]json.RawMessage{"user_name": json.RawMessage(`{"method":"elicitation/create","params":{"mode":"form","message":"What is your name?","requestedSchema":{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}}}`)}
			},
			Run: func(_ context.Context, call Call) (tasks.CallToolResult, error) {
				var in map[string]struct {
					Action  string `json:"action"`
					Content struct {
						Name string `json:"name"`
					} `json:"content"`
				}
				_ = json.Unmarshal(call.Inputs, &in)
				a, ok := in["user_name"]
				if !ok || a.Action != "accept" || a.Content.Name == "" {
					return tasks.CallToolResult{Content: []json.RawMessage{tasks.TextContent("No name was given.")}, IsError: true}, nil
				}
				return tasks.CallToolResult{Content: []json.RawMessage{tasks.TextContent("Hello, " + a.Content.Name + "! (name gathered before the task started)")}}, nil
			},
		},
		{
			Name:         "confirm_delete",
			Title:        "Confirm delete",
			Description:  "Conformance fixture: a task that asks the client to confirm (one input request), then reports whether the file would be deleted. Nothing is deleted.",
			InputSchema:  json.RawMessage(`{"type":"object","properties":{"filename":{"type":"string","minLength":1,"maxLength":200}},"required":["filename"],"additionalProperties":false}`),
			Async:        true,
			TaskRequired: true,
			TaskInputRequests: func(args json.RawMessage) map[string]json.RawMessage {
				var a struct{ Filename string }
				_ = json.Unmarshal(args, &a)
				return map[string]json.RawMessage{"confirm": elicit(fmt.Sprintf("Delete %s?", a.Filename), `{"confirm":{"type":"boolean"}}`, "confirm")}
			},
			Run: func(_ context.Context, call Call) (tasks.CallToolResult, error) {
				var a struct{ Filename string }
				_ = json.Unmarshal(call.Arguments, &a)
				if r := answers(call.Inputs)["confirm"]; r.Action == "accept" && r.Content.Confirm {
					return fixtureText("Deleted " + a.Filename + " (confirmed by the client; a fixture: nothing was deleted)."), nil
				}
				return fixtureText("Kept " + a.Filename + ": the client did not confirm."), nil
			},
		},
		{
			Name:         "multi_input",
			Title:        "Multiple inputs",
			Description:  "Conformance fixture: a task that asks the client two questions at once (two input requests), then reports both answers.",
			InputSchema:  json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`),
			Async:        true,
			TaskRequired: true,
			TaskInputRequests: func(json.RawMessage) map[string]json.RawMessage {
				return map[string]json.RawMessage{
					"name":    elicit("What is your name?", `{"name":{"type":"string"}}`, "name"),
					"confirm": elicit("Confirm the job?", `{"confirm":{"type":"boolean"}}`, "confirm"),
				}
			},
			Run: func(_ context.Context, call Call) (tasks.CallToolResult, error) {
				in := answers(call.Inputs)
				return fixtureText(fmt.Sprintf("Got both inputs: name %q (%s), confirm %t (%s).",
					in["name"].Content.Name, in["name"].Action, in["confirm"].Content.Confirm, in["confirm"].Action)), nil
			},
		},
		{
			Name:        "protocol_error_job",
			Title:       "Protocol error job",
			Description: "Conformance fixture: a job that fails with a protocol error (not a tool result) after about a second.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`),
			Async:       true,
			Delay:       func(json.RawMessage) time.Duration { return failingJobDelay },
			Run: func(context.Context, Call) (tasks.CallToolResult, error) {
				return tasks.CallToolResult{}, &ProtocolError{Code: -32603, Message: "protocol_error_job failed with a protocol error (by design)"}
			},
		},
	}
}

type slowCompute struct {
	Seconds float64 `json:"seconds"`
	Label   string  `json:"label"`
}

func slowComputeArgs(args json.RawMessage) slowCompute {
	var a slowCompute
	_ = json.Unmarshal(args, &a) // validated against the schema before any use
	a.Seconds = math.Max(0, math.Min(a.Seconds, MaxSlowComputeSeconds))
	return a
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic("gateway: " + err.Error()) // only maps of plain values are passed
	}
	return b
}

// elicit is an elicitation/create input request for a form of one field.
func elicit(message, properties, required string) json.RawMessage {
	return mustJSON(map[string]any{"method": "elicitation/create", "params": map[string]any{
		"mode": "form", "message": message,
		"requestedSchema": map[string]any{"type": "object", "properties": json.RawMessage(properties), "required": []string{required}},
	}})
}

// elicitAnswer is an elicitation result as a fixture reads it.
type elicitAnswer struct {
	Action  string `json:"action"`
	Content struct {
		Name    string `json:"name"`
		Confirm bool   `json:"confirm"`
	} `json:"content"`
}

func answers(inputs json.RawMessage) map[string]elicitAnswer {
	var m map[string]elicitAnswer
	_ = json.Unmarshal(inputs, &m) // absent or malformed answers read as none
	return m
}

func fixtureText(text string) tasks.CallToolResult {
	return tasks.CallToolResult{Content: []json.RawMessage{tasks.TextContent(text)}}
}
