package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeConfig(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "countersign.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConfigPrecedence: flag > environment > file > default, for every
// kind of setting, explicit zero values included.
func TestConfigPrecedence(t *testing.T) {
	unsetEnv(t, "COUNTERSIGN_INLINE_WAIT", "COUNTERSIGN_RATE_PER_MINUTE", "TEMPORAL_NAMESPACE", "COUNTERSIGN_LOG_LEVEL",
		"COUNTERSIGN_MAX_PENDING", "NATS_URL", "COUNTERSIGN_CONFIG", "TEMPORAL_ADDRESS")
	path := writeConfig(t, "inline_wait: 20s\nlog_level: warn\ntemporal:\n  namespace: from-file\n  address: file:7233\nlimits:\n  rate_per_minute: 7\n  max_pending: 9\nnats:\n  url: nats://file:4222\n")
	cfg, err := serviceConfig("server", []string{"--config", path}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.InlineWait != 20*time.Second || cfg.LogLevel != "warn" || cfg.TemporalNamespace != "from-file" ||
		cfg.RatePerMinute != 7 || cfg.MaxPendingPerPrincipal != 9 || cfg.NATSURL != "nats://file:4222" {
		t.Fatalf("file over defaults: %+v", cfg)
	}
	t.Setenv("COUNTERSIGN_RATE_PER_MINUTE", "11")
	t.Setenv("TEMPORAL_NAMESPACE", "from-env")
	t.Setenv("COUNTERSIGN_INLINE_WAIT", "0s") // an explicit zero wins over the file
	t.Setenv("COUNTERSIGN_MAX_PENDING", "")   // empty: unset
	cfg, err = serviceConfig("server", []string{"--config", path, "--rate-per-minute", "13", "--log-level", "debug"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"flag over env and file", cfg.RatePerMinute, 13},
		{"flag over file", cfg.LogLevel, "debug"},
		{"env over file", cfg.TemporalNamespace, "from-env"},
		{"explicit zero env over file", cfg.InlineWait, time.Duration(0)},
		{"empty env is unset", cfg.MaxPendingPerPrincipal, 9},
		{"file", cfg.TemporalAddress, "file:7233"},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	// An environment value that does not parse is an error naming the
	// variable, not ignored.
	t.Setenv("COUNTERSIGN_RATE_PER_MINUTE", "lots")
	if _, err := serviceConfig("server", []string{"--config", path}, os.Stderr); err == nil ||
		!strings.Contains(err.Error(), "COUNTERSIGN_RATE_PER_MINUTE") {
		t.Errorf("bad environment value: %v", err)
	}
}

// TestConfigCheck: `countersign config check` exits 1 with every problem,
// 0 with the effective configuration, and never prints a secret.
func TestConfigCheck(t *testing.T) {
	unsetEnv(t, "COUNTERSIGN_CONFIG", "TEMPORAL_ADDRESS", "NATS_URL", "SLACK_BOT_TOKEN", "TEMPORAL_API_KEY", "TEMPORAL_NAMESPACE")
	const apiKey, token, signing = "tcld-secret-api-key-0042", "xoxb-secret-bot-token-0042", "secret-signing-0042"
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "signing"), []byte(signing+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CS_TEST_API_KEY", apiKey)
	t.Setenv("CS_TEST_SLACK_TOKEN", token)
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte(`public_url: https://approvals.example.com
temporal:
  address: my-ns.a2b3c.tmprl.cloud:7233
  namespace: my-ns.a2b3c
  api_key: ${CS_TEST_API_KEY}
nats:
  url: [nats://nats-0:4222, nats://nats-1:4222]
  replicas: 3
slack:
  token: ${CS_TEST_SLACK_TOKEN}
  channel: "#approvals"
  signing_secret: ${file:signing}
limits:
  max_pending: 20
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TEMPORAL_NAMESPACE", "from-env")
	code, out, stderr := runCLI("config", "check", good, "--max-in-flight", "4")
	if code != 0 {
		t.Fatalf("good file: exit %d, err %s", code, stderr)
	}
	for _, want := range []string{"OK for countersign server", "api_key: <redacted>", "token: <redacted>", "signing_secret: <redacted>",
		"namespace: from-env", "max_in_flight: 4", "max_pending: 20", "rate_per_minute: 30", "replicas: 3",
		"address: my-ns.a2b3c.tmprl.cloud:7233", "enabled: true", "url: ['nats://nats-0:4222', 'nats://nats-1:4222']"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, secret := range []string{apiKey, token, signing} {
		if strings.Contains(out+stderr, secret) {
			t.Errorf("config check printed a secret:\n%s%s", out, stderr)
		}
	}

	bad := writeConfig(t, "log_level: loud\ntemporal:\n  adress: x:1\nlimits:\n  max_pending: 0\nslack:\n  token: ${CS_TEST_API_KEY}\n")
	code, out, stderr = runCLI("config", "check", bad)
	if code != 1 || out != "" {
		t.Fatalf("bad file: exit %d, out %q", code, out)
	}
	for _, want := range []string{"countersign.yaml:1: log_level:", ":3: temporal.adress: unknown field", ":5: limits.max_pending:", ":7: slack.token: is not a Slack bot token"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, apiKey) {
		t.Errorf("a problem shows a secret:\n%s", stderr)
	}

	// A file that loads but leaves server mode without Temporal and NATS,
	// or names a TLS file that is not there.
	partial := writeConfig(t, "temporal:\n  tls:\n    ca: missing-ca.pem\n")
	code, _, stderr = runCLI("config", "check", partial)
	if code != 1 || !strings.Contains(stderr, "--temporal-address (temporal.address) is required") ||
		!strings.Contains(stderr, "--nats-url (nats.url) is required") || !strings.Contains(stderr, "missing-ca.pem") {
		t.Errorf("partial file: exit %d, err %s", code, stderr)
	}
	code, out, stderr = runCLI("config", "check", "--mode", "dev", writeConfig(t, "inline_wait: 5s\n"))
	if code != 0 || !strings.Contains(out, "inline_wait: 5s") || !strings.Contains(out, "demo_tools: true") || stderr != "" {
		t.Errorf("dev mode: exit %d, out %s, err %s", code, out, stderr)
	}
	// A file that loads with a warning: OK, and the warning on stderr.
	code, out, stderr = runCLI("config", "check", "--mode", "dev", writeConfig(t, "upstreams:\n  - name: a\n    url: http://h/mcp\n    headers: {Authorization: \"Bearer abc123secret\"}\n"))
	if code != 0 || !strings.Contains(out, "OK") || !strings.Contains(stderr, "countersign: warning: ") ||
		!strings.Contains(stderr, "upstreams[0].headers.Authorization: holds a credential written inline") || strings.Contains(stderr+out, "abc123secret") {
		t.Errorf("inline credential: exit %d, out %s, err %s", code, out, stderr)
	}

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"config"}, 2, "usage: countersign config check"},
		{[]string{"config", "check"}, 2, "no FILE"},
		{[]string{"config", "check", good, "--mode", "staging"}, 2, "must be dev, server or worker"},
		{[]string{"config", "check", good, "--no-such-flag"}, 2, "flag provided but not defined"},
		{[]string{"config", "check", filepath.Join(dir, "absent.yaml")}, 1, "no such file"},
	} {
		code, out, stderr := runCLI(tc.args...)
		if code != tc.code || !strings.Contains(out+stderr, tc.want) {
			t.Errorf("%v: exit %d (want %d), output %q, want %q", tc.args, code, tc.code, out+stderr, tc.want)
		}
	}
}

// TestConfigCheckPolicy: config check loads the policy as startup does, so
// a policy that would stop the server (a directory that is not there, Rego
// that does not compile) fails the check too, beside the file's problems.
func TestConfigCheckPolicy(t *testing.T) {
	unsetEnv(t, "COUNTERSIGN_CONFIG", "COUNTERSIGN_POLICY", "TEMPORAL_ADDRESS", "NATS_URL")
	broken := t.TempDir()
	if err := os.WriteFile(filepath.Join(broken, "policy.rego"), []byte("package countersign.authz\n\ndecision := \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const base = "temporal:\n  address: temporal:7233\nnats:\n  url: nats://nats:4222\n"
	for _, tc := range []struct {
		name string
		file string
		args []string
		code int
		want []string
	}{
		{name: "embedded default", file: base, code: 0},
		{name: "no such directory", file: base + "policy: /nonexistent/countersign-policy\n", code: 1,
			want: []string{"policy:", "/nonexistent/countersign-policy"}},
		{name: "does not compile", file: base, args: []string{"--policy", broken}, code: 1,
			want: []string{"policy:", "policy.rego"}},
		{name: "with the other problems", file: "temporal:\n  address: temporal:7233\n", args: []string{"--policy", broken}, code: 1,
			want: []string{"--nats-url (nats.url) is required", "policy.rego"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, stderr := runCLI(append([]string{"config", "check", writeConfig(t, tc.file)}, tc.args...)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; out %q, err %q", code, tc.code, out, stderr)
			}
			if tc.code != 0 && out != "" {
				t.Errorf("a failed check printed a configuration: %q", out)
			}
			for _, want := range tc.want {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr lacks %q:\n%s", want, stderr)
				}
			}
		})
	}
}

// TestOAuthConfigSection: the oauth section of the file under the same
// precedence (flag > environment > file > default), and printed by
// config check.
func TestOAuthConfigSection(t *testing.T) {
	unsetEnv(t, "COUNTERSIGN_CONFIG", "TEMPORAL_ADDRESS", "NATS_URL", "COUNTERSIGN_OAUTH_ISSUER", "COUNTERSIGN_OAUTH_AUDIENCES",
		"COUNTERSIGN_OAUTH_PRINCIPAL_CLAIM", "COUNTERSIGN_OAUTH_REQUIRED_SCOPES", "COUNTERSIGN_OAUTH_CLAIMS",
		"COUNTERSIGN_OAUTH_JWKS_URL", "COUNTERSIGN_OAUTH_CLOCK_SKEW", "COUNTERSIGN_OAUTH_JWKS_MAX_AGE")
	path := writeConfig(t, `temporal:
  address: temporal:7233
nats:
  url: nats://nats:4222
oauth:
  issuer: https://idp.example.com/realms/agents
  principal_claim: client_id
  required_scopes: [mcp:tools]
  claims: [tenant]
  clock_skew: 30s
  jwks_max_age: 15m
`)
	cfg, err := serviceConfig("server", []string{"--config", path}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OAuthIssuer != "https://idp.example.com/realms/agents" || cfg.OAuthPrincipalClaim != "client_id" ||
		strings.Join(cfg.OAuthRequiredScopes, ",") != "mcp:tools" || strings.Join(cfg.OAuthClaims, ",") != "tenant" ||
		cfg.OAuthClockSkew != 30*time.Second || cfg.OAuthJWKSMaxAge != 15*time.Minute {
		t.Fatalf("file over defaults: %+v", cfg)
	}
	t.Setenv("COUNTERSIGN_OAUTH_REQUIRED_SCOPES", "mcp:tools,payments")
	t.Setenv("COUNTERSIGN_OAUTH_CLOCK_SKEW", "5s")
	cfg, err = serviceConfig("server", []string{"--config", path, "--oauth-clock-skew", "2s", "--oauth-claims", "groups,tenant"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cfg.OAuthRequiredScopes, ",") != "mcp:tools,payments" || cfg.OAuthClockSkew != 2*time.Second ||
		strings.Join(cfg.OAuthClaims, ",") != "groups,tenant" || cfg.OAuthJWKSMaxAge != 15*time.Minute {
		t.Fatalf("flag > env > file: %+v", cfg)
	}
	code, out, stderr := runCLI("config", "check", path, "--oauth-clock-skew", "45s")
	if code != 0 {
		t.Fatalf("config check: exit %d, err %s", code, stderr)
	}
	for _, want := range []string{"oauth:\n", "issuer: https://idp.example.com/realms/agents", "principal_claim: client_id",
		"required_scopes: ['mcp:tools', payments]", "claims: [tenant]", "clock_skew: 45s", "jwks_max_age: 15m0s"} {
		if !strings.Contains(out, want) {
			t.Errorf("config check output lacks %q:\n%s", want, out)
		}
	}
	code, _, stderr = runCLI("config", "check", path, "--oauth-clock-skew", "1h")
	if code != 1 || !strings.Contains(stderr, "--oauth-clock-skew 1h0m0s must be from 1s to 10m0s (0s: the default, 1m0s)") {
		t.Errorf("skew out of range: exit %d, err %s", code, stderr)
	}
	// Without an issuer nothing of OAuth is printed (it is off).
	if code, out, _ := runCLI("config", "check", writeConfig(t, "temporal:\n  address: t:7233\nnats:\n  url: nats://n:4222\n")); code != 0 || strings.Contains(out, "oauth") {
		t.Errorf("no oauth: exit %d, out %s", code, out)
	}
}
