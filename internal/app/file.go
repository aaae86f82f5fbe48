package app

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/countersign/countersign/gateway"
	"github.com/countersign/countersign/internal/config"
	"github.com/countersign/countersign/pdp"
)

// ApplyFile sets, from the configuration file f, every setting the file
// gives and explicit does not claim. explicit is asked with the setting's
// flag name ("temporal-address"); the command line answers true for a flag
// given on it or by its environment variable, which makes the precedence
// flag > environment > file > default. A nil explicit claims the settings
// that are not zero, the rule for a Config built in Go. f.Upstreams and
// f.DemoTools have no flag; New reads them from Config.File.
func (c *Config) ApplyFile(f *config.File, explicit func(flag string) bool) {
	if f == nil {
		return
	}
	set := func(flag string, zero bool) bool {
		if explicit != nil {
			return !explicit(flag)
		}
		return zero
	}
	str := func(flag string, dst *string, v string) {
		if v != "" && set(flag, *dst == "") {
			*dst = v
		}
	}
	str("addr", &c.Addr, f.Addr)
	str("data-dir", &c.DataDir, f.DataDir)
	str("audit-key-dir", &c.AuditKeyDir, f.AuditKeyDir)
	str("public-url", &c.PublicURL, f.PublicURL)
	str("server-id", &c.ServerID, f.ServerID)
	str("log-level", &c.LogLevel, f.LogLevel)
	str("policy", &c.PolicyDir, f.Policy)
	if f.InlineWait != nil && set("inline-wait", c.InlineWait == 0) {
		c.InlineWait = *f.InlineWait
	}

	t := f.Temporal
	str("temporal-address", &c.TemporalAddress, t.Address)
	str("temporal-namespace", &c.TemporalNamespace, t.Namespace)
	str("temporal-api-key", &c.TemporalAPIKey, t.APIKey)
	if t.TLS.Enabled && set("temporal-tls", !c.TemporalTLS) {
		c.TemporalTLS = true
	}
	str("temporal-tls-ca", &c.TemporalTLSCA, t.TLS.CA)
	str("temporal-tls-cert", &c.TemporalTLSCert, t.TLS.Cert)
	str("temporal-tls-key", &c.TemporalTLSKey, t.TLS.Key)
	str("temporal-tls-server-name", &c.TemporalTLSServerName, t.TLS.ServerName)

	n := f.NATS
	str("nats-url", &c.NATSURL, n.URL())
	str("nats-creds", &c.NATSCreds, n.Creds)
	str("nats-nkey", &c.NATSNKey, n.NKey)
	str("nats-tls-ca", &c.NATSTLSCA, n.TLS.CA)
	str("nats-tls-cert", &c.NATSTLSCert, n.TLS.Cert)
	str("nats-tls-key", &c.NATSTLSKey, n.TLS.Key)
	num("nats-replicas", set, &c.NATSReplicas, n.Replicas)

	str("slack-token", &c.SlackToken, f.Slack.Token)
	str("slack-channel", &c.SlackChannel, f.Slack.Channel)
	str("slack-signing-secret", &c.SlackSigningSecret, f.Slack.SigningSecret)
	str("slack-api-url", &c.SlackAPIURL, f.Slack.APIURL)

	l := f.Limits
	num("rate-per-minute", set, &c.RatePerMinute, l.RatePerMinute)
	num("rate-burst", set, &c.RateBurst, l.RateBurst)
	num("max-pending", set, &c.MaxPendingPerPrincipal, l.MaxPending)
	num("poll-interval", set, &c.PollInterval, l.PollInterval)
	num("result-retention", set, &c.ResultRetention, l.ResultRetention)
	num("requests-per-second", set, &c.RequestsPerSecond, l.RequestsPerSecond)
	num("request-burst", set, &c.RequestBurst, l.RequestBurst)
	num("max-in-flight", set, &c.MaxInFlightPerPrincipal, l.MaxInFlight)
	num("body-read-timeout", set, &c.BodyReadTimeout, l.BodyReadTimeout)
	num("max-slow-bodies", set, &c.MaxSlowBodies, l.MaxSlowBodies)
	num("max-connections", set, &c.MaxConnections, l.MaxConnections)

	o := f.OAuth
	str("oauth-issuer", &c.OAuthIssuer, o.Issuer)
	list("oauth-audiences", set, &c.OAuthAudiences, o.Audiences)
	str("oauth-principal-claim", &c.OAuthPrincipalClaim, o.PrincipalClaim)
	list("oauth-required-scopes", set, &c.OAuthRequiredScopes, o.RequiredScopes)
	list("oauth-claims", set, &c.OAuthClaims, o.Claims)
	str("oauth-jwks-url", &c.OAuthJWKSURL, o.JWKSURL)
	num("oauth-clock-skew", set, &c.OAuthClockSkew, o.ClockSkew)
	num("oauth-jwks-max-age", set, &c.OAuthJWKSMaxAge, o.JWKSMaxAge)
}

// list sets *dst to v when the file gives v (non-empty) and set allows it.
func list(flag string, set func(string, bool) bool, dst *[]string, v []string) {
	if len(v) > 0 && set(flag, len(*dst) == 0) {
		*dst = slices.Clone(v)
	}
}

// num sets *dst to v when the file gives v (not zero) and set allows it.
func num[T comparable](flag string, set func(flag string, zero bool) bool, dst *T, v T) {
	var zero T
	if v != zero && set(flag, *dst == zero) {
		*dst = v
	}
}

// FileFlags are the flags whose setting the configuration file may give,
// in the order ApplyFile takes them.
var FileFlags = []string{
	"addr", "data-dir", "audit-key-dir", "public-url", "server-id", "log-level", "policy", "inline-wait",
	"temporal-address", "temporal-namespace", "temporal-api-key", "temporal-tls", "temporal-tls-ca",
	"temporal-tls-cert", "temporal-tls-key", "temporal-tls-server-name",
	"nats-url", "nats-creds", "nats-nkey", "nats-tls-ca", "nats-tls-cert", "nats-tls-key", "nats-replicas",
	"slack-token", "slack-channel", "slack-signing-secret", "slack-api-url",
	"rate-per-minute", "rate-burst", "max-pending", "poll-interval", "result-retention",
	"requests-per-second", "request-burst", "max-in-flight", "body-read-timeout", "max-slow-bodies", "max-connections",
	"oauth-issuer", "oauth-audiences", "oauth-principal-claim", "oauth-required-scopes", "oauth-claims",
	"oauth-jwks-url", "oauth-clock-skew", "oauth-jwks-max-age",
}

// Effective is the configuration c runs with, in the file's syntax: every
// file setting from c, and the upstreams and demo_tools of c.File. Print it
// with its String method, which redacts the secrets. The NATS URLs are
// without their user information already: --nats-url and NATS_URL may
// carry user:password or a token, which the file refuses.
func (c *Config) Effective(mode Mode) *config.File {
	f := &config.File{
		Addr: c.Addr, DataDir: c.DataDir, AuditKeyDir: c.AuditKeyDir, PublicURL: c.PublicURL, ServerID: c.ServerID,
		LogLevel: c.LogLevel, Policy: c.PolicyDir,
		Temporal: config.Temporal{
			Address: c.TemporalAddress, Namespace: c.TemporalNamespace, APIKey: c.TemporalAPIKey,
			TLS: config.TemporalTLS{Enabled: c.temporalTLSOn() && c.TemporalAddress != "", CA: c.TemporalTLSCA,
				Cert: c.TemporalTLSCert, Key: c.TemporalTLSKey, ServerName: c.TemporalTLSServerName},
		},
		NATS: config.NATS{Creds: c.NATSCreds, NKey: c.NATSNKey, Replicas: c.NATSReplicas,
			TLS: config.NATSTLS{CA: c.NATSTLSCA, Cert: c.NATSTLSCert, Key: c.NATSTLSKey}},
		Slack: config.Slack{Token: c.SlackToken, Channel: c.SlackChannel, SigningSecret: c.SlackSigningSecret, APIURL: c.SlackAPIURL},
		Limits: config.Limits{RatePerMinute: c.RatePerMinute, RateBurst: c.RateBurst, MaxPending: c.MaxPendingPerPrincipal,
			PollInterval: c.PollInterval, ResultRetention: c.ResultRetention, RequestsPerSecond: c.RequestsPerSecond,
			RequestBurst: c.RequestBurst, MaxInFlight: c.MaxInFlightPerPrincipal, BodyReadTimeout: c.BodyReadTimeout,
			MaxSlowBodies: c.MaxSlowBodies, MaxConnections: c.MaxConnections},
	}
	if c.OAuthIssuer != "" {
		f.OAuth = config.OAuth{Issuer: c.OAuthIssuer, Audiences: c.OAuthAudiences, PrincipalClaim: c.OAuthPrincipalClaim,
			RequiredScopes: c.OAuthRequiredScopes, Claims: c.OAuthClaims, JWKSURL: c.OAuthJWKSURL,
			ClockSkew: c.OAuthClockSkew, JWKSMaxAge: c.OAuthJWKSMaxAge}
	}
	wait := c.InlineWait
	f.InlineWait = &wait
	f.NATS.URLs = withoutUserInfo(c.NATSURL)
	if c.File != nil {
		f.Path = c.File.Path
		f.Upstreams = c.File.Upstreams
	}
	demo := c.File.DemoToolsOr(mode == ModeDev)
	f.DemoTools = &demo
	return f
}

// Resolve makes c the configuration a process of mode runs with: the file
// loaded and applied when the caller has not (Config.File), the defaults
// filled in, and every setting checked, all problems at once. New calls
// it; `countersign config check` too, through Check.
func (c *Config) Resolve(mode Mode) error {
	if err := c.loadFile(); err != nil {
		return err
	}
	c.Defaults()
	err := c.Validate()
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	if mode != ModeDev {
		if c.TemporalAddress == "" {
			errs = append(errs, fmt.Errorf("--temporal-address (temporal.address) is required outside dev mode"))
		}
		if c.NATSURL == "" {
			errs = append(errs, fmt.Errorf("--nats-url (nats.url) is required outside dev mode"))
		}
	}
	if mode == ModeDev && c.NATSURL == "" && c.NATSReplicas > 1 {
		errs = append(errs, fmt.Errorf("--nats-replicas %d needs a NATS cluster (--nats-url); the embedded NATS of dev mode is a single node and keeps 1 replica", c.NATSReplicas))
	}
	if len(errs) > 0 {
		return fmt.Errorf("configuration: %w", errors.Join(errs...))
	}
	return nil
}

// loadFile loads ConfigFile into File and applies it (ApplyFile, the rule
// for a Config built in Go), unless the caller has (File is set).
func (c *Config) loadFile() error {
	if c.File != nil {
		return nil
	}
	f, err := LoadConfigFile(c.ConfigFile)
	if err != nil {
		return err
	}
	c.ApplyFile(f, nil)
	c.File = f
	return nil
}

// Check is what `countersign config check` checks: Resolve; the upstreams'
// prefixes against the tools Countersign serves itself in mode
// (checkNamespaces, as New does); and the policy (Config.PolicyDir, or the
// embedded default) loaded and compiled as New does, since a policy that
// does not compile stops the start. It connects to nothing. Every problem
// is reported at once.
func (c *Config) Check(ctx context.Context, mode Mode) error {
	own, _ := ownTools(c, mode, nil)
	return c.check(ctx, mode, own)
}

// check is Check with the tools Countersign serves itself, own.
func (c *Config) check(ctx context.Context, mode Mode, own []gateway.Tool) error {
	err := c.Resolve(mode)
	if c.File != nil {
		err = errors.Join(err, checkNamespaces(c.ConfigFile, own, c.File.Upstreams))
	}
	if c.File == nil || (c.Conformance && c.PolicyDir == "") {
		// The file did not load; or New writes the policy of
		// --conformance itself.
		return err
	}
	if _, perr := pdp.New(ctx, pdp.Options{Dir: c.PolicyDir}); perr != nil {
		return errors.Join(err, fmt.Errorf("policy: %w", perr))
	}
	return err
}
