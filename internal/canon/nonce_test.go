package canon_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/countersign/countersign/internal/canon"
)

func TestDecisionNonce(t *testing.T) {
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		t.Fatal(err)
	}
	approve, err := canon.DecisionNonce(salt, "approve")
	if err != nil {
		t.Fatal(err)
	}
	deny, err := canon.DecisionNonce(salt, "deny")
	if err != nil {
		t.Fatal(err)
	}
	if len(approve) != canon.NonceSize || !bytes.Equal(approve[:16], salt) || bytes.Equal(approve, deny) {
		t.Fatalf("approve %x, deny %x", approve, deny)
	}
	for _, tc := range []struct {
		nonce []byte
		want  string
	}{
		{approve, "approve"},
		{deny, "deny"},
		{append(bytes.Clone(salt), make([]byte, 16)...), ""},
		{approve[:31], ""},
		{append(bytes.Clone(approve[:31]), approve[31]^1), ""},
	} {
		if got := canon.NonceDecision(tc.nonce, "approve", "deny"); got != tc.want {
			t.Errorf("NonceDecision(%x) = %q, want %q", tc.nonce, got, tc.want)
		}
	}
	if got := canon.NonceDecision(approve, "deny"); got != "" {
		t.Errorf("an approve nonce read as %q among deny only", got)
	}
	// A fixed vector, so that a change to the derivation is seen: an
	// audit verifier must read the nonces of chains already written. It
	// was computed apart, with
	// printf 'countersign/decision-nonce/v1\0approve\0' + 16 zero bytes | sha256sum.
	n, _ := canon.DecisionNonce(make([]byte, 16), "approve")
	if got := hex.EncodeToString(n[16:]); got != "104589d7b95e79257dfbc216b4e35ea2" {
		t.Errorf("approve over a zero salt: tag %s", got)
	}
	for _, bad := range [][]byte{nil, make([]byte, 15), make([]byte, 32)} {
		if _, err := canon.DecisionNonce(bad, "approve"); err == nil {
			t.Errorf("salt of %d bytes accepted", len(bad))
		}
	}
	if _, err := canon.DecisionNonce(salt, ""); err == nil {
		t.Error("empty decision accepted")
	}
}
