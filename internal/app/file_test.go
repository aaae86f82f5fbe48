package app

import (
	"fmt"
	"strings"
	"testing"

	"github.com/countersign/countersign/internal/config"
	"github.com/countersign/countersign/workflows"
)

// The NATS URLs `config check` prints and the startup log shows carry no
// user information (user:password or a token) of any server in the list.
func TestNATSURLsRedacted(t *testing.T) {
	c := Config{NATSURL: "nats://alice:s3cret-pw@n1:4222, tls://t0ken-42@n2:4222,nats://n3:4222,nats://bob:p4ss@[::1"}
	printed := map[string]string{
		"Effective": c.Effective(ModeServer).String(),
		"Redacted":  fmt.Sprint(c.Redacted()...),
	}
	for name, out := range printed {
		for _, secret := range []string{"alice", "s3cret-pw", "t0ken-42", "bob", "p4ss"} {
			if strings.Contains(out, secret) {
				t.Errorf("%s shows %q:\n%s", name, secret, out)
			}
		}
		for _, want := range []string{"nats://n1:4222", "tls://n2:4222", "nats://n3:4222"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s lacks %q:\n%s", name, want, out)
			}
		}
	}
}

// An upstream's timeout is refused above the limit of an approved call's
// execution, which would cut it short.
func TestUpstreamTimeoutWithinExecuteTimeout(t *testing.T) {
	if config.MaxTimeout != workflows.ExecuteTimeout {
		t.Fatalf("config.MaxTimeout %v, workflows.ExecuteTimeout %v", config.MaxTimeout, workflows.ExecuteTimeout)
	}
}

// slack.api_url in the file is --slack-api-url unless the flag (or its
// environment variable) is set, and config check prints it back.
func TestSlackAPIURLFromFile(t *testing.T) {
	f := &config.File{Slack: config.Slack{Token: "xoxb-1", APIURL: "https://slack-gov.com/api/"}}
	var c Config
	c.ApplyFile(f, func(string) bool { return false })
	if c.SlackAPIURL != "https://slack-gov.com/api/" || c.SlackToken != "xoxb-1" {
		t.Fatalf("from the file: %q, token set %t", c.SlackAPIURL, c.SlackToken != "")
	}
	if out := c.Effective(ModeServer).String(); !strings.Contains(out, "api_url: https://slack-gov.com/api/") {
		t.Fatalf("effective configuration lacks the API URL:\n%s", out)
	}
	c = Config{SlackAPIURL: "https://egress.internal/slack/"}
	c.ApplyFile(f, func(flag string) bool { return flag == "slack-api-url" })
	if c.SlackAPIURL != "https://egress.internal/slack/" {
		t.Fatalf("the flag lost to the file: %q", c.SlackAPIURL)
	}
}

// audit_key_dir in the file is --audit-key-dir unless the flag (or its
// environment variable) is set, so that every server and worker given one
// file shares one key directory; config check prints it back.
func TestAuditKeyDirFromFile(t *testing.T) {
	f := &config.File{AuditKeyDir: "/etc/countersign/audit-keys"}
	var c Config
	c.ApplyFile(f, func(string) bool { return false })
	if c.AuditKeyDir != "/etc/countersign/audit-keys" {
		t.Fatalf("from the file: %q", c.AuditKeyDir)
	}
	if out := c.Effective(ModeWorker).String(); !strings.Contains(out, "audit_key_dir: /etc/countersign/audit-keys") {
		t.Fatalf("effective configuration lacks the key directory:\n%s", out)
	}
	c = Config{AuditKeyDir: "/run/keys"}
	c.ApplyFile(f, func(flag string) bool { return flag == "audit-key-dir" })
	if c.AuditKeyDir != "/run/keys" {
		t.Fatalf("the flag lost to the file: %q", c.AuditKeyDir)
	}
}
