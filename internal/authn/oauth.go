package authn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// KindOAuth is the kind of an OAuth principal's status record: a
// principal whose OAuth access tokens an admin disabled or revoked here.
// Countersign holds no token of it (the identity provider issues them); the
// record, "o.<digest of the principal>", holds only its status, and is
// written the first time an admin disables or revokes the principal.
const KindOAuth = "oauth"

// OAuthPrefix begins every OAuth principal (oauth.PrincipalPrefix), and no
// agent name: an agent name is letters, digits and . _ - @ only.
const OAuthPrefix = "oauth:"

func oauthKey(principal string) string { return "o." + digest(principal) }

// ErrPrincipalInactive is OAuthActive's answer for a principal an admin
// disabled or revoked. It wraps ErrInvalidToken.
var ErrPrincipalInactive = fmt.Errorf("%w: this principal is disabled or revoked at Countersign", ErrInvalidToken)

// OAuthActive returns nil when principal's OAuth access tokens are
// accepted: it has no status record, or an active one. It reads the store
// on every call, on every replica, as token lookups do, so a disable takes
// effect at the next request. A principal disabled or revoked is
// ErrPrincipalInactive; a store that cannot answer wraps ErrUnavailable.
func (t *Tokens) OAuthActive(ctx context.Context, principal string) error {
	e, err := t.kv.Get(ctx, oauthKey(principal))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: principal status: %w", ErrUnavailable, err)
	}
	var p Principal
	if err := json.Unmarshal(e.Value(), &p); err != nil {
		return fmt.Errorf("%w: principal status: decode: %w", ErrUnavailable, err)
	}
	if !p.Active() {
		return ErrPrincipalInactive
	}
	return nil
}

// SetOAuthStatus disables, enables or revokes an OAuth principal
// (OAuthPrefix and its principal claim; the caller checks that it is one
// a token can give). As for an agent: disable and enable are reversible, a
// revoke is permanent, repeating the current status changes nothing, and
// any action but revoke on a revoked principal is ErrRevoked. The first
// disable or revoke creates the principal's record; enabling a principal
// without one changes nothing.
func (t *Tokens) SetOAuthStatus(ctx context.Context, principal, action string) (Principal, Change, error) {
	if !strings.HasPrefix(principal, OAuthPrefix) {
		return Principal{}, Change{}, fmt.Errorf("%w: %q is not an OAuth principal", ErrNotFound, principal)
	}
	switch action {
	case ActionDisable, ActionEnable, ActionRevoke:
	default:
		return Principal{}, Change{}, fmt.Errorf("authn: unknown action %q (want disable, enable or revoke)", action)
	}
	now := time.Now().UTC()
	key := oauthKey(principal)
	if action != ActionEnable {
		b, err := json.Marshal(Principal{Name: principal, Kind: KindOAuth, CreatedAt: now})
		if err != nil {
			return Principal{}, Change{}, err
		}
		if _, err := t.kv.Create(ctx, key, b); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			return Principal{}, Change{}, fmt.Errorf("authn: %s: %w", action, err)
		}
	}
	p, ch, err := t.setStatus(ctx, key, action, now)
	if errors.Is(err, ErrNotFound) && action == ActionEnable {
		return Principal{Name: principal, Kind: KindOAuth}, Change{Status: StatusActive, At: now}, nil
	}
	return p, ch, err
}
