// Package conformance holds the fixture tools the MCP conformance suites
// (@modelcontextprotocol/conformance 0.2.0-alpha.12 and 0.1.16) expect: the
// SEP-2663 tasks-* scenarios' below, the base scenarios' in base.go. They are served only by `countersign dev
// --conformance`, and the conformance policy (pdp.WriteConformancePolicy)
// allows them.
//
// A fixture is a [gateway.Tool] plus behaviour no real tool has: it may be
// asynchronous (a call policy allows becomes an unattended task, run by the
// approval workflow without approvers, see tasks.ModeUnattended), require a
// task, wait before it runs, or ask its client for input (SEP-2322). That
// behaviour lives here, in [Fixture], so it does not shape gateway.Tool; the
// MCP server reads it through [Set.Lookup].
//
// The fixtures:
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
package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/tasks"
)

// MaxSlowComputeSeconds bounds slow_compute's delay.
const MaxSlowComputeSeconds = 3600

// failingJobDelay is how long failing_job and protocol_error_job wait
// before they fail ("after ~1s" in the conformance suite).
const failingJobDelay = time.Second

// inputTaskDelay is how long test_tool_with_task's task waits before it runs.
const inputTaskDelay = 500 * time.Millisecond

// Fixture is one fixture tool and how its calls run.
type Fixture struct {
	Tool gateway.Tool
	// Async: when policy allows a call and the client can hold a task, the
	// call becomes a task that the approval workflow runs without
	// approval, after Delay(arguments). A zero delay (or a client that
	// cannot hold a task) runs the call at once, after [Fixture.Wait].
	Async bool
	// TaskRequired: the tool can only be called as a task; a client that
	// cannot hold one gets an error, not a result.
	TaskRequired bool
	// Notifies: the fixture sends notifications (log messages) while it
	// runs even when the client asked for none, so a call to it that
	// accepts text/event-stream is answered as a stream.
	Notifies bool
	// RequiresCapability names a client capability ("sampling") that a
	// 2026-07-28 call must declare in its _meta client capabilities; a
	// call that does not is refused with -32021 before policy runs.
	RequiresCapability string

	delay             func(args json.RawMessage) time.Duration
	inputRequests     func(args json.RawMessage) map[string]json.RawMessage
	inputRounds       func(args json.RawMessage) []map[string]json.RawMessage
	taskInputRequests func(args json.RawMessage) map[string]json.RawMessage
}

// Delay is how long an Async call waits, cancellably, before it runs; 0
// for a fixture that does not wait.
func (f Fixture) Delay(args json.RawMessage) time.Duration {
	if f.delay == nil {
		return 0
	}
	return max(f.delay(args), 0)
}

// Wait is the wait of an Async call that does not run as a task: Delay,
// cancellable through ctx, before the call runs inline. A call that runs as
// a task waits in the approval workflow instead.
func (f Fixture) Wait(ctx context.Context, args json.RawMessage) error {
	d := f.Delay(args)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// InputRequests are the input requests (SEP-2322 MRTR, keyed by request
// ID, each {"method", "params"}) a call needs answered by the client before
// it runs; nil for none. Honoured only for calls policy allows: answers are
// not covered by the action hash, so an approval could not vouch for them.
func (f Fixture) InputRequests(args json.RawMessage) map[string]json.RawMessage {
	if f.inputRequests == nil {
		return nil
	}
	return f.inputRequests(args)
}

// InputRounds are input requests asked in rounds (SEP-2322): each round
// once the previous one is answered, with a requestState that carries the
// answers so far; the call runs once every round is answered. Nil for a
// fixture that asks at most once (InputRequests). Honoured only for calls
// policy allows, like InputRequests.
func (f Fixture) InputRounds(args json.RawMessage) []map[string]json.RawMessage {
	if f.inputRounds == nil {
		return nil
	}
	return f.inputRounds(args)
}

// TaskInputRequests are the input requests an Async fixture's TASK asks
// once it exists: the task waits in input_required until the client
// answers them all with tasks/update (2026-07-28), then runs with the
// answers. Honoured only for calls policy allows, like InputRequests.
func (f Fixture) TaskInputRequests(args json.RawMessage) map[string]json.RawMessage {
	if f.taskInputRequests == nil {
		return nil
	}
	return f.taskInputRequests(args)
}

// Set is an immutable set of fixtures.
type Set struct {
	fixtures map[string]Fixture
	names    []string // in declaration order
	// registry is where test_trigger_tool_change adds and removes its
	// dynamic tool (Bind); nil until bound.
	registry atomic.Pointer[gateway.Registry]
	toggle   sync.Mutex
}

// The tool list diagnostic hook of the 2026-07-28 server-stateless
// scenario: each call of TriggerToolChange adds DynamicTool to the tool
// list, or removes it, so that the server's list_changed notification can be
// observed.
const (
	TriggerToolChange = "test_trigger_tool_change"
	DynamicTool       = "test_dynamic_tool"
	dynamicSource     = "conformance-dynamic"
)

// New returns the conformance fixtures.
func New() *Set {
	s := &Set{fixtures: map[string]Fixture{}}
	for _, f := range append(fixtures(), s.triggerFixture()) {
		s.fixtures[f.Tool.Name] = f
		s.names = append(s.names, f.Tool.Name)
	}
	return s
}

// Bind gives the set the registry that serves its tools, where
// test_trigger_tool_change changes the tool list.
func (s *Set) Bind(r *gateway.Registry) { s.registry.Store(r) }

// triggerFixture is test_trigger_tool_change: it toggles DynamicTool in the
// bound registry, a change of the tool list like an upstream's.
func (s *Set) triggerFixture() Fixture {
	return Fixture{Tool: gateway.Tool{
		Name:        TriggerToolChange,
		Title:       "Change the tool list",
		Description: "Conformance fixture: adds " + DynamicTool + " to the tool list, or removes it, so that notifications/tools/list_changed can be observed.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`),
		Describe:    func(json.RawMessage) string { return "Change the tool list" },
		Run: func(context.Context, gateway.Call) (tasks.CallToolResult, error) {
			r := s.registry.Load()
			if r == nil {
				return tasks.CallToolResult{}, &gateway.ProtocolError{Code: -32603, Message: "the fixture set is not bound to a registry"}
			}
			s.toggle.Lock()
			defer s.toggle.Unlock()
			var next []gateway.Tool
			verb := "removed"
			if _, ok := r.Lookup(DynamicTool); !ok {
				next, verb = []gateway.Tool{dynamicTool()}, "added"
			}
			if err := r.Replace(dynamicSource, next); err != nil {
				return tasks.CallToolResult{}, err
			}
			return fixtureText(DynamicTool + " " + verb), nil
		},
	}}
}

func dynamicTool() gateway.Tool {
	return gateway.Tool{
		Name:        DynamicTool,
		Description: "Conformance fixture: present or not, as " + TriggerToolChange + " toggles it.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`),
		ReadOnly:    true,
		Describe:    func(json.RawMessage) string { return DynamicTool },
		Run: func(context.Context, gateway.Call) (tasks.CallToolResult, error) {
			return fixtureText("dynamic"), nil
		},
	}
}

// Tools are the fixtures' tools, to register in a gateway.Registry.
func (s *Set) Tools() []gateway.Tool {
	out := make([]gateway.Tool, 0, len(s.names))
	for _, n := range s.names {
		out = append(out, s.fixtures[n].Tool)
	}
	return out
}

// Lookup returns the fixture of a tool. It reports false for a tool that is
// not a fixture, and for every tool of a nil Set (no fixtures served): such
// a tool is synchronous and never asks for input.
func (s *Set) Lookup(name string) (Fixture, bool) {
	if s == nil {
		return Fixture{}, false
	}
	f, ok := s.fixtures[name]
	return f, ok
}

func fixtures() []Fixture {
	return append(taskFixtures(), baseFixtures()...)
}

func taskFixtures() []Fixture {
	return []Fixture{
		{Tool: gateway.Tool{
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
			Run: func(_ context.Context, call gateway.Call) (tasks.CallToolResult, error) {
				var a struct{ Name string }
				if err := json.Unmarshal(call.Arguments, &a); err != nil {
					return tasks.CallToolResult{}, &gateway.ArgumentError{Tool: "greet", Reason: "arguments are not valid JSON"}
				}
				return tasks.CallToolResult{Content: []json.RawMessage{tasks.TextContent("Hello, " + a.Name + "!")}}, nil
			},
		}},
		{
			Tool: gateway.Tool{
				Name:        "slow_compute",
				Title:       "Slow compute",
				Description: "Conformance fixture: waits `seconds` (0 = at once) and returns a result; runs as a task for clients that hold tasks; cancellable while it waits.",
				InputSchema: json.RawMessage(fmt.Sprintf(`{"type":"object","properties":{"seconds":{"type":"number","minimum":0,"maximum":%d},"label":{"type":"string","maxLength":200}},"required":["seconds"],"additionalProperties":false}`, MaxSlowComputeSeconds)),
				Describe: func(args json.RawMessage) string {
					a := slowComputeArgs(args)
					return fmt.Sprintf("Compute %q for %gs", a.Label, a.Seconds)
				},
				Run: func(_ context.Context, call gateway.Call) (tasks.CallToolResult, error) {
					a := slowComputeArgs(call.Arguments)
					text := fmt.Sprintf("Computed %s after %gs", a.Label, a.Seconds)
					return tasks.CallToolResult{
						Content:           []json.RawMessage{tasks.TextContent(text)},
						StructuredContent: mustJSON(map[string]any{"label": a.Label, "seconds": a.Seconds}),
					}, nil
				},
			},
			Async: true,
			delay: func(args json.RawMessage) time.Duration {
				a := slowComputeArgs(args)
				return time.Duration(math.Ceil(a.Seconds*1000)) * time.Millisecond
			},
		},
		{
			Tool: gateway.Tool{
				Name:        "failing_job",
				Title:       "Failing job",
				Description: "Conformance fixture: a task-only job that reports a tool execution error after about a second.",
				InputSchema: json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`),
				Run: func(context.Context, gateway.Call) (tasks.CallToolResult, error) {
					return tasks.CallToolResult{
						Content: []json.RawMessage{tasks.TextContent("failing_job failed: the job reported an error (by design).")},
						IsError: true,
					}, nil
				},
			},
			Async:        true,
			TaskRequired: true,
			delay:        func(json.RawMessage) time.Duration { return failingJobDelay },
		},
		{
			Tool: gateway.Tool{
				Name:        "test_tool_with_task",
				Title:       "Tool with input, then a task",
				Description: "Conformance fixture: asks the client for user_name (an input request), then runs as a task whose result greets that name.",
				InputSchema: json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`),
				Run: func(_ context.Context, call gateway.Call) (tasks.CallToolResult, error) {
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
			Async:        true,
			TaskRequired: true,
			delay:        func(json.RawMessage) time.Duration { return inputTaskDelay },
			inputRequests: func(json.RawMessage) map[string]json.RawMessage {
				return map[string]json.RawMessage{"user_name": json.RawMessage(`{"method":"elicitation/create","params":{"mode":"form","message":"What is your name?","requestedSchema":{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}}}`)}
			},
		},
		{
			Tool: gateway.Tool{
				Name:        "confirm_delete",
				Title:       "Confirm delete",
				Description: "Conformance fixture: a task that asks the client to confirm (one input request), then reports whether the file would be deleted. Nothing is deleted.",
				InputSchema: json.RawMessage(`{"type":"object","properties":{"filename":{"type":"string","minLength":1,"maxLength":200}},"required":["filename"],"additionalProperties":false}`),
				Run: func(_ context.Context, call gateway.Call) (tasks.CallToolResult, error) {
					var a struct{ Filename string }
					_ = json.Unmarshal(call.Arguments, &a)
					if r := answers(call.Inputs)["confirm"]; r.Action == "accept" && r.Content.Confirm {
						return fixtureText("Deleted " + a.Filename + " (confirmed by the client; a fixture: nothing was deleted)."), nil
					}
					return fixtureText("Kept " + a.Filename + ": the client did not confirm."), nil
				},
			},
			Async:        true,
			TaskRequired: true,
			taskInputRequests: func(args json.RawMessage) map[string]json.RawMessage {
				var a struct{ Filename string }
				_ = json.Unmarshal(args, &a)
				return map[string]json.RawMessage{"confirm": elicit(fmt.Sprintf("Delete %s?", a.Filename), `{"confirm":{"type":"boolean"}}`, "confirm")}
			},
		},
		{
			Tool: gateway.Tool{
				Name:        "multi_input",
				Title:       "Multiple inputs",
				Description: "Conformance fixture: a task that asks the client two questions at once (two input requests), then reports both answers.",
				InputSchema: json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`),
				Run: func(_ context.Context, call gateway.Call) (tasks.CallToolResult, error) {
					in := answers(call.Inputs)
					return fixtureText(fmt.Sprintf("Got both inputs: name %q (%s), confirm %t (%s).",
						in["name"].Content.Name, in["name"].Action, in["confirm"].Content.Confirm, in["confirm"].Action)), nil
				},
			},
			Async:        true,
			TaskRequired: true,
			taskInputRequests: func(json.RawMessage) map[string]json.RawMessage {
				return map[string]json.RawMessage{
					"name":    elicit("What is your name?", `{"name":{"type":"string"}}`, "name"),
					"confirm": elicit("Confirm the job?", `{"confirm":{"type":"boolean"}}`, "confirm"),
				}
			},
		},
		{
			Tool: gateway.Tool{
				Name:        "protocol_error_job",
				Title:       "Protocol error job",
				Description: "Conformance fixture: a job that fails with a protocol error (not a tool result) after about a second.",
				InputSchema: json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`),
				Run: func(context.Context, gateway.Call) (tasks.CallToolResult, error) {
					return tasks.CallToolResult{}, &gateway.ProtocolError{Code: -32603, Message: "protocol_error_job failed with a protocol error (by design)"}
				},
			},
			Async: true,
			delay: func(json.RawMessage) time.Duration { return failingJobDelay },
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
		panic("conformance: " + err.Error()) // only maps of plain values are passed
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
