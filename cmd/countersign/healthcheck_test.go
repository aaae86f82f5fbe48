package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHealthcheck(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			w.Write([]byte("ok\n"))
		default:
			http.Error(w, "nats not connected", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close() // nothing listens there any more

	for _, tc := range []struct {
		name    string
		args    []string
		code    int
		wantOut string
		wantErr string
	}{
		{"healthy", []string{"healthcheck", srv.URL + "/healthz"}, 0, "ok", ""},
		{"unhealthy", []string{"healthcheck", srv.URL + "/readyz"}, 1, "", "503 Service Unavailable: nats not connected"},
		{"nothing listens", []string{"healthcheck", "--timeout", "2s", down.URL + "/healthz"}, 1, "", "connect"},
		{"no URL", []string{"healthcheck"}, 2, "", "want one URL"},
		{"not http", []string{"healthcheck", "tcp://127.0.0.1:8080"}, 2, "", "not an http(s) URL"},
		{"bad timeout", []string{"healthcheck", "--timeout", "0s", srv.URL}, 2, "", "--timeout must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, stderr := runCLI(tc.args...)
			if code != tc.code || !strings.Contains(out, tc.wantOut) || !strings.Contains(stderr, tc.wantErr) {
				t.Fatalf("exit %d (want %d), out %q, err %q (want %q)", code, tc.code, out, stderr, tc.wantErr)
			}
		})
	}
}
