package telemetry

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// Log formats (--log-format).
const (
	LogText = "text"
	LogJSON = "json"
)

// NewLogger is the process logger: JSON or text lines on w at level, through
// [NewLogHandler].
func NewLogger(w io.Writer, format string, level slog.Level) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	switch format {
	case LogText, "":
		h = slog.NewTextHandler(w, opts)
	case LogJSON:
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, fmt.Errorf("--log-format %q: use %s or %s", format, LogText, LogJSON)
	}
	return slog.New(NewLogHandler(h)), nil
}

// Log keys the handler adds.
const (
	KeyTraceID = "trace_id"
	KeySpanID  = "span_id"
	KeyTaskID  = "task_id"
)

// Keys of the Temporal SDK's loggers: the workflow ID is the task ID, and
// the tracing interceptor adds the trace to the workflow logger under its
// own names.
const (
	temporalWorkflowID = "WorkflowID"
	temporalTraceID    = "TraceID"
	temporalSpanID     = "SpanID"
)

// NewLogHandler wraps h so that a line concerning a task says which, and a
// line logged within a span says which trace:
//   - trace_id and span_id from the context's span, when it is recording
//     (tracing on);
//   - task_id from the context ([WithTaskID]) when the line has none;
//   - task_id beside the Temporal SDK's WorkflowID (a workflow's ID is its
//     task's), and trace_id and span_id beside its TraceID and SpanID.
//
// Wrapping twice adds nothing twice.
func NewLogHandler(h slog.Handler) slog.Handler {
	if _, ok := h.(*logHandler); ok {
		return h
	}
	return &logHandler{inner: h}
}

type logHandler struct {
	inner slog.Handler
	// hasTask, hasTrace: attributes bound with With already carry them.
	hasTask, hasTrace bool
}

func (h *logHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

func (h *logHandler) Handle(ctx context.Context, r slog.Record) error {
	if !h.hasTrace {
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			r.AddAttrs(slog.String(KeyTraceID, sc.TraceID().String()), slog.String(KeySpanID, sc.SpanID().String()))
		}
	}
	var extra []slog.Attr
	hasTask := h.hasTask
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case KeyTaskID:
			hasTask = true
		case temporalWorkflowID:
			extra = append(extra, slog.String(KeyTaskID, a.Value.String()))
		case temporalTraceID:
			extra = append(extra, slog.String(KeyTraceID, a.Value.String()))
		case temporalSpanID:
			extra = append(extra, slog.String(KeySpanID, a.Value.String()))
		}
		return true
	})
	for _, a := range extra {
		if a.Key == KeyTaskID {
			if hasTask {
				continue
			}
			hasTask = true
		}
		r.AddAttrs(a)
	}
	if !hasTask {
		if id := TaskID(ctx); id != "" {
			r.AddAttrs(slog.String(KeyTaskID, id))
		}
	}
	return h.inner.Handle(ctx, r)
}

func (h *logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	out := &logHandler{hasTask: h.hasTask, hasTrace: h.hasTrace}
	var extra []slog.Attr
	for _, a := range attrs {
		switch a.Key {
		case KeyTaskID:
			out.hasTask = true
		case KeyTraceID:
			out.hasTrace = true
		}
	}
	for _, a := range attrs {
		switch a.Key {
		case temporalWorkflowID:
			if !out.hasTask {
				extra = append(extra, slog.String(KeyTaskID, a.Value.String()))
				out.hasTask = true
			}
		case temporalTraceID:
			if !out.hasTrace {
				extra = append(extra, slog.String(KeyTraceID, a.Value.String()))
			}
		case temporalSpanID:
			if !out.hasTrace {
				extra = append(extra, slog.String(KeySpanID, a.Value.String()))
			}
		}
	}
	for _, a := range attrs {
		if a.Key == temporalTraceID {
			out.hasTrace = true
		}
	}
	out.inner = h.inner.WithAttrs(append(attrs, extra...))
	return out
}

func (h *logHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &logHandler{inner: h.inner.WithGroup(name), hasTask: h.hasTask, hasTrace: h.hasTrace}
}
