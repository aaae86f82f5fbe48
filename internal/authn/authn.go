// Package authn issues and checks the bearer tokens of agents and admins.
//
// Tokens are 256-bit random strings shown once; only their SHA-256 is kept,
// in NATS JetStream key-value, so a copy of the bucket does not leak usable
// tokens. A token names one principal: an agent (which calls /mcp and owns
// the tasks it creates) or an admin (which calls /admin/v1).
package authn

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Bucket is the NATS KV bucket of token digests.
const Bucket = "countersign_tokens"

// Kinds of principal.
const (
	KindAgent = "agent"
	KindAdmin = "admin"
)

// Sentinel errors.
var (
	ErrInvalidToken = errors.New("authn: invalid token")
	// ErrMissingToken is a request without a bearer token. It wraps
	// ErrInvalidToken, so callers that answer both with 401 need test only
	// for that; it tells them apart for the message.
	ErrMissingToken = fmt.Errorf("%w: no bearer token", ErrInvalidToken)
	// ErrDisabled is the token of a principal an admin disabled (and has
	// not revoked). It wraps ErrInvalidToken, so callers that answer 401
	// need test only for that; it lets the holder of a valid token be told
	// that its principal is disabled, where an unknown or revoked token
	// learns only that it is invalid.
	ErrDisabled = fmt.Errorf("%w: this principal is disabled", ErrInvalidToken)
	// ErrUnavailable is wrapped by lookups that failed because the token
	// store could not answer (NATS down or slow): not a verdict on the
	// token, so callers answer 503, never 401.
	ErrUnavailable = errors.New("authn: token store unavailable")
	ErrInvalidName = errors.New("authn: name must be 1-64 characters of letters, digits, '.', '_', '-' or '@'")
	ErrNameTaken   = errors.New("authn: an agent with that name already exists")
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9._@-]{1,64}$`)

// Principal is who a token speaks for.
type Principal struct {
	Name      string    `json:"name"`
	Kind      string    `json:"kind"`
	CreatedAt time.Time `json:"createdAt"`
	// DisabledAt and RevokedAt are set by an admin (manage.go): the token
	// of a disabled or revoked principal is invalid.
	DisabledAt time.Time `json:"disabledAt,omitzero"`
	RevokedAt  time.Time `json:"revokedAt,omitzero"`
}

// Tokens is the token store.
type Tokens struct {
	kv jetstream.KeyValue
}

// Options configures [Open].
type Options struct {
	// Replicas of the bucket in a clustered NATS; 0 means 1.
	Replicas int
}

// Open opens (creating if needed) the token bucket.
func Open(ctx context.Context, js jetstream.JetStream, opts Options) (*Tokens, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      Bucket,
		Description: "Countersign bearer token digests",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    max(opts.Replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("authn: open bucket: %w", err)
	}
	return &Tokens{kv: kv}, nil
}

func digest(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// NewToken returns a fresh random token with a kind prefix.
func NewToken(kind string) string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("authn: crypto/rand failed: " + err.Error())
	}
	return "cs" + kind[:2] + "_" + base64.RawURLEncoding.EncodeToString(b[:])
}

// ValidName reports whether name is a valid agent or admin name (and so a
// principal a static token can give).
func ValidName(name string) bool { return nameRE.MatchString(name) }

// Issue creates a token for a new principal and returns it. Agent names are
// unique: an agent's name is the principal that owns its tasks.
func (t *Tokens) Issue(ctx context.Context, name, kind string) (string, error) {
	token := NewToken(kind)
	return token, t.Register(ctx, token, name, kind)
}

// Register stores a token chosen elsewhere (the dev bootstrap writes its
// tokens to files first, then registers them).
func (t *Tokens) Register(ctx context.Context, token, name, kind string) error {
	if !nameRE.MatchString(name) {
		return ErrInvalidName
	}
	if kind != KindAgent && kind != KindAdmin {
		return fmt.Errorf("authn: unknown kind %q", kind)
	}
	if len(token) < 32 {
		return errors.New("authn: token too short")
	}
	if _, err := t.kv.Create(ctx, "n."+kind+"."+nameKey(name), []byte(digest(token))); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return ErrNameTaken
		}
		return fmt.Errorf("authn: register: %w", err)
	}
	b, _ := json.Marshal(Principal{Name: name, Kind: kind, CreatedAt: time.Now().UTC()})
	if _, err := t.kv.Create(ctx, "t."+digest(token), b); err != nil {
		return fmt.Errorf("authn: register: %w", err)
	}
	return nil
}

// NameTaken reports whether a principal of kind is named name, whatever
// its status (a revoked name is never given again).
func (t *Tokens) NameTaken(ctx context.Context, name, kind string) (bool, error) {
	_, err := t.kv.Get(ctx, "n."+kind+"."+nameKey(name))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	}
	return false, fmt.Errorf("authn: look up name: %w", err)
}

// nameKey maps a name to a KV-safe key ('@' is not allowed in keys).
func nameKey(name string) string { return strings.ReplaceAll(name, "@", "=40") }

// Lookup returns the principal of a token; a revoked one is
// ErrInvalidToken, a disabled one ErrDisabled (which wraps it).
func (t *Tokens) Lookup(ctx context.Context, token string) (Principal, error) {
	p, err := t.find(ctx, token)
	if err != nil {
		return Principal{}, err
	}
	return active(p)
}

// find returns the principal of a token, whatever its status.
func (t *Tokens) find(ctx context.Context, token string) (Principal, error) {
	if token == "" || len(token) > 256 {
		return Principal{}, ErrInvalidToken
	}
	e, err := t.kv.Get(ctx, "t."+digest(token))
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return Principal{}, ErrInvalidToken
		}
		return Principal{}, fmt.Errorf("%w: lookup: %w", ErrUnavailable, err)
	}
	var p Principal
	if err := json.Unmarshal(e.Value(), &p); err != nil {
		return Principal{}, fmt.Errorf("authn: decode: %w", err)
	}
	return p, nil
}

// active returns p if it is active: read on every request, on every
// replica, so a disabled or revoked token stops at once.
func active(p Principal) (Principal, error) {
	switch p.Status() {
	case StatusActive:
		return p, nil
	case StatusDisabled:
		return Principal{}, ErrDisabled
	default:
		return Principal{}, ErrInvalidToken
	}
}

// Agent returns the agent name of a token, or ErrInvalidToken when the token
// is unknown, revoked or not an agent's (ErrDisabled, which wraps it, when
// the agent is disabled).
func (t *Tokens) Agent(ctx context.Context, token string) (string, error) {
	p, err := t.find(ctx, token)
	if err != nil {
		return "", err
	}
	if p.Kind != KindAgent {
		return "", ErrInvalidToken
	}
	if p, err = active(p); err != nil {
		return "", err
	}
	return p.Name, nil
}

// IsAdmin reports whether token is an admin token.
func (t *Tokens) IsAdmin(ctx context.Context, token string) bool {
	p, err := t.Lookup(ctx, token)
	return err == nil && p.Kind == KindAdmin
}

// AuthorizeAdmin checks that r bears an admin token ("Authorization: Bearer
// X"). A missing, unknown or non-admin token is [ErrInvalidToken] (answer
// 401; a missing one is also [ErrMissingToken]); any other error is the token store failing (answer 500, not 401, so
// an outage is not mistaken for a revoked token). It fits the
// func(*http.Request) error authorizers of the admin endpoints.
func (t *Tokens) AuthorizeAdmin(r *http.Request) error {
	_, err := t.Admin(r)
	return err
}

// Admin is [Tokens.AuthorizeAdmin] that also returns the admin, for an
// endpoint whose audit record names who acted.
func (t *Tokens) Admin(r *http.Request) (Principal, error) {
	tok := BearerToken(r.Header.Get("Authorization"))
	if tok == "" {
		return Principal{}, ErrMissingToken
	}
	p, err := t.Lookup(r.Context(), tok)
	if err != nil {
		return Principal{}, err // ErrInvalidToken, or the store's failure, wrapped
	}
	if p.Kind != KindAdmin {
		return Principal{}, ErrInvalidToken
	}
	return p, nil
}

// BearerToken extracts the token of an "Authorization: Bearer X" header.
func BearerToken(header string) string {
	scheme, tok, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}
