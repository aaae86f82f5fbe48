package passkey

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-webauthn/webauthn/webauthn"
	"github.com/nats-io/nats.go/jetstream"
)

// Approver is a human who may approve held tool calls with a passkey.
// It is also the stored record in the approvers bucket.
type Approver struct {
	ID            string    `json:"id"`
	Name          string    `json:"name"`
	Groups        []string  `json:"groups"`
	CreatedAt     time.Time `json:"createdAt"`
	CredentialIDs []string  `json:"credentialIds"` // base64url (no padding) credential ids
}

// inviteRecord is the stored enrollment invite, keyed by the SHA-256 of the
// token so a reader of the bucket cannot enroll with it.
type inviteRecord struct {
	ApproverID   string    `json:"approverId"`
	CreatedAt    time.Time `json:"createdAt"`
	ExpiresAt    time.Time `json:"expiresAt"`
	UsedAt       time.Time `json:"usedAt,omitzero"`
	CredentialID string    `json:"credentialId,omitempty"`
	// Session is the pending registration from BeginEnrollment.
	Session          *webauthn.SessionData `json:"session,omitempty"`
	SessionExpiresAt time.Time             `json:"sessionExpiresAt,omitzero"`
}

const (
	maxNameLen   = 128
	maxGroupLen  = 64
	maxGroups    = 64
	tokenBytes   = 32 // invite tokens carry 256 bits
	approverIDSz = 16
)

// validateName accepts 1–128 characters of letters, digits, spaces and
// @ . _ + - ' with no leading or trailing space.
func validateName(name string) error {
	if name == "" || !utf8.ValidString(name) || utf8.RuneCountInString(name) > maxNameLen {
		return fmt.Errorf("%w: name must be 1-%d characters of valid UTF-8", ErrInvalidArgument, maxNameLen)
	}
	if strings.TrimSpace(name) != name {
		return fmt.Errorf("%w: name must not start or end with space", ErrInvalidArgument)
	}
	for _, r := range name {
		if unicode.IsLetter(r) || unicode.IsDigit(r) || r == ' ' || strings.ContainsRune("@._+-'", r) {
			continue
		}
		return fmt.Errorf("%w: name contains %q", ErrInvalidArgument, r)
	}
	return nil
}

// validateGroup accepts 1–64 ASCII letters, digits and . _ : - starting with
// a letter or digit.
func validateGroup(g string) error {
	if g == "" || len(g) > maxGroupLen {
		return fmt.Errorf("%w: group must be 1-%d characters", ErrInvalidArgument, maxGroupLen)
	}
	for i := 0; i < len(g); i++ {
		c := g[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if alnum || (i > 0 && strings.IndexByte("._:-", c) >= 0) {
			continue
		}
		return fmt.Errorf("%w: group %q must match [A-Za-z0-9][A-Za-z0-9._:-]*", ErrInvalidArgument, g)
	}
	return nil
}

// AddApprover creates an approver in the given groups and returns an
// enrollment invite token for them. The token is shown once: only its hash
// is stored.
func (s *Service) AddApprover(ctx context.Context, name string, groups []string) (Approver, string, error) {
	if err := validateName(name); err != nil {
		return Approver{}, "", err
	}
	if len(groups) == 0 || len(groups) > maxGroups {
		return Approver{}, "", fmt.Errorf("%w: 1-%d groups required", ErrInvalidArgument, maxGroups)
	}
	for _, g := range groups {
		if err := validateGroup(g); err != nil {
			return Approver{}, "", err
		}
	}
	gs := slices.Clone(groups)
	slices.Sort(gs)
	a := Approver{
		ID:            randomID(approverIDSz),
		Name:          name,
		Groups:        slices.Compact(gs),
		CreatedAt:     s.now().UTC(),
		CredentialIDs: []string{},
	}
	if _, err := createJSON(ctx, s.approvers, a.ID, &a); err != nil {
		return Approver{}, "", fmt.Errorf("passkey: add approver: %w", err)
	}
	token, err := s.createInvite(ctx, a.ID)
	if err != nil {
		return Approver{}, "", err
	}
	s.log.InfoContext(ctx, "approver added", "approver_id", a.ID, "groups", a.Groups)
	return a, token, nil
}

// NewInvite issues another enrollment invite for an existing approver, for
// example to enroll a second passkey. Earlier invites stay valid until used
// or expired.
func (s *Service) NewInvite(ctx context.Context, approverID string) (string, error) {
	if _, err := s.Approver(ctx, approverID); err != nil {
		return "", err
	}
	return s.createInvite(ctx, approverID)
}

func (s *Service) createInvite(ctx context.Context, approverID string) (string, error) {
	b := make([]byte, tokenBytes)
	_, _ = rand.Read(b)
	token := base64.RawURLEncoding.EncodeToString(b)
	now := s.now().UTC()
	rec := inviteRecord{ApproverID: approverID, CreatedAt: now, ExpiresAt: now.Add(s.inviteTTL)}
	if _, err := createJSON(ctx, s.invites, inviteKey(token), &rec); err != nil {
		return "", fmt.Errorf("passkey: create invite: %w", err)
	}
	s.log.InfoContext(ctx, "invite issued", "approver_id", approverID, "expires_at", rec.ExpiresAt)
	return token, nil
}

// inviteKey is the bucket key of an invite token: hex(SHA-256(token)).
func inviteKey(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// validToken reports whether token has the shape createInvite produces.
func validToken(token string) bool {
	if len(token) != base64.RawURLEncoding.EncodedLen(tokenBytes) {
		return false
	}
	_, err := base64.RawURLEncoding.DecodeString(token)
	return err == nil
}

// Approver returns one approver, or an error wrapping ErrNotFound.
func (s *Service) Approver(ctx context.Context, id string) (Approver, error) {
	if !isHexID(id) {
		return Approver{}, fmt.Errorf("%w: approver %q", ErrNotFound, id)
	}
	var a Approver
	if _, err := getJSON(ctx, s.approvers, id, &a); err != nil {
		if isNotFound(err) {
			return Approver{}, fmt.Errorf("%w: approver %q", ErrNotFound, id)
		}
		return Approver{}, fmt.Errorf("passkey: get approver: %w", err)
	}
	return a, nil
}

// Approvers returns every approver, ordered by id.
func (s *Service) Approvers(ctx context.Context) ([]Approver, error) {
	w, err := s.approvers.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("passkey: list approvers: %w", err)
	}
	defer func() { _ = w.Stop() }()
	out := []Approver{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("passkey: list approvers: watcher closed")
			}
			if e == nil { // end of the initial values
				slices.SortFunc(out, func(a, b Approver) int { return strings.Compare(a.ID, b.ID) })
				return out, nil
			}
			var a Approver
			if err := json.Unmarshal(e.Value(), &a); err != nil {
				return nil, fmt.Errorf("passkey: decode approver %s: %w", e.Key(), err)
			}
			out = append(out, a)
		}
	}
}
