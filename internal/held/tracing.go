package held

import (
	"context"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/tracing"
)

// startAttempt starts the span of one effect attempt, a child of the span
// in ctx (the delivery's process span, a recovery's or a redrive's), made
// with that span's provider: with none (tracing.Off), there is no span.
func startAttempt(ctx context.Context, p Params, attempt int) (context.Context, func(error)) {
	parent := trace.SpanFromContext(ctx)
	if tracing.Off(parent) {
		return ctx, func(error) {}
	}
	ctx, span := parent.TracerProvider().Tracer(tracing.ScopeName).Start(ctx, "effect attempt")
	if span.IsRecording() { // a sampled-out span keeps nothing: build no attributes for it
		span.SetAttributes(tracing.ClaimID.Int64(p.Claim.ID), tracing.Consumer.String(p.Claim.Consumer),
			tracing.Route.String(p.Claim.Route), tracing.Attempt.Int(attempt))
	}
	return ctx, func(err error) {
		o := sideeffects.Classify(err)
		if span.IsRecording() {
			span.SetAttributes(tracing.EffectOutcome.String(o.String()))
		}
		if err != nil {
			// The outcome, not the error's text: it may quote a
			// downstream's answer.
			span.SetStatus(codes.Error, o.String())
		}
		span.End()
	}
}
