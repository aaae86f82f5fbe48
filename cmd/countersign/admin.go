package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/countersign/countersign/internal/app"
)

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// adminClient calls a running server's admin API with the admin token.
type adminClient struct {
	server string
	token  string
	http   *http.Client
}

func newAdminFlags(name string) (*flag.FlagSet, *string, *string) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	server := fs.String("server", envOr("COUNTERSIGN_SERVER", ""), "server URL: https, or plain http only to localhost or a loopback address (default: the URL saved in the data dir, else http://127.0.0.1:8080)")
	dataDir := fs.String("data-dir", envOr("COUNTERSIGN_DATA_DIR", "./countersign-data"), "data directory holding admin-token and url")
	return fs, server, dataDir
}

func newAdminClient(server, dataDir string) (*adminClient, error) {
	if server == "" {
		if b, err := os.ReadFile(filepath.Join(dataDir, app.URLFile)); err == nil {
			server = strings.TrimSpace(string(b))
		} else {
			server = "http://127.0.0.1:8080"
		}
	}
	base, err := serverURL(server)
	if err != nil {
		return nil, err
	}
	token := os.Getenv("COUNTERSIGN_ADMIN_TOKEN")
	if f := os.Getenv("COUNTERSIGN_ADMIN_TOKEN_FILE"); token == "" && f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("COUNTERSIGN_ADMIN_TOKEN_FILE: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	if token == "" {
		b, err := os.ReadFile(filepath.Join(dataDir, app.AdminTokenFile))
		if err != nil {
			return nil, fmt.Errorf("no admin token: set COUNTERSIGN_ADMIN_TOKEN or COUNTERSIGN_ADMIN_TOKEN_FILE, or pass --data-dir of a `countersign dev` (%v)", err)
		}
		token = strings.TrimSpace(string(b))
	}
	return &adminClient{server: base, token: token, http: &http.Client{Timeout: 30 * time.Second, CheckRedirect: refuseCleartextRedirect}}, nil
}

// serverURL checks --server: an absolute http(s) URL, such as
// http://127.0.0.1:8080. The admin commands and the bench send bearer
// tokens to it, so plain http is refused unless the host is this machine
// (safeForToken). It returns the URL without a trailing slash.
func serverURL(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", usageError{fmt.Sprintf("--server %q: give the server's URL with its scheme, e.g. http://127.0.0.1:8080 or https://countersign.example.com", s)}
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return "", usageError{fmt.Sprintf("--server %q: give the server's base URL, without a query or fragment", s)}
	}
	if !safeForToken(u) {
		return "", usageError{fmt.Sprintf("--server %q: plain http would send the bearer token in clear text to %s; use https (plain http is accepted only for localhost and loopback addresses)", s, u.Host)}
	}
	return strings.TrimRight(s, "/"), nil
}

// safeForToken reports whether a bearer token may be sent to u: an https
// URL, or an http URL whose host is localhost or a loopback address
// (127.0.0.0/8, ::1), so that the token never leaves the machine in clear
// text.
func safeForToken(u *url.URL) bool {
	if u.Scheme != "http" {
		return true
	}
	h := u.Hostname()
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(h)
	return err == nil && ip.Unmap().IsLoopback()
}

// refuseCleartextRedirect is the admin client's CheckRedirect: Go forwards
// the Authorization header on a redirect to the same host whatever the
// scheme, so a redirect from https to plain http would send the token in
// clear text.
func refuseCleartextRedirect(req *http.Request, via []*http.Request) error {
	if !safeForToken(req.URL) {
		return fmt.Errorf("refusing the redirect to %s: plain http would send the admin token in clear text", req.URL.Redacted())
	}
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	return nil
}

func (c *adminClient) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.server+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach %s: %w", c.server, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error   string `json:"error"`
			Message string `json:"message"`
		}
		if json.Unmarshal(b, &e) == nil && (e.Message != "" || e.Error != "") {
			return fmt.Errorf("%s %s: %s (%s)", method, path, e.Message, e.Error)
		}
		return fmt.Errorf("%s %s: HTTP %d", method, path, resp.StatusCode)
	}
	return json.Unmarshal(b, out)
}

// splitPositional lets NAME come before or after the flags.
func splitPositional(args []string) (string, []string) {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		return args[0], args[1:]
	}
	return "", args
}

// adminCommands are the commands runAdmin serves besides runManage's.
var adminCommands = map[string]bool{
	"approvers add":                 true,
	"approvers invite":              true,
	"agents add":                    true,
	"transaction-tokens issue":      true,
	"transaction-tokens rotate-key": true,
	"approvals list":                true,
}

func runAdmin(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) < 2 {
		return usageError{"missing subcommand; see countersign -h"}
	}
	if handled, err := runManage(ctx, args, stdout); handled {
		return err
	}
	cmd := args[0] + " " + args[1]
	// An unknown command is named before the admin token is looked for or
	// --server checked, whose errors would hide the typo.
	if !adminCommands[cmd] {
		return usageError{fmt.Sprintf("unknown command %q; see countersign -h", cmd)}
	}
	name, rest := splitPositional(args[2:])
	fs, server, dataDir := newAdminFlags(cmd)
	var groups, principals stringList
	var tokenFor, tokenArgs *string
	if cmd == "transaction-tokens issue" {
		tokenFor = fs.String("principal", "", "the agent principal that will make the call (required)")
		tokenArgs = fs.String("arguments", "{}", "the call's arguments, a JSON object, exactly as the agent will send them")
	}
	if cmd == "approvers add" {
		fs.Var(&groups, "group", "approver group (repeatable)")
		fs.Var(&principals, "principal", "agent principal the approver acts as, and so may not approve (repeatable; default: NAME)")
	}
	if err := fs.Parse(rest); err != nil {
		return parseError(err)
	}
	if name == "" && fs.NArg() > 0 {
		name = fs.Arg(0)
	}
	c, err := newAdminClient(*server, *dataDir)
	if err != nil {
		return err
	}
	switch cmd {
	case "approvers add":
		if name == "" || len(groups) == 0 {
			return usageError{"usage: countersign approvers add NAME --group G [--group G2] [--principal AGENT]"}
		}
		var out struct {
			ApproverID string `json:"approverId"`
			EnrollURL  string `json:"enrollUrl"`
		}
		body := map[string]any{"name": name, "groups": groups}
		if len(principals) > 0 {
			body["principals"] = principals
		}
		if err := c.do(ctx, http.MethodPost, "/admin/v1/approvers", body, &out); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "Approver %s (%s) added. Open this link on the approver's phone to enroll a passkey:\n%s\n", name, out.ApproverID, out.EnrollURL)
		if len(principals) > 0 {
			fmt.Fprintf(stdout, "The approver acts as %s and may not approve their calls.\n", strings.Join(principals, ", "))
		}
	case "approvers invite":
		if name == "" {
			return usageError{"usage: countersign approvers invite APPROVER_ID"}
		}
		var out struct {
			EnrollURL string `json:"enrollUrl"`
		}
		if err := c.do(ctx, http.MethodPost, "/admin/v1/approvers/"+name+"/invites", struct{}{}, &out); err != nil {
			return err
		}
		fmt.Fprintln(stdout, out.EnrollURL)
	case "agents add":
		if name == "" {
			return usageError{"usage: countersign agents add NAME"}
		}
		var out struct {
			Token string `json:"token"`
		}
		if err := c.do(ctx, http.MethodPost, "/admin/v1/agents", map[string]any{"name": name}, &out); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "Agent %s added. Its bearer token (shown once):\n%s\n", name, out.Token)
	case "transaction-tokens issue":
		if name == "" || *tokenFor == "" {
			return usageError{"usage: countersign transaction-tokens issue TOOL --principal AGENT [--arguments JSON]"}
		}
		if !json.Valid([]byte(*tokenArgs)) {
			return usageError{"--arguments must be a JSON object"}
		}
		var out json.RawMessage
		body := map[string]any{"principal": *tokenFor, "tool": name, "arguments": json.RawMessage(*tokenArgs)}
		if err := c.do(ctx, http.MethodPost, "/admin/v1/transaction-tokens", body, &out); err != nil {
			return err
		}
		// The whole answer, for the agent's client: it sends "token" in
		// the tools/call's params._meta["metaKey"] within 60 seconds.
		fmt.Fprintf(stdout, "%s\n", out)
	case "transaction-tokens rotate-key":
		var out struct {
			KeyID string `json:"kid"`
		}
		if err := c.do(ctx, http.MethodPost, "/admin/v1/transaction-tokens/keys", struct{}{}, &out); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "Transaction tokens are now signed with %s; the previous key is retired.\n", out.KeyID)
	case "approvals list":
		var out []struct {
			Ref         string `json:"ref"`
			Tool        string `json:"tool"`
			Status      string `json:"status"`
			DisplayText string `json:"displayText"`
			ApproveURL  string `json:"approveUrl"`
		}
		if err := c.do(ctx, http.MethodGet, "/admin/v1/approvals?status=pending", nil, &out); err != nil {
			return err
		}
		if len(out) == 0 {
			fmt.Fprintln(stdout, "No pending approvals.")
			return nil
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TOOL\tSTATUS\tACTION\tAPPROVE")
		for _, a := range out {
			// The display text comes from the agent's call: quoted, it
			// cannot send escape sequences to the terminal or add a row.
			fmt.Fprintf(tw, "%s\t%s\t%q\t%s\n", a.Tool, a.Status, a.DisplayText, a.ApproveURL)
		}
		return tw.Flush()
	}
	return nil
}
