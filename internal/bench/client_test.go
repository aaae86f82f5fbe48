package bench

import (
	"testing"

	"github.com/countersign/countersign/mcpserver"
)

// TestCodeTooManyRequests: the client reads the endpoint's over-budget code.
func TestCodeTooManyRequests(t *testing.T) {
	if codeTooManyRequests != mcpserver.CodeTooManyRequests {
		t.Fatalf("codeTooManyRequests is %d, mcpserver.CodeTooManyRequests %d", codeTooManyRequests, mcpserver.CodeTooManyRequests)
	}
}
