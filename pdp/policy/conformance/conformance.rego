# The conformance policy: the default policy plus the MCP conformance suite's
# fixture tools (gateway.ConformanceTools), which it allows. It is loaded only
# by `countersign dev --conformance` (pdp.WriteConformancePolicy); the
# asynchronous fixtures become tasks because their tools are Async, not
# because policy holds them for approval.
package countersign.authz

fixtures := {
	"greet", "slow_compute", "failing_job", "protocol_error_job",
	"test_tool_with_task", "confirm_delete", "multi_input",
}

base := allow("conformance fixture") if tool in fixtures
