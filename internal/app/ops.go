package app

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/countersign/countersign/internal/telemetry"
)

// startTelemetry builds the process's metrics and, when an OTLP endpoint
// (or a test's exporter) is configured, its tracing.
func (a *App) startTelemetry(ctx context.Context) error {
	m, err := telemetry.NewMetrics()
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	tr, err := telemetry.NewTracing(ctx, telemetry.TracingOptions{
		Endpoint: a.cfg.OTLPEndpoint,
		Protocol: a.cfg.OTLPProtocol,
		Exporter: a.cfg.TraceExporter,
	})
	if err != nil {
		return fmt.Errorf("tracing: %w", err)
	}
	a.tel = &telemetry.Telemetry{Metrics: m, Tracing: tr}
	return nil
}

// Telemetry is the process's metrics and tracing.
func (a *App) Telemetry() *telemetry.Telemetry { return a.tel }

// startOps binds the operations listener (Config.MetricsAddr): /metrics,
// /healthz and /readyz, in every mode. It is apart from the agents' port, so
// that metrics (tool names, upstream names, rates) are not public there.
func (a *App) startOps() error {
	if a.cfg.MetricsAddr == "" {
		return nil
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", a.tel.Metrics.Handler())
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.HandleFunc("GET /healthz", a.healthz)
	ln, err := net.Listen("tcp", a.cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("listen on %s (--metrics-addr): %w", a.cfg.MetricsAddr, err)
	}
	a.opsListener = ln
	a.opsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: readHeaderTimeout, ReadTimeout: readHeaderTimeout, IdleTimeout: idleTimeout}
	return nil
}

// MetricsAddr is the bound operations address, "" without one.
func (a *App) MetricsAddr() string {
	if a.opsListener == nil {
		return ""
	}
	return a.opsListener.Addr().String()
}

// healthz is the liveness probe: it answers 200 while the process serves
// HTTP, and looks at nothing else. A NATS, Temporal or upstream outage is
// /readyz's to report: restarting the process would not cure it, and
// restarting every replica at once because a dependency is down would
// turn its outage into ours.
func (a *App) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Write([]byte("ok\n"))
}

// temporalCheckTimeout bounds /readyz's health check of the Temporal frontend.
const temporalCheckTimeout = 2 * time.Second

// temporalDown says why Temporal is not ready, "" when its frontend answers
// a health check.
func (a *App) temporalDown(ctx context.Context) string {
	if a.tc == nil {
		return "temporal: not connected"
	}
	ctx, cancel := context.WithTimeout(ctx, temporalCheckTimeout)
	defer cancel()
	if _, err := a.tc.CheckHealth(ctx, &client.CheckHealthRequest{}); err != nil {
		return "temporal: " + oneLine(err.Error(), maxReadyzErr)
	}
	return ""
}
