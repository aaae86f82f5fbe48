package telemetry

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.temporal.io/sdk/client"
	temporalotel "go.temporal.io/sdk/contrib/opentelemetry"
)

// Metric names (README "Observability" lists them with their labels).
const (
	MetricGatedCalls           = "countersign_gated_calls_total"
	MetricTaskTransitions      = "countersign_task_transitions_total"
	MetricDecisions            = "countersign_decisions_total"
	MetricApprovalLatency      = "countersign_approval_decision_seconds"
	MetricExecutions           = "countersign_executions_total"
	MetricUpstreamCallSeconds  = "countersign_upstream_call_seconds"
	MetricVerificationFailures = "countersign_verification_failures_total"
	MetricUpstreamUp           = "countersign_upstream_up"
)

// Verification kinds, the kind label of MetricVerificationFailures.
const (
	VerifyPasskey = "passkey" // an approver's decision (approver API, NATS)
	VerifySEP2672 = "sep2672" // an in-band verified tools/call
	VerifyTxToken = "txtoken" // a transaction token
)

// Upstream call results, the result label of MetricUpstreamCallSeconds.
const (
	UpstreamOK        = "ok"         // the upstream answered
	UpstreamToolError = "tool_error" // it answered with isError or a JSON-RPC error
	UpstreamNotSent   = "not_sent"   // the call surely never left
	UpstreamError     = "error"      // no answer: outcome unknown
)

// Metrics are the process's Prometheus collectors, in a registry of their
// own (never the global one: tests run several processes in one binary).
// A nil *Metrics records nothing.
type Metrics struct {
	reg *prometheus.Registry

	gatedCalls      *prometheus.CounterVec
	transitions     *prometheus.CounterVec
	decisions       *prometheus.CounterVec
	approvalLatency *prometheus.HistogramVec
	executions      *prometheus.CounterVec
	upstreamCalls   *prometheus.HistogramVec
	verifyFailures  *prometheus.CounterVec

	temporal client.MetricsHandler
}

// NewMetrics creates the collectors, the Go runtime and process
// collectors, and the Temporal SDK's metrics (through its OpenTelemetry
// handler and the OpenTelemetry Prometheus exporter), all in one registry.
func NewMetrics() (*Metrics, error) {
	reg := prometheus.NewRegistry()
	m := &Metrics{reg: reg}
	m.gatedCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricGatedCalls,
		Help: "tools/call requests by policy decision: allow, deny, requestable, verify, token.",
	}, []string{"decision"})
	m.transitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricTaskTransitions,
		Help: "Task status transitions written to the read model, by the status entered (working at creation, input_required, completed, failed, cancelled).",
	}, []string{"status"})
	m.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricDecisions,
		Help: "Approver decisions delivered with a passkey, by result (accepted, rejected: the evidence failed or the workflow did not count it; refused: the task takes no more decisions or the decision was malformed) and reason.",
	}, []string{"result", "reason"})
	m.approvalLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    MetricApprovalLatency,
		Help:    "Time from a task's creation (approval requested) to its approval decision, by outcome (approved, denied, expired).",
		Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600},
	}, []string{"outcome"})
	m.executions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricExecutions,
		Help: "Ends of gated calls held as tasks or run with a transaction token, by disposition (approved-executed, execution-error, denied-not-executed, outcome-unknown).",
	}, []string{"disposition"})
	m.upstreamCalls = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    MetricUpstreamCallSeconds,
		Help:    "Latency of tool calls sent to upstream MCP servers, by upstream and result (ok, tool_error, not_sent, error).",
		Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 10), // 5 ms … ~19 s
	}, []string{"upstream", "result"})
	m.verifyFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricVerificationFailures,
		Help: "Failed verifications by kind (passkey: an approver's decision; sep2672: an in-band verified call; txtoken: a transaction token) and reason code.",
	}, []string{"kind", "reason"})
	for _, c := range []prometheus.Collector{
		m.gatedCalls, m.transitions, m.decisions, m.approvalLatency, m.executions, m.upstreamCalls, m.verifyFailures,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		return nil, err
	}
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	m.temporal = temporalotel.NewMetricsHandler(temporalotel.MetricsHandlerOptions{
		Meter:                meters.Meter("temporal-sdk-go"),
		UseMonotonicCounters: true,
		// An instrument that cannot be created is left out; never panic.
		OnError: func(error) {},
	})
	return m, nil
}

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Registry is where the collectors are (tests gather from it).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Temporal is the Temporal SDK's metrics handler (client.Options.MetricsHandler).
func (m *Metrics) Temporal() client.MetricsHandler {
	if m == nil {
		return client.MetricsNopHandler
	}
	return m.temporal
}

// GatedCall counts a tools/call policy decided.
func (m *Metrics) GatedCall(decision string) {
	if m != nil {
		m.gatedCalls.WithLabelValues(decision).Inc()
	}
}

// TaskTransition counts a task entering status.
func (m *Metrics) TaskTransition(status string) {
	if m != nil {
		m.transitions.WithLabelValues(status).Inc()
	}
}

// Decision results, the result label of MetricDecisions.
const (
	DecisionAccepted = "accepted"
	DecisionRejected = "rejected"
	DecisionRefused  = "refused"
)

// Decision counts an approver's decision by result and reason ("" when
// accepted).
func (m *Metrics) Decision(result, reason string) {
	if m != nil {
		m.decisions.WithLabelValues(result, reason).Inc()
	}
}

// ApprovalDecided observes the time from request to decision.
func (m *Metrics) ApprovalDecided(outcome string, d time.Duration) {
	if m != nil && d >= 0 {
		m.approvalLatency.WithLabelValues(outcome).Observe(d.Seconds())
	}
}

// Execution counts the end of a gated call by disposition.
func (m *Metrics) Execution(disposition string) {
	if m != nil && disposition != "" {
		m.executions.WithLabelValues(disposition).Inc()
	}
}

// UpstreamCall observes one call to an upstream.
func (m *Metrics) UpstreamCall(upstream, result string, d time.Duration) {
	if m != nil {
		m.upstreamCalls.WithLabelValues(upstream, result).Observe(d.Seconds())
	}
}

// VerificationFailed counts a failed verification of kind with its reason code.
func (m *Metrics) VerificationFailed(kind, reason string) {
	if m != nil {
		m.verifyFailures.WithLabelValues(kind, reason).Inc()
	}
}

// WatchUpstreams exports MetricUpstreamUp, 1 for each upstream that is up
// and 0 for each one that is down, read from states at every scrape. The
// upstream label is a configured name, so it is a bounded set. Call it once.
func (m *Metrics) WatchUpstreams(states func() map[string]bool) error {
	if m == nil {
		return nil
	}
	return m.reg.Register(upstreamsCollector{
		desc:   prometheus.NewDesc(MetricUpstreamUp, "Whether each configured upstream MCP server is connected (1) or down (0), by upstream.", []string{"upstream"}, nil),
		states: states,
	})
}

// upstreamsCollector reads the upstreams' states at scrape time.
type upstreamsCollector struct {
	desc   *prometheus.Desc
	states func() map[string]bool
}

func (c upstreamsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c upstreamsCollector) Collect(ch chan<- prometheus.Metric) {
	for name, up := range c.states() {
		v := 0.0
		if up {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, name)
	}
}
