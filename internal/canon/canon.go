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
//
// JCS writes every number as the IEEE-754 double nearest to it, so two
// literals that round to the same double, 9007199254740993 and
// 9007199254740992, would hash the same although a tool that parses numbers
// exactly sees two values. [Hash] therefore refuses, with a [*NumberError],
// arguments holding a number whose exact decimal value differs from the value
// of its JCS form (I-JSON, RFC 7493 §2.2). For the arguments it accepts,
// equal hashes mean equal JSON values, numbers compared by their exact value
// (100, 100.0 and 1.0e2 are one value). 0.1 is accepted (JCS writes 0.1),
// 0.10000000000000000001 is not. -0 is accepted and hashes as 0: it is
// numerically zero, and RFC 8785 writes it as 0. [Canonicalize] is RFC 8785
// alone, as the reference implementation computes it.
package canon

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

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
// arguments object as received. Arguments holding a number that JCS would
// change in value are refused with a [*NumberError] (see the package
// documentation).
func Hash(tool string, args []byte, serverID string) (ActionHash, error) {
	if serverID == "" {
		return ActionHash{}, ErrEmptyServerID
	}
	c, err := Canonicalize(args)
	if err != nil {
		return ActionHash{}, err
	}
	if err := checkNumbers(args); err != nil {
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

// ErrInexactNumber matches every [*NumberError] with [errors.Is].
var ErrInexactNumber = errors.New("canon: number is not exactly representable as an IEEE-754 double")

// NumberError reports a number of the arguments whose exact value differs
// from the value of its JCS form, the IEEE-754 double nearest to it.
type NumberError struct {
	// Pointer locates the number in the arguments (RFC 6901; "" is the
	// whole document).
	Pointer string
	// Literal is the number as received, cut to 32 bytes.
	Literal string
	// Nearest is its JCS form: what the action hash would bind.
	Nearest string
}

func (e *NumberError) Error() string {
	return fmt.Sprintf("canon: number %s at %q is not exactly representable as an IEEE-754 double (nearest: %s)",
		e.Literal, e.Pointer, e.Nearest)
}

// Is reports whether target is [ErrInexactNumber].
func (e *NumberError) Is(target error) bool { return target == ErrInexactNumber }

// checkNumbers returns a [*NumberError] for the first number of the JSON
// document raw whose exact decimal value differs from that of its RFC 8785
// form, and nil when there is none. raw must be valid JSON, as [Canonicalize]
// checks. The comparison is exact and takes time linear in the literal's
// length, whatever its exponent.
func checkNumbers(raw []byte) error {
	n := 0 // numbers seen, in document order
	for i := 0; i < len(raw); {
		switch c := raw[i]; {
		case c == '"':
			for i++; i < len(raw) && raw[i] != '"'; i++ {
				if raw[i] == '\\' {
					i++
				}
			}
			i++
		case c == '-' || '0' <= c && c <= '9':
			j := i + 1
			for j < len(raw) && strings.IndexByte("0123456789.eE+-", raw[j]) >= 0 {
				j++
			}
			lit := string(raw[i:j])
			nearest, err := jcsNumber(lit)
			if err != nil {
				return fmt.Errorf("canon: number at %q: %w", numberPointer(raw, n), err)
			}
			if decimalOf(lit) != decimalOf(nearest) {
				if len(lit) > 32 {
					lit = lit[:32] + "…"
				}
				return &NumberError{Pointer: numberPointer(raw, n), Literal: lit, Nearest: nearest}
			}
			n++
			i = j
		default:
			i++
		}
	}
	return nil
}

// numberPointer returns the RFC 6901 JSON Pointer of the nth number (from
// 0, in document order) of the valid JSON document raw.
func numberPointer(raw []byte, nth int) string {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	// path holds one frame per open container: the current member name of
	// an object, or the index of the current element of an array.
	type frame struct {
		array bool
		index int
		key   string
	}
	var path []frame
	expectKey := false
	for {
		tok, err := d.Token()
		if err != nil {
			return ""
		}
		if expectKey {
			if k, ok := tok.(string); ok {
				path[len(path)-1].key = k
				expectKey = false
				continue
			}
		}
		switch t := tok.(type) {
		case json.Delim:
			if t == '{' || t == '[' {
				path = append(path, frame{array: t == '['})
				expectKey = t == '{'
				continue
			}
			path = path[:len(path)-1]
		case json.Number:
			if nth == 0 {
				var b strings.Builder
				for _, f := range path {
					b.WriteByte('/')
					if f.array {
						b.WriteString(strconv.Itoa(f.index))
					} else {
						b.WriteString(pointerEscaper.Replace(f.key))
					}
				}
				return b.String()
			}
			nth--
		}
		// A value ended: an array moves to its next element, an object
		// expects its next key.
		if len(path) > 0 {
			f := &path[len(path)-1]
			f.index++
			expectKey = !f.array
		}
	}
}

var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// jcsNumber returns the RFC 8785 form of the JSON number lit.
func jcsNumber(lit string) (string, error) {
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil {
		return "", errors.New("out of range")
	}
	return jcs.NumberToJSON(f)
}

// decimal is the exact value of a JSON number: (-1)^neg × digits ×
// 10^exp, with digits free of leading and trailing zeros. Zero, of either
// sign, is the zero value.
type decimal struct {
	neg    bool
	digits string
	exp    int64
}

// maxExp bounds the exponent decimalOf reads. A literal with a larger
// exponent (and fewer than 2^39 digits) is zero or far outside the range of
// a double, whose JCS forms have exponents within a few hundred of 0, so
// saturating it keeps comparisons exact.
const maxExp = 1 << 40

// decimalOf returns the exact value of s, an RFC 8259 number.
func decimalOf(s string) decimal {
	var v decimal
	if strings.HasPrefix(s, "-") {
		v.neg = true
		s = s[1:]
	}
	mant, expPart := s, ""
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant, expPart = s[:i], s[i+1:]
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	if expPart != "" {
		neg := expPart[0] == '-'
		expPart = strings.TrimLeft(strings.TrimLeft(expPart, "+-"), "0")
		if len(expPart) > 12 {
			v.exp = maxExp
		} else if expPart != "" {
			v.exp, _ = strconv.ParseInt(expPart, 10, 64)
			v.exp = min(v.exp, maxExp)
		}
		if neg {
			v.exp = -v.exp
		}
	}
	digits := strings.TrimLeft(intPart+frac, "0")
	v.exp -= int64(len(frac))
	trimmed := strings.TrimRight(digits, "0")
	v.exp += int64(len(digits) - len(trimmed))
	v.digits = trimmed
	if v.digits == "" {
		return decimal{}
	}
	return v
}
