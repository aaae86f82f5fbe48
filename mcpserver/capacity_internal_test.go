package mcpserver

import (
	"errors"
	"fmt"
	"testing"

	"github.com/countersign/countersign/passkey"
)

// TestChallengeCapacityError: a full challenges bucket answers
// approval/challenge/create with CodeTooManyRequests and a message that
// says so, not an internal error.
func TestChallengeCapacityError(t *testing.T) {
	err := fromPasskey(fmt.Errorf("%w: the bucket holds 1 bytes", passkey.ErrChallengeCapacity))
	var re *rpcError
	if !errors.As(err, &re) || re.code != CodeTooManyRequests || re.msg != msgChallengeCapacity {
		t.Fatalf("got %v", err)
	}
}
