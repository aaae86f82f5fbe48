// Package testpasskey has helpers for tests that use virtualwebauthn.
package testpasskey

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"testing"

	"github.com/descope/virtualwebauthn"
)

// NewEC2Credential returns a virtual P-256 credential whose public key
// coordinates are both a full 32 bytes. virtualwebauthn v1.0.3 encodes them
// with big.Int.Bytes(), which drops leading zero bytes (about 1 key in 64),
// and go-webauthn rightly rejects such a COSE key at registration: without
// this, tests that enroll passkeys flake.
func NewEC2Credential() virtualwebauthn.Credential {
	for {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		pub, err := k.PublicKey.Bytes() // 0x04 || X || Y
		if err != nil {
			panic(err)
		}
		if pub[1] == 0 || pub[33] == 0 {
			continue
		}
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			panic(err)
		}
		return virtualwebauthn.NewCredentialWithImportedKey(virtualwebauthn.KeyTypeEC2, der)
	}
}

// FlipSignature returns the WebAuthn assertion (PublicKeyCredential JSON)
// with one character of its signature changed: the same shape, a signature
// that no longer verifies.
func FlipSignature(t testing.TB, assertion json.RawMessage) json.RawMessage {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(assertion, &m); err != nil {
		t.Fatal(err)
	}
	resp := m["response"].(map[string]any)
	sig := []byte(resp["signature"].(string))
	if sig[10] == 'A' {
		sig[10] = 'B'
	} else {
		sig[10] = 'A'
	}
	resp["signature"] = string(sig)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
