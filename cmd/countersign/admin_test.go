package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
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
