package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const sectionsExample = `addr: 0.0.0.0:8080
data_dir: data
audit_key_dir: keys
public_url: https://approvals.example.com
server_id: countersign-prod
log_level: warn
policy: /etc/countersign/policy
temporal:
  address: my-ns.a2b3c.tmprl.cloud:7233
  namespace: my-ns.a2b3c
  api_key: ${TEMPORAL_API_KEY}
  tls:
    ca: certs/ca.pem
    cert: /etc/countersign/client.pem
    key: /etc/countersign/client.key
    server_name: temporal.internal
nats:
  url: [nats://nats-0:4222, "tls://nats-1:4222"]
  creds: /etc/countersign/countersign.creds
  tls: {ca: /etc/countersign/nats-ca.pem}
  replicas: 3
slack:
  token: ${file:slack-token}
  channel: "#approvals"
  signing_secret: ${SLACK_SIGNING_SECRET}
  api_url: https://slack-gov.com/api/
limits:
  rate_per_minute: 60
  rate_burst: 20
  max_pending: 50
  poll_interval: 2s
  result_retention: 24h
  requests_per_second: 12.5
  request_burst: 40
  max_in_flight: 8
  body_read_timeout: 5s
  max_slow_bodies: 64
  max_connections: 1000
oauth:
  issuer: https://idp.example.com/realms/agents
  audiences: api://countersign
  principal_claim: client_id
  required_scopes: [mcp:tools]
  claims: [tenant, groups]
  jwks_url: https://idp.example.com/jwks
  clock_skew: 30s
  jwks_max_age: 15m
`

// The secrets of the example, each set by reference.
const (
	apiKeySecret  = "tcld-api-key-9f8e7d"
	tokenSecret   = "xoxb-slack-token-1a2b3c"
	signingSecret = "slack-signing-secret-4d5e6f"
)

func loadSectionsExample(t *testing.T) *File {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "slack-token"), []byte(tokenSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(filepath.Join(dir, "c.yaml"), []byte(sectionsExample),
		env(map[string]string{"TEMPORAL_API_KEY": apiKeySecret, "SLACK_SIGNING_SECRET": signingSecret}))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestLoadSections(t *testing.T) {
	f := loadSectionsExample(t)
	dir := filepath.Dir(f.Path)
	want := File{
		Path: f.Path, Addr: "0.0.0.0:8080", DataDir: filepath.Join(dir, "data"), AuditKeyDir: filepath.Join(dir, "keys"),
		PublicURL: "https://approvals.example.com",
		ServerID:  "countersign-prod", LogLevel: "warn", Policy: "/etc/countersign/policy",
		Temporal: Temporal{Address: "my-ns.a2b3c.tmprl.cloud:7233", Namespace: "my-ns.a2b3c", APIKey: apiKeySecret,
			TLS: TemporalTLS{CA: filepath.Join(dir, "certs/ca.pem"), Cert: "/etc/countersign/client.pem",
				Key: "/etc/countersign/client.key", ServerName: "temporal.internal"}},
		NATS: NATS{URLs: []string{"nats://nats-0:4222", "tls://nats-1:4222"}, Creds: "/etc/countersign/countersign.creds",
			TLS: NATSTLS{CA: "/etc/countersign/nats-ca.pem"}, Replicas: 3},
		Slack: Slack{Token: tokenSecret, Channel: "#approvals", SigningSecret: signingSecret, APIURL: "https://slack-gov.com/api/"},
		Limits: Limits{RatePerMinute: 60, RateBurst: 20, MaxPending: 50, PollInterval: 2 * time.Second,
			ResultRetention: 24 * time.Hour, RequestsPerSecond: 12.5, RequestBurst: 40, MaxInFlight: 8,
			BodyReadTimeout: 5 * time.Second, MaxSlowBodies: 64, MaxConnections: 1000},
		OAuth: OAuth{Issuer: "https://idp.example.com/realms/agents", Audiences: []string{"api://countersign"},
			PrincipalClaim: "client_id", RequiredScopes: []string{"mcp:tools"}, Claims: []string{"tenant", "groups"},
			JWKSURL: "https://idp.example.com/jwks", ClockSkew: 30 * time.Second, JWKSMaxAge: 15 * time.Minute},
	}
	// Compare with the secrets visible: cmp does not call String.
	if diff := cmp.Diff(want, *f); diff != "" {
		t.Errorf("loaded (-want +got):\n%s", diff)
	}
	if got := f.NATS.URL(); got != "nats://nats-0:4222,tls://nats-1:4222" {
		t.Errorf("NATS.URL() = %q", got)
	}
	// A URL string may list several servers, as NATS_URL does.
	g, err := Parse("c.yaml", []byte("nats:\n  url: nats://a:4222, nats://b:4222\n"), nil)
	if err != nil || g.NATS.URL() != "nats://a:4222,nats://b:4222" {
		t.Errorf("comma-separated url: %v %q", err, g.NATS.URL())
	}
}

// TestSectionsPrintRedacted: the secrets of the new sections appear in no
// printed form, and String prints every section in the file's syntax.
func TestSectionsPrintRedacted(t *testing.T) {
	f := loadSectionsExample(t)
	var text, jsonLog bytes.Buffer
	slog.New(slog.NewTextHandler(&text, nil)).Info("config", "config", f, "temporal", f.Temporal, "slack", f.Slack)
	slog.New(slog.NewJSONHandler(&jsonLog, nil)).Info("config", "temporal", f.Temporal, "slack", f.Slack)
	js, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	jsSections, err := json.Marshal([]any{f.Temporal, f.Slack})
	if err != nil {
		t.Fatal(err)
	}
	forms := map[string]string{
		"String": f.String(), "%v": fmt.Sprintf("%v", f), "%+v": fmt.Sprintf("%+v", *f), "%#v": fmt.Sprintf("%#v", *f),
		"%v temporal": fmt.Sprintf("%v", f.Temporal), "%+v slack": fmt.Sprintf("%+v", f.Slack), "%#v slack": fmt.Sprintf("%#v", f.Slack),
		"json": string(js), "json sections": string(jsSections), "slog text": text.String(), "slog json": jsonLog.String(),
		"Redacted": fmt.Sprint(f.Redacted().Temporal.APIKey, f.Redacted().Slack.Token, f.Redacted().Slack.SigningSecret),
	}
	for name, s := range forms {
		for _, secret := range []string{apiKeySecret, tokenSecret, signingSecret} {
			if strings.Contains(s, secret) {
				t.Errorf("%s shows a secret:\n%s", name, s)
			}
		}
	}
	if f.Temporal.APIKey != apiKeySecret {
		t.Error("Redacted changed the original")
	}
	dir := filepath.Dir(f.Path)
	want := `addr: 0.0.0.0:8080
data_dir: ` + filepath.Join(dir, "data") + `
audit_key_dir: ` + filepath.Join(dir, "keys") + `
public_url: https://approvals.example.com
server_id: countersign-prod
log_level: warn
policy: /etc/countersign/policy
temporal:
  address: my-ns.a2b3c.tmprl.cloud:7233
  namespace: my-ns.a2b3c
  api_key: <redacted>
  tls:
    enabled: true
    ca: ` + filepath.Join(dir, "certs/ca.pem") + `
    cert: /etc/countersign/client.pem
    key: /etc/countersign/client.key
    server_name: temporal.internal
nats:
  url: ['nats://nats-0:4222', 'tls://nats-1:4222']
  creds: /etc/countersign/countersign.creds
  tls:
    ca: /etc/countersign/nats-ca.pem
  replicas: 3
slack:
  token: <redacted>
  channel: '#approvals'
  signing_secret: <redacted>
  api_url: https://slack-gov.com/api/
limits:
  rate_per_minute: 60
  rate_burst: 20
  max_pending: 50
  poll_interval: 2s
  result_retention: 24h0m0s
  requests_per_second: 12.5
  request_burst: 40
  max_in_flight: 8
  body_read_timeout: 5s
  max_slow_bodies: 64
  max_connections: 1000
oauth:
  issuer: https://idp.example.com/realms/agents
  audiences: ['api://countersign']
  principal_claim: client_id
  required_scopes: ['mcp:tools']
  claims: [tenant, groups]
  jwks_url: https://idp.example.com/jwks
  clock_skew: 30s
  jwks_max_age: 15m0s
`
	if diff := cmp.Diff(want, f.String()); diff != "" {
		t.Errorf("String (-want +got):\n%s", diff)
	}
	// What String prints loads again to the same settings (secrets aside).
	again, err := Parse(f.Path, []byte(strings.ReplaceAll(f.String(), RedactedValue, "xoxb-x")), nil)
	if err != nil {
		t.Fatalf("String does not load again: %v", err)
	}
	again.Temporal.APIKey, again.Slack.Token, again.Slack.SigningSecret = f.Temporal.APIKey, f.Slack.Token, f.Slack.SigningSecret
	again.Temporal.TLS.Enabled = false
	again.Warnings = f.Warnings // the secrets put back inline are warned about
	if diff := cmp.Diff(*f, *again); diff != "" {
		t.Errorf("reloaded String (-first +again):\n%s", diff)
	}
}

// TestSectionProblems: every section's errors, each with its line and
// field; a file's problems all come at once.
func TestSectionProblems(t *testing.T) {
	tests := []struct {
		name, content string
		want          []string
	}{
		{"addr", "addr: 8080\n", []string{`c.yaml:1: addr: "8080" must be host:port`}},
		{"addr port", "addr: 'h:99999'\n", []string{`c.yaml:1: addr: "h:99999": the port must be a number`}},
		{"public_url http", "public_url: http://approvals.example.com\n", []string{`c.yaml:1: public_url: "http://approvals.example.com": passkeys need https`}},
		{"public_url path", "public_url: https://a.example/x\n", []string{`c.yaml:1: public_url: "https://a.example/x" must not have a path`}},
		{"public_url relative", "public_url: approvals\n", []string{`c.yaml:1: public_url: "approvals" must be an absolute http(s) URL`}},
		{"server_id blank", "server_id: ' '\n", []string{"c.yaml:1: server_id: must not be empty or blank"}},
		{"log_level", "log_level: verbose\n", []string{`c.yaml:1: log_level: "verbose" must be one of debug, info, warn, error`}},
		{"data_dir list", "data_dir: [a]\n", []string{"c.yaml:1: data_dir: must be a string, not a list"}},
		{"temporal not a mapping", "temporal: localhost:7233\n", []string{"c.yaml:1: temporal: must be a mapping (address, namespace, api_key, tls), not a string"}},
		{"temporal unknown", "temporal:\n  adress: h:7233\n", []string{"c.yaml:2: temporal.adress: unknown field (known: address, namespace, api_key, tls)"}},
		{"temporal address", "temporal:\n  address: temporal\n", []string{`c.yaml:2: temporal.address: "temporal" must be host:port`}},
		{"temporal api_key unset", "temporal:\n  api_key: ${NOPE}\n", []string{"c.yaml:2: temporal.api_key: environment variable NOPE is not set"}},
		{"temporal api_key empty", "temporal:\n  api_key: ${EMPTY}\n", []string{"c.yaml:2: temporal.api_key: is empty (after expansion)"}},
		{"temporal tls unknown", "temporal:\n  tls:\n    ca_file: x\n", []string{"c.yaml:3: temporal.tls.ca_file: unknown field (known: enabled, ca, cert, key, server_name)"}},
		{"temporal tls cert alone", "temporal:\n  tls:\n    cert: c.pem\n", []string{"c.yaml:3: temporal.tls.cert: needs temporal.tls.key beside it"}},
		{"temporal tls key alone", "temporal:\n  tls:\n    key: k.pem\n", []string{"c.yaml:3: temporal.tls.key: needs temporal.tls.cert beside it"}},
		{"temporal tls enabled", "temporal:\n  tls:\n    enabled: yes please\n", []string{"c.yaml:3: temporal.tls.enabled: must be true or false, not a string"}},
		{"nats url scheme", "nats:\n  url: http://n:4222\n", []string{"c.yaml:2: nats.url: must be a nats://, tls://, ws:// or wss:// URL"}},
		{"nats url password", "nats:\n  url: nats://u:hunter2@n:4222\n", []string{"c.yaml:2: nats.url: must not carry user:password or a token; use creds or nkey"}},
		{"nats url empty list", "nats:\n  url: []\n", []string{"c.yaml:2: nats.url: must not be an empty list"}},
		{"nats url no host", "nats:\n  url: nats://:4222\n", []string{"c.yaml:2: nats.url: must have a host"}},
		{"nats creds and nkey", "nats:\n  creds: a.creds\n  nkey: a.nk\n", []string{"c.yaml:3: nats.nkey: creds (line 2) and nkey exclude each other"}},
		{"nats replicas", "nats:\n  replicas: 7\n", []string{"c.yaml:2: nats.replicas: must be a whole number from 1 to 5, not 7"}},
		{"nats replicas string", "nats:\n  replicas: three\n", []string{"c.yaml:2: nats.replicas: must be a whole number from 1 to 5, not a string"}},
		{"nats tls unknown", "nats:\n  tls:\n    cafile: x\n", []string{"c.yaml:3: nats.tls.cafile: unknown field (known: ca, cert, key)"}},
		{"nats tls key alone", "nats:\n  tls:\n    key: k\n", []string{"c.yaml:3: nats.tls.key: needs nats.tls.cert beside it"}},
		{"slack not a token", "slack:\n  token: ${SIGNING}\n", []string{"c.yaml:2: slack.token: is not a Slack bot token (xoxb-…)"}},
		{"slack channel without token", "slack:\n  channel: '#a'\n  signing_secret: s\n  api_url: https://slack-gov.com/api/\n", []string{"c.yaml:2: slack.channel: needs slack.token", "c.yaml:3: slack.signing_secret: needs slack.token", "c.yaml:4: slack.api_url: needs slack.token"}},
		{"slack api url not a url", "slack:\n  token: xoxb-1\n  api_url: slack-gov.com\n", []string{`c.yaml:3: slack.api_url: must be an absolute https URL without user:password, not "slack-gov.com"`}},
		{"slack unknown", "slack:\n  token: xoxb-1\n  webhook: x\n", []string{"c.yaml:3: slack.webhook: unknown field (known: token, channel, signing_secret, api_url)"}},
		{"limits zero", "limits:\n  rate_per_minute: 0\n", []string{"c.yaml:2: limits.rate_per_minute: must be a whole number from 1 to 1000000, not 0"}},
		{"limits negative float", "limits:\n  requests_per_second: -1\n", []string{"c.yaml:2: limits.requests_per_second: must be a number greater than 0"}},
		{"limits duration", "limits:\n  poll_interval: 5\n", []string{`c.yaml:2: limits.poll_interval: "5" is not a duration`}},
		{"limits duration range", "limits:\n  body_read_timeout: 2h\n", []string{"c.yaml:2: limits.body_read_timeout: must be from 100ms to 1h0m0s, not 2h0m0s"}},
		{"limits unknown", "limits:\n  max_pendings: 3\n", []string{"c.yaml:2: limits.max_pendings: unknown field (known: rate_per_minute, "}},
		{"limits not a mapping", "limits: 5\n", []string{"c.yaml:1: limits: must be a mapping (rate_per_minute, "}},
		{"oauth issuer relative", "oauth:\n  issuer: idp.example.com\n", []string{`c.yaml:2: oauth.issuer: must be an absolute https URL without user:password, not "idp.example.com"`}},
		{"oauth issuer password", "oauth:\n  issuer: https://u:hunter2@idp.example.com\n", []string{"c.yaml:2: oauth.issuer: must be an absolute https URL without user:password"}},
		{"oauth without issuer", "oauth:\n  required_scopes: mcp:tools\n  clock_skew: 5s\n", []string{"c.yaml:2: oauth.required_scopes: needs oauth.issuer", "c.yaml:3: oauth.clock_skew: needs oauth.issuer"}},
		{"oauth clock_skew range", "oauth:\n  issuer: https://idp.example.com\n  clock_skew: 1h\n", []string{"c.yaml:3: oauth.clock_skew: must be from 1s to 10m0s, not 1h0m0s"}},
		{"oauth jwks_max_age range", "oauth:\n  issuer: https://idp.example.com\n  jwks_max_age: 10s\n", []string{"c.yaml:3: oauth.jwks_max_age: must be from 1m0s to 24h0m0s, not 10s"}},
		{"oauth empty scope", "oauth:\n  issuer: https://idp.example.com\n  required_scopes: ['']\n", []string{"c.yaml:3: oauth.required_scopes: must not hold an empty string"}},
		{"oauth unknown", "oauth:\n  issuer: https://idp.example.com\n  client_secret: x\n", []string{"c.yaml:3: oauth.client_secret: unknown field (known: issuer, audiences, principal_claim, "}},
		{"all at once", "log_level: loud\ntemporal:\n  address: x\nnats:\n  replicas: 0\nlimits:\n  max_in_flight: 1.5\n", []string{
			`c.yaml:1: log_level: "loud"`, `c.yaml:3: temporal.address: "x" must be host:port`,
			"c.yaml:5: nats.replicas: must be a whole number from 1 to 5, not 0", "c.yaml:7: limits.max_in_flight: must be a whole number"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := problems(t, tt.content, map[string]string{"EMPTY": "", "SIGNING": "abc123"})
			if len(got) != len(tt.want) {
				t.Fatalf("got %d problems, want %d:\n%s", len(got), len(tt.want), strings.Join(got, "\n"))
			}
			for i, w := range tt.want {
				if !strings.HasPrefix(got[i], w) {
					t.Errorf("problem %d:\n got %s\nwant %s…", i, got[i], w)
				}
			}
			if strings.Contains(strings.Join(got, "\n"), "hunter2") || strings.Contains(strings.Join(got, "\n"), "abc123") {
				t.Errorf("a problem shows a secret: %v", got)
			}
		})
	}
}
