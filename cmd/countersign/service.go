package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
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

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func envFloat(name string, def float64) float64 {
	if v, err := strconv.ParseFloat(os.Getenv(name), 64); err == nil {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// serviceFlags binds the flags of the service commands to cfg. The flags of
// the embedded services (--sqlite-sync) and --conformance are dev's only. Each flag
// defaults to its environment variable, else to the value app.Config.Defaults
// gives the setting (with conformance, the lifted limits of --conformance),
// so that a setting has one default. The public URL and the server ID have
// none of their own: they derive from other settings.
func serviceFlags(cmd string, cfg *app.Config, conformance bool) (fs *flag.FlagSet, logLevel *string) {
	def := app.Config{Conformance: conformance}
	def.Defaults()
	fs = flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.StringVar(&cfg.DataDir, "data-dir", envOr("COUNTERSIGN_DATA_DIR", def.DataDir), "data directory (embedded state, tokens, keys)")
	fs.StringVar(&cfg.Addr, "addr", envOr("COUNTERSIGN_ADDR", def.Addr), "HTTP listen address")
	fs.StringVar(&cfg.PublicURL, "public-url", envOr("COUNTERSIGN_PUBLIC_URL", ""), "public URL of the approver site (default http://localhost:PORT); its host is the WebAuthn RP ID")
	fs.StringVar(&cfg.ServerID, "server-id", envOr("COUNTERSIGN_SERVER_ID", ""), "server identifier bound into every action hash (default: persisted random id in dev, the public URL otherwise)")
	fs.StringVar(&cfg.TemporalAddress, "temporal-address", envOr("TEMPORAL_ADDRESS", ""), "external Temporal frontend host:port (dev default: embedded)")
	fs.StringVar(&cfg.TemporalNamespace, "temporal-namespace", envOr("TEMPORAL_NAMESPACE", def.TemporalNamespace), "Temporal namespace")
	fs.StringVar(&cfg.NATSURL, "nats-url", envOr("NATS_URL", ""), "external NATS URL (dev default: embedded)")
	fs.StringVar(&cfg.NATSCreds, "nats-creds", envOr("NATS_CREDS", ""), "NATS credentials file")
	fs.StringVar(&cfg.NATSTLSCA, "nats-tls-ca", envOr("NATS_TLS_CA", ""), "CA bundle (PEM) to verify the NATS server with")
	fs.StringVar(&cfg.NATSTLSCert, "nats-tls-cert", envOr("NATS_TLS_CERT", ""), "client certificate (PEM) for NATS mutual TLS")
	fs.StringVar(&cfg.NATSTLSKey, "nats-tls-key", envOr("NATS_TLS_KEY", ""), "client key (PEM) for NATS mutual TLS")
	fs.IntVar(&cfg.NATSReplicas, "nats-replicas", envInt("COUNTERSIGN_NATS_REPLICAS", def.NATSReplicas), "replicas of every JetStream bucket and stream, 1 to 5 (3 on a production cluster; the embedded NATS of dev takes only 1)")
	fs.StringVar(&cfg.SlackToken, "slack-token", envOr("SLACK_BOT_TOKEN", ""), "Slack bot token (chat:write); Slack notifications are off without it")
	fs.StringVar(&cfg.SlackChannel, "slack-channel", envOr("SLACK_CHANNEL", ""), "default Slack channel for approval messages (a policy may name another)")
	fs.StringVar(&cfg.SlackSigningSecret, "slack-signing-secret", envOr("SLACK_SIGNING_SECRET", ""), "Slack signing secret; enables /slack/interactivity and the Deny button")
	fs.StringVar(&cfg.ConfigFile, "config", envOr("COUNTERSIGN_CONFIG", ""), "YAML configuration file: the upstream MCP servers to gate, demo_tools (see the README)")
	fs.DurationVar(&cfg.InlineWait, "inline-wait", envDuration("COUNTERSIGN_INLINE_WAIT", 0), "hold a gated call from a client without MCP tasks this long for the approval decision (0s to 10m; default: the config file's inline_wait, else 0)")
	fs.DurationVar(&cfg.VerifiedChallengeTTL, "verified-challenge-ttl", envDuration("COUNTERSIGN_VERIFIED_CHALLENGE_TTL", 0), "how long a SEP-2672 in-band challenge (approval/challenge/create) is accepted (default 60s, at most 24h)")
	fs.Func("verified-origins", "comma-separated origins of MCP client pages that run the SEP-2672 in-band passkey ceremony, within the RP ID (dev on localhost: "+app.DevVerifiedOrigin+")", func(v string) error {
		cfg.VerifiedOrigins = splitList(v)
		return nil
	})
	if v := os.Getenv("COUNTERSIGN_VERIFIED_ORIGINS"); v != "" {
		cfg.VerifiedOrigins = splitList(v)
	}
	fs.StringVar(&cfg.PolicyDir, "policy", envOr("COUNTERSIGN_POLICY", ""), "directory of Rego policy to load instead of the embedded default")
	cfg.SQLiteSync = def.SQLiteSync
	if cmd == "dev" {
		fs.StringVar(&cfg.SQLiteSync, "sqlite-sync", envOr("COUNTERSIGN_SQLITE_SYNC", def.SQLiteSync), "embedded Temporal SQLite synchronous mode: FULL or NORMAL")
	}
	fs.IntVar(&cfg.RatePerMinute, "rate-per-minute", envInt("COUNTERSIGN_RATE_PER_MINUTE", def.RatePerMinute), "approval requests per principal per minute")
	fs.IntVar(&cfg.RateBurst, "rate-burst", envInt("COUNTERSIGN_RATE_BURST", def.RateBurst), "approval requests a principal may make at once before the per-minute rate applies")
	fs.IntVar(&cfg.MaxPendingPerPrincipal, "max-pending", envInt("COUNTERSIGN_MAX_PENDING", def.MaxPendingPerPrincipal), "pending tasks per principal")
	fs.DurationVar(&cfg.PollInterval, "poll-interval", def.PollInterval, "pollIntervalMs suggested to clients")
	fs.DurationVar(&cfg.ResultRetention, "result-retention", envDuration("COUNTERSIGN_RESULT_RETENTION", def.ResultRetention), "how long a finished task and its result stay readable after the task ends")
	fs.Float64Var(&cfg.RequestsPerSecond, "requests-per-second", envFloat("COUNTERSIGN_REQUESTS_PER_SECOND", def.RequestsPerSecond), "MCP requests per principal per second, any method")
	fs.IntVar(&cfg.RequestBurst, "request-burst", envInt("COUNTERSIGN_REQUEST_BURST", def.RequestBurst), "MCP requests a principal may make at once before the per-second rate applies")
	fs.IntVar(&cfg.MaxInFlightPerPrincipal, "max-in-flight", envInt("COUNTERSIGN_MAX_IN_FLIGHT", def.MaxInFlightPerPrincipal), "concurrent MCP requests per principal")
	fs.DurationVar(&cfg.BodyReadTimeout, "body-read-timeout", envDuration("COUNTERSIGN_BODY_READ_TIMEOUT", def.BodyReadTimeout), "time a client has to send a request body")
	fs.IntVar(&cfg.MaxSlowBodies, "max-slow-bodies", envInt("COUNTERSIGN_MAX_SLOW_BODIES", def.MaxSlowBodies), "request bodies still arriving after 1s that are read at once, server-wide; more are refused with 503")
	fs.IntVar(&cfg.MaxConnections, "max-connections", envInt("COUNTERSIGN_MAX_CONNECTIONS", def.MaxConnections), "open HTTP connections")
	fs.StringVar(&cfg.AuditKeyDir, "audit-key-dir", envOr("COUNTERSIGN_AUDIT_KEY_DIR", ""), "directory of the audit signing keys (default DATA_DIR/audit-keys); a server uses them for transaction-token records only")
	fs.StringVar(&cfg.AdminTokenFile, "admin-token-file", envOr("COUNTERSIGN_ADMIN_TOKEN_FILE", ""), "file holding an admin token (a mounted secret) registered at start as admin \"admin\"; idempotent across replicas, a new token revokes the old")
	fs.BoolVar(&cfg.AuditRedact, "audit-redact", os.Getenv("COUNTERSIGN_AUDIT_REDACT") == "true", "record a digest of tool arguments in audit records instead of the arguments")
	if cmd == "dev" {
		fs.BoolVar(&cfg.Conformance, "conformance", false, "serve /mcp WITHOUT authentication for conformance suites (loopback only); lifts the defaults of --rate-per-minute, --requests-per-second, --request-burst and --max-in-flight")
	}
	logLevel = fs.String("log-level", envOr("COUNTERSIGN_LOG_LEVEL", "info"), "log level: debug, info, warn, error")
	return fs, logLevel
}

// parseServiceFlags parses args into a Config, with the flag defaults of
// --conformance when conformance is set.
func parseServiceFlags(cmd string, args []string, stderr io.Writer, conformance bool) (cfg app.Config, logLevel string, err error) {
	fs, level := serviceFlags(cmd, &cfg, conformance)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return app.Config{}, "", parseError(err)
	}
	if fs.NArg() > 0 {
		return app.Config{}, "", usageError{fmt.Sprintf("%s: unexpected argument %q", cmd, fs.Arg(0))}
	}
	return cfg, *level, nil
}

// serviceConfig is the configuration the flags and the environment give.
func serviceConfig(cmd string, args []string, stderr io.Writer) (cfg app.Config, logLevel string, err error) {
	cfg, logLevel, err = parseServiceFlags(cmd, args, stderr, false)
	if err == nil && cfg.Conformance {
		// --conformance lifts some limits' defaults: parse again with them,
		// so that a limit set explicitly (flag or env) still wins.
		cfg, logLevel, err = parseServiceFlags(cmd, args, stderr, true)
	}
	return cfg, logLevel, err
}

func runService(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) error {
	cfg, logLevel, err := serviceConfig(cmd, args, stderr)
	if err != nil {
		return err
	}
	mode := map[string]app.Mode{"dev": app.ModeDev, "server": app.ModeServer, "worker": app.ModeWorker}[cmd]
	log := newLogger(stderr, logLevel)
	start := time.Now()
	a, err := app.New(ctx, cfg, mode, log, stdout)
	if err != nil {
		return err
	}
	log.Info("countersign started", append([]any{"mode", cmd, "http", a.Addr(), "startup", time.Since(start).Round(time.Millisecond)}, a.Config().Redacted()...)...)
	if cfg.Conformance {
		log.Warn("conformance mode: /mcp accepts requests WITHOUT authentication; every caller is the same principal")
	}
	err = a.Run(ctx)
	log.Info("countersign stopped")
	return err
}
