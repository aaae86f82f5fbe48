// Package oauth makes the MCP endpoint an OAuth 2.1 resource server (MCP
// 2026-07-28 authorization): it validates JWT access tokens issued by one
// authorization server, maps them to a principal and its scopes, and
// publishes the protected-resource metadata (RFC 9728) and the
// WWW-Authenticate challenges (RFC 6750, RFC 9728 §5.1) clients use to find
// that server.
//
// # Validation
//
// [Verifier.Verify] accepts a token only when every check passes, in this
// order; the first that fails decides the error:
//
//  1. It is a compact JWS whose alg is one of Options.Algorithms (default
//     RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, ES512,
//     EdDSA). "none" and the HMAC algorithms (HS*) are never accepted: the
//     resource server holds no shared secret, and an HMAC token "signed"
//     with a public key must not pass. Its typ header, when present, is
//     at+jwt, application/at+jwt or JWT (RFC 9068 tokens, and the IdPs that
//     still say JWT).
//  2. Its signature verifies with a key of the issuer's JWKS whose kid
//     matches (every signing key when the token has no kid), whose use is
//     sig (or unset) and whose alg, when set, is the token's.
//  3. iss equals Options.Issuer exactly; exp is present and not past; nbf
//     and iat, when present, are not in the future; each with
//     Options.ClockSkew of tolerance.
//  4. aud contains one of the accepted audiences (RFC 8707): the resource
//     (the public MCP URL) or one of Options.Audiences.
//  5. The principal claim (Options.PrincipalClaim, default sub) is a
//     non-empty string of at most 256 bytes without control characters.
//  6. Every scope of Options.RequiredScopes is granted (the scope claim, a
//     space-separated string; or scp, a list or a string, as some IdPs
//     issue it). Otherwise the error is insufficient_scope (HTTP 403),
//     every other failure is invalid_token (HTTP 401).
//
// # Keys
//
// The JWKS is found by discovery from the issuer (OpenID Connect
// Discovery, then RFC 8414, both path forms) unless Options.JWKSURL names
// it, fetched by [New] (a server that cannot reach its issuer does not
// start), and kept. It is fetched again when it is older than
// Options.JWKSMaxAge, and when a token names a kid it does not hold (the
// issuer rotated its keys), at most once per Options.JWKSMinRefresh however
// many such tokens arrive: a flood of made-up kids costs the issuer one
// request per interval. A failed fetch keeps the keys already held. Only
// when no key was ever fetched is a token unverifiable; Verify then returns
// [ErrUnavailable] (the caller answers 503, not 401: an outage is not a bad
// token).
//
// # Principal
//
// The principal that owns an OAuth caller's tasks, budgets and limits is
// "oauth:" followed by the principal claim. Static agent names cannot hold
// ":" (internal/authn), so no OAuth caller can become a static agent or
// read its tasks. [Verifier.Properties] is what policy sees as
// input.subject.properties: auth "oauth", the issuer, sub, client_id,
// scopes (always a list) and claims (those of Options.Claims the token has,
// at most MaxPolicyClaims names of at most MaxClaimBytes of JSON each).
package oauth
