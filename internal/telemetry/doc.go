// Package telemetry holds Countersign's operational signals: the Prometheus
// metrics ([Metrics]), OpenTelemetry tracing ([Tracing]) and the slog
// handler that puts the trace and the task on every log line
// ([NewLogHandler]).
//
// One [Telemetry] value per process is built by internal/app and handed to
// the packages that record (mcpserver, approvals, activities,
// gateway/upstream) through their options. A nil *Telemetry, and a nil
// *Metrics, record nothing: every method is safe on nil, so a test or a
// caller that does not care passes nothing.
//
// Metric labels are bounded sets: decisions, statuses, dispositions, reason
// codes, outcomes, the configured upstreams' names and the build's version.
// Never a task ID, a principal or a tool argument. Two gauges are read at
// scrape time from their source: each upstream's state (WatchUpstreams) and
// the deployment's pending total (WatchPending, at most every
// PendingReadEvery).
//
// Tracing is off unless an OTLP endpoint is configured (or a test supplies
// an exporter): the tracer is then OpenTelemetry's no-op one, and
// internal/app installs neither the Temporal tracing interceptor nor the
// upstream trace headers.
package telemetry
