package txtoken

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// FuzzParse feeds arbitrary strings to the token parser: it never panics,
// every failure is a rejection with a known reason (the key resolver here
// never fails), and what it accepts verified under the one key.
func FuzzParse(f *testing.F) {
	_, k, _ := ed25519.GenerateKey(rand.Reader)
	pub := k.Public().(ed25519.PublicKey)
	kid := KeyID(pub)
	now := time.Now().Unix()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: k}, (&jose.SignerOptions{}).WithHeader(jose.HeaderKey("kid"), kid))
	if err != nil {
		f.Fatal(err)
	}
	jws, _ := s.Sign([]byte(`{"iss":"s","sub":"p","aud":"s","exp":` + itoa(now+60) + `,"iat":` + itoa(now) + `,"jti":"txt_` + strings.Repeat("0", 32) + `","mcp":{"tool":"t","parameters_hash":"` + strings.Repeat("a", 64) + `"}}`))
	good, _ := jws.CompactSerialize()
	for _, seed := range []string{good, "", ".", "..", "a.b.c", "eyJhbGciOiJub25lIn0.e30.", good + "x", strings.Replace(good, ".", "..", 1), "{\"payload\":\"\"}"} {
		f.Add(seed)
	}
	known := map[string]bool{ReasonMalformed: true, ReasonUnsupportedAlg: true, ReasonUnknownKey: true, ReasonBadSignature: true, ReasonBadClaims: true}
	f.Fuzz(func(t *testing.T, raw string) {
		c, err := Parse(raw, func(id string) (ed25519.PublicKey, error) {
			if id == kid {
				return pub, nil
			}
			return nil, errUnknownKey
		})
		if err != nil {
			var rej *Error
			if !errors.As(err, &rej) || !known[rej.Reason] || rej.ErrorType == "" || rej.JTI != "" {
				t.Fatalf("Parse(%q): %v", raw, err)
			}
			return
		}
		if c.ID == "" || c.MCP.Tool == "" || !jtiRE.MatchString(c.ID) {
			t.Fatalf("accepted claims %+v", c)
		}
	})
}

func itoa(n int64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}
