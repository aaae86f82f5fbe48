package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/countersign/countersign/internal/devtest"
	"github.com/countersign/countersign/internal/testnats"
)

// The management commands against a real dev: list, disable, enable and
// revoke agents, approvers and passkeys; each change shows in the audit.
func TestManageCommands(t *testing.T) {
	s := devtest.Start(t, devtest.Options{AppLimits: true})
	dir := s.Dir
	ann := s.Enroll("ann", "approvers")

	code, out, stderr := runCLI("agents", "list", "--data-dir", dir)
	if code != 0 || !regexp.MustCompile(`dev-agent\s+active`).MatchString(out) {
		t.Fatalf("agents list: exit %d, out %q, err %q", code, out, stderr)
	}
	code, out, stderr = runCLI("agents", "disable", "dev-agent", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "Agent dev-agent is now disabled") || !strings.Contains(out, "countersign audit show admin-agent-") {
		t.Fatalf("agents disable: exit %d, out %q, err %q", code, out, stderr)
	}
	if code, auth := s.MCPAuth(s.AgentToken); code != 401 || !strings.Contains(auth, `error="invalid_token"`) {
		t.Fatalf("disabled agent's tools/list: HTTP %d %q", code, auth)
	}
	code, out, _ = runCLI("agents", "disable", "--data-dir", dir, "dev-agent")
	if code != 0 || !strings.Contains(out, "was already disabled; nothing changed") {
		t.Fatalf("agents disable again: exit %d, out %q", code, out)
	}
	code, out, _ = runCLI("agents", "enable", "dev-agent", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "now active") {
		t.Fatalf("agents enable: exit %d, out %q", code, out)
	}
	if code, _ := s.MCPAuth(s.AgentToken); code != 200 {
		t.Fatalf("enabled agent's tools/list: HTTP %d", code)
	}
	code, _, stderr = runCLI("agents", "revoke", "nobody", "--data-dir", dir)
	if code != 1 || !strings.Contains(stderr, `no agent named "nobody"`) {
		t.Fatalf("revoke unknown agent: exit %d, err %q", code, stderr)
	}
	code, _, stderr = runCLI("agents", "revoke", "--data-dir", dir)
	if code != 2 || !strings.Contains(stderr, "usage: countersign agents revoke NAME") {
		t.Fatalf("revoke without a name: exit %d, err %q", code, stderr)
	}

	code, out, stderr = runCLI("approvers", "list", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, ann.ID) || !regexp.MustCompile(`ann\s+approvers\s+active\s+\S+\s+active\s+never`).MatchString(out) {
		t.Fatalf("approvers list: exit %d, out %q, err %q", code, out, stderr)
	}
	cred := regexp.MustCompile(`active\s+(\S+)\s+active`).FindStringSubmatch(out)[1]
	code, out, stderr = runCLI("passkeys", "revoke", ann.ID, cred, "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "is now revoked") {
		t.Fatalf("passkeys revoke: exit %d, out %q, err %q", code, out, stderr)
	}
	code, out, _ = runCLI("passkeys", "revoke", ann.ID, cred, "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "was already revoked; nothing changed") {
		t.Fatalf("passkeys revoke again: exit %d, out %q", code, out)
	}
	code, _, stderr = runCLI("passkeys", "enable", ann.ID, cred, "--data-dir", dir)
	if code != 1 || !strings.Contains(stderr, "revocation is permanent") {
		t.Fatalf("passkeys enable revoked: exit %d, err %q", code, stderr)
	}
	code, _, stderr = runCLI("passkeys", "revoke", ann.ID, "--data-dir", dir)
	if code != 2 {
		t.Fatalf("passkeys revoke without a credential: exit %d, err %q", code, stderr)
	}
	// A credential ID is base64url: one in 64 starts with "-" (CI met one
	// as the flag "-6mevi…"). It is an argument, before or after the flags.
	for _, args := range [][]string{
		{"passkeys", "disable", ann.ID, "-6meviXhL85e8Cee7-S4yY3NVBSpMfzk9qX-hHkAN3g", "--data-dir", dir},
		{"passkeys", "disable", "--data-dir", dir, ann.ID, "--6meviXhL85e8Cee7"},
		{"passkeys", "disable", "--data-dir=" + dir, "--", ann.ID, "-server"},
	} {
		code, _, stderr = runCLI(args...)
		if code != 1 || !strings.Contains(stderr, "passkey") || strings.Contains(stderr, "flag provided") {
			t.Fatalf("%q: exit %d, err %q; want the unknown passkey named, exit 1", args, code, stderr)
		}
	}
	code, out, _ = runCLI("approvers", "disable", ann.ID, "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "is now disabled") {
		t.Fatalf("approvers disable: exit %d, out %q", code, out)
	}
	code, _, stderr = runCLI("approvers", "revoke", "0123456789abcdef0123456789abcdef", "--data-dir", dir)
	if code != 1 || !strings.Contains(stderr, "no approver") {
		t.Fatalf("revoke unknown approver: exit %d, err %q", code, stderr)
	}

	// The approver's admin chain, in the audit commands.
	code, out, stderr = runCLI("audit", "show", "admin-approver-"+ann.ID, "--data-dir", dir)
	if code != 0 || strings.Count(out, "admin") < 2 || !strings.Contains(out, "revoke passkey") || !strings.Contains(out, "disable approver") {
		t.Fatalf("audit show: exit %d, out %q, err %q", code, out, stderr)
	}
	export := filepath.Join(t.TempDir(), "audit.jsonl")
	code, out, stderr = runCLI("audit", "export", "--data-dir", dir)
	if code != 0 {
		t.Fatalf("audit export: exit %d, err %q", code, stderr)
	}
	if err := os.WriteFile(export, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	pub := filepath.Join(dir, "audit-key.pub")
	code, out, stderr = runCLI("audit", "verify", export, "--key", pub)
	if code != 0 || !strings.Contains(out, "admin-approver-"+ann.ID+" admin") {
		t.Fatalf("audit verify: exit %d, out %q, err %q", code, out, stderr)
	}

	// A checkpoint of that export anchors the approver's admin chain: a
	// later export verifies against it once the chain grew, and fails
	// when its last record (the disable) is left out, which the export
	// alone does not show.
	checkpoint := filepath.Join(t.TempDir(), "checkpoint.json")
	code, out, stderr = runCLI("audit", "checkpoint", export, "--key", pub)
	if code != 0 || !strings.Contains(out, `"chain": "admin-approver-`+ann.ID+`"`) || !strings.Contains(stderr, "Checkpoint of") {
		t.Fatalf("audit checkpoint: exit %d, out %q, err %q", code, out, stderr)
	}
	if err := os.WriteFile(checkpoint, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, stderr = runCLI("approvers", "enable", ann.ID, "--data-dir", dir); code != 0 {
		t.Fatalf("approvers enable: exit %d, out %q, err %q", code, out, stderr)
	}
	code, out, stderr = runCLI("audit", "export", "--data-dir", dir)
	if code != 0 {
		t.Fatalf("audit export: exit %d, err %q", code, stderr)
	}
	later := out
	if err := os.WriteFile(export, []byte(later), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, stderr = runCLI("audit", "verify", export, "--key", pub, "--checkpoint", checkpoint); code != 0 {
		t.Fatalf("a grown export against the checkpoint: exit %d, out %q, err %q", code, out, stderr)
	}
	var kept []string
	cut := 0
	for _, line := range strings.Split(strings.TrimSpace(later), "\n") {
		if strings.Contains(line, `"taskId":"admin-approver-`+ann.ID+`"`) && (strings.Contains(line, `"action":"disable"`) || strings.Contains(line, `"action":"enable"`)) && strings.Contains(line, `"type":"approver"`) {
			cut++
			continue
		}
		kept = append(kept, line)
	}
	if cut != 2 {
		t.Fatalf("cut %d records (the disable and the enable of the approver), want 2:\n%s", cut, later)
	}
	if err := os.WriteFile(export, []byte(strings.Join(kept, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, _ = runCLI("audit", "verify", export, "--key", pub); code != 0 {
		t.Fatalf("the cut export alone: exit %d, out %q; the test shows nothing", code, out)
	}
	code, out, _ = runCLI("audit", "verify", export, "--key", pub, "--checkpoint", checkpoint)
	if code != 1 || !strings.Contains(out, "FAIL admin-approver-"+ann.ID) || !strings.Contains(out, "records were removed") {
		t.Fatalf("the cut export against the checkpoint: exit %d, out %q", code, out)
	}
	if code, _, stderr = runCLI("audit", "verify", export, "--key", pub, "--checkpoint", export); code != 1 || !strings.Contains(stderr, "checkpoint") {
		t.Fatalf("an export given as a checkpoint: exit %d, err %q", code, stderr)
	}
}

// admin init, twice: the second refuses; --rotate replaces the token; the
// token file is 0600 and the admin commands read it.
func TestAdminInitCLI(t *testing.T) {
	_, nc := testnats.Start(t)
	url := nc.ConnectedUrl()
	dir := t.TempDir()
	out1 := filepath.Join(dir, "admin-token")
	code, out, stderr := runCLI("admin", "init", "--nats-url", url, "--data-dir", dir, "--out", out1)
	if code != 0 || !strings.Contains(out, "written to "+out1) || !strings.Contains(out, "countersign audit show admin-admin-") {
		t.Fatalf("admin init: exit %d, out %q, err %q", code, out, stderr)
	}
	fi, err := os.Stat(out1)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", fi.Mode(), err)
	}
	first := strings.TrimSpace(string(mustRead(t, out1)))
	if !strings.HasPrefix(first, "csad_") {
		t.Fatalf("token %q", first)
	}
	// It says how to hand auditors the public key of the record's key, and
	// names the token file it wrote.
	keyDir := filepath.Join(dir, "audit-keys")
	if !strings.Contains(out, "countersign audit public-keys --audit-key-dir "+keyDir) ||
		!strings.Contains(out, "COUNTERSIGN_ADMIN_TOKEN_FILE="+out1+" ") {
		t.Fatalf("admin init output: %q", out)
	}
	if code, pub, stderr := runCLI("audit", "public-keys", "--audit-key-dir", keyDir); code != 0 || strings.Count(pub, "BEGIN PUBLIC KEY") != 1 {
		t.Fatalf("audit public-keys: exit %d, out %q, err %q", code, pub, stderr)
	}

	code, out, stderr = runCLI("admin", "init", "--nats-url", url, "--data-dir", dir)
	if code != 1 || !strings.Contains(stderr, "an admin token already exists (admin)") || !strings.Contains(stderr, `--rotate replaces "admin"'s token`) || out != "" {
		t.Fatalf("second admin init: exit %d, out %q, err %q", code, out, stderr)
	}
	code, _, stderr = runCLI("admin", "init", "--nats-url", url, "--data-dir", dir, "--out", out1)
	if code != 1 || !strings.Contains(stderr, "exists") || strings.TrimSpace(string(mustRead(t, out1))) != first {
		t.Fatalf("admin init over an existing file: exit %d, err %q", code, stderr)
	}

	code, out, stderr = runCLI("admin", "init", "--nats-url", url, "--data-dir", dir, "--rotate")
	if code != 0 || !strings.Contains(out, "shown once") || !strings.Contains(out, "It replaces token") {
		t.Fatalf("admin init --rotate: exit %d, out %q, err %q", code, out, stderr)
	}
	if strings.Contains(out, first) {
		t.Fatal("rotation printed the old token")
	}

	code, _, stderr = runCLI("admin", "init", "--data-dir", dir)
	if code != 1 || !strings.Contains(stderr, "--nats-url") {
		t.Fatalf("admin init without NATS: exit %d, err %q", code, stderr)
	}
	code, _, _ = runCLI("admin", "bootstrap")
	if code != 2 {
		t.Fatalf("admin bootstrap: exit %d", code)
	}

	// Both records are in the admin's chain; the CLI reads the token file.
	t.Setenv("COUNTERSIGN_ADMIN_TOKEN_FILE", out1)
	t.Setenv("COUNTERSIGN_ADMIN_TOKEN", "")
	c, err := newAdminClient("http://127.0.0.1:1", dir)
	if err != nil || c.token != first {
		t.Fatalf("admin client token from file: %v", err)
	}
}

// TestAdminInitFromConfigFile: admin init reads the servers' --config file
// (COUNTERSIGN_CONFIG) for its NATS settings and data_dir, so the operator
// need not repeat them; a flag or environment variable still wins.
func TestAdminInitFromConfigFile(t *testing.T) {
	// A NATS that admits one user, by nkey, as a production one would.
	dir := t.TempDir()
	ns, seed := testnats.StartNKeyUser(t)
	if err := os.WriteFile(filepath.Join(dir, "countersign.nk"), seed, 0o600); err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "countersign.yaml")
	if err := os.WriteFile(cfgFile, []byte("data_dir: data\nnats:\n  url: ["+ns.ClientURL()+"]\n  nkey: countersign.nk\n  replicas: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A flag wins over the file: a NATS nothing listens on.
	code, out, stderr := runCLI("admin", "init", "--config", cfgFile, "--nats-url", "nats://127.0.0.1:1")
	if code != 1 || !strings.Contains(stderr, "127.0.0.1:1") {
		t.Fatalf("admin init --config with --nats-url: exit %d, out %q, err %q", code, out, stderr)
	}
	// So does the environment.
	t.Setenv("NATS_URL", "nats://127.0.0.1:1")
	code, out, stderr = runCLI("admin", "init", "--config", cfgFile)
	if code != 1 || !strings.Contains(stderr, "127.0.0.1:1") {
		t.Fatalf("admin init --config with NATS_URL: exit %d, out %q, err %q", code, out, stderr)
	}
	t.Setenv("NATS_URL", "")
	// The file alone, named by COUNTERSIGN_CONFIG; its data_dir (relative
	// to the file) holds the audit keys.
	t.Setenv("COUNTERSIGN_CONFIG", cfgFile)
	tokenFile := filepath.Join(dir, "admin-token")
	code, out, stderr = runCLI("admin", "init", "--out", tokenFile)
	if code != 0 || !strings.Contains(out, "written to "+tokenFile) {
		t.Fatalf("admin init from the config file: exit %d, out %q, err %q", code, out, stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "audit-keys", "current")); err != nil {
		t.Fatalf("the file's data_dir holds no audit keys: %v", err)
	}
	if n := ns.GlobalAccount().JetStreamUsage().Streams; n == 0 {
		t.Fatal("no stream on the file's NATS")
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
