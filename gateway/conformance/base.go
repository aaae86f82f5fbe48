package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/tasks"
)

// The base scenarios' fixtures (tools-call-*, json-schema-2020-12,
// http-*-validation, server-stateless, input-required-result-*): tools
// that policy allows and that answer inline.
//
//   - annotated_echo {text?}: echoes text; text carries x-mcp-header "Text"
//     (SEP-2243), so a 2026-07-28 client mirrors it into Mcp-Param-Text and
//     the server checks the two agree. It sorts first in tools/list, where
//     http-header-validation calls the first tool with no arguments.
//   - test_simple_text, test_image_content, test_audio_content,
//     test_embedded_resource, test_multiple_content_types: one kind of
//     content each (the last: text, image and resource).
//   - test_error_handling: a tool execution error (isError).
//   - test_tool_with_progress: progress 0, 50, 100 of 100, ~50 ms apart,
//     when the request carries a progress token.
//   - test_tool_with_logging, test_logging_tool: three info log messages
//     ~50 ms apart, sent only when the client can hear them.
//   - json_schema_2020_12_tool: an input schema with 2020-12 keywords
//     ($schema, $defs, $anchor, $ref, allOf/anyOf, if/then/else).
//   - test_missing_capability: needs the client's sampling capability
//     (2026-07-28: -32021 without it).
//   - test_streaming_elicitation, test_input_required_result_elicitation,
//     _sampling, _list_roots, _capabilities: SEP-2322 input requests
//     (elicitation, sampling, roots), then a result built from the answers.
//   - test_input_required_result_multiple_inputs, _request_state,
//     _tampered_state, _multi_round: the same, with a requestState; the
//     last asks in two rounds.

// PNG is a 1×1 red pixel; WAV is eight samples of 8 kHz, 8-bit silence.
const (
	fixturePNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
	fixtureWAV = "UklGRiwAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQgAAACAgICAgICAgA=="
)

// noteInterval is the pause between a fixture's notifications ("~50ms").
const noteInterval = 50 * time.Millisecond

// emptySchema takes no arguments.
var emptySchema = json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`)

// content returns a fixture that answers with fixed content.
func content(name, description string, items ...json.RawMessage) Fixture {
	return Fixture{Tool: gateway.Tool{
		Name: name, Description: "Conformance fixture: " + description, InputSchema: emptySchema, ReadOnly: true,
		Run: func(context.Context, gateway.Call) (tasks.CallToolResult, error) {
			return tasks.CallToolResult{Content: items}, nil
		},
	}}
}

func image() json.RawMessage {
	return mustJSON(map[string]string{"type": "image", "data": fixturePNG, "mimeType": "image/png"})
}

func resource(uri, mimeType, text string) json.RawMessage {
	return mustJSON(map[string]any{"type": "resource", "resource": map[string]string{"uri": uri, "mimeType": mimeType, "text": text}})
}

// pause waits d, or until ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// logging is a fixture that sends three log messages while it runs.
func logging(name string) Fixture {
	return Fixture{
		Tool: gateway.Tool{
			Name: name, Description: "Conformance fixture: sends three info log messages ~50 ms apart, then returns.", InputSchema: emptySchema, ReadOnly: true,
			Run: func(ctx context.Context, call gateway.Call) (tasks.CallToolResult, error) {
				call.Log("info", "Tool execution started")
				if err := pause(ctx, noteInterval); err != nil {
					return tasks.CallToolResult{}, err
				}
				call.Log("info", "Tool processing data")
				if err := pause(ctx, noteInterval); err != nil {
					return tasks.CallToolResult{}, err
				}
				call.Log("info", "Tool execution completed")
				return fixtureText("Tool with logging executed successfully"), nil
			},
		},
		Notifies: true,
	}
}

// asking is a fixture that asks its client for input (SEP-2322) and then
// reports the answers it got.
func asking(name string, requests map[string]json.RawMessage) Fixture {
	return Fixture{
		Tool: gateway.Tool{
			Name: name, Description: "Conformance fixture: asks the client for input (input requests), then reports the answers.", InputSchema: emptySchema, ReadOnly: true,
			Run: func(_ context.Context, call gateway.Call) (tasks.CallToolResult, error) {
				if r, ok := answers(call.Inputs)["user_name"]; ok && r.Content.Name != "" {
					return fixtureText("Hello, " + r.Content.Name + "!"), nil
				}
				var got map[string]json.RawMessage
				_ = json.Unmarshal(call.Inputs, &got)
				keys := make([]string, 0, len(got))
				for k := range got {
					keys = append(keys, k)
				}
				return fixtureText(fmt.Sprintf("Received %d input response(s): %v", len(got), keys)), nil
			},
		},
		inputRequests: func(json.RawMessage) map[string]json.RawMessage { return requests },
	}
}

func sampling(text string, maxTokens int) json.RawMessage {
	return mustJSON(map[string]any{"method": "sampling/createMessage", "params": map[string]any{
		"messages":  []any{map[string]any{"role": "user", "content": map[string]string{"type": "text", "text": text}}},
		"maxTokens": maxTokens,
	}})
}

var listRoots = json.RawMessage(`{"method":"roots/list","params":{}}`)

func baseFixtures() []Fixture {
	return []Fixture{
		{Tool: gateway.Tool{
			Name:        "annotated_echo",
			Description: "Conformance fixture: echoes text, which clients mirror into the Mcp-Param-Text header (x-mcp-header).",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string","maxLength":1000,"x-mcp-header":"Text"}},"additionalProperties":false}`),
			ReadOnly:    true,
			Run: func(_ context.Context, call gateway.Call) (tasks.CallToolResult, error) {
				var a struct{ Text string }
				_ = json.Unmarshal(call.Arguments, &a) // validated against the schema first
				return fixtureText("Echo: " + a.Text), nil
			},
		}},
		content("test_simple_text", "returns one text content.", tasks.TextContent("This is a simple text response for testing.")),
		content("test_image_content", "returns one image content (a 1×1 PNG).", image()),
		content("test_audio_content", "returns one audio content (a short WAV).",
			mustJSON(map[string]string{"type": "audio", "data": fixtureWAV, "mimeType": "audio/wav"})),
		content("test_embedded_resource", "returns one embedded resource.",
			resource("test://embedded-resource", "text/plain", "This is an embedded resource content.")),
		content("test_multiple_content_types", "returns text, image and resource content.",
			tasks.TextContent("Multiple content types test:"), image(),
			resource("test://mixed-content-resource", "application/json", `{"test":"data","value":123}`)),
		{Tool: gateway.Tool{
			Name: "test_error_handling", Description: "Conformance fixture: always fails with a tool execution error.", InputSchema: emptySchema, ReadOnly: true,
			Run: func(context.Context, gateway.Call) (tasks.CallToolResult, error) {
				return tasks.CallToolResult{Content: []json.RawMessage{tasks.TextContent("This tool intentionally returns an error for testing")}, IsError: true}, nil
			},
		}},
		{Tool: gateway.Tool{
			Name: "test_tool_with_progress", Description: "Conformance fixture: reports progress 0, 50 and 100 of 100, ~50 ms apart.", InputSchema: emptySchema, ReadOnly: true,
			Run: func(ctx context.Context, call gateway.Call) (tasks.CallToolResult, error) {
				for i, p := range []float64{0, 50, 100} {
					if i > 0 {
						if err := pause(ctx, noteInterval); err != nil {
							return tasks.CallToolResult{}, err
						}
					}
					call.ReportProgress(p, 100, "")
				}
				return fixtureText("Tool with progress executed successfully"), nil
			},
		}},
		logging("test_tool_with_logging"),
		logging("test_logging_tool"),
		{Tool: gateway.Tool{
			Name:        "json_schema_2020_12_tool",
			Description: "Tool with JSON Schema 2020-12 features",
			InputSchema: json.RawMessage(`{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object",` +
				`"$defs":{"address":{"$anchor":"addressDef","type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"}}}},` +
				`"properties":{"name":{"type":"string"},"address":{"$ref":"#/$defs/address"},"contactMethod":{"type":"string","enum":["phone","email"]},"phone":{"type":"string"},"email":{"type":"string"}},` +
				`"allOf":[{"anyOf":[{"required":["phone"]},{"required":["email"]}]}],` +
				`"if":{"properties":{"contactMethod":{"const":"phone"}},"required":["contactMethod"]},"then":{"required":["phone"]},"else":{"required":["email"]},` +
				`"additionalProperties":false}`),
			ReadOnly: true,
			Run: func(_ context.Context, call gateway.Call) (tasks.CallToolResult, error) {
				return fixtureText("Received " + string(call.Arguments)), nil
			},
		}},
		{
			Tool: gateway.Tool{
				Name: "test_missing_capability", Description: "Conformance fixture: needs the client's sampling capability.", InputSchema: emptySchema, ReadOnly: true,
				Run: func(context.Context, gateway.Call) (tasks.CallToolResult, error) {
					return fixtureText("The client declared sampling."), nil
				},
			},
			RequiresCapability: "sampling",
		},
		asking("test_streaming_elicitation", map[string]json.RawMessage{"user_name": elicit("What is your name?", `{"name":{"type":"string"}}`, "name")}),
		asking("test_input_required_result_elicitation", map[string]json.RawMessage{"user_name": elicit("What is your name?", `{"name":{"type":"string"}}`, "name")}),
		asking("test_input_required_result_sampling", map[string]json.RawMessage{"capital_question": sampling("What is the capital of France?", 100)}),
		asking("test_input_required_result_list_roots", map[string]json.RawMessage{"client_roots": listRoots}),
		asking("test_input_required_result_capabilities", map[string]json.RawMessage{
			"user_name":        elicit("What is your name?", `{"name":{"type":"string"}}`, "name"),
			"capital_question": sampling("What is the capital of France?", 100),
		}),
		askingInRounds("test_input_required_result_multiple_inputs", map[string]json.RawMessage{
			"user_name":    elicit("What is your name?", `{"name":{"type":"string"}}`, "name"),
			"greeting":     sampling("Generate a greeting", 50),
			"client_roots": listRoots,
		}),
		askingInRounds("test_input_required_result_request_state", map[string]json.RawMessage{
			"confirm": elicit("Please confirm", `{"ok":{"type":"boolean"}}`, "ok"),
		}),
		askingInRounds("test_input_required_result_tampered_state", map[string]json.RawMessage{
			"confirm": elicit("Please confirm", `{"ok":{"type":"boolean"}}`, "ok"),
		}),
		askingInRounds("test_input_required_result_multi_round",
			map[string]json.RawMessage{"step1": elicit("Step 1: What is your name?", `{"name":{"type":"string"}}`, "name")},
			map[string]json.RawMessage{"step2": elicit("Step 2: What is your favorite color?", `{"color":{"type":"string"}}`, "color")},
		),
	}
}

// askingInRounds is an asking fixture that asks in rounds, each once the
// previous is answered, with a requestState (Fixture.InputRounds).
func askingInRounds(name string, rounds ...map[string]json.RawMessage) Fixture {
	f := asking(name, nil)
	f.inputRequests = nil
	f.inputRounds = func(json.RawMessage) []map[string]json.RawMessage { return rounds }
	return f
}
