package canon_test

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"testing"

	"github.com/countersign/countersign/internal/canon"
)

// interopVector is one SEP-2672 §4.6 vector computed independently of this
// package, by scripts/interop/sep2672-vectors.mjs with the reference
// implementation's canonicalization (npm canonicalize 3.0.0) and Node's
// SHA-256, from testdata/sep2672-inputs.json. scripts/interop.sh recomputes
// them and fails when they differ from the committed file.
type interopVector struct {
	Name          string `json:"name"`
	Tool          string `json:"tool"`
	Arguments     string `json:"arguments"`
	ServerID      string `json:"serverId"`
	Canonical     string `json:"canonical"`
	ActionHash    string `json:"actionHash"`
	Nonce         string `json:"nonce"`
	WireChallenge string `json:"wireChallenge"`
}

// TestInteropVectors checks the canonical bytes, the action hash and the
// wire challenge (nonce ‖ hash, base64url) byte for byte against the
// reference's: unicode (NFC is not applied, escapes are resolved, U+2028
// kept raw), keys sorted by UTF-16 code units, numbers in ECMAScript form
// (2^53+1 rounds to a double, -0 is 0, 1e21 switches to exponent form),
// nesting, key order and whitespace of the input, the empty object.
//
// The hash is computed from the canonical bytes with canon.HashCanonical,
// because canon.Hash refuses arguments holding a number JCS changes in value
// (2^53+1 in "big and small numbers"); for every other vector canon.Hash
// must give the same hash.
func TestInteropVectors(t *testing.T) {
	refused := map[string]bool{"big and small numbers": true}
	b, err := os.ReadFile("testdata/sep2672-vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vs []interopVector
	if err := json.Unmarshal(b, &vs); err != nil {
		t.Fatal(err)
	}
	if len(vs) < 10 {
		t.Fatalf("%d vectors, want the 10 of sep2672-inputs.json", len(vs))
	}
	for _, v := range vs {
		t.Run(v.Name, func(t *testing.T) {
			c, err := canon.Canonicalize([]byte(v.Arguments))
			if err != nil {
				t.Fatal(err)
			}
			if string(c) != v.Canonical {
				t.Errorf("canonical:\n got %s\nwant %s", c, v.Canonical)
			}
			h := canon.HashCanonical(v.Tool, c, v.ServerID)
			if h.String() != v.ActionHash {
				t.Errorf("action hash %s, want %s", h, v.ActionHash)
			}
			switch got, err := canon.Hash(v.Tool, []byte(v.Arguments), v.ServerID); {
			case refused[v.Name]:
				if !errors.Is(err, canon.ErrInexactNumber) {
					t.Errorf("canon.Hash: got %v, want the inexact number refused", err)
				}
			case err != nil:
				t.Errorf("canon.Hash: %v", err)
			case got != h:
				t.Errorf("canon.Hash %s, want %s", got, h)
			}
			nonce, err := hex.DecodeString(v.Nonce)
			if err != nil || len(nonce) != 32 {
				t.Fatalf("nonce %q", v.Nonce)
			}
			wire := base64.RawURLEncoding.EncodeToString(append(nonce, h[:]...))
			if wire != v.WireChallenge || len(wire) != 86 {
				t.Errorf("wire challenge %s, want %s", wire, v.WireChallenge)
			}
		})
	}
}
