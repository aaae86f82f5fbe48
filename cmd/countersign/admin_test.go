package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/countersign/countersign/internal/app"
)

// The display text comes from the agent's call; `approvals list` prints it
// quoted, as the dev console does, so that escape sequences and line breaks
// in it cannot rewrite the operator's terminal or add a row of their own.
func TestApprovalsListQuotesTheDisplayText(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/admin/v1/approvals" || r.Header.Get("Authorization") != "Bearer test-admin-token" {
			http.Error(w, `{"error":"not_found","message":"no"}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`[{"ref":"apr_1","tool":"transfer_funds","status":"pending",` +
			`"displayText":"Transfer 5 USD to \u001b]8;;https://evil.example\u0007acct\u001b]8;;\u0007\ntransfer_funds\tpending\tTransfer 1 USD to savings\thttps://evil.example/approve/x",` +
			`"approveUrl":"http://countersign.test/approve/apr_1"}]`))
	}))
	defer srv.Close()
	t.Setenv("COUNTERSIGN_ADMIN_TOKEN", "test-admin-token")
	var out bytes.Buffer
	if err := runAdmin(context.Background(), []string{"approvals", "list", "--server", srv.URL, "--data-dir", t.TempDir()}, &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if strings.ContainsAny(got, "\x1b\x07") || strings.Count(got, "\n") != 2 || strings.Contains(got, "\ttransfer_funds") {
		t.Errorf("the display text reached the terminal raw:\n%q", got)
	}
	if !strings.Contains(got, `"Transfer 5 USD to \x1b]8;;https://evil.example\aacct`) {
		t.Errorf("the display text is not shown quoted:\n%s", got)
	}
}

// Every command that sends the admin token refuses a plain http --server on
// another host, before it sends anything, and names the URL; plain http to
// this machine (a `countersign dev`) and https anywhere still work.
func TestAdminRefusesPlainHTTPToAnotherHost(t *testing.T) {
	t.Setenv("COUNTERSIGN_ADMIN_TOKEN", "test-admin-token")
	dir := t.TempDir()
	const remote = "http://approvals.example.invalid"
	for _, args := range [][]string{
		{"agents", "add", "bot"},
		{"agents", "list"},
		{"agents", "revoke", "bot"},
		{"approvers", "add", "alice", "--group", "approvers"},
		{"approvers", "invite", "apv_1"},
		{"approvers", "disable", "apv_1"},
		{"passkeys", "revoke", "apv_1", "cred"},
		{"approvals", "list"},
		{"transaction-tokens", "issue", "transfer_funds", "--principal", "bot"},
		{"transaction-tokens", "rotate-key"},
		{"audit", "show", "task-1"},
		{"audit", "export"},
		{"bench", "--scenario", "gated-call", "--agent-token", "csag_x", "--requests", "1"},
	} {
		t.Run(strings.Join(args[:2], " "), func(t *testing.T) {
			code, out, stderr := runCLI(append(args, "--server", remote+"/", "--data-dir", dir)...)
			if code != 2 || !strings.Contains(stderr, `"`+remote+`/"`) || !strings.Contains(stderr, "use https") {
				t.Errorf("exit %d (want 2), output %q, want a refusal naming %s and asking for https", code, out+stderr, remote)
			}
		})
	}

	// The URL saved in the data dir is held to the same rule.
	if err := os.WriteFile(filepath.Join(dir, app.URLFile), []byte(remote+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runCLI("approvals", "list", "--data-dir", dir); code != 2 || !strings.Contains(stderr, "use https") {
		t.Errorf("URL from the data dir: exit %d, err %q; want the refusal", code, stderr)
	}

	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Host+" "+r.Header.Get("Authorization"))
		if r.URL.Path == "/redirect" {
			http.Redirect(w, r, remote+"/admin/v1/approvals", http.StatusFound)
			return
		}
		_, _ = w.Write([]byte(`[]`))
	}))
	defer srv.Close()
	port := srv.URL[strings.LastIndex(srv.URL, ":"):]
	for _, server := range []string{srv.URL, "http://localhost" + port, "http://LOCALHOST" + port + "/"} {
		if code, out, stderr := runCLI("approvals", "list", "--server", server, "--data-dir", dir); code != 0 || !strings.Contains(out, "No pending approvals") {
			t.Errorf("--server %s: exit %d, output %q", server, code, out+stderr)
		}
	}
	if len(got) != 3 || !strings.HasSuffix(got[2], " Bearer test-admin-token") {
		t.Errorf("the loopback server saw %q, want three calls with the token", got)
	}

	// A redirect to plain http on another host is not followed.
	c, err := newAdminClient(srv.URL, dir)
	if err != nil {
		t.Fatal(err)
	}
	err = c.do(context.Background(), http.MethodGet, "/redirect", nil, new([]any))
	if err == nil || !strings.Contains(err.Error(), "refusing the redirect to "+remote) {
		t.Errorf("redirect to %s: error %v, want it refused", remote, err)
	}
}

func TestSafeForToken(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want bool
	}{
		{"https://approvals.example.com", true},
		{"https://10.0.0.5:8443", true},
		{"http://localhost:8080", true},
		{"http://Localhost", true},
		{"http://127.0.0.1:8080", true},
		{"http://127.1.2.3", true},
		{"http://[::1]:8080", true},
		{"http://[::ffff:127.0.0.1]:8080", true},
		{"http://approvals.example.com", false},
		{"http://10.0.0.5:8080", false},
		{"http://0.0.0.0:8080", false},
		{"http://localhost.example.com", false},
		{"http://127.0.0.1.nip.io", false},
		{"http://[::2]", false},
	} {
		u, err := url.Parse(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		if got := safeForToken(u); got != tc.want {
			t.Errorf("safeForToken(%s) = %v, want %v", tc.url, got, tc.want)
		}
	}
}
