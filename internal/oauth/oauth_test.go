package oauth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/google/go-cmp/cmp"
)

const (
	testIssuer   = "https://idp.example.com"
	testResource = "https://countersign.example.com/mcp"
)

// idp is a fake authorization server (the outside world): its discovery
// document and JWKS, served through an in-memory transport so that tests
// can run in a synctest bubble. The real one (oidc-provider) is in
// internal/e2e.
type idp struct {
	t      testing.TB
	issuer string
	mu     sync.Mutex
	keys   map[string]any // kid → private key
	public []jose.JSONWebKey
	// discovery path → served; jwksFetches counts JWKS requests.
	docs        map[string]bool
	jwksFetches int
	down        bool
}

func newIdP(t testing.TB) *idp {
	p := &idp{t: t, issuer: testIssuer, keys: map[string]any{}, docs: map[string]bool{"/.well-known/openid-configuration": true}}
	p.addRSA("k1")
	return p
}

func (p *idp) addRSA(kid string) *rsa.PrivateKey {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keys[kid] = k
	p.public = append(p.public, jose.JSONWebKey{Key: &k.PublicKey, KeyID: kid, Use: "sig", Algorithm: "RS256"})
	return k
}

func (p *idp) addEC(kid string) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keys[kid] = k
	p.public = append(p.public, jose.JSONWebKey{Key: &k.PublicKey, KeyID: kid, Use: "sig", Algorithm: "ES256"})
}

// rotate replaces every key with a new RSA key kid.
func (p *idp) rotate(kid string) {
	p.mu.Lock()
	p.keys, p.public = map[string]any{}, nil
	p.mu.Unlock()
	p.addRSA(kid)
}

func (p *idp) fetches() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.jwksFetches
}

func (p *idp) RoundTrip(r *http.Request) (*http.Response, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rec := httptest.NewRecorder()
	switch {
	case p.down:
		rec.WriteHeader(http.StatusBadGateway)
	case r.URL.Path == "/jwks":
		p.jwksFetches++
		_ = json.NewEncoder(rec).Encode(jose.JSONWebKeySet{Keys: p.public})
	case p.docs[r.URL.Path]:
		_ = json.NewEncoder(rec).Encode(map[string]string{"issuer": p.issuer, "jwks_uri": "https://idp.example.com/jwks"})
	default:
		rec.WriteHeader(http.StatusNotFound)
	}
	return rec.Result(), nil
}

func (p *idp) client() *http.Client { return &http.Client{Transport: p} }

// sign makes a token with kid's key (alg RS256 or ES256 by key type) and
// claims, with typ at+jwt.
func (p *idp) sign(kid string, claims map[string]any) string {
	p.t.Helper()
	p.mu.Lock()
	key := p.keys[kid]
	p.mu.Unlock()
	alg := jose.RS256
	if _, ok := key.(*ecdsa.PrivateKey); ok {
		alg = jose.ES256
	}
	return signWith(p.t, alg, jose.JSONWebKey{Key: key, KeyID: kid}, claims)
}

func signWith(t testing.TB, alg jose.SignatureAlgorithm, key any, claims map[string]any) string {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, (&jose.SignerOptions{}).WithType("at+jwt"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(s).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// claims are a valid token's claims at now, with over applied (a nil value
// deletes the claim).
func claims(now time.Time, over map[string]any) map[string]any {
	c := map[string]any{
		"iss":       testIssuer,
		"sub":       "agent-7",
		"aud":       testResource,
		"client_id": "billing-bot",
		"scope":     "mcp:tools payments:write",
		"iat":       now.Unix(),
		"exp":       now.Add(10 * time.Minute).Unix(),
		"jti":       "j1",
		"groups":    []string{"finance"},
	}
	for k, v := range over {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	return c
}

func newVerifier(t *testing.T, p *idp, opts Options) *Verifier {
	t.Helper()
	opts.Issuer, opts.HTTPClient = p.issuer, p.client()
	if opts.Resource == "" {
		opts.Resource = testResource
	}
	v, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestVerify(t *testing.T) {
	p := newIdP(t)
	p.addEC("e1")
	v := newVerifier(t, p, Options{RequiredScopes: []string{"mcp:tools"}, Audiences: []string{"api://countersign"}, Claims: []string{"groups", "absent"}})
	now := time.Now()
	other, _ := rsa.GenerateKey(rand.Reader, 2048)
	pub := p.public[0].Key.(*rsa.PublicKey)
	for _, tc := range []struct {
		name  string
		token string
		want  string // "" valid; else the error code and description fragment
	}{
		{"valid RS256", p.sign("k1", claims(now, nil)), ""},
		{"valid ES256", p.sign("e1", claims(now, nil)), ""},
		{"configured audience", p.sign("k1", claims(now, map[string]any{"aud": []string{"other", "api://countersign"}})), ""},
		{"expired within the skew", p.sign("k1", claims(now, map[string]any{"exp": now.Add(-30 * time.Second).Unix()})), ""},
		{"wrong audience", p.sign("k1", claims(now, map[string]any{"aud": "https://elsewhere.example.com/mcp"})), "invalid_token: the access token is not meant for this resource"},
		{"no audience", p.sign("k1", claims(now, map[string]any{"aud": nil})), "invalid_token: the access token is not meant for this resource"},
		{"expired", p.sign("k1", claims(now, map[string]any{"exp": now.Add(-2 * time.Minute).Unix()})), "invalid_token: the access token expired"},
		{"no exp", p.sign("k1", claims(now, map[string]any{"exp": nil})), "invalid_token: the access token has no expiry"},
		{"nbf in the future", p.sign("k1", claims(now, map[string]any{"nbf": now.Add(5 * time.Minute).Unix()})), "invalid_token: the access token is not valid yet"},
		{"iat in the future", p.sign("k1", claims(now, map[string]any{"iat": now.Add(5 * time.Minute).Unix()})), "invalid_token: the access token was issued in the future"},
		{"other issuer", p.sign("k1", claims(now, map[string]any{"iss": "https://evil.example.com"})), "invalid_token: the access token is not from the expected issuer"},
		{"issuer with a trailing slash", p.sign("k1", claims(now, map[string]any{"iss": testIssuer + "/"})), "invalid_token: the access token is not from the expected issuer"},
		{"another key under a known kid", signWith(t, jose.RS256, jose.JSONWebKey{Key: other, KeyID: "k1"}, claims(now, nil)), "invalid_token: the access token's signature does not verify"},
		{"HS256 with the public key as secret", signWith(t, jose.HS256, jose.JSONWebKey{Key: pub.N.Bytes(), KeyID: "k1"}, claims(now, nil)), "invalid_token: the access token is not a JWS signed with an accepted algorithm"},
		{"alg none", unsigned(claims(now, nil)), "invalid_token: the access token is not a JWS signed with an accepted algorithm"},
		{"not a JWT", "csag_abcdef", "invalid_token: the access token is not a JWS"},
		{"missing scope", p.sign("k1", claims(now, map[string]any{"scope": "payments:write"})), "insufficient_scope: the access token lacks a required scope"},
		{"no scope at all", p.sign("k1", claims(now, map[string]any{"scope": nil})), "insufficient_scope"},
		{"scp list", p.sign("k1", claims(now, map[string]any{"scope": nil, "scp": []string{"mcp:tools"}})), ""},
		{"malformed scope", p.sign("k1", claims(now, map[string]any{"scope": 7})), "invalid_token: the access token's scope claim is malformed"},
		{"no sub", p.sign("k1", claims(now, map[string]any{"sub": nil})), "invalid_token: the access token's sub claim does not name a caller"},
		{"sub not a string", p.sign("k1", claims(now, map[string]any{"sub": 42})), "invalid_token: the access token's registered claims"},
		{"client_id not a string", p.sign("k1", claims(now, map[string]any{"client_id": 42})), "invalid_token: the access token's client_id claim is not a string"},
		{"sub with a control character", p.sign("k1", claims(now, map[string]any{"sub": "a\nb"})), "invalid_token: the access token's sub claim does not name a caller"},
		{"sub too long", p.sign("k1", claims(now, map[string]any{"sub": strings.Repeat("a", 257)})), "invalid_token: the access token's sub claim does not name a caller"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := v.Verify(context.Background(), tc.token, now)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if id.Principal != "oauth:agent-7" || id.ClientID != "billing-bot" || !cmp.Equal(id.Scopes[0], "mcp:tools") {
					t.Fatalf("identity %+v", id)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) || !strings.Contains(e.Code+": "+e.Description, tc.want) {
				t.Fatalf("Verify error = %v, want %q", err, tc.want)
			}
		})
	}
}

func unsigned(c map[string]any) string {
	b, _ := json.Marshal(c)
	return b64(`{"alg":"none","typ":"at+jwt"}`) + "." + b64(string(b)) + "."
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func TestProperties(t *testing.T) {
	p := newIdP(t)
	v := newVerifier(t, p, Options{PrincipalClaim: "client_id", Claims: []string{"groups", "absent"}})
	now := time.Now()
	id, err := v.Verify(context.Background(), p.sign("k1", claims(now, nil)), now)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(v.Properties(id))
	want := `{"auth":"oauth","claims":{"groups":["finance"]},"client_id":"billing-bot","issuer":"https://idp.example.com","scopes":["mcp:tools","payments:write"],"sub":"agent-7"}`
	if string(got) != want || id.Principal != "oauth:billing-bot" {
		t.Fatalf("principal %q, properties %s\nwant %s", id.Principal, got, want)
	}
	// A token without scopes still gives policy a list; azp stands in
	// for a missing client_id.
	v = newVerifier(t, p, Options{PrincipalClaim: "azp"})
	id, err = v.Verify(context.Background(), p.sign("k1", claims(now, map[string]any{"scope": nil, "client_id": nil, "azp": "web-app"})), now)
	if err != nil {
		t.Fatal(err)
	}
	if got := v.Properties(id); !cmp.Equal(got["scopes"], []any{}) || id.Principal != "oauth:web-app" || got["client_id"] != "web-app" {
		t.Fatalf("principal %q, properties %v", id.Principal, got)
	}
}

// TestPolicyClaimsBounds: the claims passed to policy are a bounded,
// checked list, and a claim value too large for policy is left out
// rather than passed on.
func TestPolicyClaimsBounds(t *testing.T) {
	p := newIdP(t)
	many := make([]string, MaxPolicyClaims+1)
	for i := range many {
		many[i] = fmt.Sprintf("c%d", i)
	}
	for _, tc := range []struct {
		name   string
		claims []string
		want   string
	}{
		{"too many", many, "at most 16 claims"},
		{"reserved", []string{"scope"}, `claim "scope" cannot be passed to policy`},
		{"aud", []string{"aud"}, `claim "aud" cannot be passed to policy`},
		{"twice", []string{"groups", "groups"}, `claim "groups" is listed twice`},
		{"empty", []string{""}, "must be 1 to 64 characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(context.Background(), Options{Issuer: p.issuer, Resource: testResource, HTTPClient: p.client(), Claims: tc.claims})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, want %q", err, tc.want)
			}
		})
	}
	v := newVerifier(t, p, Options{Claims: []string{"groups", "tenant"}})
	now := time.Now()
	id, err := v.Verify(context.Background(), p.sign("k1", claims(now, map[string]any{"groups": strings.Repeat("g", MaxClaimBytes), "tenant": "acme"})), now)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]any{"tenant": "acme"}; !cmp.Equal(id.Claims, want) {
		t.Fatalf("claims %v, want %v", id.Claims, want)
	}
}

func TestClaims(t *testing.T) {
	p := newIdP(t)
	v := newVerifier(t, p, Options{})
	now := time.Now()
	for _, tc := range []struct {
		name  string
		token string
		want  bool
	}{
		{"our issuer's JWT", p.sign("k1", claims(now, nil)), true},
		{"our issuer, alg none", unsigned(claims(now, nil)), true},
		{"another issuer's JWT", p.sign("k1", claims(now, map[string]any{"iss": "https://other.example.com"})), false},
		{"a static agent token", "csag_0123456789abcdefghijklmnopqrstuvwxyzABCD", false},
		{"three parts, not JSON", "a.b.c", false},
		{"empty", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := v.Claims(tc.token); got != tc.want {
				t.Fatalf("Claims = %v, want %v", got, tc.want)
			}
		})
	}
}

// The issuer rotates its keys: a token with the new kid makes the verifier
// fetch the key set again, once; a flood of unknown kids fetches at most
// once per JWKSMinRefresh; the set is fetched again when older than
// JWKSMaxAge; an outage keeps the keys held.
func TestKeyRotation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newIdP(t)
		v := newVerifier(t, p, Options{JWKSMinRefresh: 10 * time.Second, JWKSMaxAge: time.Hour})
		ctx := context.Background()
		verify := func(kid string) error {
			_, err := v.Verify(ctx, p.sign(kid, claims(time.Now(), nil)), time.Now())
			return err
		}
		if err := verify("k1"); err != nil || p.fetches() != 1 {
			t.Fatalf("first token: %v, %d fetches", err, p.fetches())
		}
		time.Sleep(11 * time.Second)
		p.rotate("k2")
		if err := verify("k2"); err != nil {
			t.Fatalf("token of the rotated key: %v", err)
		}
		if p.fetches() != 2 {
			t.Fatalf("%d fetches after the rotation, want 2", p.fetches())
		}
		// Unknown kids within the interval: refused without a fetch.
		p.addRSA("k3")
		for range 20 {
			if err := verify("k3"); !errors.Is(err, ErrInvalidToken) {
				t.Fatalf("unknown kid: %v", err)
			}
		}
		if p.fetches() != 2 {
			t.Fatalf("%d fetches after a flood of unknown kids, want 2", p.fetches())
		}
		time.Sleep(10 * time.Second)
		if err := verify("k3"); err != nil || p.fetches() != 3 {
			t.Fatalf("after the interval: %v, %d fetches", err, p.fetches())
		}
		// Old keys are fetched again; an outage keeps them.
		p.mu.Lock()
		p.down = true
		p.mu.Unlock()
		time.Sleep(time.Hour + time.Second)
		if err := verify("k3"); err != nil {
			t.Fatalf("issuer down, keys held: %v", err)
		}
	})
}

func TestDiscovery(t *testing.T) {
	t.Run("RFC 8414 with a path", func(t *testing.T) {
		p := newIdP(t)
		p.issuer = testIssuer + "/tenant"
		p.docs = map[string]bool{"/.well-known/oauth-authorization-server/tenant": true}
		v := newVerifier(t, p, Options{})
		if _, err := v.Verify(context.Background(), p.sign("k1", claims(time.Now(), map[string]any{"iss": p.issuer})), time.Now()); err != nil {
			t.Fatal(err)
		}
	})
	for _, tc := range []struct {
		name   string
		mutate func(p *idp)
		opts   Options
		want   string
	}{
		{"issuer mismatch", func(p *idp) { p.issuer = testIssuer + "/" }, Options{Issuer: testIssuer}, `names issuer "https://idp.example.com/", not "https://idp.example.com"`},
		{"no document", func(p *idp) { p.docs = nil }, Options{}, "no discovery document"},
		{"issuer down", func(p *idp) { p.down = true }, Options{}, "HTTP 502"},
		{"http issuer", nil, Options{Issuer: "http://idp.example.com"}, "must be an https URL (http only on a loopback host)"},
		{"HS256 allowed", nil, Options{Algorithms: []string{"HS256"}}, `algorithm "HS256" is not accepted`},
		{"no resource", nil, Options{Resource: "/mcp"}, "the resource"},
		{"skew too large", nil, Options{ClockSkew: time.Hour}, "the clock skew 1h0m0s must be from 0s to 10m0s"},
		{"bad scope", nil, Options{RequiredScopes: []string{`a"b`}}, `scope "a\"b" is not a valid scope token`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newIdP(t)
			if tc.mutate != nil {
				tc.mutate(p)
			}
			opts := tc.opts
			if opts.Issuer == "" {
				opts.Issuer = p.issuer
			}
			if opts.Resource == "" {
				opts.Resource = testResource
			}
			opts.HTTPClient = p.client()
			_, err := New(context.Background(), opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New error = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestChallenge(t *testing.T) {
	p := newIdP(t)
	v := newVerifier(t, p, Options{RequiredScopes: []string{"mcp:tools", "mcp:tasks"}})
	bare := newVerifier(t, p, Options{})
	const meta = `resource_metadata="https://countersign.example.com/.well-known/oauth-protected-resource/mcp"`
	for _, tc := range []struct {
		name       string
		v          *Verifier
		err        error
		wantStatus int
		want       string
	}{
		{"no token", v, nil, 401, `Bearer scope="mcp:tools mcp:tasks", ` + meta},
		{"no token, no scopes", bare, nil, 401, `Bearer ` + meta},
		{"invalid", v, invalid(`the access token "expired"`, errors.New("cause")), 401,
			`Bearer error="invalid_token", error_description="the access token expired", scope="mcp:tools mcp:tasks", ` + meta},
		{"not ours", v, errors.New("authn: invalid token"), 401,
			`Bearer error="invalid_token", error_description="the access token is not valid", scope="mcp:tools mcp:tasks", ` + meta},
		{"insufficient scope", v, &Error{Code: CodeInsufficientScope, Description: "the access token lacks a required scope"}, 403,
			`Bearer error="insufficient_scope", error_description="the access token lacks a required scope", scope="mcp:tools mcp:tasks", ` + meta},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, h := tc.v.Challenge(tc.err)
			if status != tc.wantStatus || h != tc.want {
				t.Fatalf("Challenge = %d %s\nwant %d %s", status, h, tc.wantStatus, tc.want)
			}
		})
	}
}

func TestMetadata(t *testing.T) {
	p := newIdP(t)
	v := newVerifier(t, p, Options{RequiredScopes: []string{"mcp:tools"}, Algorithms: []string{"RS256"}})
	if got, want := v.MetadataPaths(), []string{MetadataPath, MetadataPath + "/mcp"}; !cmp.Equal(got, want) {
		t.Fatalf("paths %v, want %v", got, want)
	}
	srv := httptest.NewServer(v.MetadataHandler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + MetadataPath + "/mcp")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	want := `{"resource":"https://countersign.example.com/mcp","authorization_servers":["https://idp.example.com"],"scopes_supported":["mcp:tools"],"bearer_methods_supported":["header"],"resource_name":"Countersign","resource_signing_alg_values_supported":["RS256"]}`
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || string(b) != want {
		t.Fatalf("%d %s %s\nwant %s", resp.StatusCode, resp.Header.Get("Content-Type"), b, want)
	}
	resp2, err := http.Post(srv.URL+MetadataPath, "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %d", resp2.StatusCode)
	}
}

// FuzzVerify: no input panics, and only the issuer's own claims verify.
func FuzzVerify(f *testing.F) {
	p := newIdP(f)
	now := time.Now()
	f.Add(p.sign("k1", claims(now, nil)))
	f.Add(unsigned(claims(now, nil)))
	f.Add("a.b.c")
	f.Add("eyJhbGciOiJSUzI1NiJ9.e30.")
	v, err := New(context.Background(), Options{Issuer: testIssuer, Resource: testResource, HTTPClient: p.client()})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, token string) {
		v.Claims(token)
		id, err := v.Verify(context.Background(), token, now)
		if err == nil && id.Principal != "oauth:agent-7" {
			t.Fatalf("verified a token the issuer did not sign: %q", token)
		}
	})
}
