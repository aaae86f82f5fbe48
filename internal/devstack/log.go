package devstack

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"

	tlog "go.temporal.io/server/common/log"
	"go.temporal.io/server/common/log/tag"
)

// minLevel keeps the embedded server quiet: it logs a lot at info level
// (every service start, every shard acquisition).
const minLevel = slog.LevelWarn

// serverLogger adapts an *slog.Logger to Temporal's log.Logger.
//
// While the server starts and after it begins to stop, its services dial
// each other before they listen and after they stopped, and warn about it
// ("Failed to poll for task.", "network dial error", and "service failures"
// with grpc_code Unavailable at error level). quiet drops warnings and
// Unavailable errors in those windows; other errors always pass.
//
// Fatal and Panic log and then panic. Temporal's own logger exits the process
// on Fatal, and the code that calls it does not expect it to return (after
// "Failed to start gRPC listener" it would go on with a nil listener).
type serverLogger struct {
	l     *slog.Logger
	quiet *atomic.Bool
}

var (
	_ tlog.Logger      = serverLogger{}
	_ tlog.WithLogger  = serverLogger{}
	_ tlog.SLogWrapper = serverLogger{}
)

func newServerLogger(l *slog.Logger, quiet *atomic.Bool) serverLogger {
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return serverLogger{l: slog.New(levelHandler{h: l.Handler()}).With("component", "temporal"), quiet: quiet}
}

func (s serverLogger) Debug(msg string, tags ...tag.Tag)  { s.log(slog.LevelDebug, msg, tags) }
func (s serverLogger) Info(msg string, tags ...tag.Tag)   { s.log(slog.LevelInfo, msg, tags) }
func (s serverLogger) Warn(msg string, tags ...tag.Tag)   { s.log(slog.LevelWarn, msg, tags) }
func (s serverLogger) Error(msg string, tags ...tag.Tag)  { s.log(slog.LevelError, msg, tags) }
func (s serverLogger) DPanic(msg string, tags ...tag.Tag) { s.log(slog.LevelError, msg, tags) }

func (s serverLogger) Panic(msg string, tags ...tag.Tag) {
	s.log(slog.LevelError, msg, tags)
	panic("temporal: " + msg)
}

func (s serverLogger) Fatal(msg string, tags ...tag.Tag) {
	s.log(slog.LevelError, msg, tags)
	panic("temporal: fatal: " + msg)
}

// With returns a logger with tags prepended; Temporal calls it for every
// component.
func (s serverLogger) With(tags ...tag.Tag) tlog.Logger {
	if len(tags) == 0 {
		return s
	}
	args := make([]any, len(tags))
	for i, t := range tags {
		args[i] = slog.Any(t.Key(), t.Value())
	}
	return serverLogger{l: s.l.With(args...), quiet: s.quiet}
}

// SLog lets Temporal code that wants an *slog.Logger use the same filtered
// logger.
func (s serverLogger) SLog() *slog.Logger { return s.l }

func (s serverLogger) log(level slog.Level, msg string, tags []tag.Tag) {
	ctx := context.Background()
	if s.quiet.Load() && (level < slog.LevelError || unavailable(tags)) || !s.l.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, len(tags))
	for i, t := range tags {
		attrs[i] = slog.Any(t.Key(), t.Value())
	}
	s.l.LogAttrs(ctx, level, msg, attrs...)
}

// unavailable reports whether a log entry is about a gRPC Unavailable error,
// which is transient while services come up or go down.
func unavailable(tags []tag.Tag) bool {
	for _, t := range tags {
		if t.Key() == "grpc_code" && fmt.Sprint(t.Value()) == "Unavailable" {
			return true
		}
	}
	return false
}

// levelHandler drops records below minLevel whatever the wrapped handler's
// own level is.
type levelHandler struct {
	h slog.Handler
}

func (h levelHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return level >= minLevel && h.h.Enabled(ctx, level)
}

func (h levelHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.h.Handle(ctx, r)
}

func (h levelHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return levelHandler{h: h.h.WithAttrs(attrs)}
}

func (h levelHandler) WithGroup(name string) slog.Handler {
	return levelHandler{h: h.h.WithGroup(name)}
}
