package txtoken

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/audit"
)

// Error types: the Zero-Trust MCP Handshake RFC's error_handling.error_type
// values a token rejection uses.
const (
	TypeTokenExpired      = "token_expired"
	TypeTokenConsumed     = "token_consumed"
	TypeParameterMismatch = "parameter_mismatch"
	TypePermissionDenied  = "permission_denied"
)

// Reasons: the specific cause of a rejection, one per check.
const (
	ReasonMalformed        = "malformed"             // not a compact JWS of the expected shape
	ReasonUnsupportedAlg   = "unsupported_algorithm" // alg is not EdDSA
	ReasonUnknownKey       = "unknown_key"           // no kid, or a kid this service never had
	ReasonBadSignature     = "bad_signature"         // the signature does not verify
	ReasonRetiredKey       = "retired_key"           // issued after its key was retired
	ReasonBadClaims        = "bad_claims"            // claims missing or of the wrong type
	ReasonWrongAudience    = "wrong_audience"        // iss or aud is not this server
	ReasonNotYetValid      = "not_yet_valid"         // iat in the future beyond the skew
	ReasonLifetimeTooLong  = "lifetime_too_long"     // exp - iat over MaxLifetime
	ReasonExpired          = "expired"               // now past exp + skew
	ReasonWrongSubject     = "wrong_subject"         // sub is another principal
	ReasonWrongTool        = "wrong_tool"            // mcp.tool is another tool
	ReasonParameterChanged = "parameters_changed"    // the call's action hash differs
	ReasonAlreadyUsed      = "already_used"          // the jti was consumed before
)

// TypeInternal and ReasonInternal mark, in the audit log only, a
// redemption that failed on this server's side: the key store or the
// used-token store could not be read or written, so nothing ran. They are
// not one of the RFC's error types: the caller gets an internal error, not
// a token rejection.
const (
	TypeInternal   = "internal_error"
	ReasonInternal = "internal"
)

// Error is a rejected token: nothing ran and, but for the audit record,
// nothing changed. Its wire form is the RFC's error_handling object plus
// the specific reason.
type Error struct {
	StatusCode   int    `json:"status_code"`
	ErrorType    string `json:"error_type"`
	Reason       string `json:"reason"`
	Message      string `json:"message"`
	RetryAllowed bool   `json:"retry_allowed"`
	// JTI is set once the token verified (signature and claims).
	JTI string `json:"jti,omitempty"`
}

func (e *Error) Error() string {
	return "txtoken: " + e.ErrorType + " (" + e.Reason + "): " + e.Message
}

// Is matches another *Error by code: the same reason, or, when target
// names no reason, the same error type. errors.Is(err,
// &txtoken.Error{ErrorType: txtoken.TypeTokenConsumed}) asks "was the
// token used before?".
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	if t.Reason != "" {
		return t.Reason == e.Reason
	}
	return t.ErrorType != "" && t.ErrorType == e.ErrorType
}

// reject builds the Error for a reason.
func reject(reason, msg string) *Error {
	e := &Error{Reason: reason, Message: msg, ErrorType: TypePermissionDenied, StatusCode: 403}
	switch reason {
	case ReasonExpired:
		// A new token for the same call may be requested.
		e.ErrorType, e.StatusCode, e.RetryAllowed = TypeTokenExpired, 401, true
	case ReasonAlreadyUsed:
		e.ErrorType, e.StatusCode = TypeTokenConsumed, 409
	case ReasonParameterChanged:
		e.ErrorType, e.StatusCode = TypeParameterMismatch, 400
	case ReasonMalformed, ReasonUnsupportedAlg, ReasonUnknownKey, ReasonBadSignature, ReasonBadClaims, ReasonRetiredKey:
		e.StatusCode = 401
	}
	return e
}

// header is the protected header we read before go-jose does, to name the
// reason precisely.
type header struct {
	Alg string `json:"alg"`
	Kid string `json:"kid"`
}

// Parse checks a presented token's form, algorithm, key and signature, in
// that order, and decodes its claims. It changes nothing and reads only
// through key, which resolves a kid to a public key (errUnknownKey when it
// has none). Any other error from key is returned as is (the key store
// failed); a rejection is an *Error.
func Parse(raw string, key func(kid string) (ed25519.PublicKey, error)) (Claims, error) {
	if raw == "" || len(raw) > MaxTokenBytes {
		return Claims{}, reject(ReasonMalformed, fmt.Sprintf("the token must be a compact JWS of at most %d bytes", MaxTokenBytes))
	}
	// An empty signature part is still the form: an unsecured JWT ("alg":
	// "none", RFC 7519 §6.1) has one, and is refused for its algorithm; an
	// EdDSA token without a signature does not verify.
	parts := strings.Split(raw, ".")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" {
		return Claims{}, reject(ReasonMalformed, "the token is not a compact JWS (three base64url parts)")
	}
	hb, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil {
		return Claims{}, reject(ReasonMalformed, "the token's header is not base64url")
	}
	var h header
	if err := json.Unmarshal(hb, &h); err != nil {
		return Claims{}, reject(ReasonMalformed, "the token's header is not a JSON object")
	}
	if h.Alg != string(Algorithm) {
		return Claims{}, reject(ReasonUnsupportedAlg, fmt.Sprintf("the token's alg must be %s", Algorithm))
	}
	jws, err := jose.ParseSignedCompact(raw, []jose.SignatureAlgorithm{Algorithm})
	if err != nil || len(jws.Signatures) != 1 {
		return Claims{}, reject(ReasonMalformed, "the token is not a valid compact JWS")
	}
	kid := jws.Signatures[0].Protected.KeyID
	if kid == "" || kid != h.Kid {
		return Claims{}, reject(ReasonUnknownKey, "the token names no signing key (kid)")
	}
	pub, err := key(kid)
	if errors.Is(err, errUnknownKey) {
		return Claims{}, reject(ReasonUnknownKey, "the token was signed by a key this server does not have")
	}
	if err != nil {
		return Claims{}, err
	}
	payload, err := jws.Verify(pub)
	if err != nil {
		return Claims{}, reject(ReasonBadSignature, "the token's signature does not verify")
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	var c Claims
	if err := dec.Decode(&c); err != nil || dec.More() {
		return Claims{}, reject(ReasonBadClaims, "the token's claims are not the expected object")
	}
	if c.Issuer == "" || c.Subject == "" || c.Audience == "" || c.Expiry <= 0 || c.IssuedAt <= 0 ||
		!jtiRE.MatchString(c.ID) || c.MCP.Tool == "" || len(c.MCP.ParametersHash) != 64 {
		return Claims{}, reject(ReasonBadClaims, "the token lacks a required claim (iss, sub, aud, exp, iat, jti, mcp.tool, mcp.parameters_hash) or has one out of range")
	}
	return c, nil
}

// Expect is the call a token is presented with.
type Expect struct {
	Principal  string // the authenticated caller
	Tool       string
	ActionHash string // of the arguments as received, hex
}

// check applies the claim checks, in order: issuer and audience, issued-at,
// lifetime, expiry, subject, tool, parameters hash.
func check(c Claims, x Expect, serverID string, now time.Time, skew time.Duration) *Error {
	switch {
	case c.Issuer != serverID || c.Audience != serverID:
		return reject(ReasonWrongAudience, "the token was issued for another server")
	case time.Unix(c.IssuedAt, 0).After(now.Add(skew)):
		return reject(ReasonNotYetValid, "the token is issued in the future")
	case c.Expiry <= c.IssuedAt || c.Expiry-c.IssuedAt > int64(MaxLifetime/time.Second):
		return reject(ReasonLifetimeTooLong, fmt.Sprintf("the token's lifetime exceeds %v", MaxLifetime))
	case now.After(time.Unix(c.Expiry, 0).Add(skew)):
		return reject(ReasonExpired, "the token has expired; request a new one for this call")
	case c.Subject != x.Principal:
		return reject(ReasonWrongSubject, "the token was issued to another principal")
	case c.MCP.Tool != x.Tool:
		return reject(ReasonWrongTool, "the token was issued for another tool")
	case c.MCP.ParametersHash != x.ActionHash:
		return reject(ReasonParameterChanged, "the call's arguments are not those the token was issued for")
	}
	return nil
}

// Redemption is a consumed token: the call it authorizes runs now, once.
type Redemption struct {
	Claims Claims
	s      *Service
}

// Redeem verifies a token presented with call x (Parse, then the claim
// checks), then consumes its jti with a create-only write: of any number
// of concurrent redemptions, on any replicas, exactly one succeeds. Every
// outcome is audited: a rejection (*Error) is recorded, then returned; a
// consumption is recorded before Redeem returns, and a consumption that
// could not be recorded returns an error, so the call does not run.
// Any other error (a store that failed) is recorded as a rejection of
// type TypeInternal, and nothing runs; the token may be spent.
//
// Once the jti is consumed, ctx's cancellation no longer counts: the
// caller hanging up must not leave a spent token without its record.
func (s *Service) Redeem(ctx context.Context, raw string, x Expect) (*Redemption, error) {
	var kid string
	c, err := Parse(raw, func(k string) (ed25519.PublicKey, error) { kid = k; return s.publicKey(ctx, k) })
	var rej *Error
	if errors.As(err, &rej) {
		s.rejected(ctx, "", rej, x)
		return nil, rej
	}
	if err != nil {
		// The key store failed before the token verified: no jti.
		s.rejected(ctx, "", internalError(""), x)
		return nil, err
	}
	retired, err := s.retiredAt(ctx, kid)
	if err != nil {
		// The token verified, but whether its key was retired before
		// it was signed is unknown: its jti is named, not trusted with
		// its chain.
		s.rejected(ctx, "", internalError(c.ID), x)
		return nil, err
	}
	if !retired.IsZero() && time.Unix(c.IssuedAt, 0).After(retired) {
		// Signed by a key after it was retired: not a token this
		// service issued. Its jti is not trusted.
		rej := reject(ReasonRetiredKey, "the token was signed by a retired key")
		s.rejected(ctx, "", rej, x)
		return nil, rej
	}
	now := s.opts.Now()
	if rej := check(c, x, s.opts.ServerID, now, s.opts.Skew); rej != nil {
		rej.JTI = c.ID
		chain := c.ID
		if c.Subject != x.Principal {
			// Someone else's token: its chain takes only what its own
			// principal does, so another caller cannot fill it (and
			// block its use) with rejections.
			chain = ""
		}
		s.rejected(ctx, chain, rej, x)
		return nil, rej
	}
	consumed := audit.TokenConsumed{JTI: c.ID, Principal: x.Principal, Tool: x.Tool, ActionHash: x.ActionHash, At: now.UTC()}
	ours, err := s.consume(ctx, consumed)
	// From here on the jti may be spent: record whatever happens, even if
	// the caller has gone.
	dctx, cancel := detach(ctx)
	defer cancel()
	if err != nil {
		s.rejected(dctx, c.ID, internalError(c.ID), x)
		return nil, err
	}
	if !ours {
		rej := reject(ReasonAlreadyUsed, "the token has already been used")
		rej.JTI = c.ID
		s.rejected(dctx, c.ID, rej, x)
		return nil, rej
	}
	if err := s.record(dctx, c.ID, audit.Step{ID: audit.StepTokenConsumed, Kind: audit.KindTokenConsumed, At: now.UTC(), Body: consumed}); err != nil {
		return nil, fmt.Errorf("txtoken: audit consumption of %s (token spent, call not run): %w", c.ID, err)
	}
	s.log.InfoContext(ctx, "txtoken: consumed", "jti", c.ID, "principal", x.Principal, "tool", x.Tool)
	return &Redemption{Claims: c, s: s}, nil
}

// usedEntry is the value of a consumed jti's entry in UsedBucket: the
// consumption, and a nonce of the redemption that wrote it, so a request
// whose write's answer was lost can tell its own write from another's.
type usedEntry struct {
	audit.TokenConsumed
	Redemption string `json:"redemption"`
}

// consume takes the consumption's jti with a create-only write, and
// reports whether this request took it (false: it was taken before). A
// write whose answer is an error other than "key exists" (a timeout, say)
// may have landed all the same: the entry is read back, without ctx's
// cancellation, and is this request's if it holds this request's nonce.
// An error means the store does not show this request's write (then the
// token may yet be spent by it) or could not be read.
func (s *Service) consume(ctx context.Context, consumed audit.TokenConsumed) (bool, error) {
	val, err := json.Marshal(usedEntry{TokenConsumed: consumed, Redemption: newID("")})
	if err != nil {
		return false, err
	}
	_, err = s.used.Create(ctx, consumed.JTI, val)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyExists):
		return false, nil
	}
	rctx, cancel := detach(ctx)
	defer cancel()
	e, gerr := s.used.Get(rctx, consumed.JTI)
	switch {
	case gerr == nil:
		s.log.WarnContext(ctx, "txtoken: consume answered an error, read back", "jti", consumed.JTI, "ours", bytes.Equal(e.Value(), val), "err", err)
		return bytes.Equal(e.Value(), val), nil
	case errors.Is(gerr, jetstream.ErrKeyNotFound):
		return false, fmt.Errorf("txtoken: consume %s (not in the store; nothing ran): %w", consumed.JTI, err)
	}
	return false, fmt.Errorf("txtoken: consume %s (outcome unknown, token may be spent; nothing ran; read back: %v): %w", consumed.JTI, gerr, err)
}

// internalError is the rejection recorded for a redemption a store
// failure stopped (TypeInternal); jti is set once the token verified.
func internalError(jti string) *Error {
	return &Error{StatusCode: 500, ErrorType: TypeInternal, Reason: ReasonInternal,
		Message: "the token could not be checked or consumed: a store failed; nothing ran", JTI: jti}
}

// settleTimeout bounds what is done after the jti is consumed without the
// caller's cancellation: the consumption and result records, and reading
// back a consume whose answer was lost. It exceeds recordPatience.
const settleTimeout = 2 * recordPatience

// detach is ctx without its cancellation, bounded by settleTimeout.
func detach(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
}

// Finish records what the one run returned: its disposition and the
// digest of its result (audit.Digest). It is recorded without ctx's
// cancellation: the call has run, whether or not its caller is still
// there. A failure is logged, and the chain then shows a consumption
// without a result.
func (r *Redemption) Finish(ctx context.Context, disposition string, result any) {
	ctx, cancel := detach(ctx)
	defer cancel()
	at := r.s.opts.Now().UTC()
	resultDigest, err := audit.Digest(result)
	if err != nil {
		r.s.log.ErrorContext(ctx, "txtoken: digest result", "jti", r.Claims.ID, "err", err)
	}
	if err := r.s.record(ctx, r.Claims.ID, audit.Step{ID: audit.StepTokenResult, Kind: audit.KindTokenResult, At: at, Body: audit.TokenResult{
		Disposition: disposition, ResultDigest: resultDigest, At: at,
	}}); err != nil {
		r.s.log.ErrorContext(ctx, "txtoken: audit result", "jti", r.Claims.ID, "err", err)
	}
}

// rejected records a rejection: in the token's chain (chain = its jti)
// when the token verified and the caller is its subject, else in a chain
// of its own; the record names the jti whenever the token verified
// (e.JTI). A failure to record is logged; the rejection stands.
func (s *Service) rejected(ctx context.Context, chain string, e *Error, x Expect) {
	jti := e.JTI
	s.log.WarnContext(ctx, "txtoken: rejected", "jti", jti, "error_type", e.ErrorType, "reason", e.Reason, "principal", x.Principal, "tool", x.Tool)
	step := newID("rejected-")
	if chain == "" {
		chain, step = newID("txr_"), "rejected"
	}
	at := s.opts.Now().UTC()
	if err := s.record(ctx, chain, audit.Step{ID: step, Kind: audit.KindTokenRejected, At: at, Body: audit.TokenRejected{
		JTI: jti, ErrorType: e.ErrorType, Reason: e.Reason, Principal: x.Principal, Tool: x.Tool, ActionHash: x.ActionHash, At: at,
	}}); err != nil {
		s.log.ErrorContext(ctx, "txtoken: audit rejection", "jti", jti, "reason", e.Reason, "err", err)
	}
}

// recordPatience bounds how long a record is retried: one token's chain
// takes every concurrent rejection of it, and audit.Log.Append gives up
// after a number of lost races. Appends are idempotent by step ID, so a
// retry never writes a step twice.
const recordPatience = 5 * time.Second

// record appends a step to a token's chain, retrying with jittered
// backoff until recordPatience has passed or ctx ends.
func (s *Service) record(ctx context.Context, chain string, step audit.Step) error {
	deadline := time.Now().Add(recordPatience)
	for attempt := 0; ; attempt++ {
		_, err := s.opts.Audit.Append(ctx, chain, step)
		if err == nil || errors.Is(err, audit.ErrSealed) || errors.Is(err, audit.ErrInvalidTaskID) || time.Now().After(deadline) {
			return err
		}
		wait := time.Duration(10+mrand.IntN(40*min(attempt+1, 5))) * time.Millisecond
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}
