package telemetry

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	temporalotel "go.temporal.io/sdk/contrib/opentelemetry"
	"go.temporal.io/sdk/interceptor"
)

// Telemetry is a process's metrics and tracing. The zero value and nil
// record nothing.
type Telemetry struct {
	Metrics *Metrics
	Tracing *Tracing
}

// M returns the metrics; nil when t is nil (a nil *Metrics records nothing).
func (t *Telemetry) M() *Metrics {
	if t == nil {
		return nil
	}
	return t.Metrics
}

// TracingOn reports whether spans are exported.
func (t *Telemetry) TracingOn() bool { return t != nil && t.Tracing.On() }

var (
	noopTracer = noop.NewTracerProvider().Tracer("")
	// noSpan is the no-op span (never ctx's own, which a caller would end).
	noSpan = trace.SpanFromContext(context.Background())
)

// Tracer is Countersign's tracer, the no-op one when tracing is off.
func (t *Telemetry) Tracer() trace.Tracer {
	if !t.TracingOn() {
		return noopTracer
	}
	return t.Tracing.Provider().Tracer(instrumentationName)
}

// StartSpan starts a span as a child of ctx's. With tracing off it returns
// ctx and a no-op span, at the cost of one interface call.
func (t *Telemetry) StartSpan(ctx context.Context, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if !t.TracingOn() {
		return ctx, noSpan
	}
	return t.Tracer().Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
}

// TraceParent is ctx's span context as a W3C traceparent, "" when ctx has
// no valid one (tracing off, or no span).
func TraceParent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c.Get("traceparent")
}

// StartLinkedSpan starts a span as a child of ctx's, linked to the span a
// traceparent names (TraceParent's form; "" or a malformed one: no link).
// It joins a later request (an approver's decision) to the trace of the
// request it concerns (the tools/call that created the task) without
// making it part of that trace. With tracing off it returns ctx and a
// no-op span.
func (t *Telemetry) StartLinkedSpan(ctx context.Context, name, traceparent string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if !t.TracingOn() {
		return ctx, noSpan
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...)}
	if traceparent != "" {
		linked := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent})
		if sc := trace.SpanContextFromContext(linked); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		}
	}
	return t.Tracer().Start(ctx, name, opts...)
}

// instrumentationName names Countersign's tracer and meter.
const instrumentationName = "github.com/countersign/countersign"

type taskKey struct{}

// WithTaskID returns ctx carrying the task it concerns: the log handler
// adds task_id to every line logged with it.
func WithTaskID(ctx context.Context, taskID string) context.Context {
	if taskID == "" {
		return ctx
	}
	return context.WithValue(ctx, taskKey{}, taskID)
}

// TaskID returns the task ctx concerns, "" if none.
func TaskID(ctx context.Context) string {
	id, _ := ctx.Value(taskKey{}).(string)
	return id
}

// TemporalInterceptors are the Temporal client's interceptors: with tracing
// on, the SDK's OpenTelemetry tracing interceptor, which carries the trace
// from a workflow's start through the workflow to its activities (Temporal
// headers); none otherwise.
func (t *Telemetry) TemporalInterceptors() ([]interceptor.ClientInterceptor, error) {
	if !t.TracingOn() {
		return nil, nil
	}
	i, err := temporalotel.NewTracingInterceptor(temporalotel.TracerOptions{
		Tracer:            t.Tracing.Provider().Tracer("temporal-sdk-go"),
		TextMapPropagator: Propagator,
	})
	if err != nil {
		return nil, err
	}
	return []interceptor.ClientInterceptor{i}, nil
}

// InjectHTTP writes ctx's trace context into h (an outgoing request's
// headers) when tracing is on.
func (t *Telemetry) InjectHTTP(ctx context.Context, h http.Header) {
	if t.TracingOn() {
		Propagator.Inject(ctx, propagation.HeaderCarrier(h))
	}
}

// ExtractHTTP wraps next so that a request's W3C trace context (traceparent)
// becomes the parent of the spans it starts, when tracing is on.
func (t *Telemetry) ExtractHTTP(next http.Handler) http.Handler {
	if !t.TracingOn() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(Propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))))
	})
}

// ForTask returns ctx carrying the task (see [WithTaskID]) and names the
// task on ctx's span (attribute countersign.task_id).
func ForTask(ctx context.Context, taskID string) context.Context {
	if taskID == "" {
		return ctx
	}
	trace.SpanFromContext(ctx).SetAttributes(attribute.String(AttrTaskID, taskID))
	return WithTaskID(ctx, taskID)
}

// Span attributes Countersign sets.
const (
	AttrTaskID   = "countersign.task_id"
	AttrTool     = "countersign.tool"
	AttrDecision = "countersign.decision"
	AttrUpstream = "countersign.upstream"
)
