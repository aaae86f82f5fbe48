package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/countersign/countersign/internal/app"
)

// envOr returns the environment variable's value, or def.
func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// serviceFlags binds the flags of the service commands to cfg, and names
// each flag's environment variable in env. The flags of the embedded
// services (--sqlite-sync) and --conformance are dev's only. Each flag defaults to the value
// app.Config.Defaults gives the setting (with conformance, the lifted limits
// of --conformance), so that a setting has one default. The public URL and
// the server ID have none of their own: they derive from other settings.
func serviceFlags(cmd string, cfg *app.Config, conformance bool) (fs *flag.FlagSet, env map[string]string) {
	def := app.Config{Conformance: conformance}
	def.Defaults()
	fs = flag.NewFlagSet(cmd, flag.ContinueOnError)
	env = map[string]string{}
	// e registers name's environment variable and adds it to the usage.
	e := func(name, variable, usage string) string {
		env[name] = variable
		return usage + " (env " + variable + ")"
	}
	fs.StringVar(&cfg.DataDir, "data-dir", def.DataDir, e("data-dir", "COUNTERSIGN_DATA_DIR", "data directory (embedded state, tokens, keys)"))
	fs.StringVar(&cfg.Addr, "addr", def.Addr, e("addr", "COUNTERSIGN_ADDR", "HTTP listen address"))
	fs.StringVar(&cfg.PublicURL, "public-url", "", e("public-url", "COUNTERSIGN_PUBLIC_URL", "public URL of the approver site (default http://localhost:PORT); its host is the WebAuthn RP ID"))
	fs.StringVar(&cfg.ServerID, "server-id", "", e("server-id", "COUNTERSIGN_SERVER_ID", "server identifier bound into every action hash (default: persisted random id in dev, the public URL otherwise)"))
	fs.StringVar(&cfg.TemporalAddress, "temporal-address", "", e("temporal-address", "TEMPORAL_ADDRESS", "external Temporal frontend host:port (dev default: embedded)"))
	fs.StringVar(&cfg.TemporalNamespace, "temporal-namespace", def.TemporalNamespace, e("temporal-namespace", "TEMPORAL_NAMESPACE", "Temporal namespace"))
	fs.BoolVar(&cfg.TemporalTLS, "temporal-tls", false, e("temporal-tls", "TEMPORAL_TLS", "connect to Temporal over TLS (implied by the other --temporal-tls-* flags and --temporal-api-key)"))
	fs.StringVar(&cfg.TemporalTLSCA, "temporal-tls-ca", "", e("temporal-tls-ca", "TEMPORAL_TLS_CA_PATH", "CA bundle (PEM) to verify the Temporal server with (default: the system roots)"))
	fs.StringVar(&cfg.TemporalTLSCert, "temporal-tls-cert", "", e("temporal-tls-cert", "TEMPORAL_TLS_CERT_PATH", "client certificate (PEM) for Temporal mutual TLS"))
	fs.StringVar(&cfg.TemporalTLSKey, "temporal-tls-key", "", e("temporal-tls-key", "TEMPORAL_TLS_KEY_PATH", "client key (PEM) for Temporal mutual TLS"))
	fs.StringVar(&cfg.TemporalTLSServerName, "temporal-tls-server-name", "", e("temporal-tls-server-name", "TEMPORAL_TLS_SERVER_NAME", "name the Temporal server certificate must carry (default: the address's host)"))
	fs.StringVar(&cfg.TemporalAPIKey, "temporal-api-key", "", e("temporal-api-key", "TEMPORAL_API_KEY", "Temporal Cloud API key (implies TLS); prefer the environment variable or the config file's ${file:…} to a flag"))
	fs.StringVar(&cfg.NATSURL, "nats-url", "", e("nats-url", "NATS_URL", "external NATS URL, or comma-separated URLs of a cluster (dev default: embedded)"))
	fs.StringVar(&cfg.NATSCreds, "nats-creds", "", e("nats-creds", "NATS_CREDS", "NATS credentials file (user JWT and nkey seed)"))
	fs.StringVar(&cfg.NATSNKey, "nats-nkey", "", e("nats-nkey", "NATS_NKEY", "NATS nkey seed file (instead of --nats-creds)"))
	fs.StringVar(&cfg.NATSTLSCA, "nats-tls-ca", "", e("nats-tls-ca", "NATS_TLS_CA", "CA bundle (PEM) to verify the NATS server with"))
	fs.StringVar(&cfg.NATSTLSCert, "nats-tls-cert", "", e("nats-tls-cert", "NATS_TLS_CERT", "client certificate (PEM) for NATS mutual TLS"))
	fs.StringVar(&cfg.NATSTLSKey, "nats-tls-key", "", e("nats-tls-key", "NATS_TLS_KEY", "client key (PEM) for NATS mutual TLS"))
	fs.IntVar(&cfg.NATSReplicas, "nats-replicas", def.NATSReplicas, e("nats-replicas", "COUNTERSIGN_NATS_REPLICAS", "replicas of every JetStream bucket and stream, 1 to 5 (3 on a production cluster; the embedded NATS of dev takes only 1)"))
	fs.StringVar(&cfg.SlackToken, "slack-token", "", e("slack-token", "SLACK_BOT_TOKEN", "Slack bot token (chat:write); Slack notifications are off without it"))
	fs.StringVar(&cfg.SlackChannel, "slack-channel", "", e("slack-channel", "SLACK_CHANNEL", "default Slack channel for approval messages (a policy may name another)"))
	fs.StringVar(&cfg.SlackAPIURL, "slack-api-url", "", e("slack-api-url", "SLACK_API_URL", "Slack's Web API base URL, for GovSlack (https://slack-gov.com/api/) or an egress proxy (default https://slack.com/api/)"))
	fs.StringVar(&cfg.SlackSigningSecret, "slack-signing-secret", "", e("slack-signing-secret", "SLACK_SIGNING_SECRET", "Slack signing secret; enables /slack/interactivity and the Deny button"))
	fs.StringVar(&cfg.ConfigFile, "config", "", e("config", "COUNTERSIGN_CONFIG", "YAML configuration file: upstream MCP servers, demo_tools and the settings of these flags (see the README); flags and environment variables win over it"))
	fs.DurationVar(&cfg.InlineWait, "inline-wait", 0, e("inline-wait", "COUNTERSIGN_INLINE_WAIT", "hold a gated call from a client without MCP tasks this long for the approval decision (0s to 10m)"))
	fs.DurationVar(&cfg.VerifiedChallengeTTL, "verified-challenge-ttl", 0, e("verified-challenge-ttl", "COUNTERSIGN_VERIFIED_CHALLENGE_TTL", "how long a SEP-2672 in-band challenge (approval/challenge/create) is accepted (default 60s, at most 24h)"))
	fs.StringVar(&cfg.InBandEnrollment, "inband-enrollment", "", e("inband-enrollment", "COUNTERSIGN_INBAND_ENROLLMENT", "who may enroll a passkey in-band (SEP-2672 approval/enroll/*, authorized by the agent's bearer token alone): open, first (a principal's first passkey only; more through approver-site invites) or closed (default: open in dev, first in server)"))
	fs.Int64Var(&cfg.ChallengeMaxBytes, "challenge-max-bytes", 0, e("challenge-max-bytes", "COUNTERSIGN_CHALLENGE_MAX_BYTES", "size cap in bytes of the passkey challenges bucket (default 256 MiB, at least 1 MiB); agents' new challenges are refused once it holds half of it, the approver site's once it holds seven eighths, and none is evicted"))
	fs.Func("verified-origins", e("verified-origins", "COUNTERSIGN_VERIFIED_ORIGINS", "comma-separated origins of MCP client pages that run the SEP-2672 in-band passkey ceremony, within the RP ID (dev on localhost: "+app.DevVerifiedOrigin+")"), func(v string) error {
		cfg.VerifiedOrigins = splitList(v)
		return nil
	})
	fs.StringVar(&cfg.PolicyDir, "policy", "", e("policy", "COUNTERSIGN_POLICY", "directory of Rego policy to load instead of the embedded default"))
	fs.DurationVar(&cfg.PolicyTimeout, "policy-timeout", 0, e("policy-timeout", "COUNTERSIGN_POLICY_TIMEOUT", "longest one policy evaluation may take before it is stopped and the call denied (default 5s, 10ms to 20s)"))
	cfg.SQLiteSync = def.SQLiteSync
	if cmd == "dev" {
		fs.StringVar(&cfg.SQLiteSync, "sqlite-sync", def.SQLiteSync, e("sqlite-sync", "COUNTERSIGN_SQLITE_SYNC", "embedded Temporal SQLite synchronous mode: FULL or NORMAL"))
	}
	fs.IntVar(&cfg.RatePerMinute, "rate-per-minute", def.RatePerMinute, e("rate-per-minute", "COUNTERSIGN_RATE_PER_MINUTE", "approval requests per principal per minute; also, counted apart, in-band challenges (approval/challenge/create)"))
	fs.IntVar(&cfg.RateBurst, "rate-burst", def.RateBurst, e("rate-burst", "COUNTERSIGN_RATE_BURST", "approval requests (and, counted apart, in-band challenges) a principal may make at once before the per-minute rate applies"))
	fs.IntVar(&cfg.MaxPendingPerPrincipal, "max-pending", def.MaxPendingPerPrincipal, e("max-pending", "COUNTERSIGN_MAX_PENDING", "pending tasks per principal"))
	fs.DurationVar(&cfg.PollInterval, "poll-interval", def.PollInterval, e("poll-interval", "COUNTERSIGN_POLL_INTERVAL", "pollIntervalMs suggested to clients"))
	fs.DurationVar(&cfg.ResultRetention, "result-retention", def.ResultRetention, e("result-retention", "COUNTERSIGN_RESULT_RETENTION", "how long a finished task and its result stay readable after the task ends"))
	fs.Float64Var(&cfg.RequestsPerSecond, "requests-per-second", def.RequestsPerSecond, e("requests-per-second", "COUNTERSIGN_REQUESTS_PER_SECOND", "MCP requests per principal per second, any method"))
	fs.IntVar(&cfg.RequestBurst, "request-burst", def.RequestBurst, e("request-burst", "COUNTERSIGN_REQUEST_BURST", "MCP requests a principal may make at once before the per-second rate applies"))
	fs.IntVar(&cfg.MaxInFlightPerPrincipal, "max-in-flight", def.MaxInFlightPerPrincipal, e("max-in-flight", "COUNTERSIGN_MAX_IN_FLIGHT", "concurrent MCP requests per principal"))
	fs.DurationVar(&cfg.BodyReadTimeout, "body-read-timeout", def.BodyReadTimeout, e("body-read-timeout", "COUNTERSIGN_BODY_READ_TIMEOUT", "time a client has to send a request body"))
	fs.IntVar(&cfg.MaxSlowBodies, "max-slow-bodies", def.MaxSlowBodies, e("max-slow-bodies", "COUNTERSIGN_MAX_SLOW_BODIES", "request bodies still arriving after 1s that are read at once, server-wide; more are refused with 503"))
	fs.IntVar(&cfg.MaxConnections, "max-connections", def.MaxConnections, e("max-connections", "COUNTERSIGN_MAX_CONNECTIONS", "open HTTP connections"))
	fs.StringVar(&cfg.AuditKeyDir, "audit-key-dir", "", e("audit-key-dir", "COUNTERSIGN_AUDIT_KEY_DIR", "directory of the audit signing keys (default DATA_DIR/audit-keys); a server signs admin and transaction-token records with them"))
	fs.StringVar(&cfg.AdminTokenFile, "admin-token-file", "", e("admin-token-file", "COUNTERSIGN_ADMIN_TOKEN_FILE", "file holding an admin token (a mounted secret) registered at start as admin \"admin\"; idempotent across replicas, a new token revokes the old"))
	fs.StringVar(&cfg.OAuthIssuer, "oauth-issuer", "", e("oauth-issuer", "COUNTERSIGN_OAUTH_ISSUER", "OAuth 2.1 authorization server (issuer URL) whose JWT access tokens /mcp accepts besides the static agent tokens; off when empty"))
	fs.Func("oauth-audiences", e("oauth-audiences", "COUNTERSIGN_OAUTH_AUDIENCES", "comma-separated audiences accepted besides the public MCP URL (PUBLIC_URL/mcp)"), func(v string) error {
		cfg.OAuthAudiences = splitList(v)
		return nil
	})
	fs.StringVar(&cfg.OAuthPrincipalClaim, "oauth-principal-claim", "", e("oauth-principal-claim", "COUNTERSIGN_OAUTH_PRINCIPAL_CLAIM", "the access-token claim that names the agent (default sub; client_id or azp for client-credentials tokens)"))
	fs.Func("oauth-required-scopes", e("oauth-required-scopes", "COUNTERSIGN_OAUTH_REQUIRED_SCOPES", "comma-separated scopes every access token must grant (403 insufficient_scope otherwise)"), func(v string) error {
		cfg.OAuthRequiredScopes = splitList(v)
		return nil
	})
	fs.Func("oauth-claims", e("oauth-claims", "COUNTERSIGN_OAUTH_CLAIMS", "comma-separated access-token claims policy sees in input.subject.properties.claims (at most 16; sub, client_id and the scopes are always there)"), func(v string) error {
		cfg.OAuthClaims = splitList(v)
		return nil
	})
	fs.DurationVar(&cfg.OAuthClockSkew, "oauth-clock-skew", def.OAuthClockSkew, e("oauth-clock-skew", "COUNTERSIGN_OAUTH_CLOCK_SKEW", "tolerance of an access token's exp, nbf and iat (at most 10m)"))
	fs.DurationVar(&cfg.OAuthJWKSMaxAge, "oauth-jwks-max-age", def.OAuthJWKSMaxAge, e("oauth-jwks-max-age", "COUNTERSIGN_OAUTH_JWKS_MAX_AGE", "how long the issuer's fetched key set is used before it is fetched again (a token naming an unknown kid fetches it sooner, at most every 10s)"))
	fs.StringVar(&cfg.OAuthJWKSURL, "oauth-jwks-url", "", e("oauth-jwks-url", "COUNTERSIGN_OAUTH_JWKS_URL", "the issuer's JWKS URL (default: found by OpenID Connect / RFC 8414 discovery)"))
	fs.BoolVar(&cfg.AuditRedact, "audit-redact", false, e("audit-redact", "COUNTERSIGN_AUDIT_REDACT", "record a digest of tool arguments in audit records instead of the arguments"))
	if cmd == "dev" {
		fs.BoolVar(&cfg.Conformance, "conformance", false, "serve /mcp WITHOUT authentication for conformance suites (loopback only); lifts the defaults of --rate-per-minute, --requests-per-second, --request-burst and --max-in-flight")
	}
	fs.StringVar(&cfg.MetricsAddr, "metrics-addr", "", e("metrics-addr", "COUNTERSIGN_METRICS_ADDR", "operations listener for /metrics (Prometheus), /healthz and /readyz, in every mode (the worker's probes too), e.g. 127.0.0.1:9090; off when empty. /metrics is never served on --addr"))
	fs.DurationVar(&cfg.ShutdownDelay, "shutdown-delay", def.ShutdownDelay, e("shutdown-delay", "COUNTERSIGN_SHUTDOWN_DELAY", "on SIGTERM or SIGINT, answer /readyz with 503 at once but keep serving this long (the time a load balancer takes to stop routing here, e.g. 5s) before the graceful shutdown (at most 15s); 0 to 5m. A second signal exits at once"))
	fs.StringVar(&cfg.OTLPEndpoint, "otlp-endpoint", "", e("otlp-endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT", "OpenTelemetry collector URL for traces (OTLP), e.g. http://otel-collector:4318; tracing is off when empty"))
	fs.StringVar(&cfg.OTLPProtocol, "otlp-protocol", def.OTLPProtocol, e("otlp-protocol", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTLP protocol: http/protobuf or grpc"))
	fs.StringVar(&cfg.LogFormat, "log-format", def.LogFormat, e("log-format", "COUNTERSIGN_LOG_FORMAT", "log format: text or json"))
	fs.StringVar(&cfg.LogLevel, "log-level", def.LogLevel, e("log-level", "COUNTERSIGN_LOG_LEVEL", "log level: debug, info, warn, error"))
	return fs, env
}

// parseServiceFlags parses args into a Config, with the flag defaults of
// --conformance when conformance is set. A flag not on the command line
// takes its environment variable when that is set and not empty. explicit
// holds the flags given either way.
func parseServiceFlags(cmd string, args []string, stderr io.Writer, conformance bool) (cfg app.Config, explicit map[string]bool, err error) {
	fs, env := serviceFlags(cmd, &cfg, conformance)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return app.Config{}, nil, parseError(err)
	}
	if fs.NArg() > 0 {
		return app.Config{}, nil, usageError{fmt.Sprintf("%s: unexpected argument %q", cmd, fs.Arg(0))}
	}
	if explicit, err = setFromEnv(fs, env); err != nil {
		return app.Config{}, nil, err
	}
	return cfg, explicit, nil
}

// setFromEnv sets each flag of the parsed fs that the command line did not
// give from its environment variable (env maps a flag's name to it), when
// that variable is set and not empty. A value that does not parse is a
// usage error naming the variable and what the flag wants, never the value
// (it may be a secret). It returns the flags given either way.
func setFromEnv(fs *flag.FlagSet, env map[string]string) (explicit map[string]bool, err error) {
	explicit = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	for _, name := range slices.Sorted(maps.Keys(env)) {
		v := os.Getenv(env[name])
		if explicit[name] || v == "" {
			continue
		}
		if err := fs.Set(name, v); err != nil {
			return nil, usageError{fmt.Sprintf("environment variable %s (for --%s): %s", env[name], name, valueProblem(fs.Lookup(name), err))}
		}
		explicit[name] = true
	}
	return explicit, nil
}

// valueProblem says why a value does not parse for f, and what f wants,
// without the value (it may be a secret): the flag package's own error of
// a number, duration or boolean is a bare "parse error".
func valueProblem(f *flag.Flag, err error) string {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return err.Error()
	}
	example := "such as the default, " + f.DefValue
	outOfRange := strings.Contains(err.Error(), "out of range")
	switch g.Get().(type) {
	case int, int64, uint, uint64:
		if outOfRange {
			return "the number is out of range; want a whole number " + example
		}
		return "not a whole number; want one " + example
	case float64:
		if outOfRange {
			return "the number is out of range; want a number " + example
		}
		return "not a number; want one " + example
	case time.Duration:
		return "not a duration; want a number with a unit (ms, s, m, h), " + example + ", or 30s, 5m, 1h30m"
	case bool:
		return "not a boolean; want true or false"
	}
	return err.Error()
}

// serviceConfig is the configuration the flags, the environment and the
// configuration file give, in that precedence, over the defaults.
func serviceConfig(cmd string, args []string, stderr io.Writer) (cfg app.Config, err error) {
	cfg, explicit, err := parseServiceFlags(cmd, args, stderr, false)
	if err == nil && cfg.Conformance {
		// --conformance lifts some limits' defaults: parse again with them,
		// so that a limit set explicitly (flag or env) still wins.
		cfg, explicit, err = parseServiceFlags(cmd, args, stderr, true)
	}
	if err != nil {
		return app.Config{}, err
	}
	if err := applyConfigFile(&cfg, explicit, stderr); err != nil {
		return app.Config{}, err
	}
	return cfg, nil
}

// applyConfigFile loads cfg.ConfigFile (none is an empty file) into
// cfg.File, writes its warnings to stderr, and applies it to the settings
// whose flag explicit does not hold: flag > environment > file > default.
func applyConfigFile(cfg *app.Config, explicit map[string]bool, stderr io.Writer) error {
	f, err := app.LoadConfigFile(cfg.ConfigFile)
	if err != nil {
		return err
	}
	for _, w := range f.Warnings {
		fmt.Fprintf(stderr, "countersign: warning: %s\n", w)
	}
	cfg.ApplyFile(f, func(flag string) bool { return explicit[flag] })
	cfg.File = f
	return nil
}

// modes are the service commands' app modes.
var modes = map[string]app.Mode{"dev": app.ModeDev, "server": app.ModeServer, "worker": app.ModeWorker}

// startedAttrs are the start-up log's attributes: the mode, the HTTP
// address the process serves (none for a worker, whose only listener is
// metrics_addr) and who may enroll passkeys in-band there, the start-up
// time and the configuration without secrets.
func startedAttrs(cmd, httpAddr string, startup time.Duration, cfg *app.Config) []any {
	attrs := []any{"mode", cmd}
	if httpAddr != "" {
		attrs = append(attrs, "http", httpAddr, "inband_enrollment", cfg.InBandEnrollmentFor(modes[cmd]))
	}
	attrs = append(attrs, "startup", startup.Round(time.Millisecond))
	return append(attrs, cfg.Redacted()...)
}

func runService(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) error {
	cfg, err := serviceConfig(cmd, args, stderr)
	if err != nil {
		return err
	}
	mode := modes[cmd]
	log, err := newFormatLogger(stderr, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return usageError{err.Error()}
	}
	start := time.Now()
	a, err := app.New(ctx, cfg, mode, log, stdout)
	if err != nil {
		return err
	}
	log.Info("countersign started", startedAttrs(cmd, a.Addr(), time.Since(start), a.Config())...)
	if cfg.Conformance {
		log.Warn("conformance mode: /mcp accepts requests WITHOUT authentication; every caller is the same principal")
	}
	err = a.Run(ctx)
	log.Info("countersign stopped")
	return err
}
