package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/countersign/countersign/mcpserver"
)

// TestCodeTooManyRequests: the client reads the endpoint's over-budget code.
func TestCodeTooManyRequests(t *testing.T) {
	if codeTooManyRequests != mcpserver.CodeTooManyRequests {
		t.Fatalf("codeTooManyRequests is %d, mcpserver.CodeTooManyRequests %d", codeTooManyRequests, mcpserver.CodeTooManyRequests)
	}
}

// TestNoRedirects: a server that redirects gets no second request, so the
// tokens never follow a redirect (to plain http, say), and the bench says
// why it stopped.
func TestNoRedirects(t *testing.T) {
	var followed bool
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		followed = true
	}))
	defer target.Close()
	redirecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer redirecting.Close()
	c := newClient(Options{Server: redirecting.URL, AgentToken: "agent-token"})
	_, err := c.rpc(context.Background(), c.agent, "tools/list", "", nil, true)
	if err == nil || !strings.Contains(err.Error(), "redirected to "+target.URL) || followed {
		t.Fatalf("err %v, followed %t; want the redirect refused", err, followed)
	}
}
