package oauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// discover finds the issuer's jwks_uri: OpenID Connect Discovery
// ({issuer}/.well-known/openid-configuration), then RFC 8414
// (/.well-known/oauth-authorization-server inserted before the issuer's
// path), then OpenID Connect with the path inserted, as MCP clients try
// them. The document's issuer must be the issuer exactly.
func discover(ctx context.Context, client *http.Client, issuer string) (string, error) {
	u, _ := url.Parse(issuer) // checked by validate
	path := strings.TrimSuffix(u.Path, "/")
	base := u.Scheme + "://" + u.Host
	candidates := []string{
		strings.TrimSuffix(issuer, "/") + "/.well-known/openid-configuration",
		base + "/.well-known/oauth-authorization-server" + path,
	}
	if path != "" {
		candidates = append(candidates, base+"/.well-known/openid-configuration"+path)
	}
	var errs []error
	for _, c := range candidates {
		var doc struct {
			Issuer  string `json:"issuer"`
			JWKSURI string `json:"jwks_uri"`
		}
		status, err := getJSON(ctx, client, c, &doc)
		switch {
		case status == http.StatusNotFound:
			errs = append(errs, fmt.Errorf("%s: 404", c))
			continue
		case err != nil:
			return "", fmt.Errorf("oauth: discovery at %s: %w", c, err)
		case doc.Issuer != issuer:
			return "", fmt.Errorf("oauth: discovery at %s names issuer %q, not %q (they must be equal exactly)", c, doc.Issuer, issuer)
		case doc.JWKSURI == "":
			return "", fmt.Errorf("oauth: discovery at %s has no jwks_uri", c)
		}
		return doc.JWKSURI, nil
	}
	return "", fmt.Errorf("oauth: no discovery document for issuer %q: %w", issuer, errors.Join(errs...))
}

// getJSON fetches a JSON document of at most maxDocumentBytes; status is the
// HTTP status (0 when there was none).
func getJSON(ctx context.Context, client *http.Client, u string, dst any) (status int, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxDocumentBytes+1))
	if err != nil {
		return resp.StatusCode, err
	}
	if len(b) > maxDocumentBytes {
		return resp.StatusCode, fmt.Errorf("larger than %d bytes", maxDocumentBytes)
	}
	if err := json.Unmarshal(b, dst); err != nil {
		return resp.StatusCode, fmt.Errorf("not a JSON document: %w", err)
	}
	return resp.StatusCode, nil
}

// keySet is the issuer's JWKS, fetched again when it is old or lacks a
// token's kid (at most once per minRefresh), one fetch at a time.
type keySet struct {
	url        string
	client     *http.Client
	maxAge     time.Duration
	minRefresh time.Duration
	log        *slog.Logger

	// fetchMu is held by the one goroutine fetching; mu guards the rest.
	fetchMu   sync.Mutex
	mu        sync.Mutex
	keys      []jose.JSONWebKey
	fetchedAt time.Time // last successful fetch
	triedAt   time.Time // last attempt, successful or not
}

// candidates returns the keys that may have signed a token with kid and
// alg, fetching the set again if it is older than maxAge or lacks kid.
func (s *keySet) candidates(ctx context.Context, kid, alg string) ([]jose.JSONWebKey, error) {
	now := time.Now()
	s.mu.Lock()
	keys, fetchedAt, triedAt := s.keys, s.fetchedAt, s.triedAt
	s.mu.Unlock()
	found := match(keys, kid, alg)
	stale := now.Sub(fetchedAt) > s.maxAge
	if (len(found) == 0 || stale) && now.Sub(triedAt) >= s.minRefresh {
		s.refresh(ctx, triedAt)
		s.mu.Lock()
		keys = s.keys
		s.mu.Unlock()
		found = match(keys, kid, alg)
	}
	switch {
	case len(keys) == 0:
		return nil, ErrUnavailable
	case len(found) == 0:
		return nil, invalid("the access token's signing key (kid) is not one of the issuer's keys", nil)
	}
	return found, nil
}

// refresh fetches the set unless another goroutine did so since seen (the
// triedAt its caller saw). A failure keeps the keys held.
func (s *keySet) refresh(ctx context.Context, seen time.Time) {
	s.fetchMu.Lock()
	defer s.fetchMu.Unlock()
	s.mu.Lock()
	again := s.triedAt.Equal(seen)
	s.mu.Unlock()
	if !again {
		return
	}
	if err := s.fetch(ctx); err != nil {
		s.log.WarnContext(ctx, "oauth: fetching the issuer's key set failed; keeping the keys held", "url", s.url, "err", err)
	}
}

// fetch gets the set and, when it parses, replaces the keys held.
func (s *keySet) fetch(ctx context.Context) error {
	now := time.Now()
	s.mu.Lock()
	s.triedAt = now
	s.mu.Unlock()
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if _, err := getJSON(ctx, s.client, s.url, &set); err != nil {
		return fmt.Errorf("%s: %w", s.url, err)
	}
	var keys []jose.JSONWebKey
	for _, raw := range set.Keys {
		var k jose.JSONWebKey
		if err := k.UnmarshalJSON(raw); err != nil {
			continue // a key of a type go-jose does not know (RFC 7517 §5: ignore it)
		}
		if !k.IsPublic() {
			// A JWKS that publishes a private or symmetric key is
			// misconfigured; such a key must never verify anything.
			continue
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return fmt.Errorf("%s: no usable public signing key", s.url)
	}
	s.mu.Lock()
	s.keys, s.fetchedAt = keys, now
	s.mu.Unlock()
	s.log.InfoContext(ctx, "oauth: fetched the issuer's key set", "url", s.url, "keys", len(keys))
	return nil
}

// match returns the signing keys for kid (every key when kid is empty)
// whose alg, when set, is alg.
func match(keys []jose.JSONWebKey, kid, alg string) []jose.JSONWebKey {
	var out []jose.JSONWebKey
	for _, k := range keys {
		switch {
		case kid != "" && k.KeyID != kid:
		case k.Use != "" && k.Use != "sig":
		case k.Algorithm != "" && k.Algorithm != alg:
		default:
			out = append(out, k)
		}
	}
	return out
}
