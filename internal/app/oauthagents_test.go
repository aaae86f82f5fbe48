package app

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/countersign/countersign/internal/authn"
	"github.com/countersign/countersign/internal/oauth"
)

// jwksOnly serves one JSON Web Key Set at any URL.
type jwksOnly []byte

func (j jwksOnly) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(string(j))), Request: r}, nil
}

// With OAuth on, a disabled agent's static token is refused with the
// OAuth challenge, which says the agent is disabled, as it says of a
// disabled OAuth principal; any other refused token learns no more.
func TestOAuthChallengeOfADisabledAgent(t *testing.T) {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key, err := jose.JSONWebKey{Key: pub, KeyID: "k1", Algorithm: "EdDSA", Use: "sig"}.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	v, err := oauth.New(context.Background(), oauth.Options{Issuer: "https://idp.example.com", Resource: "https://cs.example.com/mcp",
		JWKSURL: "https://idp.example.com/jwks", HTTPClient: &http.Client{Transport: jwksOnly(`{"keys":[` + string(key) + `]}`)}})
	if err != nil {
		t.Fatal(err)
	}
	o := oauthAgents{v: v}
	for err, disabled := range map[error]bool{authn.ErrDisabled: true, authn.ErrInvalidToken: false, errors.New("unknown token"): false} {
		status, www := o.Challenge(err)
		if status != http.StatusUnauthorized || !strings.Contains(www, `error="invalid_token"`) ||
			strings.Contains(www, `error_description="this agent is disabled at Countersign"`) != disabled {
			t.Errorf("%v: %d %q", err, status, www)
		}
	}
}
