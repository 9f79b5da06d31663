package sideeffects

import (
	"context"

	"go.opentelemetry.io/otel/trace"
)

// traced reports whether ctx carries a valid span (the effect attempt's):
// the HTTP transport (tracinghttp.Transport) then sends that span's child's
// traceparent, and the message's own traceparent, tracestate and
// Diagnostic-Id (the producer's) are not forwarded. With tracing off they
// are, as they always were.
func traced(ctx context.Context) bool {
	return trace.SpanContextFromContext(ctx).IsValid()
}
