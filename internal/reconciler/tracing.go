package reconciler

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/tracing"
)

// The reconciler's spans:
//
//	reconcile                   a tick (root)
//	  recover pass | flag pass  under the database lock
//	    recover claim           one stale claim: take-over (path
//	                            reconciler), then its effect attempts
//	                            (internal/held) and outcome write
//	  purge pass
//	redrive | handoff           an operator's action on one claim (root)

// startTick starts a tick's root span; end records what the tick did.
func (r *Reconciler) startTick(ctx context.Context) (context.Context, func(res *TickResult, err error)) {
	ctx, span := tracing.Tracer(r.cfg.TracerProvider).Start(ctx, "reconcile", trace.WithNewRoot())
	return ctx, func(res *TickResult, err error) {
		if res != nil {
			span.SetAttributes(attribute.Bool("sbclaim.reconciler.locked", res.Locked),
				attribute.Int("sbclaim.reconciler.recovered", res.Recovered),
				attribute.Int("sbclaim.reconciler.postponed", res.Postponed),
				attribute.Int("sbclaim.reconciler.failed", res.Failed),
				attribute.Int("sbclaim.reconciler.flagged", len(res.Flagged)),
				attribute.Int64("sbclaim.reconciler.purged", res.Purged))
		}
		if err != nil {
			span.SetStatus(codes.Error, "tick failed")
		}
		span.End()
	}
}

// pass runs one pass in its own span, a child of the tick's.
func (r *Reconciler) pass(ctx context.Context, name string, fn func(context.Context) error) error {
	ctx, span := tracing.Tracer(r.cfg.TracerProvider).Start(ctx, name+" pass", trace.WithAttributes(tracing.Pass.String(name)))
	defer span.End()
	err := fn(ctx)
	if err != nil {
		span.SetStatus(codes.Error, name+" pass failed")
	}
	return err
}

var outcomeNames = map[recoveryOutcome]string{
	skipped: "skipped", recovered: "recovered", postponed: "postponed", failedFinal: "failed", flaggedForOperators: "flagged",
}

// recoverTraced is recoverOne in a "recover claim" span.
func (r *Reconciler) recoverTraced(ctx context.Context, c *claim.Claim) (recoveryOutcome, *claim.Claim) {
	ctx, span := tracing.Tracer(r.cfg.TracerProvider).Start(ctx, "recover claim", trace.WithAttributes(
		tracing.ClaimID.Int64(c.ID), tracing.Consumer.String(c.Consumer), tracing.Route.String(c.Route),
		tracing.ClaimState.String(string(c.State)), tracing.TakeOverPath.String(string(claim.PathReconciler)),
		tracing.PreviousHolder.String(c.ClaimedBy)))
	defer span.End()
	outcome, flagged := r.recoverOne(ctx, c)
	span.SetAttributes(tracing.Outcome.String(outcomeNames[outcome]))
	return outcome, flagged
}

// startAction starts the root span of an operator's action on claim id.
func startAction(ctx context.Context, tp trace.TracerProvider, name string, id int64) (context.Context, func(c *claim.Claim, err error)) {
	ctx, span := tracing.Tracer(tp).Start(ctx, name, trace.WithNewRoot(), trace.WithAttributes(tracing.ClaimID.Int64(id),
		tracing.TakeOverPath.String(string(claim.PathOperator))))
	return ctx, func(c *claim.Claim, err error) {
		if c != nil {
			span.SetAttributes(tracing.Consumer.String(c.Consumer), tracing.Route.String(c.Route), tracing.ClaimState.String(string(c.State)))
		}
		if err != nil {
			span.SetStatus(codes.Error, name+" refused or failed")
		}
		span.End()
	}
}

// spanLogger is logger (its lines) carrying the trace of ctx's span, even
// on lines logged without a context.
func spanLogger(ctx context.Context, logger *slog.Logger) *slog.Logger {
	return tracing.WithSpan(tracing.Logger(logger), trace.SpanContextFromContext(ctx))
}
