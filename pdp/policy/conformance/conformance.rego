# The conformance policy: the default policy plus the MCP conformance suite's
# fixture tools (gateway.ConformanceTools), which it allows. It is loaded only
# by `countersign dev --conformance` (pdp.WriteConformancePolicy); the
# asynchronous fixtures become tasks because their tools are Async, not
# because policy holds them for approval.
package countersign.authz

fixtures := {
	"greet", "slow_compute", "failing_job", "protocol_error_job",
	"test_tool_with_task", "confirm_delete", "multi_input",
	# the base scenarios' fixtures (gateway/conformance/base.go)
	"annotated_echo", "test_simple_text", "test_image_content",
	"test_audio_content", "test_embedded_resource",
	"test_multiple_content_types", "test_error_handling",
	"test_tool_with_progress", "test_tool_with_logging", "test_logging_tool",
	"json_schema_2020_12_tool", "test_missing_capability",
	"test_streaming_elicitation", "test_input_required_result_elicitation",
	"test_input_required_result_sampling",
	"test_input_required_result_list_roots",
	"test_input_required_result_capabilities",
	"test_input_required_result_multiple_inputs",
	"test_input_required_result_request_state",
	"test_input_required_result_tampered_state",
	"test_input_required_result_multi_round",
	# the tool list diagnostic hook of server-stateless, and the tool it toggles
	"test_trigger_tool_change", "test_dynamic_tool",
}

base := allow("conformance fixture") if tool in fixtures
