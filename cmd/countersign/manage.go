package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"
)

// The management commands: list, disable, enable and revoke agents,
// approvers and passkeys, over the admin API.

// manageCommands are the commands runManage serves, with their usage.
var manageCommands = map[string]string{
	"agents list":       "countersign agents list",
	"agents disable":    "countersign agents disable NAME",
	"agents enable":     "countersign agents enable NAME",
	"agents revoke":     "countersign agents revoke NAME",
	"approvers list":    "countersign approvers list",
	"approvers disable": "countersign approvers disable APPROVER_ID",
	"approvers enable":  "countersign approvers enable APPROVER_ID",
	"approvers revoke":  "countersign approvers revoke APPROVER_ID",
	"passkeys disable":  "countersign passkeys disable APPROVER_ID CREDENTIAL_ID",
	"passkeys enable":   "countersign passkeys enable APPROVER_ID CREDENTIAL_ID",
	"passkeys revoke":   "countersign passkeys revoke APPROVER_ID CREDENTIAL_ID",
}

// runManage runs a management command; handled is false for any other.
func runManage(ctx context.Context, args []string, stdout io.Writer) (handled bool, err error) {
	if len(args) < 2 {
		return false, nil
	}
	cmd := args[0] + " " + args[1]
	use, ok := manageCommands[cmd]
	if !ok {
		return false, nil
	}
	want := strings.Count(use, " ") - 2 // positional arguments
	fs, server, dataDir := newAdminFlags(cmd)
	flags, pos := splitArgs(fs, args[2:])
	if err := fs.Parse(flags); err != nil {
		return true, parseError(err)
	}
	pos = append(pos, fs.Args()...)
	if len(pos) != want {
		return true, usageError{"usage: " + use + " [--server URL] [--data-dir DIR]"}
	}
	c, err := newAdminClient(*server, *dataDir)
	if err != nil {
		return true, err
	}
	verb := args[1]
	switch {
	case cmd == "agents list":
		return true, listAgents(ctx, c, stdout)
	case cmd == "approvers list":
		return true, listApprovers(ctx, c, stdout)
	case args[0] == "agents":
		return true, act(ctx, c, stdout, "/admin/v1/agents/"+url.PathEscape(pos[0])+"/"+verb, "Agent "+pos[0])
	case args[0] == "approvers":
		return true, act(ctx, c, stdout, "/admin/v1/approvers/"+url.PathEscape(pos[0])+"/"+verb, "Approver "+pos[0])
	default:
		return true, act(ctx, c, stdout, "/admin/v1/approvers/"+url.PathEscape(pos[0])+"/passkeys/"+url.PathEscape(pos[1])+"/"+verb,
			"Passkey "+pos[1]+" of approver "+pos[0])
	}
}

// splitArgs separates fs's flags, before or after the positional
// arguments, from those arguments. Only a flag fs defines (or -h, -help)
// counts as one: a passkey's credential ID is base64url and may start with
// "-" (one in 64 does), and must not be taken for an unknown flag. After
// "--" everything is positional.
func splitArgs(fs *flag.FlagSet, args []string) (flags, pos []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return flags, append(pos, args[i+1:]...)
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		isFlag := strings.HasPrefix(a, "-") && len(a) > 1 && (fs.Lookup(name) != nil || name == "h" || name == "help")
		if !isFlag {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		if !hasValue && fs.Lookup(name) != nil && i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	return flags, pos
}

func act(ctx context.Context, c *adminClient, stdout io.Writer, path, what string) error {
	var out struct {
		Action      string `json:"action"`
		Changed     bool   `json:"changed"`
		Status      string `json:"status"`
		AuditChain  string `json:"auditChain"`
		AuditRecord string `json:"auditRecord"`
	}
	if err := c.do(ctx, http.MethodPost, path, struct{}{}, &out); err != nil {
		return err
	}
	if out.Changed {
		fmt.Fprintf(stdout, "%s is now %s.\n", what, out.Status)
	} else {
		fmt.Fprintf(stdout, "%s was already %s; nothing changed.\n", what, out.Status)
	}
	if out.AuditRecord != "" {
		fmt.Fprintf(stdout, "Audit record %s (countersign audit show %s).\n", out.AuditRecord, out.AuditChain)
	}
	return nil
}

func listAgents(ctx context.Context, c *adminClient, stdout io.Writer) error {
	var out []struct {
		Name       string    `json:"name"`
		Status     string    `json:"status"`
		CreatedAt  time.Time `json:"createdAt"`
		AuditChain string    `json:"auditChain"`
	}
	if err := c.do(ctx, http.MethodGet, "/admin/v1/agents", nil, &out); err != nil {
		return err
	}
	if len(out) == 0 {
		fmt.Fprintln(stdout, "No agents.")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATUS\tCREATED\tAUDIT CHAIN")
	for _, a := range out {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", a.Name, a.Status, a.CreatedAt.Format(time.RFC3339), a.AuditChain)
	}
	return tw.Flush()
}

func listApprovers(ctx context.Context, c *adminClient, stdout io.Writer) error {
	var out []struct {
		ID       string   `json:"id"`
		Name     string   `json:"name"`
		Groups   []string `json:"groups"`
		Status   string   `json:"status"`
		Passkeys []struct {
			CredentialID string    `json:"credentialId"`
			Status       string    `json:"status"`
			Transports   []string  `json:"transports"`
			LastUsedAt   time.Time `json:"lastUsedAt"`
		} `json:"passkeys"`
	}
	if err := c.do(ctx, http.MethodGet, "/admin/v1/approvers", nil, &out); err != nil {
		return err
	}
	if len(out) == 0 {
		fmt.Fprintln(stdout, "No approvers.")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "APPROVER\tNAME\tGROUPS\tSTATUS\tPASSKEY\tPASSKEY STATUS\tLAST USED")
	for _, a := range out {
		if len(a.Passkeys) == 0 {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t-\t\t\n", a.ID, a.Name, strings.Join(a.Groups, ","), a.Status)
		}
		for _, p := range a.Passkeys {
			used := "never"
			if !p.LastUsedAt.IsZero() {
				used = p.LastUsedAt.Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.Name, strings.Join(a.Groups, ","), a.Status, p.CredentialID, p.Status, used)
		}
	}
	return tw.Flush()
}
