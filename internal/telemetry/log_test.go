package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func decodeLines(t *testing.T, b *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func TestLogHandler(t *testing.T) {
	tr, err := NewTracing(context.Background(), TracingOptions{Exporter: tracetest.NewInMemoryExporter()})
	if err != nil {
		t.Fatal(err)
	}
	tel := &Telemetry{Tracing: tr}
	ctx, span := tel.StartSpan(context.Background(), "op", 0)
	defer span.End()
	sc := span.SpanContext()

	var b bytes.Buffer
	log, err := NewLogger(&b, LogJSON, slog.LevelInfo)
	if err != nil {
		t.Fatal(err)
	}
	log.InfoContext(WithTaskID(ctx, "tsk_1"), "in a span, for a task")
	log.InfoContext(WithTaskID(ctx, "tsk_1"), "explicit task wins", "task_id", "tsk_2")
	log.Info("no context")
	log.With("WorkflowID", "tsk_3", "TraceID", "abc", "SpanID", "def").Info("temporal workflow logger")
	log.With("task_id", "tsk_4").With("WorkflowID", "tsk_5").Info("bound task wins")

	lines := decodeLines(t, &b)
	tests := []struct {
		name                  string
		task, traceID, spanID any
	}{
		{"in a span, for a task", "tsk_1", sc.TraceID().String(), sc.SpanID().String()},
		{"explicit task wins", "tsk_2", sc.TraceID().String(), sc.SpanID().String()},
		{"no context", nil, nil, nil},
		{"temporal workflow logger", "tsk_3", "abc", "def"},
		{"bound task wins", "tsk_4", nil, nil},
	}
	for i, tc := range tests {
		l := lines[i]
		if l["msg"] != tc.name || l[KeyTaskID] != tc.task || l[KeyTraceID] != tc.traceID || l[KeySpanID] != tc.spanID {
			t.Errorf("%s: got %v", tc.name, l)
		}
	}
	if n := strings.Count(lines[1]["task_id"].(string), "tsk"); n != 1 {
		t.Errorf("task_id twice: %v", lines[1])
	}
	if _, err := NewLogger(&b, "xml", slog.LevelInfo); err == nil {
		t.Error("log format xml accepted")
	}
}

func TestNilTelemetryRecordsNothing(t *testing.T) {
	var tel *Telemetry
	tel.M().GatedCall("allow")
	tel.M().UpstreamCall("u", UpstreamOK, 0)
	ctx, span := tel.StartSpan(context.Background(), "x", 0)
	span.End()
	if span.SpanContext().IsValid() || ctx == nil || tel.TracingOn() {
		t.Error("a nil Telemetry traced")
	}
	if i, err := tel.TemporalInterceptors(); i != nil || err != nil {
		t.Error("a nil Telemetry installed a Temporal interceptor")
	}
}
