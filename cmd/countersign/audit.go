package main

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/app"
	"github.com/countersign/countersign/tasks"
)

const auditUsage = `usage:
  countersign audit show TASK [--server URL] [--data-dir DIR] [--json]
  countersign audit export [--since RFC3339] [--server URL] [--data-dir DIR] > audit.jsonl
  countersign audit verify FILE --key PUBKEY [--key PUBKEY2] [--checkpoint CP] [--allow-incomplete] [--json]
  countersign audit checkpoint FILE --key PUBKEY [--key PUBKEY2] [--allow-incomplete] > checkpoint.json
  countersign audit rotate-key [--audit-key-dir DIR | --data-dir DIR]
  countersign audit public-keys [--audit-key-dir DIR | --data-dir DIR] > audit-key.pub`

// errVerifyFailed makes `audit verify` exit 1 after printing its verdicts.
var errVerifyFailed = errors.New("audit verification FAILED")

func runAudit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{auditUsage}
	}
	sub := args[0]
	name, rest := splitPositional(args[1:])
	switch sub {
	case "show":
		fs, server, dataDir := newAdminFlags("audit show")
		asJSON := fs.Bool("json", false, "print the records as JSON Lines, exactly as signed")
		if err := fs.Parse(rest); err != nil {
			return parseError(err)
		}
		if name == "" && fs.NArg() > 0 {
			name = fs.Arg(0)
		}
		if name == "" {
			return usageError{"usage: countersign audit show TASK"}
		}
		c, err := newAdminClient(*server, *dataDir)
		if err != nil {
			return err
		}
		var out struct {
			Records []json.RawMessage `json:"records"`
		}
		if err := c.do(ctx, http.MethodGet, "/admin/v1/audit/"+url.PathEscape(name), nil, &out); err != nil {
			return err
		}
		return printChain(stdout, out.Records, *asJSON)
	case "export":
		fs, server, dataDir := newAdminFlags("audit export")
		since := fs.String("since", "", "only chains with a record at or after this RFC 3339 time")
		if err := fs.Parse(args[1:]); err != nil {
			return parseError(err)
		}
		if fs.NArg() > 0 {
			return usageError{"usage: countersign audit export [--since T] > file.jsonl"}
		}
		path := "/admin/v1/audit"
		if *since != "" {
			if _, err := time.Parse(time.RFC3339, *since); err != nil {
				return usageError{"--since must be an RFC 3339 time, such as 2026-01-02T15:04:05Z"}
			}
			path += "?since=" + url.QueryEscape(*since)
		}
		c, err := newAdminClient(*server, *dataDir)
		if err != nil {
			return err
		}
		return c.stream(ctx, path, stdout)
	case "verify":
		fs := flag.NewFlagSet("audit verify", flag.ContinueOnError)
		fs.SetOutput(stderr)
		var keyFiles stringList
		fs.Var(&keyFiles, "key", "audit public key file (PEM; repeatable; a file may hold several keys)")
		var checkpoints stringList
		fs.Var(&checkpoints, "checkpoint", "an earlier checkpoint of the log (audit checkpoint; repeatable): every chain it saw must be in FILE, a whole export, at least as long and unchanged")
		allow := fs.Bool("allow-incomplete", false, "accept chains of tasks that had not ended when exported")
		asJSON := fs.Bool("json", false, "print the report as JSON")
		if err := fs.Parse(rest); err != nil {
			return parseError(err)
		}
		if name == "" && fs.NArg() > 0 {
			name = fs.Arg(0)
		}
		if name == "" || len(keyFiles) == 0 {
			return usageError{"usage: countersign audit verify FILE --key PUBKEY"}
		}
		opts := audit.VerifyOptions{AllowIncomplete: *allow}
		for _, f := range checkpoints {
			cp, err := readCheckpoint(f)
			if err != nil {
				return err
			}
			opts.Checkpoints = append(opts.Checkpoints, cp)
		}
		keys, lines, err := readKeysAndExport(keyFiles, name)
		if err != nil {
			return err
		}
		return printReport(audit.Verify(lines, keys, opts), *asJSON, stdout)
	case "checkpoint":
		fs := flag.NewFlagSet("audit checkpoint", flag.ContinueOnError)
		fs.SetOutput(stderr)
		var keyFiles stringList
		fs.Var(&keyFiles, "key", "audit public key file (PEM; repeatable; a file may hold several keys)")
		allow := fs.Bool("allow-incomplete", false, "accept chains of tasks that had not ended when exported")
		if err := fs.Parse(rest); err != nil {
			return parseError(err)
		}
		if name == "" && fs.NArg() > 0 {
			name = fs.Arg(0)
		}
		if name == "" || len(keyFiles) == 0 {
			return usageError{"usage: countersign audit checkpoint FILE --key PUBKEY > checkpoint.json"}
		}
		keys, lines, err := readKeysAndExport(keyFiles, name)
		if err != nil {
			return err
		}
		cp, rep, err := audit.NewCheckpoint(lines, keys, audit.VerifyOptions{AllowIncomplete: *allow}, time.Now())
		if errors.Is(err, audit.ErrExportFailed) {
			// The verdicts go to stderr: stdout is the checkpoint's.
			fmt.Fprintln(stderr, "No checkpoint: the export does not verify.")
			return printReport(rep, false, stderr)
		}
		if err != nil {
			return err
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(cp); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "Checkpoint of %d chains. Keep it where Countersign cannot write; verify a later whole export against it with --checkpoint.\n", len(cp.Chains))
		return nil
	case "rotate-key":
		_, dataDir, keyDir, dir, err := keyDirFlags("audit rotate-key", args[1:], stderr)
		if err != nil {
			return err
		}
		k, err := audit.OpenKeyring(dir)
		if err != nil {
			return err
		}
		// A new (empty or missing) directory: OpenKeyring has just made
		// its first key, current; a second would never sign anything.
		id := k.CurrentID()
		if !k.Created() {
			if id, err = k.Rotate(); err != nil {
				return err
			}
		}
		if keyDir == "" {
			if err := os.WriteFile(filepath.Join(dataDir, app.AuditPubKeyFile), k.PublicKeysPEM(), 0o644); err != nil {
				return err
			}
		}
		fmt.Fprintf(stdout, "New audit key %s; processes reading this directory sign with it within 30 s. Public keys (give all to auditors):\n%s", id, k.PublicKeysPEM())
		return nil
	case "public-keys":
		fs, _, _, dir, err := keyDirFlags("audit public-keys", args[1:], stderr)
		if err != nil {
			return err
		}
		if fs.NArg() > 0 {
			return usageError{"audit public-keys takes no arguments\n" + auditUsage}
		}
		// OpenKeyring makes a first key in a directory without one: a
		// mistyped directory must not print a key nothing signs with.
		if _, err := os.Stat(filepath.Join(dir, "current")); err != nil {
			return fmt.Errorf("%s holds no audit signing keys (no current file): give the directory of the servers' and workers' --audit-key-dir", dir)
		}
		k, err := audit.OpenKeyring(dir)
		if err != nil {
			return err
		}
		_, err = stdout.Write(k.PublicKeysPEM())
		return err
	}
	return usageError{fmt.Sprintf("unknown audit command %q\n%s", sub, auditUsage)}
}

// keyDirFlags parses the flags of the audit commands that work on the key
// directory: --data-dir and --audit-key-dir, and the directory they name
// (--audit-key-dir, else DATA_DIR/audit-keys).
func keyDirFlags(name string, args []string, stderr io.Writer) (fs *flag.FlagSet, dataDir, keyDir, dir string, err error) {
	fs = flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&dataDir, "data-dir", envOr("COUNTERSIGN_DATA_DIR", "./countersign-data"), "data directory")
	fs.StringVar(&keyDir, "audit-key-dir", envOr("COUNTERSIGN_AUDIT_KEY_DIR", ""), "audit key directory (default DATA_DIR/audit-keys)")
	if err := fs.Parse(args); err != nil {
		return nil, "", "", "", parseError(err)
	}
	dir = keyDir
	if dir == "" {
		dir = filepath.Join(dataDir, app.AuditKeyDir)
	}
	return fs, dataDir, keyDir, dir, nil
}

// stream copies a streaming admin API answer to w.
func (c *adminClient) stream(ctx context.Context, path string, w io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.server+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	hc := *c.http
	hc.Timeout = 0 // an export may be long; ctx bounds it
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach %s: %w", c.server, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error   string `json:"error"`
			Message string `json:"message"`
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, &e) == nil && e.Message != "" {
			return fmt.Errorf("GET %s: %s (%s)", path, e.Message, e.Error)
		}
		return fmt.Errorf("GET %s: HTTP %d", path, resp.StatusCode)
	}
	bw := bufio.NewWriter(w)
	if _, err := io.Copy(bw, resp.Body); err != nil {
		return fmt.Errorf("export cut short: %w", err)
	}
	return bw.Flush()
}

func printChain(w io.Writer, recs []json.RawMessage, asJSON bool) error {
	if asJSON {
		for _, r := range recs {
			if _, err := fmt.Fprintf(w, "%s\n", r); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tAT\tSTEP\tDETAIL\tHASH")
	for _, raw := range recs {
		var r audit.Record
		if err := json.Unmarshal(raw, &r); err != nil {
			return fmt.Errorf("malformed record from the server: %w", err)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%.16s…\n", r.Seq, r.At.Format(time.RFC3339), r.Kind, summarize(r), audit.Hash(raw))
	}
	return tw.Flush()
}

// summarize is one line about a record's body.
func summarize(r audit.Record) string {
	switch r.Kind {
	case audit.KindRequested:
		var b audit.Requested
		if json.Unmarshal(r.Body, &b) == nil {
			return fmt.Sprintf("%s by %s, %d of %q, policy %.12s", b.Envelope.Tool, b.Envelope.Principal, b.Requirement.Quorum, b.Requirement.Group, b.PolicyVersion)
		}
	case audit.KindDecision:
		var b audit.Decision
		if json.Unmarshal(r.Body, &b) == nil {
			switch {
			case !b.Accepted:
				return fmt.Sprintf("%s rejected: %s", b.Decision, b.Reason)
			case b.Approval != nil:
				return fmt.Sprintf("%s by %s with passkey %.16s…", b.Decision, b.Approval.ApproverName, b.Approval.CredentialID)
			case b.Unsigned != nil:
				return fmt.Sprintf("%s by %s via %s (no passkey)", b.Decision, b.Unsigned.ApproverName, b.Unsigned.Via)
			}
		}
	case audit.KindReevaluated, audit.KindClaimed:
		var b audit.Policy
		if json.Unmarshal(r.Body, &b) == nil {
			return fmt.Sprintf("allow=%t policy %.12s %s", b.Allow, b.PolicyVersion, b.Reason)
		}
	case audit.KindCancelRefused:
		return "cancel refused: the call was already claimed"
	case audit.KindAdmin:
		var b audit.AdminAction
		if json.Unmarshal(r.Body, &b) == nil {
			s := fmt.Sprintf("%s %s %s by %s: %s", b.Action, b.Target.Type, b.Target.ID, b.By, b.Status)
			if b.Token != "" {
				s += ", token " + b.Token
			}
			if b.Replaced != "" {
				s += ", replaces " + b.Replaced
			}
			return s
		}
	case audit.KindOutcome:
		var b audit.Outcome
		if json.Unmarshal(r.Body, &b) == nil {
			// The outcome lists every accepted decision with its
			// assertion, denials included: count them apart.
			approved := 0
			for _, a := range b.Approvals {
				if a.Decision == tasks.DecisionApprove {
					approved++
				}
			}
			s := fmt.Sprintf("%s %s, %s", b.Status, b.Disposition, count(approved, "approval"))
			if denied := len(b.Approvals) - approved; denied > 0 {
				s += ", " + count(denied, "signed denial")
			}
			return s
		}
	default:
		var b audit.Ended
		if json.Unmarshal(r.Body, &b) == nil && b.Status != "" {
			return fmt.Sprintf("%s %s", b.Status, b.Disposition)
		}
	}
	return ""
}

// readKeysAndExport reads the audit public keys in keyFiles and the
// export's lines.
func readKeysAndExport(keyFiles []string, file string) ([]ed25519.PublicKey, [][]byte, error) {
	var keys []ed25519.PublicKey
	for _, kf := range keyFiles {
		b, err := os.ReadFile(kf)
		if err != nil {
			return nil, nil, err
		}
		k, err := audit.ParsePublicKeys(b)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", kf, err)
		}
		keys = append(keys, k...)
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	lines, err := audit.ReadExport(f)
	return keys, lines, err
}

func readCheckpoint(file string) (*audit.Checkpoint, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cp, err := audit.ReadCheckpoint(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return cp, nil
}

// printReport prints rep, as text or JSON, and returns errVerifyFailed
// when it is not OK.
func printReport(rep audit.Report, asJSON bool, w io.Writer) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		for _, t := range rep.Tasks {
			verdict := "OK  "
			if !t.OK {
				verdict = "FAIL"
			}
			what := t.Disposition
			if what == "" {
				what = t.Status
			}
			switch {
			case t.Complete:
			case what == "":
				what = "pending"
			default: // an end, or a claim, and no outcome after it
				what += ", not sealed"
			}
			fmt.Fprintf(w, "%s %s %s (%s, %s)\n", verdict, t.TaskID, what, count(t.Records, "record"), count(t.Approvals, "approval"))
			if rules := t.Rules(); len(rules) > 0 {
				fmt.Fprintf(w, "     broken rules: %s\n", strings.Join(rules, ", "))
			}
			for _, f := range t.Failures {
				if f.Record < 0 {
					fmt.Fprintf(w, "     problem [%s] %s: %s\n", f.Rule, t.TaskID, f.Message)
				} else {
					fmt.Fprintf(w, "     problem [%s] %s record %d (%s): %s\n", f.Rule, t.TaskID, f.Record, f.Kind, f.Message)
				}
			}
			for _, n := range t.Notes {
				fmt.Fprintf(w, "     note: %s\n", n)
			}
		}
		for _, p := range rep.Problems {
			fmt.Fprintf(w, "FAIL %s\n", p)
		}
		fmt.Fprintln(w, rep.Summary())
	}
	if !rep.OK {
		return errVerifyFailed
	}
	return nil
}

// count is "1 thing" or "n things".
func count(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
