package telemetry

import (
	"context"
	"net/http"
	"runtime"
	"runtime/debug"
	"sync"
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
	MetricPendingTasks         = "countersign_pending_tasks"
	MetricStartFailures        = "countersign_workflow_start_failures_total"
	MetricOrphanedTasks        = "countersign_orphaned_tasks_total"
	MetricBuildInfo            = "countersign_build_info"
)

// What became of a workflow start that returned an error, the outcome label
// of MetricStartFailures.
const (
	StartNotStarted    = "not_started"    // Temporal never heard of it: the task fails, the tool does not run
	StartStartedAnyway = "started_anyway" // the start took effect after all
	StartUnknown       = "unknown"        // Temporal could not tell; the record stays for the reconciler
)

// What the reconciler did with an orphaned task (a record whose workflow
// never started), the outcome label of MetricOrphanedTasks.
const (
	OrphanResumed = "resumed" // its workflow was started from the record
	OrphanFailed  = "failed"  // it was failed: the tool did not run
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
	startFailures   *prometheus.CounterVec
	orphans         *prometheus.CounterVec
	pending         *pendingCollector // WatchPending's; nil before

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
	m.startFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricStartFailures,
		Help: "Workflow starts that returned an error, by what became of them (not_started: the task failed, the tool did not run; started_anyway; unknown: left to the reconciler).",
	}, []string{"outcome"})
	m.orphans = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricOrphanedTasks,
		Help: "Orphaned tasks (a record whose workflow never started) the reconciler resumed or failed, by outcome.",
	}, []string{"outcome"})
	version, goVersion := BuildVersion()
	buildInfo := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        MetricBuildInfo,
		Help:        "Always 1; the labels say which build of countersign runs: its module version (or VCS revision) and Go version.",
		ConstLabels: prometheus.Labels{"version": version, "go_version": goVersion},
	}, func() float64 { return 1 })
	for _, c := range []prometheus.Collector{
		m.gatedCalls, m.transitions, m.decisions, m.approvalLatency, m.executions, m.upstreamCalls, m.verifyFailures,
		m.startFailures, m.orphans, buildInfo,
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
	// The SDK's timers record seconds, and OpenTelemetry's default
	// buckets (5, 10, 25 … 10000) are meant for milliseconds: every
	// latency under 5 s would fall in the first one. These go from a
	// millisecond (a workflow task, a poll) to a day (an approval
	// workflow from start to end).
	seconds := sdkmetric.NewView(
		sdkmetric.Instrument{Kind: sdkmetric.InstrumentKindHistogram, Unit: "s"},
		sdkmetric.Stream{Aggregation: sdkmetric.AggregationExplicitBucketHistogram{Boundaries: []float64{
			0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
			300, 1800, 3600, 4 * 3600, 24 * 3600,
		}}},
	)
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithView(seconds))
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

// StartFailed counts a workflow start that returned an error, by outcome
// (StartNotStarted, StartStartedAnyway, StartUnknown).
func (m *Metrics) StartFailed(outcome string) {
	if m != nil {
		m.startFailures.WithLabelValues(outcome).Inc()
	}
}

// Orphans counts n orphaned tasks the reconciler handled with outcome
// (OrphanResumed, OrphanFailed).
func (m *Metrics) Orphans(outcome string, n int) {
	if m != nil && n > 0 {
		m.orphans.WithLabelValues(outcome).Add(float64(n))
	}
}

// Bounds of WatchPending's read of the pending total.
const (
	// PendingReadEvery is how often, at most, a scrape reads the total;
	// scrapes in between get the last value read.
	PendingReadEvery = 15 * time.Second
	// pendingReadTimeout bounds one read.
	pendingReadTimeout = 2 * time.Second
)

// WatchPending exports MetricPendingTasks, the tasks of the whole
// deployment that hold a pending slot (the approval backlog), read with
// read at scrape time, at most once every PendingReadEvery and within
// pendingReadTimeout. A failed read leaves the last value read (none
// before the first success). Call it once.
func (m *Metrics) WatchPending(read func(context.Context) (int, error)) error {
	if m == nil {
		return nil
	}
	c := &pendingCollector{
		desc: prometheus.NewDesc(MetricPendingTasks, "Tasks of the whole deployment that hold a pending slot: waiting for a decision, or approved and not yet ended (the sum of the per-agent pending counters; the same on every process, aggregate with max).", nil, nil),
		read: read,
	}
	if err := m.reg.Register(c); err != nil {
		return err
	}
	m.pending = c
	return nil
}

// pendingCollector reads the pending total at scrape time, rate-limited.
type pendingCollector struct {
	desc *prometheus.Desc
	read func(context.Context) (int, error)

	mu     sync.Mutex
	at     time.Time // of the last read, failed or not
	value  int
	loaded bool
}

func (c *pendingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *pendingCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); c.at.IsZero() || now.Sub(c.at) >= PendingReadEvery {
		c.at = now
		ctx, cancel := context.WithTimeout(context.Background(), pendingReadTimeout)
		n, err := c.read(ctx)
		cancel()
		if err == nil {
			c.value, c.loaded = n, true
		}
	}
	if c.loaded {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(c.value))
	}
}

// BuildVersion is the running binary's module version (the VCS revision
// for a build from a work tree that has one; "(devel)" without either) and
// its Go version: what `countersign version` prints and the
// countersign_build_info metric's labels hold.
func BuildVersion() (version, goVersion string) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown", runtime.Version()
	}
	version = info.Main.Version
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" && (version == "" || version == "(devel)") {
			version = s.Value
		}
	}
	if version == "" {
		version = "(devel)"
	}
	return version, info.GoVersion
}
