package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/config"
)

// unsetEnv unsets the environment variables for the rest of the test.
func unsetEnv(t *testing.T, names ...string) {
	t.Helper()
	for _, name := range names {
		if v, ok := os.LookupEnv(name); ok {
			t.Cleanup(func() { os.Setenv(name, v) })
			os.Unsetenv(name)
		}
	}
}

// TestFlagDefaultsAreConfigDefaults: every flag of a setting defaults to
// what app.Config.Defaults gives that setting, so the two cannot disagree.
func TestFlagDefaultsAreConfigDefaults(t *testing.T) {
	def := app.Config{}
	def.Defaults()
	table := []struct {
		flag, env string
		want      any // the default; "" for a setting derived from others
	}{
		{"data-dir", "COUNTERSIGN_DATA_DIR", def.DataDir},
		{"addr", "COUNTERSIGN_ADDR", def.Addr},
		{"public-url", "COUNTERSIGN_PUBLIC_URL", ""},
		{"server-id", "COUNTERSIGN_SERVER_ID", def.ServerID},
		{"temporal-address", "TEMPORAL_ADDRESS", def.TemporalAddress},
		{"temporal-namespace", "TEMPORAL_NAMESPACE", def.TemporalNamespace},
		{"temporal-tls", "TEMPORAL_TLS", def.TemporalTLS},
		{"temporal-tls-ca", "TEMPORAL_TLS_CA_PATH", def.TemporalTLSCA},
		{"temporal-tls-cert", "TEMPORAL_TLS_CERT_PATH", def.TemporalTLSCert},
		{"temporal-tls-key", "TEMPORAL_TLS_KEY_PATH", def.TemporalTLSKey},
		{"temporal-tls-server-name", "TEMPORAL_TLS_SERVER_NAME", def.TemporalTLSServerName},
		{"temporal-api-key", "TEMPORAL_API_KEY", def.TemporalAPIKey},
		{"nats-url", "NATS_URL", def.NATSURL},
		{"nats-creds", "NATS_CREDS", def.NATSCreds},
		{"nats-nkey", "NATS_NKEY", def.NATSNKey},
		{"nats-tls-ca", "NATS_TLS_CA", def.NATSTLSCA},
		{"nats-tls-cert", "NATS_TLS_CERT", def.NATSTLSCert},
		{"nats-tls-key", "NATS_TLS_KEY", def.NATSTLSKey},
		{"nats-replicas", "COUNTERSIGN_NATS_REPLICAS", def.NATSReplicas},
		{"slack-token", "SLACK_BOT_TOKEN", def.SlackToken},
		{"slack-channel", "SLACK_CHANNEL", def.SlackChannel},
		{"slack-signing-secret", "SLACK_SIGNING_SECRET", def.SlackSigningSecret},
		{"slack-api-url", "SLACK_API_URL", def.SlackAPIURL},
		{"config", "COUNTERSIGN_CONFIG", def.ConfigFile},
		{"inline-wait", "COUNTERSIGN_INLINE_WAIT", def.InlineWait},
		{"verified-challenge-ttl", "COUNTERSIGN_VERIFIED_CHALLENGE_TTL", def.VerifiedChallengeTTL},
		{"challenge-max-bytes", "COUNTERSIGN_CHALLENGE_MAX_BYTES", def.ChallengeMaxBytes},
		{"inband-enrollment", "COUNTERSIGN_INBAND_ENROLLMENT", ""}, // by mode: Config.InBandEnrollmentFor
		{"verified-origins", "COUNTERSIGN_VERIFIED_ORIGINS", ""},   // none: dev adds app.DevVerifiedOrigin
		{"policy", "COUNTERSIGN_POLICY", def.PolicyDir},
		{"policy-timeout", "COUNTERSIGN_POLICY_TIMEOUT", def.PolicyTimeout},
		{"sqlite-sync", "COUNTERSIGN_SQLITE_SYNC", def.SQLiteSync},
		{"rate-per-minute", "COUNTERSIGN_RATE_PER_MINUTE", def.RatePerMinute},
		{"rate-burst", "COUNTERSIGN_RATE_BURST", def.RateBurst},
		{"max-pending", "COUNTERSIGN_MAX_PENDING", def.MaxPendingPerPrincipal},
		{"poll-interval", "COUNTERSIGN_POLL_INTERVAL", def.PollInterval},
		{"result-retention", "COUNTERSIGN_RESULT_RETENTION", def.ResultRetention},
		{"requests-per-second", "COUNTERSIGN_REQUESTS_PER_SECOND", def.RequestsPerSecond},
		{"request-burst", "COUNTERSIGN_REQUEST_BURST", def.RequestBurst},
		{"max-in-flight", "COUNTERSIGN_MAX_IN_FLIGHT", def.MaxInFlightPerPrincipal},
		{"body-read-timeout", "COUNTERSIGN_BODY_READ_TIMEOUT", def.BodyReadTimeout},
		{"max-slow-bodies", "COUNTERSIGN_MAX_SLOW_BODIES", def.MaxSlowBodies},
		{"max-connections", "COUNTERSIGN_MAX_CONNECTIONS", def.MaxConnections},
		{"audit-key-dir", "COUNTERSIGN_AUDIT_KEY_DIR", def.AuditKeyDir},
		{"audit-redact", "COUNTERSIGN_AUDIT_REDACT", def.AuditRedact},
		{"admin-token-file", "COUNTERSIGN_ADMIN_TOKEN_FILE", def.AdminTokenFile},
		{"oauth-issuer", "COUNTERSIGN_OAUTH_ISSUER", def.OAuthIssuer},
		{"oauth-audiences", "COUNTERSIGN_OAUTH_AUDIENCES", ""},
		{"oauth-principal-claim", "COUNTERSIGN_OAUTH_PRINCIPAL_CLAIM", def.OAuthPrincipalClaim},
		{"oauth-required-scopes", "COUNTERSIGN_OAUTH_REQUIRED_SCOPES", ""},
		{"oauth-jwks-url", "COUNTERSIGN_OAUTH_JWKS_URL", def.OAuthJWKSURL},
		{"oauth-claims", "COUNTERSIGN_OAUTH_CLAIMS", ""},
		{"oauth-clock-skew", "COUNTERSIGN_OAUTH_CLOCK_SKEW", def.OAuthClockSkew},
		{"oauth-jwks-max-age", "COUNTERSIGN_OAUTH_JWKS_MAX_AGE", def.OAuthJWKSMaxAge},
		{"conformance", "", def.Conformance},
		{"metrics-addr", "COUNTERSIGN_METRICS_ADDR", def.MetricsAddr},
		{"shutdown-delay", "COUNTERSIGN_SHUTDOWN_DELAY", def.ShutdownDelay},
		{"otlp-endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT", def.OTLPEndpoint},
		{"otlp-protocol", "OTEL_EXPORTER_OTLP_PROTOCOL", def.OTLPProtocol},
		{"log-format", "COUNTERSIGN_LOG_FORMAT", def.LogFormat},
		{"log-level", "COUNTERSIGN_LOG_LEVEL", def.LogLevel},
	}
	inTable := map[string]bool{}
	for _, tc := range table {
		inTable[tc.flag] = true
		if tc.env != "" {
			unsetEnv(t, tc.env)
		}
	}
	for _, tc := range table {
		t.Run(tc.flag, func(t *testing.T) {
			var cfg app.Config
			fs, env := serviceFlags("dev", &cfg, false)
			f := fs.Lookup(tc.flag)
			if f == nil {
				t.Fatalf("no flag --%s", tc.flag)
			}
			if env[tc.flag] != tc.env {
				t.Errorf("--%s reads environment variable %q, want %q", tc.flag, env[tc.flag], tc.env)
			}
			if got, want := f.DefValue, fmt.Sprint(tc.want); got != want {
				t.Errorf("--%s defaults to %q, app.Config.Defaults to %q", tc.flag, got, want)
			}
		})
	}

	// The README's configuration tables document every flag, with its
	// environment variable on the same row, and say which flags have none.
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{} // flag -> its README table row
	for _, line := range strings.Split(string(readme), "\n") {
		if !strings.HasPrefix(line, "| `--") {
			continue
		}
		cell, _, _ := strings.Cut(line[2:], " |")
		for _, f := range strings.Split(cell, " / ") {
			rows[strings.Trim(f, "`-")] = line
		}
	}
	for _, tc := range table {
		row, ok := rows[tc.flag]
		switch {
		case !ok:
			t.Errorf("README: no configuration table row for --%s", tc.flag)
		case tc.env != "" && !strings.Contains(row, "`"+tc.env+"`"):
			t.Errorf("README: the row of --%s does not name %s:\n%s", tc.flag, tc.env, row)
		case tc.env == "" && !strings.Contains(row, "none"):
			t.Errorf("README: the row of --%s must say it has no environment variable (\"none\"):\n%s", tc.flag, row)
		}
	}

	// Every flag is in the table, and parsing no arguments yields exactly
	// the defaults (the public URL stays empty: app derives it from --addr).
	var cfg app.Config
	fs, _ := serviceFlags("dev", &cfg, false)
	fs.VisitAll(func(f *flag.Flag) {
		if !inTable[f.Name] {
			t.Errorf("--%s is not in the table", f.Name)
		}
	})
	cfg, err = serviceConfig("dev", nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := def
	want.PublicURL = ""
	want.File = &config.File{}
	if diff := cmp.Diff(want, cfg); diff != "" {
		t.Errorf("parsed defaults (-Config.Defaults +flags):\n%s", diff)
	}
}

// TestConformanceLiftsLimitDefaults: --conformance lifts the limits' defaults
// as app.Config.Defaults does, and an explicit setting still wins.
func TestConformanceLiftsLimitDefaults(t *testing.T) {
	unsetEnv(t, "COUNTERSIGN_RATE_PER_MINUTE", "COUNTERSIGN_REQUESTS_PER_SECOND", "COUNTERSIGN_REQUEST_BURST", "COUNTERSIGN_MAX_IN_FLIGHT")
	lifted := app.Config{Conformance: true}
	lifted.Defaults()
	var plain app.Config
	plain.Defaults()
	if lifted.RatePerMinute <= plain.RatePerMinute || lifted.RequestsPerSecond <= plain.RequestsPerSecond {
		t.Fatalf("conformance defaults %+v do not lift %+v", lifted, plain)
	}
	for _, tc := range []struct {
		name string
		args []string
		want app.Config // the limits only
	}{
		{"lifted", []string{"--conformance"}, app.Config{RatePerMinute: lifted.RatePerMinute, RequestsPerSecond: lifted.RequestsPerSecond,
			RequestBurst: lifted.RequestBurst, MaxInFlightPerPrincipal: lifted.MaxInFlightPerPrincipal}},
		{"explicit wins", []string{"--conformance", "--rate-per-minute", "7", "--max-in-flight", "3"}, app.Config{RatePerMinute: 7,
			RequestsPerSecond: lifted.RequestsPerSecond, RequestBurst: lifted.RequestBurst, MaxInFlightPerPrincipal: 3}},
		{"without conformance", nil, app.Config{RatePerMinute: plain.RatePerMinute, RequestsPerSecond: plain.RequestsPerSecond,
			RequestBurst: plain.RequestBurst, MaxInFlightPerPrincipal: plain.MaxInFlightPerPrincipal}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := serviceConfig("dev", tc.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			got := app.Config{RatePerMinute: cfg.RatePerMinute, RequestsPerSecond: cfg.RequestsPerSecond,
				RequestBurst: cfg.RequestBurst, MaxInFlightPerPrincipal: cfg.MaxInFlightPerPrincipal}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("limits (-want +got):\n%s", diff)
			}
		})
	}
}

// TestReadmeFileSettings: the README names the service flags the
// configuration file cannot give (app.FileFlags are those it can), and
// the file refuses each as an unknown field.
func TestReadmeFileSettings(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(readme)), " ")
	_, rest, ok := strings.Cut(text, "; the others (")
	list, _, ok2 := strings.Cut(rest, ") are flags and environment variables only")
	if !ok || !ok2 {
		t.Fatal(`README: no "the others (…) are flags and environment variables only" in the configuration file section`)
	}
	var named []string // flag names or prefixes ("otlp-")
	for _, m := range regexp.MustCompile("`--([a-z-]+)(\\*?)`").FindAllStringSubmatch(list, -1) {
		named = append(named, m[1])
	}
	inFile := map[string]bool{"config": true, "conformance": true}
	for _, f := range app.FileFlags {
		inFile[f] = true
	}
	var cfg app.Config
	fs, _ := serviceFlags("dev", &cfg, false)
	listed := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		isNamed := slices.ContainsFunc(named, func(n string) bool {
			return n == f.Name || strings.HasSuffix(n, "-") && strings.HasPrefix(f.Name, n)
		})
		switch {
		case inFile[f.Name] && isNamed:
			t.Errorf("README names --%s as flag-only, but the file gives it", f.Name)
		case !inFile[f.Name] && !isNamed:
			t.Errorf("README: --%s is not in the file and not named as flag-only", f.Name)
		case isNamed:
			listed[f.Name] = true
		}
	})
	for _, n := range named {
		if !strings.HasSuffix(n, "-") && !listed[n] {
			t.Errorf("README names --%s, which is not a service flag", n)
		}
	}
	// The file refuses each of them.
	dir := t.TempDir()
	for name := range listed {
		key := strings.ReplaceAll(name, "-", "_")
		p := filepath.Join(dir, key+".yaml")
		if err := os.WriteFile(p, []byte(key+": x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := app.LoadConfigFile(p); err == nil || !strings.Contains(err.Error(), key+": unknown field") {
			t.Errorf("the file takes %s: %v", key, err)
		}
	}
}

// The start-up log names only a listener the process serves: a worker has
// none but metrics_addr, so no "http" and no configured "addr".
func TestStartedAttrs(t *testing.T) {
	cfg := &app.Config{Addr: ":8080", MetricsAddr: ":9090"}
	keys := func(attrs []any) map[string]any {
		m := map[string]any{}
		for i := 0; i+1 < len(attrs); i += 2 {
			m[attrs[i].(string)] = attrs[i+1]
		}
		return m
	}
	worker := keys(startedAttrs("worker", "", time.Second, cfg))
	if _, ok := worker["addr"]; ok {
		t.Errorf("worker start-up log shows addr: %v", worker)
	}
	if _, ok := worker["http"]; ok {
		t.Errorf("worker start-up log shows http: %v", worker)
	}
	if worker["metrics_addr"] != ":9090" || worker["mode"] != "worker" {
		t.Errorf("worker start-up log: %v", worker)
	}
	server := keys(startedAttrs("server", "127.0.0.1:8080", time.Second, cfg))
	if _, ok := server["addr"]; ok || server["http"] != "127.0.0.1:8080" {
		t.Errorf("server start-up log: %v", server)
	}
	// Who may enroll in-band, as the process applies it (dev and server
	// differ by default); a worker serves no MCP endpoint.
	if server["inband_enrollment"] != "first" || worker["inband_enrollment"] != nil {
		t.Errorf("inband_enrollment: server %v, worker %v", server["inband_enrollment"], worker["inband_enrollment"])
	}
	if dev := keys(startedAttrs("dev", "127.0.0.1:8080", time.Second, cfg)); dev["inband_enrollment"] != "open" {
		t.Errorf("dev start-up log: inband_enrollment %v", dev["inband_enrollment"])
	}
}

// TestBadEnvironmentValue: an environment value that does not parse names
// the variable, what is wrong with the value and the form wanted, not a
// bare "parse error"; the value itself is not echoed.
func TestBadEnvironmentValue(t *testing.T) {
	var def app.Config
	def.Defaults()
	for _, tc := range []struct {
		variable, value string
		want            []string
	}{
		{"COUNTERSIGN_RATE_PER_MINUTE", "lots", []string{"not a whole number", fmt.Sprint("such as the default, ", def.RatePerMinute)}},
		{"COUNTERSIGN_RATE_PER_MINUTE", "99999999999999999999999", []string{"out of range", "whole number"}},
		{"COUNTERSIGN_CHALLENGE_MAX_BYTES", "lots", []string{"not a whole number"}},
		{"COUNTERSIGN_REQUESTS_PER_SECOND", "lots", []string{"not a number", "such as the default"}},
		{"COUNTERSIGN_INLINE_WAIT", "lots", []string{"not a duration", "30s"}},
		{"COUNTERSIGN_INLINE_WAIT", "45", []string{"not a duration", "with a unit"}},
		{"COUNTERSIGN_AUDIT_REDACT", "lots", []string{"not a boolean", "true or false"}},
	} {
		t.Run(tc.variable+"="+tc.value, func(t *testing.T) {
			unsetEnv(t, "COUNTERSIGN_CONFIG")
			t.Setenv(tc.variable, tc.value)
			_, err := serviceConfig("server", nil, io.Discard)
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			if !strings.Contains(msg, "environment variable "+tc.variable+" (for --") || strings.Contains(msg, "parse error") ||
				strings.Contains(msg, tc.value) {
				t.Errorf("%s", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("%q lacks %q", msg, w)
				}
			}
		})
	}
}

// TestAdminInitBadReplicasEnv: admin init does not fall back to the
// default on a COUNTERSIGN_NATS_REPLICAS that does not parse; it says
// what is wrong, before touching NATS. A flag given still wins.
func TestAdminInitBadReplicasEnv(t *testing.T) {
	unsetEnv(t, "COUNTERSIGN_CONFIG", "NATS_URL")
	t.Setenv("COUNTERSIGN_NATS_REPLICAS", "three")
	dir := t.TempDir()
	code, _, stderr := runCLI("admin", "init", "--data-dir", dir)
	if code != 2 || !strings.Contains(stderr, "environment variable COUNTERSIGN_NATS_REPLICAS (for --nats-replicas): not a whole number") ||
		strings.Contains(stderr, "three") {
		t.Fatalf("admin init with COUNTERSIGN_NATS_REPLICAS=three: exit %d, err %q", code, stderr)
	}
	code, _, stderr = runCLI("admin", "init", "--data-dir", dir, "--nats-replicas", "1")
	if code != 1 || !strings.Contains(stderr, "--nats-url") {
		t.Fatalf("admin init with --nats-replicas over a bad environment value: exit %d, err %q", code, stderr)
	}
}
