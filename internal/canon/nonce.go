package canon

import (
	"bytes"
	"crypto/sha256"
	"errors"
)

// NonceSize is the length of a challenge nonce, the part of a wire
// challenge (nonce ‖ action hash) before the action hash.
const NonceSize = 32

// decisionSaltSize is the random half of a decision-bound nonce.
const decisionSaltSize = NonceSize / 2

// decisionNonceDomain separates the decision tag from every other hash.
const decisionNonceDomain = "countersign/decision-nonce/v1"

// DecisionNonce returns a challenge nonce bound to decision: salt (16
// random bytes) followed by the first 16 bytes of
//
//	SHA-256(utf8("countersign/decision-nonce/v1") || 0x00 || utf8(decision) || 0x00 || salt)
//
// An authenticator that signs nonce ‖ action hash thereby signs which
// decision it was asked for, so the assertion alone shows it offline: a
// signed deny cannot be recorded as an approval. The nonce is as
// unpredictable as its salt (128 bits), and to a client it is any other
// 32-byte nonce.
func DecisionNonce(salt []byte, decision string) ([]byte, error) {
	if len(salt) != decisionSaltSize {
		return nil, errors.New("canon: a decision nonce's salt is 16 bytes")
	}
	if decision == "" {
		return nil, errors.New("canon: a decision nonce needs a decision")
	}
	return append(bytes.Clone(salt), decisionTag(salt, decision)...), nil
}

// NonceDecision returns which of decisions nonce is bound to
// ([DecisionNonce]), or "" when it is bound to none of them (a random
// nonce, or one made before decisions were bound).
func NonceDecision(nonce []byte, decisions ...string) string {
	if len(nonce) != NonceSize {
		return ""
	}
	salt, tag := nonce[:decisionSaltSize], nonce[decisionSaltSize:]
	for _, d := range decisions {
		if d != "" && bytes.Equal(tag, decisionTag(salt, d)) {
			return d
		}
	}
	return ""
}

func decisionTag(salt []byte, decision string) []byte {
	h := sha256.New()
	h.Write([]byte(decisionNonceDomain))
	h.Write([]byte{0})
	h.Write([]byte(decision))
	h.Write([]byte{0})
	h.Write(salt)
	return h.Sum(nil)[:NonceSize-decisionSaltSize]
}
