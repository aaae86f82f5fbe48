package txtoken

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/internal/testnats"
)

const serverID = "https://countersign.test"

// fixture is a Service over a real embedded NATS with a signing audit log.
type fixture struct {
	js   jetstream.JetStream
	log  *audit.Log
	keys *audit.Keyring
	svc  *Service
	now  atomic.Pointer[time.Time]
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	js, _ := testnats.Start(t)
	return newFixtureOn(t, js, serverID)
}

// newFixtureOn opens another Service (a replica) on js.
func newFixtureOn(t *testing.T, js jetstream.JetStream, id string) *fixture {
	t.Helper()
	ctx := context.Background()
	keys, err := audit.OpenKeyring(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l, err := audit.Open(ctx, js, audit.Options{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{js: js, log: l, keys: keys}
	now := time.Now()
	f.now.Store(&now)
	f.svc, err = Open(ctx, js, Options{ServerID: id, Audit: l, Now: func() time.Time { return *f.now.Load() }})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) advance(d time.Duration) {
	n := f.now.Load().Add(d)
	f.now.Store(&n)
}

var args = json.RawMessage(`{"amount": 5000, "to": "acct-1"}`)

func hashOf(t *testing.T, tool string, a json.RawMessage) string {
	t.Helper()
	h, err := canon.Hash(tool, a, serverID)
	if err != nil {
		t.Fatal(err)
	}
	return h.String()
}

func (f *fixture) issue(t *testing.T) Issued {
	t.Helper()
	is, err := f.svc.Issue(context.Background(), Request{Principal: "agent-a", Tool: "transfer_funds", Arguments: args, IssuedBy: "agent:agent-a"})
	if err != nil {
		t.Fatal(err)
	}
	return is
}

func expect(t *testing.T) Expect {
	return Expect{Principal: "agent-a", Tool: "transfer_funds", ActionHash: hashOf(t, "transfer_funds", args)}
}

// consumed reports whether jti's consumption entry exists.
func (f *fixture) consumed(t *testing.T, jti string) bool {
	t.Helper()
	_, err := f.svc.used.Get(context.Background(), jti)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// chain checks the token's audit chain and returns its kinds.
func (f *fixture) chain(t *testing.T, id string, others ...*fixture) []string {
	t.Helper()
	lines, err := f.log.Chain(context.Background(), id)
	if err != nil {
		t.Fatalf("chain %s: %v", id, err)
	}
	keys := f.keys.PublicKeys()
	for _, o := range others {
		keys = append(keys, o.keys.PublicKeys()...)
	}
	v, recs, err := audit.CheckChain(id, lines, audit.CheckOptions{Keys: keys})
	if err != nil || !v.OK {
		t.Fatalf("chain %s: %v %v", id, err, v.Problems)
	}
	var kinds []string
	for _, r := range recs {
		kinds = append(kinds, r.Kind)
	}
	return kinds
}

func TestIssueAndRedeemOnce(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	is := f.issue(t)
	if is.ExpiresAt.Sub(is.IssuedAt) > MaxLifetime || is.KeyID != f.svc.CurrentKeyID() || is.ParametersHash != hashOf(t, "transfer_funds", args) {
		t.Fatalf("issued %+v", is)
	}
	// The claims as the RFC names them.
	c, err := Parse(is.Token, func(kid string) (ed25519.PublicKey, error) { return f.svc.publicKey(ctx, kid) })
	if err != nil {
		t.Fatal(err)
	}
	if c.Subject != "agent-a" || c.Audience != serverID || c.Issuer != serverID || c.ID != is.JTI || c.MCP.Tool != "transfer_funds" || c.Expiry-c.IssuedAt != 60 {
		t.Fatalf("claims %+v", c)
	}
	if f.consumed(t, is.JTI) {
		t.Fatal("consumed before use")
	}
	r, err := f.svc.Redeem(ctx, is.Token, expect(t))
	if err != nil {
		t.Fatal(err)
	}
	r.Finish(ctx, "executed", map[string]any{"content": []any{}})
	if !f.consumed(t, is.JTI) {
		t.Fatal("not consumed")
	}
	_, err = f.svc.Redeem(ctx, is.Token, expect(t))
	var rej *Error
	if !errors.As(err, &rej) || rej.ErrorType != TypeTokenConsumed || rej.Reason != ReasonAlreadyUsed || rej.JTI != is.JTI {
		t.Fatalf("replay: %v", err)
	}
	if !errors.Is(err, &Error{ErrorType: TypeTokenConsumed}) || !errors.Is(err, &Error{Reason: ReasonAlreadyUsed}) ||
		errors.Is(err, &Error{ErrorType: TypeTokenExpired}) || errors.Is(err, &Error{}) {
		t.Fatalf("Is by code: %v", err)
	}
	got := strings.Join(f.chain(t, is.JTI), ",")
	if got != "token-issued,token-consumed,token-result,token-rejected" {
		t.Fatalf("chain %s", got)
	}
}

// signWith signs claims with key under kid and alg.
func signWith(t *testing.T, key any, alg jose.SignatureAlgorithm, kid string, claims any) string {
	t.Helper()
	opts := (&jose.SignerOptions{}).WithType("JWT")
	if kid != "" {
		opts = opts.WithHeader(jose.HeaderKey("kid"), kid)
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, opts)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(claims)
	jws, err := s.Sign(b)
	if err != nil {
		t.Fatal(err)
	}
	out, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestRejections(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	// A replica of another deployment: its own NATS, its own key.
	foreign := newFixture(t)
	// A service on the same key bucket but another server ID.
	other := newFixtureOn(t, f.js, "https://other.test")
	_, strayKey, _ := ed25519.GenerateKey(rand.Reader)

	valid := func() Claims {
		now := time.Now().Unix()
		return Claims{Issuer: serverID, Subject: "agent-a", Audience: serverID, IssuedAt: now, Expiry: now + 30,
			ID: newID("txt_"), MCP: MCP{Tool: "transfer_funds", ParametersHash: hashOf(t, "transfer_funds", args)}}
	}
	own := func(c any) string {
		priv, err := f.svc.privateKey(ctx, f.svc.CurrentKeyID())
		if err != nil {
			t.Fatal(err)
		}
		return signWith(t, priv, jose.EdDSA, f.svc.CurrentKeyID(), c)
	}
	changed := json.RawMessage(`{"amount": 50000, "to": "acct-1"}`)
	cases := []struct {
		name    string
		token   func() string
		x       func() Expect
		typ     string
		reason  string
		skipJTI bool // the token never verified
	}{
		{"changed parameters", func() string { return f.issue(t).Token },
			func() Expect { x := expect(t); x.ActionHash = hashOf(t, "transfer_funds", changed); return x }, TypeParameterMismatch, ReasonParameterChanged, false},
		{"another principal", func() string { return f.issue(t).Token },
			func() Expect { x := expect(t); x.Principal = "agent-b"; return x }, TypePermissionDenied, ReasonWrongSubject, false},
		{"another tool", func() string { return f.issue(t).Token },
			func() Expect { x := expect(t); x.Tool = "delete_records"; return x }, TypePermissionDenied, ReasonWrongTool, false},
		{"foreign key", func() string { return foreign.issue(t).Token }, func() Expect { return expect(t) }, TypePermissionDenied, ReasonUnknownKey, true},
		{"stray key under our kid", func() string { return signWith(t, strayKey, jose.EdDSA, f.svc.CurrentKeyID(), valid()) },
			func() Expect { return expect(t) }, TypePermissionDenied, ReasonBadSignature, true},
		{"no kid", func() string { return signWith(t, strayKey, jose.EdDSA, "", valid()) }, func() Expect { return expect(t) }, TypePermissionDenied, ReasonUnknownKey, true},
		{"HS256", func() string {
			return signWith(t, []byte("0123456789abcdef0123456789abcdef"), jose.HS256, f.svc.CurrentKeyID(), valid())
		},
			func() Expect { return expect(t) }, TypePermissionDenied, ReasonUnsupportedAlg, true},
		{"alg none", func() string {
			// An unsecured JWT as RFC 7519 §6.1 writes it: an empty signature.
			h := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","kid":"` + f.svc.CurrentKeyID() + `"}`))
			b, _ := json.Marshal(valid())
			return h + "." + base64.RawURLEncoding.EncodeToString(b) + "."
		}, func() Expect { return expect(t) }, TypePermissionDenied, ReasonUnsupportedAlg, true},
		{"EdDSA without a signature", func() string {
			tok := own(valid())
			return tok[:strings.LastIndex(tok, ".")+1]
		}, func() Expect { return expect(t) }, TypePermissionDenied, ReasonBadSignature, true},
		{"garbage", func() string { return "not-a-token" }, func() Expect { return expect(t) }, TypePermissionDenied, ReasonMalformed, true},
		{"too long", func() string { return strings.Repeat("a", MaxTokenBytes+1) }, func() Expect { return expect(t) }, TypePermissionDenied, ReasonMalformed, true},
		{"extra claim", func() string {
			c := map[string]any{"iss": serverID, "sub": "agent-a", "aud": serverID, "exp": time.Now().Unix() + 30, "iat": time.Now().Unix(), "jti": newID("txt_"),
				"mcp": map[string]any{"tool": "transfer_funds", "parameters_hash": hashOf(t, "transfer_funds", args)}, "admin": true}
			return own(c)
		}, func() Expect { return expect(t) }, TypePermissionDenied, ReasonBadClaims, true},
		{"missing jti", func() string { c := valid(); c.ID = ""; return own(c) }, func() Expect { return expect(t) }, TypePermissionDenied, ReasonBadClaims, true},
		{"negative iat", func() string { c := valid(); c.IssuedAt = -1 << 62; c.Expiry = 1 << 62; return own(c) }, func() Expect { return expect(t) }, TypePermissionDenied, ReasonBadClaims, true},
		{"another audience", func() string { return other.issue(t).Token }, func() Expect { return expect(t) }, TypePermissionDenied, ReasonWrongAudience, false},
		{"aud alone another server", func() string { c := valid(); c.Audience = "https://other.test"; return own(c) }, func() Expect { return expect(t) }, TypePermissionDenied, ReasonWrongAudience, false},
		{"iss alone another server", func() string { c := valid(); c.Issuer = "https://other.test"; return own(c) }, func() Expect { return expect(t) }, TypePermissionDenied, ReasonWrongAudience, false},
		{"lifetime over 60s", func() string { c := valid(); c.Expiry = c.IssuedAt + 61; return own(c) }, func() Expect { return expect(t) }, TypePermissionDenied, ReasonLifetimeTooLong, false},
		{"lifetime overflowing a Duration", func() string { c := valid(); c.Expiry = c.IssuedAt + 1<<62; return own(c) }, func() Expect { return expect(t) }, TypePermissionDenied, ReasonLifetimeTooLong, false},
		{"issued in the future", func() string { c := valid(); c.IssuedAt += 30; c.Expiry += 30; return own(c) }, func() Expect { return expect(t) }, TypePermissionDenied, ReasonNotYetValid, false},
		{"expired", func() string { c := valid(); c.IssuedAt -= 100; c.Expiry = c.IssuedAt + 60; return own(c) }, func() Expect { return expect(t) }, TypeTokenExpired, ReasonExpired, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tok := tc.token()
			_, err := f.svc.Redeem(ctx, tok, tc.x())
			var rej *Error
			if !errors.As(err, &rej) {
				t.Fatalf("got %v, want a rejection", err)
			}
			if rej.ErrorType != tc.typ || rej.Reason != tc.reason {
				t.Fatalf("got %s/%s, want %s/%s", rej.ErrorType, rej.Reason, tc.typ, tc.reason)
			}
			if tc.skipJTI != (rej.JTI == "") {
				t.Fatalf("jti %q", rej.JTI)
			}
			if rej.JTI != "" {
				if f.consumed(t, rej.JTI) {
					t.Fatal("a rejected token was consumed")
				}
				kinds := f.chain(t, rej.JTI, other)
				last := kinds[len(kinds)-1]
				if rej.Reason == ReasonWrongSubject {
					// Another principal's attempt stays out of the
					// owner's chain (a chain of its own).
					if last != audit.KindTokenIssued {
						t.Fatalf("chain %v", kinds)
					}
				} else if last != audit.KindTokenRejected {
					t.Fatalf("chain %v", kinds)
				}
			}
		})
	}
	// A rejected, unconsumed token still works for its own call.
	is := f.issue(t)
	x := expect(t)
	x.Principal = "agent-b"
	if _, err := f.svc.Redeem(ctx, is.Token, x); err == nil {
		t.Fatal("another principal redeemed")
	}
	if _, err := f.svc.Redeem(ctx, is.Token, expect(t)); err != nil {
		t.Fatalf("the rightful call after a rejection: %v", err)
	}
}

func TestExpiryUsesSkew(t *testing.T) {
	f := newFixture(t)
	is := f.issue(t)
	f.advance(60*time.Second + DefaultSkew - time.Second)
	if _, err := f.svc.Redeem(context.Background(), is.Token, expect(t)); err != nil {
		t.Fatalf("within the skew: %v", err)
	}
	is = f.issue(t)
	f.advance(60*time.Second + DefaultSkew + time.Second)
	_, err := f.svc.Redeem(context.Background(), is.Token, expect(t))
	var rej *Error
	if !errors.As(err, &rej) || rej.ErrorType != TypeTokenExpired || !rej.RetryAllowed {
		t.Fatalf("past the skew: %v", err)
	}
	if f.consumed(t, is.JTI) {
		t.Fatal("expired token consumed")
	}
}

// TestIssuedAtUsesSkew: an iat ahead of this server's clock by less than
// the skew (another replica's clock) is accepted; beyond it the token is
// not_yet_valid and is not consumed.
func TestIssuedAtUsesSkew(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	priv, err := f.svc.privateKey(ctx, f.svc.CurrentKeyID())
	if err != nil {
		t.Fatal(err)
	}
	ahead := func(d time.Duration) (string, string) {
		iat := f.svc.opts.Now().Add(d).Unix()
		c := Claims{Issuer: serverID, Subject: "agent-a", Audience: serverID, IssuedAt: iat, Expiry: iat + 60,
			ID: newID("txt_"), MCP: MCP{Tool: "transfer_funds", ParametersHash: hashOf(t, "transfer_funds", args)}}
		return signWith(t, priv, jose.EdDSA, f.svc.CurrentKeyID(), c), c.ID
	}
	// Issued by a replica whose clock runs ahead, redeemed here.
	f.advance(DefaultSkew - time.Second)
	is := f.issue(t)
	f.advance(-(DefaultSkew - time.Second))
	if _, err := f.svc.Redeem(ctx, is.Token, expect(t)); err != nil {
		t.Fatalf("iat within the skew: %v", err)
	}
	tok, jti := ahead(DefaultSkew + 2*time.Second)
	_, err = f.svc.Redeem(ctx, tok, expect(t))
	var rej *Error
	if !errors.As(err, &rej) || rej.Reason != ReasonNotYetValid {
		t.Fatalf("iat past the skew: %v", err)
	}
	if f.consumed(t, jti) {
		t.Fatal("a token issued in the future was consumed")
	}
}

// TestCheckOrder pins the order: form, algorithm, key, signature, claims,
// audience, issued-at, lifetime, expiry, subject, tool, parameters, use.
func TestCheckOrder(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	h := strings.Repeat("a", 64)
	base := Claims{Issuer: serverID, Audience: serverID, Subject: "p", IssuedAt: now.Unix(), Expiry: now.Unix() + 60, ID: "txt_" + strings.Repeat("0", 32), MCP: MCP{Tool: "t", ParametersHash: h}}
	x := Expect{Principal: "p", Tool: "t", ActionHash: h}
	type mut func(c *Claims, x *Expect)
	aud := func(c *Claims, _ *Expect) { c.Audience = "x" }
	exp := func(c *Claims, _ *Expect) { c.IssuedAt -= 120; c.Expiry -= 120 }
	sub := func(_ *Claims, x *Expect) { x.Principal = "q" }
	tool := func(_ *Claims, x *Expect) { x.Tool = "u" }
	par := func(_ *Claims, x *Expect) { x.ActionHash = strings.Repeat("b", 64) }
	for _, tc := range []struct {
		muts []mut
		want string
	}{
		{[]mut{par, tool, sub, exp, aud}, ReasonWrongAudience},
		{[]mut{par, tool, sub, exp}, ReasonExpired},
		{[]mut{par, tool, sub}, ReasonWrongSubject},
		{[]mut{par, tool}, ReasonWrongTool},
		{[]mut{par}, ReasonParameterChanged},
	} {
		c, xx := base, x
		for _, m := range tc.muts {
			m(&c, &xx)
		}
		e := check(c, xx, serverID, now, DefaultSkew)
		if e == nil || e.Reason != tc.want {
			t.Errorf("%d mutations: got %v, want %s", len(tc.muts), e, tc.want)
		}
	}
	if e := check(base, x, serverID, now, DefaultSkew); e != nil {
		t.Fatalf("valid: %v", e)
	}
	// The key is resolved before the signature, the signature before the
	// claims: a token of an unknown key with broken claims is unknown_key.
	_, k, _ := ed25519.GenerateKey(rand.Reader)
	tok := signWith(t, k, jose.EdDSA, "ed25519-"+strings.Repeat("1", 32), map[string]any{"junk": 1})
	_, err := Parse(tok, func(string) (ed25519.PublicKey, error) { return nil, errUnknownKey })
	var rej *Error
	if !errors.As(err, &rej) || rej.Reason != ReasonUnknownKey {
		t.Fatalf("got %v", err)
	}
	_, err = Parse(tok, func(string) (ed25519.PublicKey, error) { return k.Public().(ed25519.PublicKey), nil })
	if !errors.As(err, &rej) || rej.Reason != ReasonBadClaims {
		t.Fatalf("got %v", err)
	}
}

// TestConcurrentRedeem races one token on two replicas (two Services on
// one NATS), 64 redemptions at once: exactly one wins, every other is
// token_consumed, and all of them are in the token's audit chain.
func TestConcurrentRedeem(t *testing.T) {
	a := newFixture(t)
	b := newFixtureOn(t, a.js, serverID)
	if a.svc.CurrentKeyID() != b.svc.CurrentKeyID() {
		t.Fatal("replicas sign with different keys")
	}
	for round := 0; round < 5; round++ {
		is := b.issue(t)
		var wins, consumed atomic.Int32
		var wg sync.WaitGroup
		exp := expect(t) // on the test's goroutine: it may t.Fatal
		for i := 0; i < 64; i++ {
			svc := a.svc
			if i%2 == 1 {
				svc = b.svc
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := svc.Redeem(context.Background(), is.Token, exp)
				var rej *Error
				switch {
				case err == nil:
					wins.Add(1)
				case errors.As(err, &rej) && rej.ErrorType == TypeTokenConsumed:
					consumed.Add(1)
				default:
					t.Errorf("redeem: %v", err)
				}
			}()
		}
		wg.Wait()
		if wins.Load() != 1 || consumed.Load() != 63 {
			t.Fatalf("round %d: %d wins, %d consumed", round, wins.Load(), consumed.Load())
		}
		// Every rejection is recorded, however many race on one chain.
		kinds := a.chain(t, is.JTI, b)
		n := 0
		for _, k := range kinds {
			if k == audit.KindTokenRejected {
				n++
			}
		}
		if n != 63 || kinds[0] != audit.KindTokenIssued || !slices.Contains(kinds, audit.KindTokenConsumed) {
			t.Fatalf("round %d: %d rejections recorded, want 63 (%v)", round, n, kinds)
		}
	}
}

func TestOpenRefusesBadOptions(t *testing.T) {
	js, _ := testnats.Start(t)
	ctx := context.Background()
	if _, err := Open(ctx, js, Options{ServerID: serverID}); err == nil {
		t.Fatal("no audit accepted")
	}
	keys, _ := audit.OpenKeyring(t.TempDir())
	l, err := audit.Open(ctx, js, audit.Options{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, js, Options{ServerID: serverID, Audit: l, Lifetime: 61 * time.Second}); err == nil {
		t.Fatal("lifetime over 60s accepted")
	}
	if _, err := Open(ctx, js, Options{ServerID: serverID, Audit: l, Lifetime: 500 * time.Millisecond}); err == nil {
		t.Fatal("lifetime under 1s accepted")
	}
	if _, err := Open(ctx, js, Options{ServerID: serverID, Audit: l, Skew: time.Minute}); err == nil {
		t.Fatal("skew over 30s accepted")
	}
	if _, err := Open(ctx, js, Options{Audit: l}); err == nil {
		t.Fatal("no server id accepted")
	}
}

// TestCrashAfterConsume: the process consumes a token and dies before the
// call finishes (no Finish). After a restart (a new Service on the same
// NATS) the token is spent: the call can never run a second time, and the
// audit chain says it was consumed without a result.
func TestCrashAfterConsume(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	is := f.issue(t)
	if _, err := f.svc.Redeem(ctx, is.Token, expect(t)); err != nil {
		t.Fatal(err)
	}
	// "Crash": the redemption is dropped; a new process starts.
	restarted, err := Open(ctx, f.js, Options{ServerID: serverID, Audit: f.log})
	if err != nil {
		t.Fatal(err)
	}
	_, err = restarted.Redeem(ctx, is.Token, expect(t))
	var rej *Error
	if !errors.As(err, &rej) || rej.ErrorType != TypeTokenConsumed {
		t.Fatalf("after the restart: %v", err)
	}
	lines, err := f.log.Chain(ctx, is.JTI)
	if err != nil {
		t.Fatal(err)
	}
	v, _, err := audit.CheckChain(is.JTI, lines, audit.CheckOptions{Keys: f.keys.PublicKeys()})
	if err != nil || !v.OK || len(v.Notes) == 0 || !strings.Contains(strings.Join(v.Notes, " "), "consumed without a result") {
		t.Fatalf("chain: %v %+v", err, v)
	}
}

// TestRotate: a rotation on one replica moves every replica's signing key;
// tokens issued before it still verify; a token the retired key signs
// afterwards (a leaked key) is refused.
func TestRotate(t *testing.T) {
	a := newFixture(t)
	b := newFixtureOn(t, a.js, serverID)
	b.svc.opts.Now = a.svc.opts.Now // one clock
	ctx := context.Background()
	old := a.svc.CurrentKeyID()
	before := b.issue(t)
	oldPriv, err := a.svc.privateKey(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	rot, err := a.svc.Rotate(ctx)
	kid := rot.KeyID
	if err != nil || kid == old || rot.Retired != old || a.svc.CurrentKeyID() != kid {
		t.Fatalf("rotate: %+v %v", rot, err)
	}
	after := b.issue(t)
	if after.KeyID != kid || b.svc.CurrentKeyID() != kid {
		t.Fatalf("replica B signs with %s, want %s", after.KeyID, kid)
	}
	for _, tok := range []Issued{before, after} {
		if _, err := a.svc.Redeem(ctx, tok.Token, expect(t)); err != nil {
			t.Fatalf("token of %s: %v", tok.KeyID, err)
		}
	}
	a.advance(10 * time.Second)
	now := a.now.Load().Unix()
	forged := signWith(t, oldPriv, jose.EdDSA, old, Claims{Issuer: serverID, Subject: "agent-a", Audience: serverID, IssuedAt: now, Expiry: now + 30,
		ID: newID("txt_"), MCP: MCP{Tool: "transfer_funds", ParametersHash: hashOf(t, "transfer_funds", args)}})
	_, err = b.svc.Redeem(ctx, forged, expect(t))
	var rej *Error
	if !errors.As(err, &rej) || rej.Reason != ReasonRetiredKey || rej.JTI != "" {
		t.Fatalf("retired key: %v", err)
	}
}

// TestConcurrentRotate: two replicas rotating at once agree on one current
// key; the losing key is retired unused.
func TestConcurrentRotate(t *testing.T) {
	a := newFixture(t)
	b := newFixtureOn(t, a.js, serverID)
	ctx := context.Background()
	var wg sync.WaitGroup
	for _, f := range []*fixture{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := f.svc.Rotate(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	ia, ib := a.issue(t), b.issue(t)
	if ia.KeyID != ib.KeyID {
		t.Fatalf("replicas sign with %s and %s", ia.KeyID, ib.KeyID)
	}
	if r, err := a.svc.retiredAt(ctx, ia.KeyID); err != nil || !r.IsZero() {
		t.Fatalf("the current key is retired: %v %v", r, err)
	}
}

// TestRotateUpdateTimeout: the compare-and-set of "current" times out,
// before or after its write lands. Before: Rotate fails and changes
// nothing (the old key stays current and unretired, to be rotated again).
// After: the rotation happened, and Rotate says so; the new key is
// current, not retired, and its tokens verify.
func TestRotateUpdateTimeout(t *testing.T) {
	ctx := context.Background()
	t.Run("before the write", func(t *testing.T) {
		f := newFixture(t)
		old := f.svc.CurrentKeyID()
		f.svc.keys = &faultyKV{KeyValue: f.svc.keys, key: currentKey, onWrite: timeoutBefore}
		if rot, err := f.svc.Rotate(ctx); err == nil || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("rotate: %+v %v", rot, err)
		}
		if r, err := f.svc.retiredAt(ctx, old); err != nil || !r.IsZero() {
			t.Fatalf("the current key was retired: %v %v", r, err)
		}
		if is := f.issue(t); is.KeyID != old {
			t.Fatalf("signs with %s, want %s", is.KeyID, old)
		}
	})
	t.Run("after the write", func(t *testing.T) {
		f := newFixture(t)
		old := f.svc.CurrentKeyID()
		f.svc.keys = &faultyKV{KeyValue: f.svc.keys, key: currentKey, onWrite: timeoutAfter}
		rot, err := f.svc.Rotate(ctx)
		if err != nil || rot.KeyID == old || rot.Retired != old {
			t.Fatalf("rotate: %+v %v", rot, err)
		}
		if r, err := f.svc.retiredAt(ctx, rot.KeyID); err != nil || !r.IsZero() {
			t.Fatalf("the new current key is retired: %v %v", r, err)
		}
		if r, err := f.svc.retiredAt(ctx, old); err != nil || r.IsZero() {
			t.Fatalf("the old key is not retired: %v %v", r, err)
		}
		f.advance(2 * DefaultSkew)
		is := f.issue(t)
		if _, err := f.svc.Redeem(ctx, is.Token, expect(t)); is.KeyID != rot.KeyID || err != nil {
			t.Fatalf("token of %s (want %s): %v", is.KeyID, rot.KeyID, err)
		}
	})
}

// TestRotateConflict: another replica rotates between this one's read of
// "current" and its compare-and-set. This rotation loses: the winner's
// key is current and unretired, this one's key is retired unused, and a
// conflict that leaves the old key current is an error, not a success.
func TestRotateConflict(t *testing.T) {
	ctx := context.Background()
	a := newFixture(t)
	b := newFixtureOn(t, a.js, serverID)
	old := a.svc.CurrentKeyID()
	var won Rotation
	a.svc.keys = &faultyKV{KeyValue: a.svc.keys, key: currentKey, onWrite: func(write func() (uint64, error)) (uint64, error) {
		var err error
		if won, err = b.svc.Rotate(ctx); err != nil {
			return 0, err
		}
		return write()
	}}
	rot, err := a.svc.Rotate(ctx)
	if err != nil || rot.KeyID != won.KeyID || rot.Retired != "" || won.Retired != old {
		t.Fatalf("rotate: %+v %v (winner %+v)", rot, err, won)
	}
	if r, err := a.svc.retiredAt(ctx, won.KeyID); err != nil || !r.IsZero() {
		t.Fatalf("the winner's key is retired: %v %v", r, err)
	}
	if is := a.issue(t); is.KeyID != won.KeyID {
		t.Fatalf("signs with %s, want %s", is.KeyID, won.KeyID)
	}

	// A conflict, yet the old key still current: an error.
	c := newFixture(t)
	old = c.svc.CurrentKeyID()
	c.svc.keys = &faultyKV{KeyValue: c.svc.keys, key: currentKey, onWrite: func(func() (uint64, error)) (uint64, error) {
		return 0, jetstream.ErrKeyRevisionMismatch
	}}
	if rot, err := c.svc.Rotate(ctx); err == nil {
		t.Fatalf("rotate: %+v", rot)
	}
	if r, err := c.svc.retiredAt(ctx, old); err != nil || !r.IsZero() {
		t.Fatalf("the current key was retired: %v %v", r, err)
	}
}

// TestRotateRetirementFails: a rotation moves "current", then fails to
// write the old key's retirement. The old key is not left able to sign
// for ever: the next purge retires it, dated when "current" moved, and
// purges its private half PurgeAfter later. A key a rotation is still
// making (written after "current" last moved) is left alone; once
// "current" moves past it unused, it is retired too.
func TestRotateRetirementFails(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	old := f.svc.CurrentKeyID()
	oldPriv, err := f.svc.privateKey(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	keys := f.svc.keys
	f.svc.keys = &faultyKV{KeyValue: keys, key: retiredPrefix + old, onWrite: timeoutBefore}
	if rot, err := f.svc.Rotate(ctx); err == nil {
		t.Fatalf("rotate: %+v, want the retirement's error", rot)
	}
	f.svc.keys = keys
	cur, err := keys.Get(ctx, currentKey)
	if err != nil || string(cur.Value()) == old {
		t.Fatalf("current: %v; want it moved", err)
	}
	if r, err := f.svc.retiredAt(ctx, old); err != nil || !r.IsZero() {
		t.Fatalf("before the purge: retired %v %v", r, err)
	}

	inProgress, err := f.svc.newKey(ctx) // a rotation's key, before its compare-and-set
	if err != nil {
		t.Fatal(err)
	}
	if purged, err := f.svc.PurgeRetired(ctx); err != nil || len(purged) != 0 {
		t.Fatalf("purge: %v %v", purged, err)
	}
	r, err := f.svc.retiredAt(ctx, old)
	if err != nil || r.IsZero() || r.After(f.svc.opts.Now()) {
		t.Fatalf("the stranded key: retired %v %v", r, err)
	}
	if r, err := f.svc.retiredAt(ctx, inProgress); err != nil || !r.IsZero() {
		t.Fatalf("a key of a rotation in progress was retired: %v %v", r, err)
	}
	f.advance(10 * time.Second)
	now := f.now.Load().Unix()
	_, err = f.svc.Redeem(ctx, signWith(t, oldPriv, jose.EdDSA, old, claimsAt(t, now)), expect(t))
	var rej *Error
	if !errors.As(err, &rej) || rej.Reason != ReasonRetiredKey {
		t.Fatalf("a token the stranded key signs now: %v", err)
	}

	f.advance(PurgeAfter + time.Second)
	if _, err := f.svc.Rotate(ctx); err != nil { // moves past the unused key
		t.Fatal(err)
	}
	// The unused key's retirement is dated when "current" moved by the
	// store's clock, which this test's clock has left behind: it may be
	// purged at once too.
	purged, err := f.svc.PurgeRetired(ctx)
	if err != nil || !slices.Contains(purged, old) || slices.Contains(purged, string(cur.Value())) {
		t.Fatalf("purged %v, %v; want %s and not %s", purged, err, old, cur.Value())
	}
	if r, err := f.svc.retiredAt(ctx, inProgress); err != nil || r.IsZero() {
		t.Fatalf("the unused key of a rotation that lost: retired %v %v", r, err)
	}
	if is := f.issue(t); is.KeyID == inProgress || is.KeyID == old {
		t.Fatalf("signs with %s", is.KeyID)
	}
}

// claimsAt are valid claims for the test call, issued at iat.
func claimsAt(t *testing.T, iat int64) Claims {
	return Claims{Issuer: serverID, Subject: "agent-a", Audience: serverID, IssuedAt: iat, Expiry: iat + 60,
		ID: newID("txt_"), MCP: MCP{Tool: "transfer_funds", ParametersHash: hashOf(t, "transfer_funds", args)}}
}

// keyRecord reports whether the key bucket holds key.
func (f *fixture) keyRecord(t *testing.T, key string) bool {
	t.Helper()
	_, err := f.svc.keys.Get(context.Background(), key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// TestVerifyNeedsNoPrivateKey: a replica verifies a token of a key it has
// not seen from the key's public half alone: with the private half gone
// from the bucket, the token verifies and is consumed.
func TestVerifyNeedsNoPrivateKey(t *testing.T) {
	a := newFixture(t)
	b := newFixtureOn(t, a.js, serverID)
	ctx := context.Background()
	rot, err := a.svc.Rotate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	is := a.issue(t)
	if is.KeyID != rot.KeyID {
		t.Fatalf("signed with %s, want %s", is.KeyID, rot.KeyID)
	}
	if err := a.svc.keys.Purge(ctx, "key."+is.KeyID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.Redeem(ctx, is.Token, expect(t)); err != nil {
		t.Fatalf("verify without the private half: %v", err)
	}
}

// TestPurgeRetired: a retired key's private half stays until PurgeAfter
// has passed since its retirement, then PurgeRetired purges it; its public
// half stays. Its tokens then get the refusals they got before the purge,
// on a replica that never saw the key too: expired for one issued before
// the retirement, retired_key for one forged after it with the leaked key.
func TestPurgeRetired(t *testing.T) {
	a := newFixture(t)
	ctx := context.Background()
	old := a.svc.CurrentKeyID()
	oldPriv, err := a.svc.privateKey(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	before := a.issue(t)
	rot, err := a.svc.Rotate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	retiredAt := a.now.Load().Unix()
	a.advance(PurgeAfter - time.Second)
	if purged, err := a.svc.PurgeRetired(ctx); err != nil || len(purged) != 0 || !a.keyRecord(t, "key."+old) {
		t.Fatalf("within PurgeAfter: purged %v, %v", purged, err)
	}
	a.advance(2 * time.Second)
	purged, err := a.svc.PurgeRetired(ctx)
	if err != nil || !slices.Equal(purged, []string{old}) {
		t.Fatalf("purged %v, %v; want [%s]", purged, err, old)
	}
	if a.keyRecord(t, "key."+old) || !a.keyRecord(t, "pub."+old) {
		t.Fatal("after the purge: want the public half alone")
	}
	if !a.keyRecord(t, "key."+rot.KeyID) {
		t.Fatal("the current key's private half was purged")
	}
	if purged, err := a.svc.PurgeRetired(ctx); err != nil || len(purged) != 0 {
		t.Fatalf("a second purge: %v, %v", purged, err)
	}

	c := newFixtureOn(t, a.js, serverID) // has never seen the old key
	c.svc.opts.Now = a.svc.opts.Now
	now := a.now.Load().Unix()
	for _, tc := range []struct {
		name   string
		token  string
		reason string
	}{
		{"issued before the retirement", before.Token, ReasonExpired},
		{"forged before the retirement", signWith(t, oldPriv, jose.EdDSA, old, claimsAt(t, retiredAt-1)), ReasonExpired},
		{"forged after the retirement", signWith(t, oldPriv, jose.EdDSA, old, claimsAt(t, now)), ReasonRetiredKey},
	} {
		_, err := c.svc.Redeem(ctx, tc.token, expect(t))
		var rej *Error
		if !errors.As(err, &rej) || rej.Reason != tc.reason {
			t.Errorf("%s: got %v, want %s", tc.name, err, tc.reason)
		}
	}
	if _, err := c.svc.Redeem(ctx, c.issue(t).Token, expect(t)); err != nil {
		t.Fatalf("a token of the current key: %v", err)
	}
}

// TestOldShapeKeys: a bucket written before the keys were split holds
// private halves alone. Open stores their public halves and purges the
// private half of a key retired long ago; a key an older replica adds
// afterwards (a rotation of its own) verifies on this version, which then
// stores its public half.
func TestOldShapeKeys(t *testing.T) {
	js, _ := testnats.Start(t)
	ctx := context.Background()
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: KeyBucket, History: 1, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	oldKey := func() (string, ed25519.PrivateKey) {
		pub, priv, _ := ed25519.GenerateKey(rand.Reader)
		der, err := x509.MarshalPKCS8PrivateKey(priv)
		if err != nil {
			t.Fatal(err)
		}
		kid := KeyID(pub)
		if _, err := kv.Create(ctx, "key."+kid, der); err != nil {
			t.Fatal(err)
		}
		return kid, priv
	}
	gone, _ := oldKey()
	if _, err := kv.Create(ctx, "retired."+gone, []byte(time.Now().Add(-time.Hour).Format(time.RFC3339Nano))); err != nil {
		t.Fatal(err)
	}
	cur, _ := oldKey()
	if _, err := kv.Create(ctx, currentKey, []byte(cur)); err != nil {
		t.Fatal(err)
	}

	a := newFixtureOn(t, js, serverID)
	if a.svc.CurrentKeyID() != cur {
		t.Fatalf("current %s, want %s", a.svc.CurrentKeyID(), cur)
	}
	for key, want := range map[string]bool{"pub." + cur: true, "key." + cur: true, "pub." + gone: true, "key." + gone: false} {
		if a.keyRecord(t, key) != want {
			t.Errorf("%s: present %t, want %t", key, !want, want)
		}
	}
	// A replica that has not seen the key verifies without its private half.
	b := newFixtureOn(t, js, serverID)
	if err := kv.Purge(ctx, "key."+cur); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.Redeem(ctx, a.issue(t).Token, expect(t)); err != nil {
		t.Fatalf("a token of a migrated key: %v", err)
	}

	// An older replica rotates: a private half alone, made current.
	added, _ := oldKey()
	e, err := kv.Get(ctx, currentKey)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Update(ctx, currentKey, []byte(added), e.Revision()); err != nil {
		t.Fatal(err)
	}
	is := a.issue(t) // a follows "current"
	if is.KeyID != added {
		t.Fatalf("signed with %s, want %s", is.KeyID, added)
	}
	if _, err := b.svc.Redeem(ctx, is.Token, expect(t)); err != nil {
		t.Fatalf("a token of a key an older replica added: %v", err)
	}
	if !b.keyRecord(t, "pub."+added) {
		t.Fatal("its public half was not stored")
	}
}
