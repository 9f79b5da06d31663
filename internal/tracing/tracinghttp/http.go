// Package tracinghttp traces the HTTP requests of a routes file's effects
// (Transport) with otelhttp. It is apart from package tracing so that the
// root package, which uses tracing for its spans and logs, links neither
// otelhttp nor what it imports: only programs that read a routes file do
// (package routesfile wraps the routes' client with Transport).
package tracinghttp

import (
	"context"
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"

	"github.com/sbclaim/sbclaim/internal/tracing"
)

// Transport wraps base (http.DefaultTransport when nil) with otelhttp:
// each request gets a CLIENT span, a child of the span in its context
// (the effect attempt's), and carries that span's traceparent, so the
// downstream's span is its child. The span keeps only what cannot leak a
// secret: the method, the scheme, host and port, the status and the error
// type — never url.full, a path, a query, a header or an error text (a
// webhook's path or an API key in its query are secrets). Its provider is
// the one of the span in the request's context, else the global one.
//
// A request whose context carries no span (or a no-op one: tracing.Off) while no
// global tracer or meter provider is installed goes straight to base:
// otelhttp would make a no-op span, inject nothing and drop its
// measurements, at the cost of a request clone and its attributes.
func Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{base: base, traced: otelhttp.NewTransport(base,
		otelhttp.WithTracerProvider(scrubbingProvider{}),
		otelhttp.WithPropagators(propagation.TraceContext{}),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method }),
	)}
}

// transport sends a request through otelhttp (traced) only when that can
// record, propagate or measure anything.
type transport struct {
	base   http.RoundTripper
	traced *otelhttp.Transport
}

// RoundTrip implements http.RoundTripper.
func (t *transport) RoundTrip(r *http.Request) (*http.Response, error) {
	if tracing.Off(trace.SpanFromContext(r.Context())) && !tracing.GlobalTracing() && !tracing.GlobalMetrics() {
		return t.base.RoundTrip(r)
	}
	return t.traced.RoundTrip(r)
}

// CloseIdleConnections closes the base transport's idle connections
// (http.Client.CloseIdleConnections).
func (t *transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// allowedHTTPAttributes are the only attributes an HTTP client span keeps.
var allowedHTTPAttributes = map[attribute.Key]bool{
	"http.request.method":          true,
	"http.request.method_original": true,
	"http.response.status_code":    true,
	"http.request.resend_count":    true,
	"server.address":               true,
	"server.port":                  true,
	"url.scheme":                   true,
	"error.type":                   true,
	"network.protocol.name":        true,
	"network.protocol.version":     true,
}

// ScrubHTTPAttributes keeps the allowed attributes of kvs.
func ScrubHTTPAttributes(kvs []attribute.KeyValue) []attribute.KeyValue {
	out := kvs[:0:0]
	for _, kv := range kvs {
		if allowedHTTPAttributes[kv.Key] {
			out = append(out, kv)
		}
	}
	return out
}

// scrubbingProvider hands otelhttp a tracer that resolves the real
// provider per request (the context's span's, else the global one) and
// scrubs what otelhttp sets on the span.
type scrubbingProvider struct{ embedded.TracerProvider }

func (scrubbingProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return scrubbingTracer{name: name, opts: opts}
}

type scrubbingTracer struct {
	embedded.Tracer
	name string
	opts []trace.TracerOption
}

func (t scrubbingTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	tp := otel.GetTracerProvider()
	if span := trace.SpanFromContext(ctx); span.SpanContext().IsValid() {
		tp = span.TracerProvider()
	}
	cfg := trace.NewSpanStartConfig(opts...)
	clean := []trace.SpanStartOption{trace.WithSpanKind(cfg.SpanKind()), trace.WithAttributes(ScrubHTTPAttributes(cfg.Attributes())...)}
	if !cfg.Timestamp().IsZero() {
		clean = append(clean, trace.WithTimestamp(cfg.Timestamp()))
	}
	if cfg.NewRoot() {
		clean = append(clean, trace.WithNewRoot())
	}
	ctx, span := tp.Tracer(t.name, t.opts...).Start(ctx, name, clean...)
	if !span.IsRecording() {
		return ctx, span
	}
	s := &scrubbingSpan{Span: span}
	return trace.ContextWithSpan(ctx, s), s
}

// scrubbingSpan drops every attribute but the allowed ones, and error
// texts (an error of net/http may quote the URL).
type scrubbingSpan struct{ trace.Span }

func (s *scrubbingSpan) SetAttributes(kv ...attribute.KeyValue) {
	s.Span.SetAttributes(ScrubHTTPAttributes(kv)...)
}

func (s *scrubbingSpan) SetStatus(code codes.Code, _ string) { s.Span.SetStatus(code, "") }

func (s *scrubbingSpan) RecordError(error, ...trace.EventOption) {}

func (s *scrubbingSpan) AddEvent(string, ...trace.EventOption) {}
