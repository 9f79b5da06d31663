package tracing

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// The global providers as OpenTelemetry starts them, before any
// otel.SetTracerProvider or otel.SetMeterProvider: until one is set, every
// span they make is a no-op and every measurement is dropped.
var (
	startTracerProvider = otel.GetTracerProvider()
	startMeterProvider  = otel.GetMeterProvider()
)

// GlobalTracing reports whether a tracer provider was installed as the
// global one (otel.SetTracerProvider). Until then, a span made by the
// global provider records nothing, carries an invalid span context and
// propagates nothing; it still costs allocations, which Enabled lets the
// hot path skip.
func GlobalTracing() bool { return otel.GetTracerProvider() != startTracerProvider }

// GlobalMetrics reports whether a meter provider was installed as the
// global one (otel.SetMeterProvider).
func GlobalMetrics() bool { return otel.GetMeterProvider() != startMeterProvider }

// Enabled reports whether spans made with tp (the global provider when
// nil, as in Tracer) can record or propagate anything: tp was given, or a
// global provider is installed. It is checked per use, so a provider
// installed later is honoured from then on.
func Enabled(tp trace.TracerProvider) bool { return tp != nil || GlobalTracing() }

// Off reports whether span — the span in a context, whose provider makes
// its children — is no span at all: not recording and with an invalid
// span context (no SDK made it). Its children would be no-ops that
// propagate nothing, so they need not be made, nor their attributes
// built. A span an SDK sampled out still has a valid context and is not
// Off.
func Off(span trace.Span) bool { return !span.IsRecording() && !span.SpanContext().IsValid() }
