// Package canon canonicalizes tool arguments with RFC 8785 (JCS) and derives
// the SEP-2672 §4.6 action hash that binds an approval to one exact call.
//
// The action hash is
//
//	SHA-256(utf8(tool) || 0x00 || JCS(arguments) || 0x00 || utf8(serverID))
//
// computed over the arguments exactly as received: no schema defaults, no
// coercion. Both the challenge an approver signs and the envelope the workflow
// executes are bound to this value.
package canon

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/gowebpki/jcs"
)

// HashSize is the length of an action hash in bytes.
const HashSize = sha256.Size

// ActionHash is a SEP-2672 action hash.
type ActionHash [HashSize]byte

// String returns the lowercase hex form used in envelopes, logs and audit records.
func (h ActionHash) String() string { return hex.EncodeToString(h[:]) }

// IsZero reports whether h is the zero value.
func (h ActionHash) IsZero() bool { return h == ActionHash{} }

// ParseActionHash parses the hex form produced by [ActionHash.String].
func ParseActionHash(s string) (ActionHash, error) {
	var h ActionHash
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != HashSize {
		return h, fmt.Errorf("canon: action hash must be %d hex characters", 2*HashSize)
	}
	copy(h[:], b)
	return h, nil
}

// ErrEmptyServerID is returned when no server identifier is given: SEP-2672
// forbids a constant or empty serverId because it enables cross-server replay.
var ErrEmptyServerID = errors.New("canon: server id must not be empty")

// Canonicalize returns the RFC 8785 form of a JSON value. Empty input is
// treated as the empty object, which is how MCP clients omit arguments.
func Canonicalize(raw []byte) ([]byte, error) {
	if len(raw) == 0 {
		return []byte("{}"), nil
	}
	out, err := jcs.Transform(raw)
	if err != nil {
		return nil, fmt.Errorf("canon: arguments are not valid JSON: %w", err)
	}
	return out, nil
}

// Hash computes the action hash of a call. args is the raw JSON of the
// arguments object as received.
func Hash(tool string, args []byte, serverID string) (ActionHash, error) {
	if serverID == "" {
		return ActionHash{}, ErrEmptyServerID
	}
	c, err := Canonicalize(args)
	if err != nil {
		return ActionHash{}, err
	}
	return HashCanonical(tool, c, serverID), nil
}

// HashCanonical computes the action hash from already canonical arguments.
func HashCanonical(tool string, canonicalArgs []byte, serverID string) ActionHash {
	h := sha256.New()
	h.Write([]byte(tool))
	h.Write([]byte{0})
	h.Write(canonicalArgs)
	h.Write([]byte{0})
	h.Write([]byte(serverID))
	var out ActionHash
	h.Sum(out[:0])
	return out
}
