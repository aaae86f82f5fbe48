package oauth

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// PrincipalPrefix starts every OAuth principal (see the package doc).
const PrincipalPrefix = "oauth:"

// Defaults of [Options].
const (
	DefaultPrincipalClaim = "sub"
	DefaultClockSkew      = 60 * time.Second
	MaxClockSkew          = 10 * time.Minute
	DefaultJWKSMaxAge     = time.Hour
	DefaultJWKSMinRefresh = 10 * time.Second
	// MaxPrincipalBytes bounds the principal claim's value.
	MaxPrincipalBytes = 256
	// MaxPolicyClaims bounds Options.Claims, and MaxClaimBytes the JSON of
	// one claim's value passed to policy: a larger value is left out.
	MaxPolicyClaims = 16
	MaxClaimBytes   = 1024
	// maxDocumentBytes bounds a discovery document or a JWKS.
	maxDocumentBytes = 1 << 20
	// maxTokenBytes bounds an access token.
	maxTokenBytes = 16 << 10
)

// DefaultAlgorithms are the signature algorithms accepted by default: every
// asymmetric JWS algorithm, never none or HS*.
var DefaultAlgorithms = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// Options configures a [Verifier]. Issuer and Resource are required.
type Options struct {
	// Issuer is the authorization server's issuer identifier; a token's
	// iss must equal it exactly, and so must the discovery document's
	// issuer. https, or http on a loopback host (tests, local IdPs).
	Issuer string
	// Resource is this resource server's identifier: the public URL of
	// the MCP endpoint (e.g. https://countersign.example.com/mcp). It is
	// the resource of the protected-resource metadata, and always an
	// accepted audience.
	Resource string
	// Audiences are further accepted audiences (an IdP that cannot put the
	// resource URL in aud issues some other identifier).
	Audiences []string
	// PrincipalClaim names the claim that identifies the caller (default
	// "sub"; "client_id" or "azp" for client-credentials tokens of IdPs
	// whose sub is not the client).
	PrincipalClaim string
	// RequiredScopes must all be granted, or the token is answered 403
	// insufficient_scope.
	RequiredScopes []string
	// ScopesSupported are listed in the protected-resource metadata
	// (default RequiredScopes).
	ScopesSupported []string
	// Claims are further claims passed to policy, under
	// subject.properties.claims, when the token has them: at most
	// MaxPolicyClaims names, each value at most MaxClaimBytes of JSON (a
	// larger one is left out and logged). The registered claims policy
	// already sees (sub, client_id, azp, scope, scp, iss) and those it
	// must not rely on (aud, exp, nbf, iat, jti) are refused.
	Claims []string
	// ClockSkew is the tolerance of exp, nbf and iat (default 60s, at most
	// 10m).
	ClockSkew time.Duration
	// Algorithms are the accepted JWS algorithms (default
	// DefaultAlgorithms); none and HS* are refused.
	Algorithms []string
	// JWKSURL skips discovery: the issuer's key set is there.
	JWKSURL string
	// JWKSMaxAge is how long a fetched key set is used before it is
	// fetched again (default 1h). JWKSMinRefresh is the least time
	// between two fetches caused by an unknown kid (default 10s).
	JWKSMaxAge     time.Duration
	JWKSMinRefresh time.Duration
	// HTTPClient fetches the discovery document and the key set (default:
	// a client with a 10 s timeout).
	HTTPClient *http.Client
	// Logger receives key-set fetches and failures; nil discards them.
	Logger *slog.Logger
}

// Verifier validates access tokens. It is safe for concurrent use.
type Verifier struct {
	opts      Options
	algs      []jose.SignatureAlgorithm
	audiences []string
	log       *slog.Logger
	keys      *keySet
	metadata  []byte
}

// New validates opts, discovers the issuer's key set and fetches it once.
func New(ctx context.Context, opts Options) (*Verifier, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	v := &Verifier{opts: opts, log: opts.Logger}
	if v.log == nil {
		v.log = slog.New(slog.DiscardHandler)
	}
	for _, a := range opts.Algorithms {
		v.algs = append(v.algs, jose.SignatureAlgorithm(a))
	}
	v.audiences = append([]string{opts.Resource}, opts.Audiences...)
	meta, err := json.Marshal(v.Metadata())
	if err != nil {
		return nil, fmt.Errorf("oauth: metadata: %w", err)
	}
	v.metadata = meta
	jwksURL := opts.JWKSURL
	if jwksURL == "" {
		if jwksURL, err = discover(ctx, opts.HTTPClient, opts.Issuer); err != nil {
			return nil, err
		}
	}
	if err := checkURL("the jwks_uri", jwksURL); err != nil {
		return nil, err
	}
	v.keys = &keySet{url: jwksURL, client: opts.HTTPClient, maxAge: opts.JWKSMaxAge, minRefresh: opts.JWKSMinRefresh, log: v.log}
	if err := v.keys.fetch(ctx); err != nil {
		return nil, fmt.Errorf("oauth: the issuer's key set: %w", err)
	}
	return v, nil
}

func (o *Options) validate() error {
	var errs []error
	if err := checkURL("the issuer", o.Issuer); err != nil {
		errs = append(errs, err)
	}
	if u, err := url.Parse(o.Resource); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") || u.Fragment != "" {
		errs = append(errs, fmt.Errorf("oauth: the resource %q must be an absolute http(s) URL without a fragment", o.Resource))
	}
	if o.PrincipalClaim == "" {
		o.PrincipalClaim = DefaultPrincipalClaim
	}
	if o.ClockSkew == 0 {
		o.ClockSkew = DefaultClockSkew
	}
	if o.ClockSkew < 0 || o.ClockSkew > MaxClockSkew {
		errs = append(errs, fmt.Errorf("oauth: the clock skew %v must be from 0s to %v", o.ClockSkew, MaxClockSkew))
	}
	if len(o.Algorithms) == 0 {
		o.Algorithms = DefaultAlgorithms
	}
	for _, a := range o.Algorithms {
		if !slices.Contains(DefaultAlgorithms, a) {
			errs = append(errs, fmt.Errorf("oauth: algorithm %q is not accepted (none and HS* never are; known: %s)", a, strings.Join(DefaultAlgorithms, ", ")))
		}
	}
	for _, s := range append(slices.Clone(o.RequiredScopes), o.ScopesSupported...) {
		if !validScope(s) {
			errs = append(errs, fmt.Errorf("oauth: scope %q is not a valid scope token", s))
		}
	}
	if o.ScopesSupported == nil {
		o.ScopesSupported = o.RequiredScopes
	}
	if len(o.Claims) > MaxPolicyClaims {
		errs = append(errs, fmt.Errorf("oauth: at most %d claims may be passed to policy (%d given)", MaxPolicyClaims, len(o.Claims)))
	}
	for i, c := range o.Claims {
		switch {
		case c == "" || len(c) > 64 || strings.ContainsFunc(c, unicode.IsControl):
			errs = append(errs, fmt.Errorf("oauth: the claim name %q must be 1 to 64 characters without control characters", c))
		case slices.Contains(reservedClaims, c):
			errs = append(errs, fmt.Errorf("oauth: claim %q cannot be passed to policy (policy already sees sub, client_id and scopes; aud, exp, nbf, iat and jti are checked here)", c))
		case slices.Contains(o.Claims[:i], c):
			errs = append(errs, fmt.Errorf("oauth: claim %q is listed twice", c))
		}
	}
	for _, a := range o.Audiences {
		if a == "" {
			errs = append(errs, errors.New("oauth: an audience must not be empty"))
		}
	}
	if o.JWKSMaxAge == 0 {
		o.JWKSMaxAge = DefaultJWKSMaxAge
	}
	if o.JWKSMinRefresh == 0 {
		o.JWKSMinRefresh = DefaultJWKSMinRefresh
	}
	if o.JWKSMaxAge < 0 || o.JWKSMinRefresh < 0 {
		errs = append(errs, errors.New("oauth: the key set's max age and min refresh must not be negative"))
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	return errors.Join(errs...)
}

// reservedClaims cannot be among Options.Claims.
var reservedClaims = []string{"iss", "sub", "aud", "exp", "nbf", "iat", "jti", "client_id", "azp", "scope", "scp"}

// validScope reports whether s is a scope-token of RFC 6749 §3.3 (and so
// safe inside a quoted WWW-Authenticate parameter).
func validScope(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x21 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// checkURL requires an absolute https URL, or http on a loopback host.
func checkURL(what, s string) error {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return fmt.Errorf("oauth: %s %q must be an absolute https URL", what, s)
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if h := u.Hostname(); h == "localhost" || net.ParseIP(h).IsLoopback() {
			return nil
		}
	}
	return fmt.Errorf("oauth: %s %q must be an https URL (http only on a loopback host)", what, s)
}

// Issuer is the configured issuer.
func (v *Verifier) Issuer() string { return v.opts.Issuer }

// Identity is who a valid access token speaks for.
type Identity struct {
	// Principal is PrincipalPrefix + the principal claim.
	Principal string
	// Subject is sub, and ClientID is client_id (RFC 9068) or else azp,
	// when the token has them.
	Subject  string
	ClientID string
	// Scopes are the granted scopes, in token order.
	Scopes []string
	// Claims are the configured extra claims the token has.
	Claims map[string]any
	// Expiry is exp.
	Expiry time.Time
}

// Properties is the identity as policy sees it, in
// input.subject.properties: auth "oauth", the issuer, sub and client_id
// (when the token has them), scopes (always a list, possibly empty) and,
// when the token has any of Options.Claims, claims (an object of those).
func (v *Verifier) Properties(id Identity) map[string]any {
	p := map[string]any{"auth": "oauth", "issuer": v.opts.Issuer, "scopes": scopesOrEmpty(id.Scopes)}
	if id.Subject != "" {
		p["sub"] = id.Subject
	}
	if id.ClientID != "" {
		p["client_id"] = id.ClientID
	}
	if len(id.Claims) > 0 {
		p["claims"] = id.Claims
	}
	return p
}

func scopesOrEmpty(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// Claims reports whether token is addressed to this verifier: a JWT whose
// unverified iss is the configured issuer. Such a token is verified with
// Verify and nothing else; any other token (a static agent token) is not
// this package's to judge. It does not verify anything.
func (v *Verifier) Claims(token string) bool {
	if len(token) > maxTokenBytes || strings.Count(token, ".") != 2 {
		return false
	}
	payload := token[strings.IndexByte(token, '.')+1 : strings.LastIndexByte(token, '.')]
	b, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		return false
	}
	var c struct {
		Issuer string `json:"iss"`
	}
	return json.Unmarshal(b, &c) == nil && c.Issuer == v.opts.Issuer
}

// tokenClaims are the claims Verify reads besides the registered ones.
type tokenClaims struct {
	Scope, Scp    json.RawMessage
	ClientID, AZP string
}

// Verify validates token (see the package doc) at now and returns its
// identity. Errors are *Error (invalid_token or insufficient_scope; the
// description is safe to send) or ErrUnavailable.
func (v *Verifier) Verify(ctx context.Context, token string, now time.Time) (Identity, error) {
	if len(token) > maxTokenBytes {
		return Identity{}, invalid("the access token is too long", nil)
	}
	tok, err := jwt.ParseSigned(token, v.algs)
	if err != nil {
		return Identity{}, invalid("the access token is not a JWS signed with an accepted algorithm", err)
	}
	if len(tok.Headers) != 1 {
		return Identity{}, invalid("the access token must have one signature", nil)
	}
	h := tok.Headers[0]
	if typ, ok := h.ExtraHeaders[jose.HeaderType]; ok {
		s, _ := typ.(string)
		switch strings.ToLower(s) {
		case "at+jwt", "application/at+jwt", "jwt":
		default:
			return Identity{}, invalid("the token's typ is not an access token's", nil)
		}
	}
	keys, err := v.keys.candidates(ctx, h.KeyID, h.Algorithm)
	if err != nil {
		return Identity{}, err
	}
	var sigErr error
	ok := false
	for _, k := range keys {
		if sigErr = tok.Claims(k.Key); sigErr == nil {
			ok = true
			break
		}
	}
	if !ok {
		return Identity{}, invalid("the access token's signature does not verify", sigErr)
	}
	var (
		std   jwt.Claims
		extra tokenClaims
		all   map[string]json.RawMessage
	)
	if err := tok.UnsafeClaimsWithoutVerification(&all); err != nil { // verified above
		return Identity{}, invalid("the access token's claims are not a JSON object", err)
	}
	if err := tok.UnsafeClaimsWithoutVerification(&std); err != nil {
		return Identity{}, invalid("the access token's registered claims (iss, sub, aud, exp, nbf, iat) are malformed", err)
	}
	for name, dst := range map[string]*string{"client_id": &extra.ClientID, "azp": &extra.AZP} {
		if raw, ok := all[name]; ok && json.Unmarshal(raw, dst) != nil {
			return Identity{}, invalid("the access token's "+name+" claim is not a string", nil)
		}
	}
	extra.Scope, extra.Scp = all["scope"], all["scp"]
	switch {
	case std.Issuer != v.opts.Issuer:
		return Identity{}, invalid("the access token is not from the expected issuer", nil)
	case std.Expiry == nil:
		return Identity{}, invalid("the access token has no expiry (exp)", nil)
	}
	err = std.ValidateWithLeeway(jwt.Expected{AnyAudience: v.audiences, Time: now}, v.opts.ClockSkew)
	switch {
	case errors.Is(err, jwt.ErrInvalidAudience):
		return Identity{}, invalid("the access token is not meant for this resource (aud)", err)
	case errors.Is(err, jwt.ErrExpired):
		return Identity{}, invalid("the access token expired", err)
	case errors.Is(err, jwt.ErrNotValidYet):
		return Identity{}, invalid("the access token is not valid yet (nbf)", err)
	case errors.Is(err, jwt.ErrIssuedInTheFuture):
		return Identity{}, invalid("the access token was issued in the future (iat)", err)
	case err != nil:
		return Identity{}, invalid("the access token's claims are not valid", err)
	}
	var principal string
	if raw, ok := all[v.opts.PrincipalClaim]; !ok || json.Unmarshal(raw, &principal) != nil || !usablePrincipal(principal) {
		return Identity{}, invalid("the access token's "+v.opts.PrincipalClaim+" claim does not name a caller", nil)
	}
	scopes, err := parseScopes(extra.Scope, extra.Scp)
	if err != nil {
		return Identity{}, invalid("the access token's scope claim is malformed", err)
	}
	id := Identity{
		Principal: PrincipalPrefix + principal,
		Subject:   std.Subject,
		ClientID:  extra.ClientID,
		Scopes:    scopes,
		Expiry:    std.Expiry.Time(),
	}
	if id.ClientID == "" {
		id.ClientID = extra.AZP
	}
	for _, c := range v.opts.Claims {
		raw, ok := all[c]
		if !ok {
			continue
		}
		if len(raw) > MaxClaimBytes {
			v.log.InfoContext(ctx, "oauth: a claim is too large to pass to policy; left out", "claim", c, "bytes", len(raw))
			continue
		}
		var val any
		if json.Unmarshal(raw, &val) == nil {
			if id.Claims == nil {
				id.Claims = map[string]any{}
			}
			id.Claims[c] = val
		}
	}
	if missing := missingScopes(v.opts.RequiredScopes, scopes); len(missing) > 0 {
		return id, &Error{Code: CodeInsufficientScope, Description: "the access token lacks a required scope", Scopes: v.opts.RequiredScopes}
	}
	return id, nil
}

// ValidPrincipal reports whether p is a principal an OAuth access token
// can give: PrincipalPrefix and a usable principal claim (1 to
// MaxPrincipalBytes of UTF-8, no control characters).
func ValidPrincipal(p string) bool {
	claim, ok := strings.CutPrefix(p, PrincipalPrefix)
	return ok && usablePrincipal(claim)
}

func usablePrincipal(s string) bool {
	if s == "" || len(s) > MaxPrincipalBytes || !utf8.ValidString(s) {
		return false
	}
	return !strings.ContainsFunc(s, unicode.IsControl)
}

// parseScopes reads scope (RFC 9068: a space-separated string) or, when it
// is absent, scp (a list of strings, or a string).
func parseScopes(scope, scp json.RawMessage) ([]string, error) {
	raw := scope
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		raw = scp
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return strings.Fields(s), nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, errors.New("not a string or a list of strings")
	}
	return list, nil
}

func missingScopes(required, granted []string) []string {
	var missing []string
	for _, r := range required {
		if !slices.Contains(granted, r) {
			missing = append(missing, r)
		}
	}
	return missing
}

// Error codes of RFC 6750 §3.1.
const (
	CodeInvalidToken      = "invalid_token"
	CodeInsufficientScope = "insufficient_scope"
)

// Error is a rejected token. Description is safe to send to the client;
// the cause stays for the log.
type Error struct {
	Code        string
	Description string
	// Scopes are the scopes the resource requires (insufficient_scope).
	Scopes []string
	cause  error
}

// Sentinels to match an *Error's code with errors.Is.
var (
	ErrInvalidToken      = &Error{Code: CodeInvalidToken}
	ErrInsufficientScope = &Error{Code: CodeInsufficientScope}
	// ErrUnavailable: no key set could be fetched, so no token can be
	// verified (answer 503).
	ErrUnavailable = errors.New("oauth: the issuer's key set is unavailable")
)

func (e *Error) Error() string {
	msg := "oauth: " + e.Code + ": " + e.Description
	if e.cause != nil {
		msg += ": " + e.cause.Error()
	}
	return msg
}

// Is matches by code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

func (e *Error) Unwrap() error { return e.cause }

func invalid(desc string, cause error) *Error {
	return &Error{Code: CodeInvalidToken, Description: desc, cause: cause}
}
