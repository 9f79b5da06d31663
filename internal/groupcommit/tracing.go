package groupcommit

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbclaim/sbclaim/internal/tracing"
)

// traceBatch starts one span for a batch about to be written, when any of
// its callers is traced: a root span (a batch serves several traces)
// linked to each caller's span, and each caller's span (the message's
// outcome write) linked back to it. The returned end closes it with the
// batch's errors.
func traceBatch[R any](batch []*call[R]) (end func(errs []error)) {
	var (
		tp    trace.TracerProvider
		links []trace.Link
	)
	for _, c := range batch {
		if c.span == nil || !c.span.IsRecording() {
			continue
		}
		if tp == nil {
			tp = c.span.TracerProvider()
		}
		links = append(links, trace.Link{SpanContext: c.span.SpanContext()})
	}
	if tp == nil {
		return func([]error) {}
	}
	_, span := tp.Tracer(tracing.ScopeName).Start(context.Background(), "write outcomes",
		trace.WithNewRoot(), trace.WithLinks(links...),
		trace.WithAttributes(tracing.Count.Int(len(batch)), attribute.String("db.operation.name", "WriteOutcomes")))
	link := trace.Link{SpanContext: span.SpanContext(), Attributes: []attribute.KeyValue{attribute.String("sbclaim.link", "outcome_batch")}}
	for _, c := range batch {
		if c.span != nil && c.span.IsRecording() {
			c.span.AddLink(link)
		}
	}
	return func(errs []error) {
		failed := 0
		for _, err := range errs {
			if err != nil {
				failed++
			}
		}
		if failed > 0 {
			span.SetAttributes(attribute.Int("sbclaim.failed", failed))
			if failed == len(errs) {
				span.SetStatus(codes.Error, "batch failed")
			}
		}
		span.End()
	}
}
