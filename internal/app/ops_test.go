package app

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestProbesWithoutDependencies: with neither NATS nor Temporal connected,
// /healthz (the process) still answers 200 and /readyz answers 503 naming
// both. internal/e2e TestProbes checks them on a running process whose
// NATS goes away and whose upstream is down.
func TestProbesWithoutDependencies(t *testing.T) {
	a := &App{}
	rec := httptest.NewRecorder()
	a.healthz(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != http.StatusOK || rec.Body.String() != "ok\n" {
		t.Errorf("/healthz: %d %q", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	a.readyz(rec, httptest.NewRequest("GET", "/readyz", nil))
	if body := rec.Body.String(); rec.Code != http.StatusServiceUnavailable ||
		!strings.Contains(body, "nats: not connected\n") || !strings.Contains(body, "temporal: not connected\n") {
		t.Errorf("/readyz: %d %q", rec.Code, body)
	}
}
