package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/internal/testnats"
)

func TestAuditVerifyCLI(t *testing.T) {
	js, _ := testnats.Start(t)
	keys, err := audit.OpenKeyring(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l, err := audit.Open(context.Background(), js, audit.Options{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	at := time.Now()
	env, _ := audit.NewEnvelope("t", []byte(`{}`), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "agent", "tool:t", "srv", at, true)
	if _, err := l.Append(ctx, "tsk_cli", audit.Step{ID: audit.StepRequested, Kind: audit.KindRequested, At: at,
		Body: audit.Requested{Envelope: env, Requirement: audit.Requirement{Quorum: 1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Seal(ctx, "tsk_cli", audit.End{Kind: audit.KindExpired, At: at, Status: "completed", Disposition: "denied-not-executed"}); err != nil {
		t.Fatal(err)
	}
	var export []byte
	if err := l.Export(ctx, time.Time{}, func(b []byte) error { export = append(append(export, b...), '\n'); return nil }); err != nil {
		t.Fatal(err)
	}
	var recs []json.RawMessage
	for _, l := range strings.Split(strings.TrimSpace(string(export)), "\n") {
		recs = append(recs, json.RawMessage(l))
	}
	var shown strings.Builder
	if err := printChain(&shown, recs, false); err != nil || !strings.Contains(shown.String(), "requested") ||
		!strings.Contains(shown.String(), "completed denied-not-executed") || !strings.Contains(shown.String(), "outcome") {
		t.Fatalf("show: %v\n%s", err, shown.String())
	}
	dir := t.TempDir()
	file, pub := filepath.Join(dir, "audit.jsonl"), filepath.Join(dir, "audit-key.pub")
	os.WriteFile(file, export, 0o600)
	os.WriteFile(pub, keys.PublicKeysPEM(), 0o600)

	code, out, _ := runCLI("audit", "verify", file, "--key", pub)
	if code != 0 || !strings.Contains(out, "OK   tsk_cli denied-not-executed") || !strings.HasSuffix(out, "\n1 chain: 1 task; 0 failed\n") {
		t.Fatalf("verify: exit %d\n%s", code, out)
	}
	bad := []byte(strings.Replace(string(export), `"expired"`, `"executed"`, 1))
	os.WriteFile(file, bad, 0o600)
	code, out, _ = runCLI("audit", "verify", file, "--key", pub)
	if code != 1 || !strings.Contains(out, "FAIL tsk_cli") {
		t.Fatalf("tampered verify: exit %d\n%s", code, out)
	}
	// No checkpoint of an export that does not verify; the verdicts go
	// to stderr, and stdout (the checkpoint's) stays empty.
	code, out, errOut := runCLI("audit", "checkpoint", file, "--key", pub)
	if code != 1 || out != "" || !strings.Contains(errOut, "No checkpoint: the export does not verify") || !strings.Contains(errOut, "FAIL tsk_cli") {
		t.Fatalf("checkpoint of a tampered export: exit %d, out %q, err %q", code, out, errOut)
	}
	// Signed by the server's key but claimed without a quorum: the output
	// names the rule, the task and the record.
	if _, err := l.Append(ctx, "tsk_noquorum", audit.Step{ID: audit.StepRequested, Kind: audit.KindRequested, At: at,
		Body: audit.Requested{Envelope: env, Requirement: audit.Requirement{Group: "g", Quorum: 1}}}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{audit.KindReevaluated, audit.KindClaimed} {
		if _, err := l.Append(ctx, "tsk_noquorum", audit.Step{ID: k, Kind: k, At: at, Body: audit.Policy{Allow: true, PolicyVersion: "p"}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Append(ctx, "tsk_noquorum", audit.Step{ID: "cancel-refused", Kind: audit.KindCancelRefused, At: at, Body: struct{}{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Seal(ctx, "tsk_noquorum", audit.End{Kind: audit.KindExecuted, At: at, Status: "completed", Disposition: "approved-executed", ResultDigest: "00"}); err != nil {
		t.Fatal(err)
	}
	lines, err := l.Chain(ctx, "tsk_noquorum")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(file, append(bytes.Join(lines, []byte("\n")), '\n'), 0o600)
	code, out, _ = runCLI("audit", "verify", file, "--key", pub)
	if code != 1 || !strings.Contains(out, "FAIL tsk_noquorum") || !strings.Contains(out, "broken rules: quorum-before-claim") ||
		!strings.Contains(out, "problem [quorum-before-claim] tsk_noquorum record 2 (claimed): execution claimed with 0 distinct approver(s)") {
		t.Fatalf("verify of a claim without quorum: exit %d\n%s", code, out)
	}
	var shownBad strings.Builder
	raw := make([]json.RawMessage, len(lines))
	for i, l := range lines {
		raw[i] = l
	}
	if err := printChain(&shownBad, raw, false); err != nil || !strings.Contains(shownBad.String(), "cancel refused") {
		t.Fatalf("show: %v\n%s", err, shownBad.String())
	}
	// A chain cut after the claim is not "pending": the tool may have run.
	if _, err := l.Append(ctx, "tsk_cut", audit.Step{ID: audit.StepRequested, Kind: audit.KindRequested, At: at,
		Body: audit.Requested{Envelope: env, Requirement: audit.Requirement{Quorum: 0}}}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{audit.KindReevaluated, audit.KindClaimed} {
		if _, err := l.Append(ctx, "tsk_cut", audit.Step{ID: k, Kind: k, At: at, Body: audit.Policy{Allow: true, PolicyVersion: "p"}}); err != nil {
			t.Fatal(err)
		}
	}
	if lines, err = l.Chain(ctx, "tsk_cut"); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(file, append(bytes.Join(lines, []byte("\n")), '\n'), 0o600)
	code, out, _ = runCLI("audit", "verify", file, "--key", pub, "--allow-incomplete")
	if code != 0 || !strings.Contains(out, "OK   tsk_cut claimed, not sealed (3 records") || !strings.Contains(out, "the tool may have run") {
		t.Fatalf("verify of a chain cut after the claim: exit %d\n%s", code, out)
	}
	if code, _, errOut := runCLI("audit", "verify", file); code != 2 || !strings.Contains(errOut, "--key") {
		t.Fatalf("verify without --key: exit %d %s", code, errOut)
	}
}

func TestAuditShowAndExportCLI(t *testing.T) {
	dir := startDev(t)
	code, out, errOut := runCLI("audit", "export", "--data-dir", dir)
	if code != 0 || strings.Count(out, "\n") != 1 || !strings.Contains(out, `"action":"create"`) || !strings.Contains(out, `"id":"dev-agent"`) {
		t.Fatalf("export of a new dev's log, which holds only its agent's creation: exit %d %q %s", code, out, errOut)
	}
	code, _, errOut = runCLI("audit", "show", "tsk_nosuchtask", "--data-dir", dir)
	if code != 1 || !strings.Contains(errOut, "no audit records") {
		t.Fatalf("show unknown: exit %d %s", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(dir, app.AuditPubKeyFile)); err != nil {
		t.Fatalf("dev did not write the audit public key: %v", err)
	}
	code, out, _ = runCLI("audit", "rotate-key", "--data-dir", dir)
	if code != 0 || strings.Count(readPEM(t, filepath.Join(dir, app.AuditPubKeyFile)), "BEGIN PUBLIC KEY") != 2 {
		t.Fatalf("rotate-key: exit %d %s", code, out)
	}
}

// TestAuditPublicKeysCLI: `audit public-keys` prints the public half of
// every key in a server's or worker's key directory, which `audit verify
// --key` reads (only dev writes audit-key.pub), and refuses a directory
// without keys rather than make one.
func TestAuditPublicKeysCLI(t *testing.T) {
	dir := filepath.Join(t.TempDir(), app.AuditKeyDir)
	// A new directory: one key, current (not a first key never used and
	// the one rotate-key makes).
	code, out, stderr := runCLI("audit", "rotate-key", "--audit-key-dir", dir)
	if code != 0 || strings.Count(out, "BEGIN PUBLIC KEY") != 1 {
		t.Fatalf("rotate-key of a new directory: exit %d %s %s", code, out, stderr)
	}
	pems, _ := filepath.Glob(filepath.Join(dir, "*.pem"))
	current, _ := os.ReadFile(filepath.Join(dir, "current"))
	if len(pems) != 1 || !strings.HasPrefix(out, "New audit key "+strings.TrimSpace(string(current))+";") {
		t.Fatalf("rotate-key of a new directory: keys %v, current %q, printed %q", pems, current, out)
	}
	// Then a new key, current, beside the old.
	code, out, stderr = runCLI("audit", "rotate-key", "--audit-key-dir", dir)
	current, _ = os.ReadFile(filepath.Join(dir, "current"))
	if code != 0 || strings.Count(out, "BEGIN PUBLIC KEY") != 2 || !strings.HasPrefix(out, "New audit key "+strings.TrimSpace(string(current))+";") {
		t.Fatalf("rotate-key: exit %d %s %s", code, out, stderr)
	}
	printed := out[strings.Index(out, "-----BEGIN"):]
	code, pub, stderr := runCLI("audit", "public-keys", "--audit-key-dir", dir)
	if code != 0 || pub != printed || strings.Count(pub, "BEGIN PUBLIC KEY") != 2 || strings.Contains(pub, "PRIVATE") {
		t.Fatalf("public-keys: exit %d, out %q (rotate-key printed %q), err %q", code, pub, printed, stderr)
	}
	file := filepath.Join(t.TempDir(), "audit-key.pub")
	if err := os.WriteFile(file, []byte(pub), 0o644); err != nil {
		t.Fatal(err)
	}
	if keys, _, err := readKeysAndExport([]string{file}, os.DevNull); err != nil || len(keys) != 2 {
		t.Fatalf("audit verify reads the printed keys as %d keys: %v", len(keys), err)
	}
	// The data dir's key directory by default, through the environment too.
	t.Setenv("COUNTERSIGN_DATA_DIR", filepath.Dir(dir)) // dir is DATA_DIR/audit-keys
	if code, again, _ := runCLI("audit", "public-keys"); code != 0 || again != pub {
		t.Fatalf("public-keys from COUNTERSIGN_DATA_DIR: exit %d %q", code, again)
	}
	missing := filepath.Join(t.TempDir(), "typo")
	code, out, stderr = runCLI("audit", "public-keys", "--audit-key-dir", missing)
	if code != 1 || out != "" || !strings.Contains(stderr, "holds no audit signing keys") {
		t.Fatalf("public-keys of a directory without keys: exit %d, out %q, err %q", code, out, stderr)
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Fatalf("public-keys made %s: %v", missing, err)
	}
}

func readPEM(t *testing.T, p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestSummarizeOutcomeCountsDecisions: an outcome's line tells approvals
// from signed denials, in the singular where there is one.
func TestSummarizeOutcomeCountsDecisions(t *testing.T) {
	outcome := func(decisions ...string) audit.Record {
		var o audit.Outcome
		o.Status, o.Disposition = "completed", "denied-not-executed"
		for _, d := range decisions {
			o.Approvals = append(o.Approvals, audit.Approval{Decision: d})
		}
		body, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		return audit.Record{Kind: audit.KindOutcome, Body: body}
	}
	for _, tc := range []struct {
		decisions []string
		want      string
	}{
		{nil, "completed denied-not-executed, 0 approvals"},
		{[]string{"deny"}, "completed denied-not-executed, 0 approvals, 1 signed denial"},
		{[]string{"approve"}, "completed denied-not-executed, 1 approval"},
		{[]string{"approve", "approve", "deny"}, "completed denied-not-executed, 2 approvals, 1 signed denial"},
	} {
		if got := summarize(outcome(tc.decisions...)); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.decisions, got, tc.want)
		}
	}
}
