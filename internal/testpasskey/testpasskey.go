// Package testpasskey has helpers for tests that use virtualwebauthn.
package testpasskey

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
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

// ResignClientData returns the WebAuthn assertion (PublicKeyCredential
// JSON) with its clientDataJSON rewritten by edit and signed again with
// cred: what a client, or an authenticator in another context, would
// send for that client data. The signature verifies; only the client
// data's own checks (type, challenge, origin, crossOrigin) can refuse it.
func ResignClientData(t testing.TB, assertion json.RawMessage, cred virtualwebauthn.Credential, edit func(cd map[string]any)) json.RawMessage {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(assertion, &m); err != nil {
		t.Fatal(err)
	}
	resp := m["response"].(map[string]any)
	raw, err := base64.RawURLEncoding.DecodeString(resp["clientDataJSON"].(string))
	if err != nil {
		t.Fatal(err)
	}
	var cd map[string]any
	if err := json.Unmarshal(raw, &cd); err != nil {
		t.Fatal(err)
	}
	edit(cd)
	if raw, err = json.Marshal(cd); err != nil {
		t.Fatal(err)
	}
	authData, err := base64.RawURLEncoding.DecodeString(resp["authenticatorData"].(string))
	if err != nil {
		t.Fatal(err)
	}
	cdHash := sha256.Sum256(raw)
	digest := sha256.Sum256(append(authData, cdHash[:]...))
	sig, err := cred.Key.Sign(digest[:])
	if err != nil {
		t.Fatal(err)
	}
	resp["clientDataJSON"] = base64.RawURLEncoding.EncodeToString(raw)
	resp["signature"] = base64.RawURLEncoding.EncodeToString(sig)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
