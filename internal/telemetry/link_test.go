package telemetry

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestStartLinkedSpan: a span started with the traceparent TraceParent gave
// for another span is a root of its own trace linked to that span; a
// malformed or empty traceparent gives no link; with tracing off nothing
// is started.
func TestStartLinkedSpan(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr, err := NewTracing(context.Background(), TracingOptions{Exporter: exp})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	tel := &Telemetry{Tracing: tr} // a syncer: spans are exported as they end
	ctx, call := tel.StartSpan(context.Background(), "tools/call", 0)
	tp := TraceParent(ctx)
	call.End()
	if tp == "" || TraceParent(context.Background()) != "" {
		t.Fatalf("TraceParent = %q (and %q without a span)", tp, TraceParent(context.Background()))
	}
	for _, tc := range []struct {
		name, traceparent string
		links             int
	}{{"linked", tp, 1}, {"empty", "", 0}, {"malformed", "00-zz-01", 0}} {
		_, sp := tel.StartLinkedSpan(context.Background(), "decision "+tc.name, tc.traceparent)
		sp.End()
	}
	got := map[string]tracetest.SpanStub{}
	for _, sp := range exp.GetSpans() {
		got[sp.Name] = sp
	}
	root, linked := got["tools/call"], got["decision linked"]
	if len(linked.Links) != 1 || linked.Links[0].SpanContext.SpanID() != root.SpanContext.SpanID() ||
		linked.SpanContext.TraceID() == root.SpanContext.TraceID() || linked.Parent.IsValid() {
		t.Errorf("linked span: trace %s parent %v links %+v; tools/call %s", linked.SpanContext.TraceID(), linked.Parent, linked.Links, root.SpanContext.SpanID())
	}
	for _, n := range []string{"decision empty", "decision malformed"} {
		if sp, ok := got[n]; !ok || len(sp.Links) != 0 {
			t.Errorf("%s: %v links %+v", n, ok, sp.Links)
		}
	}
	var off *Telemetry
	if ctx, sp := off.StartLinkedSpan(context.Background(), "x", tp); sp.SpanContext().IsValid() || TraceParent(ctx) != "" {
		t.Error("tracing off started a span")
	}
}
