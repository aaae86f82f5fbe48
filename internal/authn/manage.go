package authn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Statuses of a principal's token, as admins set them.
const (
	StatusActive   = "active"
	StatusDisabled = "disabled" // reversible
	StatusRevoked  = "revoked"  // permanent
)

// Admin actions on an agent.
const (
	ActionDisable = "disable"
	ActionEnable  = "enable"
	ActionRevoke  = "revoke"
)

// Management errors.
var (
	// ErrNotFound: no agent (or admin) of that name.
	ErrNotFound = errors.New("authn: no such principal")
	// ErrRevoked: an action other than revoke on a revoked principal;
	// revocation is permanent.
	ErrRevoked = errors.New("authn: revoked; a revocation is permanent")
	// ErrAdminExists: InitAdmin found an active admin token and was not
	// asked to rotate.
	ErrAdminExists = errors.New("authn: an admin token already exists")
	// ErrTokenRevoked: RegisterAdmin was given a token that was revoked.
	ErrTokenRevoked = errors.New("authn: this token was revoked")
)

// Status is the principal's status: StatusActive, StatusDisabled or
// StatusRevoked.
func (p Principal) Status() string {
	switch {
	case !p.RevokedAt.IsZero():
		return StatusRevoked
	case !p.DisabledAt.IsZero():
		return StatusDisabled
	}
	return StatusActive
}

// Active reports whether the principal's token is accepted.
func (p Principal) Active() bool { return p.Status() == StatusActive }

// Change is the result of an admin action: the status after it, whether
// it changed anything, the KV revision of the record holding the status
// (an idempotency key for its audit record) and when the status was set.
type Change struct {
	Status   string
	Changed  bool
	Revision uint64
	At       time.Time
}

// Fingerprint names a token in listings and audit records without
// revealing it: the first 16 hex characters of its SHA-256.
func Fingerprint(token string) string { return digest(token)[:16] }

// Agents returns every agent, active or not, and every OAuth principal an
// admin disabled or revoked (or enabled again), ordered by name.
func (t *Tokens) Agents(ctx context.Context) ([]Principal, error) {
	return t.principals(ctx, KindAgent, KindOAuth)
}

// Admins returns every admin token's principal (a rotated-out token
// appears as revoked), ordered by name then creation.
func (t *Tokens) Admins(ctx context.Context) ([]Principal, error) {
	return t.principals(ctx, KindAdmin)
}

func (t *Tokens) principals(ctx context.Context, kinds ...string) ([]Principal, error) {
	filters := []string{"t.>"}
	if slices.Contains(kinds, KindOAuth) {
		filters = append(filters, "o.>")
	}
	l, err := t.kv.ListKeysFiltered(ctx, filters...)
	if err != nil {
		return nil, fmt.Errorf("authn: list: %w", err)
	}
	defer func() { _ = l.Stop() }()
	out := []Principal{}
	for key := range l.Keys() {
		e, err := t.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("authn: list: %w", err)
		}
		var p Principal
		if err := json.Unmarshal(e.Value(), &p); err != nil {
			return nil, fmt.Errorf("authn: decode %s: %w", key, err)
		}
		if slices.Contains(kinds, p.Kind) {
			out = append(out, p)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b Principal) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return a.CreatedAt.Compare(b.CreatedAt)
	})
	return out, nil
}

// currentDigest returns the digest of the token that kind/name holds now,
// and the revision of that name record.
func (t *Tokens) currentDigest(ctx context.Context, kind, name string) (string, uint64, error) {
	if !nameRE.MatchString(name) {
		return "", 0, fmt.Errorf("%w: %s %q", ErrNotFound, kind, name)
	}
	e, err := t.kv.Get(ctx, "n."+kind+"."+nameKey(name))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", 0, fmt.Errorf("%w: %s %q", ErrNotFound, kind, name)
	}
	if err != nil {
		return "", 0, fmt.Errorf("authn: get %s: %w", kind, err)
	}
	return string(e.Value()), e.Revision(), nil
}

// AgentPrincipal returns one agent's principal, whatever its status.
func (t *Tokens) AgentPrincipal(ctx context.Context, name string) (Principal, error) {
	d, _, err := t.currentDigest(ctx, KindAgent, name)
	if err != nil {
		return Principal{}, err
	}
	p, _, err := t.record(ctx, "t."+d)
	return p, err
}

// record reads the status record under key: a token's ("t.<digest>") or
// an OAuth principal's ("o.<digest>").
func (t *Tokens) record(ctx context.Context, key string) (Principal, uint64, error) {
	e, err := t.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Principal{}, 0, fmt.Errorf("%w: status record", ErrNotFound)
	}
	if err != nil {
		return Principal{}, 0, fmt.Errorf("authn: get token: %w", err)
	}
	var p Principal
	if err := json.Unmarshal(e.Value(), &p); err != nil {
		return Principal{}, 0, fmt.Errorf("authn: decode: %w", err)
	}
	return p, e.Revision(), nil
}

// setStatus applies action to the status record under key by
// compare-and-set.
func (t *Tokens) setStatus(ctx context.Context, key, action string, now time.Time) (Principal, Change, error) {
	for range 16 {
		p, rev, err := t.record(ctx, key)
		if err != nil {
			return Principal{}, Change{}, err
		}
		unchanged := func(at time.Time) (Principal, Change, error) {
			return p, Change{Status: p.Status(), Revision: rev, At: at}, nil
		}
		if action != ActionRevoke && !p.RevokedAt.IsZero() {
			return p, Change{Status: p.Status(), Revision: rev}, ErrRevoked
		}
		switch action {
		case ActionRevoke:
			if !p.RevokedAt.IsZero() {
				return unchanged(p.RevokedAt)
			}
			p.RevokedAt = now
		case ActionDisable:
			if !p.DisabledAt.IsZero() {
				return unchanged(p.DisabledAt)
			}
			p.DisabledAt = now
		case ActionEnable:
			if p.DisabledAt.IsZero() {
				return unchanged(now)
			}
			p.DisabledAt = time.Time{}
		default:
			return Principal{}, Change{}, fmt.Errorf("authn: unknown action %q (want disable, enable or revoke)", action)
		}
		b, err := json.Marshal(p)
		if err != nil {
			return Principal{}, Change{}, err
		}
		newRev, err := t.kv.Update(ctx, key, b, rev)
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		}
		if err != nil {
			return Principal{}, Change{}, fmt.Errorf("authn: %s: %w", action, err)
		}
		return p, Change{Status: p.Status(), Changed: true, Revision: newRev, At: now}, nil
	}
	return Principal{}, Change{}, errors.New("authn: too much contention on the token record")
}

// SetAgentStatus disables, enables or revokes an agent's token. It takes
// effect at once on every replica: every request looks its token up (no
// cache), so the next one is 401. Disable and enable are reversible; a
// revoke is permanent, and the name stays taken (the agent's tasks belong
// to its name). Repeating the current status changes nothing
// (Change.Changed false); any action but revoke on a revoked agent is
// ErrRevoked; an unknown agent wraps ErrNotFound.
func (t *Tokens) SetAgentStatus(ctx context.Context, name, action string) (Principal, Change, error) {
	d, _, err := t.currentDigest(ctx, KindAgent, name)
	if err != nil {
		return Principal{}, Change{}, err
	}
	return t.setStatus(ctx, "t."+d, action, time.Now().UTC())
}

// AdminChange is what InitAdmin or RegisterAdmin did.
type AdminChange struct {
	Name string
	// Fingerprint is the new token's.
	Fingerprint string
	// Changed: a token was registered (false: it was already, nothing done).
	Changed bool
	// Replaced is the fingerprint of the token the new one replaced and
	// revoked ("" when there was none).
	Replaced string
	Revision uint64
	At       time.Time
}

// InitAdmin creates the first admin token, named name, and returns it. It
// refuses (ErrAdminExists, naming the admins) when any admin token is
// active, unless rotate: then the named admin's token, if any, is revoked
// and replaced by the new one.
func (t *Tokens) InitAdmin(ctx context.Context, name string, rotate bool) (string, AdminChange, error) {
	if !nameRE.MatchString(name) {
		return "", AdminChange{}, ErrInvalidName
	}
	if !rotate {
		admins, err := t.Admins(ctx)
		if err != nil {
			return "", AdminChange{}, err
		}
		var active []string
		for _, a := range admins {
			if a.Active() {
				active = append(active, a.Name)
			}
		}
		if len(active) > 0 {
			return "", AdminChange{}, fmt.Errorf("%w (%s)", ErrAdminExists, strings.Join(active, ", "))
		}
	}
	token := NewToken(KindAdmin)
	ch, err := t.setAdmin(ctx, token, name)
	return token, ch, err
}

// RegisterAdmin makes token the admin token of name, as the server does at
// start with --admin-token-file: idempotent (a token already registered
// for name changes nothing, so any number of replicas may run it), and a
// different token replaces and revokes name's earlier one (rotating the
// secret). A token once revoked is ErrTokenRevoked: a replica started with
// an old secret does not undo a rotation.
func (t *Tokens) RegisterAdmin(ctx context.Context, token, name string) (AdminChange, error) {
	if !nameRE.MatchString(name) {
		return AdminChange{}, ErrInvalidName
	}
	if len(token) < 32 || len(token) > 256 {
		return AdminChange{}, errors.New("authn: an admin token must be 32 to 256 characters")
	}
	return t.setAdmin(ctx, token, name)
}

// setAdmin registers token as name's admin token: first its token record,
// then the name record pointing at it, then the revocation of the token it
// replaced. Run again after a crash at any step, it finishes the job.
func (t *Tokens) setAdmin(ctx context.Context, token, name string) (AdminChange, error) {
	d := digest(token)
	now := time.Now().UTC()
	ch := AdminChange{Name: name, Fingerprint: d[:16], At: now}
	b, _ := json.Marshal(Principal{Name: name, Kind: KindAdmin, CreatedAt: now})
	rev, err := t.kv.Create(ctx, "t."+d, b)
	switch {
	case err == nil:
		ch.Changed, ch.Revision = true, rev
	case errors.Is(err, jetstream.ErrKeyExists):
		p, rev, err := t.record(ctx, "t."+d)
		if err != nil {
			return AdminChange{}, err
		}
		if p.Kind != KindAdmin || p.Name != name {
			return AdminChange{}, fmt.Errorf("authn: this token is already registered for %s %q", p.Kind, p.Name)
		}
		if !p.RevokedAt.IsZero() {
			return AdminChange{}, ErrTokenRevoked
		}
		ch.Revision, ch.At = rev, p.CreatedAt
	default:
		return AdminChange{}, fmt.Errorf("authn: register admin: %w", err)
	}
	nameKey := "n." + KindAdmin + "." + nameKey(name)
	for range 16 {
		e, err := t.kv.Get(ctx, nameKey)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			if _, err := t.kv.Create(ctx, nameKey, []byte(d)); errors.Is(err, jetstream.ErrKeyExists) {
				continue
			} else if err != nil {
				return AdminChange{}, fmt.Errorf("authn: register admin: %w", err)
			}
			return ch, nil
		}
		if err != nil {
			return AdminChange{}, fmt.Errorf("authn: register admin: %w", err)
		}
		old := string(e.Value())
		if old == d {
			return ch, nil
		}
		if _, err := t.kv.Update(ctx, nameKey, []byte(d), e.Revision()); errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		} else if err != nil {
			return AdminChange{}, fmt.Errorf("authn: register admin: %w", err)
		}
		if _, _, err := t.setStatus(ctx, "t."+old, ActionRevoke, now); err != nil && !errors.Is(err, ErrNotFound) {
			return AdminChange{}, fmt.Errorf("authn: revoke the replaced admin token: %w", err)
		}
		ch.Changed, ch.Replaced = true, old[:16]
		return ch, nil
	}
	return AdminChange{}, errors.New("authn: too much contention on the admin name")
}

// WatchInactive calls fn, from its own goroutine, with each principal whose
// token is disabled or revoked from now on (an OAuth principal's included,
// Kind KindOAuth), until ctx ends: a process ends what a token opened once
// and keeps open (notification streams) with it. Lookups need no such
// watch: they read the store on every request.
func (t *Tokens) WatchInactive(ctx context.Context, fn func(Principal)) error {
	w, err := t.kv.WatchFiltered(ctx, []string{"t.>", "o.>"}, jetstream.UpdatesOnly(), jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("authn: watch: %w", err)
	}
	go func() {
		defer func() { _ = w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					continue
				}
				var p Principal
				if json.Unmarshal(e.Value(), &p) == nil && !p.Active() {
					fn(p)
				}
			}
		}
	}()
	return nil
}
