package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
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

func runService(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg app.Config
	fs.StringVar(&cfg.DataDir, "data-dir", envOr("COUNTERSIGN_DATA_DIR", "./countersign-data"), "data directory (embedded state, tokens, keys)")
	fs.StringVar(&cfg.Addr, "addr", envOr("COUNTERSIGN_ADDR", "127.0.0.1:8080"), "HTTP listen address")
	fs.StringVar(&cfg.PublicURL, "public-url", envOr("COUNTERSIGN_PUBLIC_URL", ""), "public URL of the approver site (default http://localhost:PORT); its host is the WebAuthn RP ID")
	fs.StringVar(&cfg.ServerID, "server-id", envOr("COUNTERSIGN_SERVER_ID", ""), "server identifier bound into every action hash (default: persisted random id in dev, the public URL otherwise)")
	fs.StringVar(&cfg.TemporalAddress, "temporal-address", envOr("TEMPORAL_ADDRESS", ""), "external Temporal frontend host:port (dev default: embedded)")
	fs.StringVar(&cfg.TemporalNamespace, "temporal-namespace", envOr("TEMPORAL_NAMESPACE", "default"), "Temporal namespace")
	fs.StringVar(&cfg.NATSURL, "nats-url", envOr("NATS_URL", ""), "external NATS URL (dev default: embedded)")
	fs.StringVar(&cfg.NATSCreds, "nats-creds", envOr("NATS_CREDS", ""), "NATS credentials file")
	fs.StringVar(&cfg.NATSTLSCA, "nats-tls-ca", envOr("NATS_TLS_CA", ""), "CA bundle (PEM) to verify the NATS server with")
	fs.StringVar(&cfg.NATSTLSCert, "nats-tls-cert", envOr("NATS_TLS_CERT", ""), "client certificate (PEM) for NATS mutual TLS")
	fs.StringVar(&cfg.NATSTLSKey, "nats-tls-key", envOr("NATS_TLS_KEY", ""), "client key (PEM) for NATS mutual TLS")
	fs.StringVar(&cfg.SlackToken, "slack-token", envOr("SLACK_BOT_TOKEN", ""), "Slack bot token (chat:write); Slack notifications are off without it")
	fs.StringVar(&cfg.SlackChannel, "slack-channel", envOr("SLACK_CHANNEL", ""), "default Slack channel for approval messages (a policy may name another)")
	fs.StringVar(&cfg.SlackSigningSecret, "slack-signing-secret", envOr("SLACK_SIGNING_SECRET", ""), "Slack signing secret; enables /slack/interactivity and the Deny button")
	fs.StringVar(&cfg.PolicyDir, "policy", envOr("COUNTERSIGN_POLICY", ""), "directory of Rego policy to load instead of the embedded default")
	fs.StringVar(&cfg.SQLiteSync, "sqlite-sync", envOr("COUNTERSIGN_SQLITE_SYNC", "FULL"), "embedded Temporal SQLite synchronous mode: FULL or NORMAL")
	fs.IntVar(&cfg.RatePerMinute, "rate-per-minute", envInt("COUNTERSIGN_RATE_PER_MINUTE", 0), "approval requests per principal per minute (default 30)")
	fs.IntVar(&cfg.RateBurst, "rate-burst", envInt("COUNTERSIGN_RATE_BURST", 0), "approval requests a principal may make at once before the per-minute rate applies (default 10)")
	fs.IntVar(&cfg.MaxPendingPerPrincipal, "max-pending", envInt("COUNTERSIGN_MAX_PENDING", 0), "pending tasks per principal (default 100)")
	fs.DurationVar(&cfg.PollInterval, "poll-interval", 0, "pollIntervalMs suggested to clients (default 2s)")
	fs.Float64Var(&cfg.RequestsPerSecond, "requests-per-second", envFloat("COUNTERSIGN_REQUESTS_PER_SECOND", 0), "MCP requests per principal per second, any method (default 50)")
	fs.IntVar(&cfg.RequestBurst, "request-burst", envInt("COUNTERSIGN_REQUEST_BURST", 0), "MCP requests a principal may make at once before the per-second rate applies (default 100)")
	fs.IntVar(&cfg.MaxInFlightPerPrincipal, "max-in-flight", envInt("COUNTERSIGN_MAX_IN_FLIGHT", 0), "concurrent MCP requests per principal (default 16)")
	fs.DurationVar(&cfg.BodyReadTimeout, "body-read-timeout", envDuration("COUNTERSIGN_BODY_READ_TIMEOUT", 0), "time a client has to send a request body (default 10s)")
	fs.IntVar(&cfg.MaxSlowBodies, "max-slow-bodies", envInt("COUNTERSIGN_MAX_SLOW_BODIES", 0), "request bodies still arriving after 1s that are read at once, server-wide; more are refused with 503 (default 128)")
	fs.IntVar(&cfg.MaxConnections, "max-connections", envInt("COUNTERSIGN_MAX_CONNECTIONS", 0), "open HTTP connections (default 4096)")
	fs.StringVar(&cfg.AuditKeyDir, "audit-key-dir", envOr("COUNTERSIGN_AUDIT_KEY_DIR", ""), "directory of the audit signing keys (default DATA_DIR/audit-keys); worker and dev only")
	fs.BoolVar(&cfg.AuditRedact, "audit-redact", os.Getenv("COUNTERSIGN_AUDIT_REDACT") == "true", "record a digest of tool arguments in audit records instead of the arguments")
	fs.BoolVar(&cfg.Conformance, "conformance", false, "serve /mcp WITHOUT authentication for conformance suites (loopback only)")
	logLevel := fs.String("log-level", envOr("COUNTERSIGN_LOG_LEVEL", "info"), "log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return parseError(err)
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("%s: unexpected argument %q", cmd, fs.Arg(0))}
	}
	mode := map[string]app.Mode{"dev": app.ModeDev, "server": app.ModeServer, "worker": app.ModeWorker}[cmd]
	log := newLogger(stderr, *logLevel)
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
