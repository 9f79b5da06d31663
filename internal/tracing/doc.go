// Package tracing holds what sbclaim's spans have in common: the tracer,
// the OpenTelemetry messaging semantic-convention attributes for Service
// Bus, the producer's context read from a message (traceparent, or the
// Azure SDKs' Diagnostic-Id), the slog handler that puts trace_id and
// span_id on every log line written inside a span, and the HTTP transport
// of the HTTP effect (otelhttp, keeping only the scheme, host, method and
// status of a request: never its path, query or headers).
//
// Every span is made with a trace.TracerProvider the caller chooses, the
// global one (otel.GetTracerProvider()) by default: with no SDK installed
// the spans are no-ops and cost next to nothing.
package tracing
