package telemetry

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestOTLPHTTPEndpointPath: the endpoint is OTEL_EXPORTER_OTLP_ENDPOINT's
// base URL, so over http/protobuf spans go to its path plus /v1/traces,
// where an OpenTelemetry collector takes them; a URL that already names
// /v1/traces is used as it is.
func TestOTLPHTTPEndpointPath(t *testing.T) {
	for _, tc := range []struct {
		name, path, want string
	}{
		{"base URL", "", "/v1/traces"},
		{"base URL with a slash", "/", "/v1/traces"},
		{"base URL with a path", "/otlp", "/otlp/v1/traces"},
		{"signal URL", "/v1/traces", "/v1/traces"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var got []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				got = append(got, r.URL.Path)
				mu.Unlock()
				w.Header().Set("Content-Type", "application/x-protobuf")
			}))
			defer srv.Close()
			tr, err := NewTracing(context.Background(), TracingOptions{Endpoint: srv.URL + tc.path, Protocol: ProtocolHTTPProtobuf})
			if err != nil {
				t.Fatal(err)
			}
			tel := &Telemetry{Tracing: tr}
			_, sp := tel.StartSpan(context.Background(), "tools/call", 0)
			sp.End()
			if err := tr.Shutdown(context.Background()); err != nil { // flushes the batch
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if diff := cmp.Diff([]string{tc.want}, got); diff != "" {
				t.Errorf("export requests' paths (-want +got):\n%s", diff)
			}
		})
	}
}
