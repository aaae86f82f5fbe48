// Package app wires Countersign's packages into the processes the binary
// runs: `dev` (everything in one process, embedded NATS and Temporal),
// `server` (MCP endpoint and approver site) and `worker` (the approval
// workflow and its activities).
package app

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/internal/config"
	"github.com/countersign/countersign/internal/httplimit"
	"github.com/countersign/countersign/internal/oauth"
	"github.com/countersign/countersign/internal/telemetry"
	"github.com/countersign/countersign/mcpserver"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/pdp"
	"github.com/countersign/countersign/tasks"
	"github.com/countersign/countersign/workflows"
)

// Config is every setting of a Countersign process, from flags and env.
type Config struct {
	// DataDir holds embedded state (dev), tokens and keys.
	DataDir string
	// Addr is the HTTP listen address.
	Addr string
	// PublicURL is the URL approvers open; its host is the WebAuthn RP ID.
	PublicURL string
	// ServerID feeds every action hash (SEP-2672 §4.6). Dev persists a
	// random one in DataDir; server mode defaults to PublicURL.
	ServerID string

	// TemporalAddress selects an external Temporal; empty in dev means embedded.
	TemporalAddress   string
	TemporalNamespace string
	// Temporal TLS (temporal.go): on when TemporalTLS or any other of these
	// is set. TemporalTLSCA is a CA bundle to trust instead of the system
	// roots; TemporalTLSCert and TemporalTLSKey a client certificate and key
	// (mutual TLS); TemporalTLSServerName the name the server certificate
	// must carry (default: the address's host). TemporalAPIKey is sent as a
	// bearer token (Temporal Cloud API keys) and implies TLS.
	TemporalTLS           bool
	TemporalTLSCA         string
	TemporalTLSCert       string
	TemporalTLSKey        string
	TemporalTLSServerName string
	TemporalAPIKey        string
	// NATSURL selects an external NATS (comma-separated servers); empty in
	// dev means embedded. NATSCreds is a credentials file (user JWT and
	// nkey seed), NATSNKey an nkey seed file; at most one.
	NATSURL   string
	NATSCreds string
	NATSNKey  string
	// NATS TLS: a CA bundle to trust, and a client certificate and key
	// (mutual TLS). Empty means the system roots and no client certificate.
	NATSTLSCA   string
	NATSTLSCert string
	NATSTLSKey  string
	// NATSReplicas is the replica count of every JetStream bucket and
	// stream Countersign creates: 1 to 5 (3 on a production cluster). The
	// embedded NATS of dev mode is a single node and takes only 1.
	NATSReplicas int

	// Slack notifications: off when SlackToken is empty. SlackChannel is
	// the default channel (a policy may name another); SlackSigningSecret
	// enables the interactivity endpoint and its Deny button.
	SlackToken         string
	SlackChannel       string
	SlackSigningSecret string
	// SlackAPIURL is Slack's Web API base URL: GovSlack's
	// (https://slack-gov.com/api/), an egress proxy's, a test server's.
	// https, or http on a loopback host. Empty means
	// https://slack.com/api/.
	SlackAPIURL string

	// ConfigFile is the YAML configuration file (internal/config): the
	// upstream MCP servers to gate, whether the demo tools are served, and
	// the file's form of the settings here. Empty: no upstreams, demo tools
	// in dev only.
	ConfigFile string
	// File is ConfigFile loaded and already applied to this Config by the
	// caller (ApplyFile, with the command line's rule: flag > environment >
	// file > default). Nil: New loads ConfigFile and applies it to the
	// settings left at their zero value.
	File *config.File

	// LogLevel is debug, info (the default), warn or error.
	LogLevel string

	// InlineWait holds a tools/call from a client without MCP tasks for the
	// approval decision, up to this long (mcpserver.Options.InlineWait).
	// Zero takes the config file's inline_wait, else 0: answer at once.
	InlineWait time.Duration

	// VerifiedChallengeTTL is how long a SEP-2672 in-band challenge
	// (approval/challenge/create) is accepted; zero means 60 s
	// (passkey.DefaultInBandChallengeTTL), at most 24 h.
	VerifiedChallengeTTL time.Duration
	// InBandEnrollment says who may enroll a passkey in-band
	// (approval/enroll/*, authorized by the agent's bearer token alone):
	// passkey.EnrollOpen, EnrollFirst (a principal's first passkey only)
	// or EnrollClosed. Empty means open in dev (the SEP-2672 reference's
	// clients enroll as they please) and first in server mode
	// (Config.InBandEnrollmentFor).
	InBandEnrollment string
	// ChallengeMaxBytes caps the passkey challenges bucket
	// (passkey.Options.ChallengeMaxBytes); zero means 256 MiB
	// (passkey.DefaultChallengeMaxBytes), at least 1 MiB.
	ChallengeMaxBytes int64
	// VerifiedOrigins are the origins, besides PublicURL's, of the pages
	// where MCP clients run the in-band WebAuthn ceremony (SEP-2672), for
	// example "https://agent.example.com". Each must be within the RP ID
	// (PublicURL's host). They are accepted only for in-band calls, never on
	// the approver site. Dev with a localhost PublicURL adds
	// http://localhost:5173, the SEP-2672 reference client's.
	VerifiedOrigins []string

	// PolicyDir loads a custom policy instead of the embedded default.
	PolicyDir string
	// PolicyTimeout bounds one policy evaluation (pdp.Options.EvalTimeout);
	// zero means 5 s (pdp.DefaultEvalTimeout), from MinPolicyTimeout to
	// MaxPolicyTimeout. An evaluation stopped by it denies the call.
	PolicyTimeout time.Duration
	// SQLiteSync is the embedded Temporal's SQLite synchronous mode: FULL
	// (durable against power loss, the default) or NORMAL (durable against a
	// process crash only; faster).
	SQLiteSync string

	// Limits. Defaults fills zero values with the MCP endpoint's defaults
	// (mcpserver.Default*); with Conformance, RatePerMinute and the
	// request budget are lifted instead. RatePerMinute and RateBurst
	// bound a principal's task creations and, counted apart, its in-band
	// challenges.
	RatePerMinute          int
	RateBurst              int
	MaxPendingPerPrincipal int
	PollInterval           time.Duration
	// ResultRetention is how long a finished task and its result stay
	// readable after the task ends (tasks.DefaultResultRetention).
	ResultRetention time.Duration

	// HTTP request limits (README "Request limits"); Defaults fills zero
	// values with the default in brackets. BodyReadTimeout bounds how long a request body may take
	// to arrive (10s); MaxSlowBodies how many bodies still arriving after a
	// second are read at once, server-wide, before the next is cut with 503
	// (128); MaxConnections the open HTTP connections (4096).
	BodyReadTimeout time.Duration
	MaxSlowBodies   int
	MaxConnections  int
	// The per-principal MCP request budget: requests a second (50), burst
	// (100) and concurrent requests (16). Over it, HTTP 429.
	RequestsPerSecond       float64
	RequestBurst            int
	MaxInFlightPerPrincipal int

	// AuditKeyDir holds the audit signing keys (default DataDir/audit-keys);
	// AuditRedact records argument digests instead of arguments.
	AuditKeyDir string
	AuditRedact bool

	// AdminTokenFile holds an admin token (a Kubernetes Secret, say) whose
	// digest the server registers at start, as admin "admin" (admin.go):
	// idempotent across replicas; a new token rotates the old one out.
	AdminTokenFile string

	// OAuth 2.1 for agents (internal/oauth): when OAuthIssuer is set, /mcp
	// also accepts JWT access tokens of that issuer whose audience is the
	// public MCP URL (PublicURL + "/mcp") or one of OAuthAudiences, and
	// serves the protected-resource metadata (RFC 9728). OAuthPrincipalClaim
	// names the caller (default sub); OAuthRequiredScopes must all be
	// granted; OAuthJWKSURL skips discovery. OAuthClaims are the further
	// token claims policy sees in input.subject.properties.claims (at
	// most oauth.MaxPolicyClaims), besides sub, client_id and the scopes.
	// OAuthClockSkew is the tolerance of exp, nbf and iat; OAuthJWKSMaxAge
	// how long a fetched key set is used before it is fetched again.
	OAuthIssuer         string
	OAuthAudiences      []string
	OAuthPrincipalClaim string
	OAuthRequiredScopes []string
	OAuthJWKSURL        string
	OAuthClaims         []string
	OAuthClockSkew      time.Duration
	OAuthJWKSMaxAge     time.Duration

	// Conformance serves the MCP endpoint without auth (loopback only).
	Conformance bool

	// MetricsAddr is the operations listener: /metrics (Prometheus),
	// /healthz and /readyz, in every mode, the worker's too. Empty: none
	// (and /metrics is never served on Addr, the agents' port).
	MetricsAddr string
	// ShutdownDelay is how long a stopping process keeps serving, /readyz
	// answering 503, before its graceful shutdown (ShutdownTimeout) starts:
	// the time a load balancer takes to stop routing to it. From 0 (the
	// default: shut down at once) to MaxShutdownDelay.
	ShutdownDelay time.Duration
	// LogFormat is the log line format: "text" (the default) or "json".
	LogFormat string
	// OTLPEndpoint turns on tracing: spans go to this OTLP collector URL
	// over OTLPProtocol ("http/protobuf", the default, or "grpc"). Empty:
	// no tracing.
	OTLPEndpoint string
	OTLPProtocol string
	// TraceExporter replaces the OTLP exporter and turns tracing on (tests;
	// not a flag).
	TraceExporter sdktrace.SpanExporter
	// ExecuteHeartbeatTimeout is the worker's workflows.Options
	// .ExecuteHeartbeatTimeout: how soon a claimed call whose worker died
	// ends outcome-unknown. Zero is the default (30 s). Not a flag: tests
	// lower it to see a dead worker's call end in seconds.
	ExecuteHeartbeatTimeout time.Duration
}

// Defaults of the settings whose default no constructor owns.
const (
	DefaultDataDir           = "./countersign-data"
	DefaultAddr              = "127.0.0.1:8080"
	DefaultTemporalNamespace = "default"
	DefaultSQLiteSync        = "FULL"
	DefaultNATSReplicas      = 1
	DefaultLogLevel          = "info"
)

// Defaults fills unset (zero) fields. It is the one place a setting gets its
// default: the command line's flag defaults are a zero Config's Defaults,
// and the values come from the constructors' exported Default* constants.
func (c *Config) Defaults() {
	setDefault(&c.DataDir, DefaultDataDir)
	setDefault(&c.Addr, DefaultAddr)
	setDefault(&c.TemporalNamespace, DefaultTemporalNamespace)
	setDefault(&c.SQLiteSync, DefaultSQLiteSync)
	setDefault(&c.NATSReplicas, DefaultNATSReplicas)
	setDefault(&c.LogLevel, DefaultLogLevel)
	setDefault(&c.OTLPProtocol, telemetry.ProtocolHTTPProtobuf)
	setDefault(&c.LogFormat, telemetry.LogText)
	if c.Conformance {
		// Every caller is one anonymous principal and the suites create
		// tasks in bursts; explicit settings still win.
		setDefault(&c.RatePerMinute, conformanceRatePerMinute)
		setDefault(&c.RequestsPerSecond, conformanceRequestBudget)
		setDefault(&c.RequestBurst, conformanceRequestBudget)
		setDefault(&c.MaxInFlightPerPrincipal, conformanceRequestBudget)
	}
	setDefault(&c.RatePerMinute, approvals.DefaultRatePerMinute)
	setDefault(&c.RateBurst, approvals.DefaultBurst)
	setDefault(&c.MaxPendingPerPrincipal, approvals.DefaultMaxPendingPerPrincipal)
	setDefault(&c.PollInterval, approvals.DefaultPollInterval)
	setDefault(&c.ResultRetention, tasks.DefaultResultRetention)
	setDefault(&c.RequestsPerSecond, mcpserver.DefaultRequestsPerSecond)
	setDefault(&c.RequestBurst, mcpserver.DefaultRequestBurst)
	setDefault(&c.MaxInFlightPerPrincipal, mcpserver.DefaultMaxInFlightPerPrincipal)
	setDefault(&c.BodyReadTimeout, httplimit.DefaultBodyTimeout)
	setDefault(&c.MaxSlowBodies, httplimit.DefaultMaxSlowBodies)
	setDefault(&c.MaxConnections, httplimit.DefaultMaxConns)
	setDefault(&c.OAuthClockSkew, oauth.DefaultClockSkew)
	setDefault(&c.OAuthJWKSMaxAge, oauth.DefaultJWKSMaxAge)
	if c.PublicURL == "" {
		_, port, err := net.SplitHostPort(c.Addr)
		if err != nil || port == "" || port == "0" {
			port = "8080"
		}
		c.PublicURL = "http://localhost:" + port
	}
}

// InBandEnrollmentFor is the in-band enrollment policy a process of mode
// applies: InBandEnrollment, else open in dev and first elsewhere.
func (c *Config) InBandEnrollmentFor(mode Mode) string {
	switch {
	case c.InBandEnrollment != "":
		return c.InBandEnrollment
	case mode == ModeDev:
		return passkey.EnrollOpen
	}
	return passkey.EnrollFirst
}

// The limits of --conformance (task creation rate per minute, and the
// request budget: requests a second, burst, in flight), where every caller
// is one anonymous principal and the suites create tasks in bursts.
const (
	conformanceRatePerMinute = 100000
	conformanceRequestBudget = 100000
)

// ShutdownTimeout bounds a stopping process's graceful shutdown (open
// requests, the workflow starts in flight, the worker's activities), after
// Config.ShutdownDelay. A deployment's termination grace period must exceed
// their sum (deploy/ checks its manifests against this value).
const ShutdownTimeout = 15 * time.Second

// Bounds of Config.PolicyTimeout. The longest stays under the 30 s that
// the approval workflow gives one re-evaluation, so that a slow policy is
// stopped by its own timeout, with its error, and retried.
const (
	MinPolicyTimeout = 10 * time.Millisecond
	MaxPolicyTimeout = 20 * time.Second
)

// MaxShutdownDelay is the longest Config.ShutdownDelay.
const MaxShutdownDelay = 5 * time.Minute

// setDefault sets *v to def if it is the zero value.
func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Validate checks the configuration once, at startup, with errors that say
// what to change.
func (c *Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		errs = append(errs, fmt.Errorf("--addr %q: %v", c.Addr, err))
	}
	u, err := url.Parse(c.PublicURL)
	switch {
	case err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https"):
		errs = append(errs, fmt.Errorf("--public-url %q must be an absolute http(s) URL", c.PublicURL))
	case u.Scheme == "http" && u.Hostname() != "localhost":
		// WebAuthn is available only in secure contexts: https, or
		// http://localhost.
		errs = append(errs, fmt.Errorf("--public-url %q: passkeys need https, or http://localhost; use an https URL (e.g. behind a TLS proxy)", c.PublicURL))
	case u.Path != "" && u.Path != "/":
		errs = append(errs, fmt.Errorf("--public-url %q must not have a path", c.PublicURL))
	}
	if (c.NATSTLSCert == "") != (c.NATSTLSKey == "") {
		errs = append(errs, errors.New("--nats-tls-cert and --nats-tls-key go together"))
	} else if _, err := loadTLS("--nats-tls", "nats.tls", c.NATSTLSCA, c.NATSTLSCert, c.NATSTLSKey); err != nil {
		errs = append(errs, err)
	}
	if c.NATSCreds != "" && c.NATSNKey != "" {
		errs = append(errs, errors.New("--nats-creds and --nats-nkey exclude each other: a credentials file holds its own nkey seed"))
	}
	if err := checkNATSCreds(c.NATSCreds); err != nil {
		errs = append(errs, fmt.Errorf("--nats-creds (nats.creds) %s: %w", c.NATSCreds, err))
	}
	if err := checkNATSNKey(c.NATSNKey); err != nil {
		errs = append(errs, fmt.Errorf("--nats-nkey (nats.nkey) %s: %w", c.NATSNKey, err))
	}
	errs = append(errs, c.validateTemporal()...)
	if err := config.CheckLogLevel(c.LogLevel); err != nil {
		errs = append(errs, fmt.Errorf("--log-level: %w", err))
	}
	if c.SlackToken == "" && (c.SlackChannel != "" || c.SlackSigningSecret != "" || c.SlackAPIURL != "") {
		errs = append(errs, errors.New("--slack-channel, --slack-signing-secret and --slack-api-url need --slack-token (SLACK_BOT_TOKEN)"))
	}
	if err := checkSlackAPIURL(c.SlackAPIURL); err != nil {
		errs = append(errs, err)
	}
	if c.SQLiteSync != "FULL" && c.SQLiteSync != "NORMAL" {
		errs = append(errs, fmt.Errorf("--sqlite-sync %q must be FULL or NORMAL", c.SQLiteSync))
	}
	if c.NATSReplicas < 1 || c.NATSReplicas > 5 {
		errs = append(errs, fmt.Errorf("--nats-replicas %d must be between 1 and 5", c.NATSReplicas))
	}
	if c.InlineWait < 0 || c.InlineWait > mcpserver.MaxInlineWait {
		errs = append(errs, fmt.Errorf("--inline-wait %s must be from 0s to %s", c.InlineWait, mcpserver.MaxInlineWait))
	}
	if c.ChallengeMaxBytes != 0 && c.ChallengeMaxBytes < passkey.MinChallengeMaxBytes {
		errs = append(errs, fmt.Errorf("--challenge-max-bytes %d must be 0 (the default, %d) or at least %d", c.ChallengeMaxBytes, passkey.DefaultChallengeMaxBytes, passkey.MinChallengeMaxBytes))
	}
	if c.VerifiedChallengeTTL < 0 || c.VerifiedChallengeTTL > passkey.MaxChallengeTTL {
		errs = append(errs, fmt.Errorf("--verified-challenge-ttl %s must be from 0s (the default, 60s) to %s", c.VerifiedChallengeTTL, passkey.MaxChallengeTTL))
	}
	switch c.InBandEnrollment {
	case "", passkey.EnrollOpen, passkey.EnrollFirst, passkey.EnrollClosed:
	default:
		errs = append(errs, fmt.Errorf("--inband-enrollment %q must be %s, %s or %s", c.InBandEnrollment, passkey.EnrollOpen, passkey.EnrollFirst, passkey.EnrollClosed))
	}
	if c.ResultRetention < 0 {
		errs = append(errs, fmt.Errorf("--result-retention %s must not be negative", c.ResultRetention))
	}
	if err := c.workflowOptions().Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.BodyReadTimeout < 0 || c.MaxSlowBodies < 0 || c.MaxConnections < 0 ||
		c.RequestsPerSecond < 0 || c.RequestBurst < 0 || c.MaxInFlightPerPrincipal < 0 {
		errs = append(errs, errors.New("--body-read-timeout, --max-slow-bodies, --max-connections, --requests-per-second, --request-burst and --max-in-flight must not be negative"))
	}
	// The file's bounds (internal/config); 0 is the default, set above.
	if c.OAuthClockSkew < config.MinOAuthClockSkew || c.OAuthClockSkew > config.MaxOAuthClockSkew {
		errs = append(errs, fmt.Errorf("--oauth-clock-skew %s must be from %s to %s (0s: the default, %s)", c.OAuthClockSkew, config.MinOAuthClockSkew, config.MaxOAuthClockSkew, oauth.DefaultClockSkew))
	}
	if c.OAuthJWKSMaxAge < config.MinOAuthJWKSMaxAge || c.OAuthJWKSMaxAge > config.MaxOAuthJWKSMaxAge {
		errs = append(errs, fmt.Errorf("--oauth-jwks-max-age %s must be from %s to %s (0s: the default, %s)", c.OAuthJWKSMaxAge, config.MinOAuthJWKSMaxAge, config.MaxOAuthJWKSMaxAge, oauth.DefaultJWKSMaxAge))
	}
	if c.PolicyTimeout != 0 && (c.PolicyTimeout < MinPolicyTimeout || c.PolicyTimeout > MaxPolicyTimeout) {
		errs = append(errs, fmt.Errorf("--policy-timeout %s must be 0 (the default, %s) or from %s to %s", c.PolicyTimeout, pdp.DefaultEvalTimeout, MinPolicyTimeout, MaxPolicyTimeout))
	}
	if c.ShutdownDelay < 0 || c.ShutdownDelay > MaxShutdownDelay {
		errs = append(errs, fmt.Errorf("--shutdown-delay %s must be from 0s to %s", c.ShutdownDelay, MaxShutdownDelay))
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			errs = append(errs, fmt.Errorf("--metrics-addr %q: %v", c.MetricsAddr, err))
		}
	}
	if c.OTLPProtocol != "" && c.OTLPProtocol != telemetry.ProtocolGRPC && c.OTLPProtocol != telemetry.ProtocolHTTPProtobuf {
		errs = append(errs, fmt.Errorf("--otlp-protocol %q must be %s or %s", c.OTLPProtocol, telemetry.ProtocolHTTPProtobuf, telemetry.ProtocolGRPC))
	}
	if c.LogFormat != telemetry.LogText && c.LogFormat != telemetry.LogJSON {
		errs = append(errs, fmt.Errorf("--log-format %q must be %s or %s", c.LogFormat, telemetry.LogText, telemetry.LogJSON))
	}
	if c.Conformance {
		host, _, _ := net.SplitHostPort(c.Addr)
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			errs = append(errs, fmt.Errorf("--conformance serves /mcp without authentication and refuses to listen on %q: use a loopback address", c.Addr))
		}
	}
	if c.DataDir != "" {
		if abs, err := filepath.Abs(c.DataDir); err == nil {
			c.DataDir = abs
		}
	}
	return errors.Join(errs...)
}

// workflowOptions are the worker's settings of the approval workflow.
func (c *Config) workflowOptions() workflows.Options {
	return workflows.Options{ExecuteHeartbeatTimeout: c.ExecuteHeartbeatTimeout}
}

// DevVerifiedOrigin is the SEP-2672 reference client's page, accepted for
// in-band ceremonies in dev when PublicURL is on localhost and no
// VerifiedOrigins are set.
const DevVerifiedOrigin = "http://localhost:5173"

// RPID is the WebAuthn relying party ID: the public URL's host name.
func (c *Config) RPID() string {
	u, _ := url.Parse(c.PublicURL)
	return u.Hostname()
}

// Origin is the public URL's origin, what browsers send as Origin.
func (c *Config) Origin() string {
	u, _ := url.Parse(c.PublicURL)
	return strings.ToLower(u.Scheme) + "://" + u.Host
}

// withoutUserInfo is the comma-separated URLs of urls, for display: each
// without its user information (user:password or a token). A URL that does
// not parse loses what lies between its scheme and its last "@".
func withoutUserInfo(urls string) []string {
	var out []string
	for _, s := range strings.Split(urls, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if u, err := url.Parse(s); err == nil {
			u.User = nil
			s = u.String()
		} else if at := strings.LastIndexByte(s, '@'); at >= 0 {
			scheme := ""
			if i := strings.Index(s, "://"); i >= 0 && i < at {
				scheme = s[:i+3]
			}
			s = scheme + s[at+1:]
		}
		out = append(out, s)
	}
	return out
}

// Redacted describes the configuration for the startup log, without
// secrets. It holds no listen address: the log names the one the process
// serves (a worker serves none but metrics_addr).
func (c *Config) Redacted() []any {
	nats := strings.Join(withoutUserInfo(c.NATSURL), ",")
	if nats == "" {
		nats = "embedded"
	}
	temporal := c.TemporalAddress
	if temporal == "" {
		temporal = "embedded"
	}
	policy := c.PolicyDir
	if policy == "" {
		policy = "embedded default"
	}
	slackState := "off"
	if c.SlackToken != "" {
		slackState = "on, default channel " + c.SlackChannel
		if c.SlackSigningSecret != "" {
			slackState += ", interactivity on"
		}
		if c.SlackAPIURL != "" {
			slackState += ", API " + c.SlackAPIURL
		}
	}
	metrics := c.MetricsAddr
	if metrics == "" {
		metrics = "off"
	}
	tracing := "off"
	if c.OTLPEndpoint != "" {
		tracing = "otlp " + c.OTLPProtocol
		if u, err := url.Parse(c.OTLPEndpoint); err == nil {
			u.User = nil
			tracing += " " + u.Redacted()
		}
	}
	return []any{"metrics_addr", metrics, "tracing", tracing, "public_url", c.PublicURL, "data_dir", c.DataDir,
		"temporal", temporal, "namespace", c.TemporalNamespace, "nats", nats, "nats_replicas", c.NATSReplicas,
		"policy", policy, "slack", slackState}
}

// checkSlackAPIURL accepts "" (Slack's own) or an absolute https URL
// without credentials, query or fragment; http only on a loopback host.
func checkSlackAPIURL(s string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if strings.Contains(s, "@") || (err == nil && u.User != nil) {
		// The value is not shown: it may hold a password.
		return errors.New("--slack-api-url must be an https URL without user:password")
	}
	if err != nil || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return fmt.Errorf("--slack-api-url %q must be an absolute https URL without query or fragment, such as https://slack-gov.com/api/", s)
	}
	switch h := u.Hostname(); {
	case u.Scheme == "https":
		return nil
	case u.Scheme == "http" && (h == "localhost" || net.ParseIP(h).IsLoopback()):
		return nil
	}
	return fmt.Errorf("--slack-api-url %q must be an https URL (http only on a loopback host): the bot token is sent to it", s)
}
