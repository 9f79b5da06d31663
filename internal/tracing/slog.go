package tracing

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// LogHandler wraps a slog.Handler: a record written inside a span (its
// context carries a valid span context) gets trace_id and span_id, so a
// log line in Log Analytics leads to its trace. A record whose context
// carries none gets the span bound with WithSpan, if any; with neither,
// the record is passed on unchanged.
type LogHandler struct {
	inner slog.Handler
	bound trace.SpanContext
}

// NewLogHandler wraps h; it returns h itself when h is a LogHandler
// already.
func NewLogHandler(h slog.Handler) *LogHandler {
	if lh, ok := h.(*LogHandler); ok {
		return lh
	}
	return &LogHandler{inner: h}
}

// Logger returns l with its handler wrapped by NewLogHandler (nil stays
// nil).
func Logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return nil
	}
	if _, ok := l.Handler().(*LogHandler); ok {
		return l
	}
	return slog.New(NewLogHandler(l.Handler()))
}

// WithSpan returns l whose lines carry sc's ids when their context carries
// no span (a line logged with context.Background() about a message being
// processed). l is returned as it is when its handler is no LogHandler or
// sc is invalid.
func WithSpan(l *slog.Logger, sc trace.SpanContext) *slog.Logger {
	h, ok := l.Handler().(*LogHandler)
	if !ok || !sc.IsValid() {
		return l
	}
	return slog.New(&LogHandler{inner: h.inner, bound: sc})
}

// Enabled implements slog.Handler.
func (h *LogHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.inner.Enabled(ctx, level)
}

// Handle implements slog.Handler.
func (h *LogHandler) Handle(ctx context.Context, r slog.Record) error {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		sc = h.bound
	}
	if sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.inner.Handle(ctx, r)
}

// WithAttrs implements slog.Handler.
func (h *LogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &LogHandler{inner: h.inner.WithAttrs(attrs), bound: h.bound}
}

// WithGroup implements slog.Handler.
func (h *LogHandler) WithGroup(name string) slog.Handler {
	return &LogHandler{inner: h.inner.WithGroup(name), bound: h.bound}
}
