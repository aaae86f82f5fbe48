package mcpserver

import "testing"

// TestApplicationCodesOutsideReservedRange: JSON-RPC reserves -32768 to
// -32000 (MCP defines its own codes in -32020 to -32099 and forbids
// emitting any other there), so Countersign's own codes lie outside it,
// distinct from each other and from every code the endpoint takes from the
// specifications.
func TestApplicationCodesOutsideReservedRange(t *testing.T) {
	specified := map[int64]string{
		codeParseError: "parse error", codeInvalidRequest: "invalid request", codeMethodNotFound: "method not found",
		codeInvalidParams: "invalid params", codeInternal: "internal error", codeHeaderMismatch: "header mismatch",
		codeMissingCapability: "missing capability", CodeApproval: "SEP-2672 approval",
	}
	seen := map[int64]string{}
	for _, c := range []struct {
		name string
		code int64
	}{{"CodeTooManyRequests", CodeTooManyRequests}, {"CodeTokenRefused", CodeTokenRefused}} {
		if c.code >= -32768 && c.code <= -32000 {
			t.Errorf("%s is %d, inside JSON-RPC's reserved range", c.name, c.code)
		}
		if other, ok := specified[c.code]; ok {
			t.Errorf("%s is %d, the code of %s", c.name, c.code, other)
		}
		if other, ok := seen[c.code]; ok {
			t.Errorf("%s is %d, like %s", c.name, c.code, other)
		}
		seen[c.code] = c.name
	}
}
