package config

import (
	"net/url"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// OAuth is the oauth section: /mcp as an OAuth 2.1 resource server for
// agents (internal/oauth). Each key is the flag of the same name
// (principal_claim is --oauth-principal-claim); nothing here is a secret
// (a resource server holds none).
//
//	oauth:
//	  issuer: https://idp.example.com/realms/agents   # --oauth-issuer; OAuth off without it
//	  audiences: [api://countersign]                  # --oauth-audiences
//	  principal_claim: client_id                      # --oauth-principal-claim
//	  required_scopes: [mcp:tools]                    # --oauth-required-scopes
//	  claims: [tenant, groups]                        # --oauth-claims: passed to policy
//	  jwks_url: https://idp.example.com/jwks          # --oauth-jwks-url
//	  clock_skew: 30s                                 # --oauth-clock-skew
//	  jwks_max_age: 15m                               # --oauth-jwks-max-age
//
// Lists take a YAML list or one string. Every key but issuer needs issuer.
type OAuth struct {
	Issuer         string
	Audiences      []string
	PrincipalClaim string
	RequiredScopes []string
	Claims         []string
	JWKSURL        string
	ClockSkew      time.Duration
	JWKSMaxAge     time.Duration
}

// Bounds of the oauth durations (internal/oauth's).
const (
	MinOAuthClockSkew  = time.Second
	MaxOAuthClockSkew  = 10 * time.Minute
	MinOAuthJWKSMaxAge = time.Minute
	MaxOAuthJWKSMaxAge = 24 * time.Hour
)

var oauthFields = []string{"issuer", "audiences", "principal_claim", "required_scopes", "claims", "jwks_url", "clock_skew", "jwks_max_age"}

func (d *decoder) oauth(f *File, v *yaml.Node) {
	o := &f.OAuth
	var issuerLine int
	lines := map[string]int{}
	d.section(v, "oauth", oauthFields, func(key, sub string, k, v *yaml.Node) {
		lines[key] = k.Line
		switch key {
		case "issuer":
			issuerLine = k.Line
			o.Issuer = d.absURL(v, sub)
		case "audiences":
			o.Audiences = d.nonEmptyList(v, sub)
		case "principal_claim":
			o.PrincipalClaim = d.nonEmpty(v, sub)
		case "required_scopes":
			o.RequiredScopes = d.nonEmptyList(v, sub)
		case "claims":
			o.Claims = d.nonEmptyList(v, sub)
		case "jwks_url":
			o.JWKSURL = d.absURL(v, sub)
		case "clock_skew":
			o.ClockSkew = d.duration(v, sub, MinOAuthClockSkew, MaxOAuthClockSkew)
		case "jwks_max_age":
			o.JWKSMaxAge = d.duration(v, sub, MinOAuthJWKSMaxAge, MaxOAuthJWKSMaxAge)
		}
	})
	if issuerLine == 0 {
		for _, key := range oauthFields[1:] {
			if lines[key] != 0 {
				d.addf(lines[key], "oauth."+key, "needs oauth.issuer")
			}
		}
	}
}

// absURL is an absolute http(s) URL (internal/oauth checks the rest when
// the process starts: https, or http on a loopback host).
func (d *decoder) absURL(v *yaml.Node, field string) string {
	s := d.nonEmpty(v, field)
	if s == "" {
		return ""
	}
	u, err := url.Parse(s)
	switch {
	case strings.Contains(s, "@") || (err == nil && u.User != nil):
		// The value is not shown: it may hold a password.
		d.addf(v.Line, field, "must be an absolute https URL without user:password")
		return ""
	case err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http"):
		d.addf(v.Line, field, "must be an absolute https URL without user:password, not %q", s)
		return ""
	}
	return s
}

// nonEmptyList is a string or a list of strings, none of them empty.
func (d *decoder) nonEmptyList(v *yaml.Node, field string) []string {
	l := d.stringList(v, field)
	if slices.Contains(l, "") {
		d.addf(v.Line, field, "must not hold an empty string")
		return nil
	}
	return l
}

type oauthView struct {
	Issuer         string   `yaml:"issuer,omitempty"`
	Audiences      []string `yaml:"audiences,omitempty,flow"`
	PrincipalClaim string   `yaml:"principal_claim,omitempty"`
	RequiredScopes []string `yaml:"required_scopes,omitempty,flow"`
	Claims         []string `yaml:"claims,omitempty,flow"`
	JWKSURL        string   `yaml:"jwks_url,omitempty"`
	ClockSkew      string   `yaml:"clock_skew,omitempty"`
	JWKSMaxAge     string   `yaml:"jwks_max_age,omitempty"`
}

// view is the printed form of the section; nil when it is empty (OAuth
// off: without an issuer nothing else applies).
func (o OAuth) view() *oauthView {
	if o.Issuer == "" {
		return nil
	}
	return &oauthView{Issuer: o.Issuer, Audiences: o.Audiences, PrincipalClaim: o.PrincipalClaim,
		RequiredScopes: o.RequiredScopes, Claims: o.Claims, JWKSURL: o.JWKSURL,
		ClockSkew: durationString(o.ClockSkew), JWKSMaxAge: durationString(o.JWKSMaxAge)}
}
