package passkey

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-webauthn/webauthn/webauthn"
	"golang.org/x/text/unicode/norm"
)

// Approver is a human who may approve held tool calls with a passkey.
// It is also the stored record in the approvers bucket.
type Approver struct {
	ID     string   `json:"id"`
	Name   string   `json:"name"`
	Groups []string `json:"groups"`
	// Principals are the agent identities the approver acts as, in NFC:
	// the approver may not approve their calls (self_approval). None (an
	// approver added without, or before principals existed) means the
	// approver's own name; see ActsAs.
	Principals    []string  `json:"principals,omitempty"`
	CreatedAt     time.Time `json:"createdAt"`
	CredentialIDs []string  `json:"credentialIds"` // base64url (no padding) credential ids
	// DisabledAt and RevokedAt are set by an admin (admin.go): a disabled
	// approver takes no part until enabled again; a revoked one never does.
	DisabledAt time.Time `json:"disabledAt,omitzero"`
	RevokedAt  time.Time `json:"revokedAt,omitzero"`
}

// ActsAs reports whether principal, the authenticated identity that made a
// call, is the approver: their id, or one of their principals. Identities are
// identifiers, so a principal matches exactly, after Unicode NFC
// normalization and nothing else: no case folding, no look-alike folding.
//
// An approver without principals acts as their own name, compared as before
// principals existed: case-insensitively (after NFC). That default only ever
// refuses more than the exact rule, so records written before principals
// existed lose no protection; an admin who links principals replaces it, and
// the display name is then compared with nothing.
func (a Approver) ActsAs(principal string) bool {
	if principal == "" {
		return false
	}
	if principal == a.ID {
		return true
	}
	p := norm.NFC.String(principal)
	if len(a.Principals) == 0 {
		return strings.EqualFold(p, norm.NFC.String(a.Name))
	}
	for _, q := range a.Principals {
		if norm.NFC.String(q) == p {
			return true
		}
	}
	return false
}

// ApproverOption adjusts one AddApprover call.
type ApproverOption func(*approverOptions)

type approverOptions struct {
	principals []string
}

// WithPrincipals sets the agent identities the approver acts as (see
// [Approver.Principals]); without it, the approver acts as their own name.
func WithPrincipals(principals ...string) ApproverOption {
	return func(o *approverOptions) { o.principals = append(o.principals, principals...) }
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
	maxNameLen      = 128
	maxGroupLen     = 64
	maxGroups       = 64
	maxPrincipalLen = 128
	maxPrincipals   = 64
	tokenBytes      = 32 // invite tokens carry 256 bits
	approverIDSz    = 16
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
	if err := singleScript(name); err != nil {
		return fmt.Errorf("%w: name %v", ErrInvalidArgument, err)
	}
	return nil
}

// validatePrincipal accepts 1–128 visible characters (no spaces, controls or
// invisible format characters) from one script, and returns the principal
// in NFC.
func validatePrincipal(p string) (string, error) {
	if !utf8.ValidString(p) {
		return "", fmt.Errorf("%w: principal must be valid UTF-8", ErrInvalidArgument)
	}
	p = norm.NFC.String(p)
	if p == "" || utf8.RuneCountInString(p) > maxPrincipalLen {
		return "", fmt.Errorf("%w: principal must be 1-%d characters", ErrInvalidArgument, maxPrincipalLen)
	}
	for _, r := range p {
		if !unicode.IsGraphic(r) || unicode.IsSpace(r) {
			return "", fmt.Errorf("%w: principal contains %q", ErrInvalidArgument, r)
		}
	}
	if err := singleScript(p); err != nil {
		return "", fmt.Errorf("%w: principal %v", ErrInvalidArgument, err)
	}
	return p, nil
}

// singleScript refuses text whose letters mix scripts the way a look-alike
// does: "аlice" with a Cyrillic "а" reads as "alice". It applies the
// "Highly Restrictive" level of Unicode TS #39 (section 5.2): the letters
// come from one script, or from Latin together with the scripts written
// alongside it in Japanese (Han, Hiragana, Katakana), Chinese (Han,
// Bopomofo) or Korean (Han, Hangul). Digits, punctuation and spaces
// (script Common) and combining marks (Inherited) belong to every script.
//
// A name entirely in another script ("аре" in Cyrillic, like "ape") passes:
// that needs TS #39's confusables data, which the standard library and
// golang.org/x/text do not carry. Self-approval does not depend on it for an
// approver linked to their principals: it then compares identities
// ([Approver.ActsAs]), never display names.
func singleScript(s string) error {
	seen := map[string]bool{}
	for _, r := range s {
		if sc := scriptOf(r); sc != "" {
			seen[sc] = true
		}
	}
	if len(seen) <= 1 {
		return nil
	}
	for _, allowed := range scriptCombinations {
		ok := true
		for sc := range seen {
			if !slices.Contains(allowed, sc) {
				ok = false
				break
			}
		}
		if ok {
			return nil
		}
	}
	names := slices.Sorted(maps.Keys(seen))
	return fmt.Errorf("mixes %s letters, which makes look-alikes of other names; use one script", strings.Join(names, " and "))
}

// scriptCombinations are the mixes of scripts singleScript accepts.
var scriptCombinations = [][]string{
	{"Latin", "Han", "Hiragana", "Katakana"},
	{"Latin", "Han", "Bopomofo"},
	{"Latin", "Han", "Hangul"},
}

// scriptOf returns the Unicode script of r, or "" for Common, Inherited and
// unassigned code points.
func scriptOf(r rune) string {
	if unicode.Is(unicode.Common, r) || unicode.Is(unicode.Inherited, r) {
		return ""
	}
	// The likeliest first; each rune has exactly one script.
	for _, name := range []string{"Latin", "Cyrillic", "Greek"} {
		if unicode.Is(unicode.Scripts[name], r) {
			return name
		}
	}
	for name, t := range unicode.Scripts {
		if unicode.Is(t, r) {
			return name
		}
	}
	return ""
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
func (s *Service) AddApprover(ctx context.Context, name string, groups []string, opts ...ApproverOption) (Approver, string, error) {
	var o approverOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := validateName(name); err != nil {
		return Approver{}, "", err
	}
	if len(o.principals) > maxPrincipals {
		return Approver{}, "", fmt.Errorf("%w: at most %d principals", ErrInvalidArgument, maxPrincipals)
	}
	principals := make([]string, 0, len(o.principals))
	for _, p := range o.principals {
		p, err := validatePrincipal(p)
		if err != nil {
			return Approver{}, "", err
		}
		principals = append(principals, p)
	}
	slices.Sort(principals)
	principals = slices.Compact(principals)
	if len(principals) == 0 {
		principals = nil // the approver acts as their name (ActsAs)
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
		Principals:    principals,
		CreatedAt:     s.now().UTC(),
		CredentialIDs: []string{},
	}
	if err := s.record(ctx, Event{Kind: EventAdd, ApproverID: a.ID, By: actorOf(ctx)}); err != nil {
		return Approver{}, "", err
	}
	if _, err := createJSON(ctx, s.approvers, a.ID, &a); err != nil {
		return Approver{}, "", fmt.Errorf("passkey: add approver: %w", err)
	}
	token, err := s.createInvite(ctx, a.ID)
	if err != nil {
		return Approver{}, "", err
	}
	s.log.InfoContext(ctx, "approver added", "approver_id", a.ID, "groups", a.Groups, "principals", a.Principals)
	return a, token, nil
}

// NewInvite issues another enrollment invite for an existing approver, for
// example to enroll a second passkey. Earlier invites stay valid until used
// or expired. A revoked approver gets none (ErrRevoked), nor does a
// disabled one (ErrInvalidArgument: enable them first).
func (s *Service) NewInvite(ctx context.Context, approverID string) (string, error) {
	a, err := s.Approver(ctx, approverID)
	if err != nil {
		return "", err
	}
	switch {
	case !a.RevokedAt.IsZero():
		return "", fmt.Errorf("%w: approver %s", ErrRevoked, approverID)
	case !a.DisabledAt.IsZero():
		return "", fmt.Errorf("%w: approver %s is disabled; enable them first", ErrInvalidArgument, approverID)
	}
	return s.createInvite(ctx, approverID)
}

func (s *Service) createInvite(ctx context.Context, approverID string) (string, error) {
	b := make([]byte, tokenBytes)
	_, _ = rand.Read(b)
	token := base64.RawURLEncoding.EncodeToString(b)
	now := s.now().UTC()
	rec := inviteRecord{ApproverID: approverID, CreatedAt: now, ExpiresAt: now.Add(s.inviteTTL)}
	if err := s.record(ctx, Event{Kind: EventInvite, ApproverID: approverID, By: actorOf(ctx), Key: inviteChangeKey(inviteKey(token))}); err != nil {
		return "", err
	}
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
