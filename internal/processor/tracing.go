package processor

import (
	"context"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/tracing"
)

// procTracing makes the processor's spans (OpenTelemetry messaging
// semantic conventions) and its semantic-convention metrics:
//
//	process <destination>       CONSUMER, one per delivery, linked to the
//	                            producer and to the delivery that abandoned
//	                            the message last
//	  claim                     the claim's insert (batched: one span per
//	                            message, sbclaim.batch size attribute)
//	  takeover                  a redelivery taking a claim over
//	  effect attempt            each attempt (internal/held)
//	    POST                    the HTTP effect's request (otelhttp)
//	  outcome <kind>            the outcome write, linked to its
//	                            group-committed batch (internal/groupcommit)
//	  <complete|abandon|dead_letter> <destination>   CLIENT, the settlement
type procTracing struct {
	tracer   trace.Tracer
	base     []attribute.KeyValue // system, destination
	dest     string               // the destination in span names
	consumer attribute.KeyValue

	duration metric.Float64Histogram // messaging.process.duration
	consumed metric.Int64Counter     // messaging.client.consumed.messages
	metAttrs metric.MeasurementOption
}

func newProcTracing(opts Options) *procTracing {
	mp := opts.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(tracing.ScopeName)
	t := &procTracing{
		tracer:   tracing.Tracer(opts.TracerProvider),
		base:     append([]attribute.KeyValue{tracing.System}, tracing.Destination(opts.Entity)...),
		dest:     tracing.DestinationName(opts.Entity),
		consumer: tracing.Consumer.String(opts.Consumer),
	}
	t.metAttrs = metric.WithAttributes(append([]attribute.KeyValue{tracing.MessagingOperationName.String("process")}, t.base...)...)
	// Errors here only come from invalid instrument names; the no-op
	// instruments returned with them are safe to use.
	t.duration, _ = meter.Float64Histogram("messaging.process.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of processing operation."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10))
	t.consumed, _ = meter.Int64Counter("messaging.client.consumed.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Number of messages that were delivered to the application."))
	return t
}

// deliveryTrace is one delivery's process span.
type deliveryTrace struct {
	span trace.Span
}

// startProcess starts d's process span and binds d's logger to it. With
// no tracer provider (none given, none installed globally) there is no
// span to make: d.tr stays nil and the delivery's other spans are skipped.
func (p *Processor) startProcess(d *delivery) {
	t := p.tr
	t.consumed.Add(context.Background(), 1, t.metAttrs)
	if !tracing.Enabled(p.opts.TracerProvider) {
		return
	}
	m := d.msg
	attrs := make([]attribute.KeyValue, 0, 10)
	attrs = append(attrs, t.base...)
	attrs = append(attrs,
		tracing.MessagingOperationType.String("process"),
		tracing.MessagingOperationName.String("process"),
		tracing.MessagingMessageID.String(m.MessageID),
		tracing.ServiceBusDeliveryCount.Int64(int64(m.DeliveryCount)),
		t.consumer,
	)
	if m.EnqueuedTime != nil {
		attrs = append(attrs, tracing.ServiceBusEnqueuedTime.Int64(m.EnqueuedTime.Unix()))
	}
	_, span := t.tracer.Start(context.Background(), "process "+t.dest,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithTimestamp(d.received),
		trace.WithAttributes(attrs...),
		trace.WithLinks(tracing.Links([]string{"producer", "previous_attempt"},
			tracing.ProducerContext(m), tracing.PreviousAttempt(m))...))
	d.tr = &deliveryTrace{span: span}
	d.log = tracing.WithSpan(d.log, span.SpanContext())
}

// traced returns ctx carrying d's process span, so the spans of the work
// done on ctx are its children.
func (d *delivery) traced(ctx context.Context) context.Context {
	if d.tr == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, d.tr.span)
}

// startClaims starts a claim span under each delivery's process span; the
// returned end records each result (or the batch's error).
func (p *Processor) startClaims(ds []*delivery) (end func(results []claim.ClaimResult, err error)) {
	var spans []trace.Span
	for i, d := range ds {
		if d.tr == nil {
			continue
		}
		if spans == nil {
			spans = make([]trace.Span, len(ds))
		}
		_, spans[i] = p.tr.tracer.Start(d.traced(context.Background()), "claim",
			trace.WithAttributes(attribute.Int("sbclaim.batch", len(ds)), p.tr.consumer))
	}
	if spans == nil {
		return func([]claim.ClaimResult, error) {}
	}
	return func(results []claim.ClaimResult, err error) {
		for i, s := range spans {
			switch {
			case s == nil:
				continue
			case err != nil:
				s.SetStatus(codes.Error, "claim failed")
			case i < len(results):
				r := results[i]
				s.SetAttributes(tracing.ClaimOutcome.String(r.Outcome.String()))
				if r.Claim != nil {
					s.SetAttributes(tracing.ClaimID.Int64(r.Claim.ID), tracing.ClaimState.String(string(r.Claim.State)))
				}
			}
			s.End()
		}
	}
}

// startTakeOver starts the span of a redelivery's take-over of c, linked
// to the trace of the delivery that abandoned the message last, when it
// said so.
func (p *Processor) startTakeOver(ctx context.Context, d *delivery, c *claim.Claim) (context.Context, func(taken *claim.Claim, err error)) {
	ctx, span := p.tr.tracer.Start(d.traced(ctx), "takeover",
		trace.WithAttributes(tracing.ClaimID.Int64(c.ID), tracing.ClaimState.String(string(c.State)),
			tracing.TakeOverPath.String(string(claim.PathRedelivery)), tracing.PreviousHolder.String(c.ClaimedBy)),
		trace.WithLinks(tracing.Links([]string{"previous_attempt"}, tracing.PreviousAttempt(d.msg))...))
	return ctx, func(taken *claim.Claim, err error) {
		if err != nil {
			span.SetStatus(codes.Error, "take-over refused or failed")
		} else if taken != nil {
			span.SetAttributes(tracing.ClaimState.String(string(taken.State)))
		}
		span.End()
	}
}

// startOutcome starts the span of an outcome write (processed, released,
// failed) under ctx's span; the group commit links it to its batch.
func (p *Processor) startOutcome(ctx context.Context, c *claim.Claim, kind string) (context.Context, func(err error)) {
	parent := trace.SpanFromContext(ctx)
	if tracing.Off(parent) {
		return ctx, func(error) {}
	}
	ctx, span := parent.TracerProvider().Tracer(tracing.ScopeName).Start(ctx, "outcome "+kind)
	if span.IsRecording() {
		span.SetAttributes(tracing.ClaimID.Int64(c.ID), tracing.OutcomeWrite.String(kind))
	}
	return ctx, func(err error) {
		if err != nil {
			span.SetStatus(codes.Error, "outcome write failed")
		}
		span.End()
	}
}

// settlementName is messaging.operation.name (and the disposition status)
// of a settlement; "" for none.
func settlementName(s settlement) string {
	switch s {
	case settleComplete:
		return "complete"
	case settleAbandon:
		return "abandon"
	case settleDeadLetter:
		return "dead_letter"
	}
	return ""
}

// startSettle starts the settle span of d's verdict; end records the
// settlement's error (a no-op when there is nothing to settle).
func (p *Processor) startSettle(d *delivery, v verdict) (end func(err error)) {
	op := settlementName(v.settle)
	if op == "" || d.tr == nil {
		return func(error) {}
	}
	_, span := p.tr.tracer.Start(d.traced(context.Background()), op+" "+p.tr.dest, trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() { // a sampled-out span keeps nothing: build no attributes for it
		attrs := make([]attribute.KeyValue, 0, 8)
		attrs = append(attrs, p.tr.base...)
		attrs = append(attrs,
			tracing.MessagingOperationType.String("settle"),
			tracing.MessagingOperationName.String(op),
			tracing.ServiceBusDispositionStatus.String(op),
			tracing.MessagingMessageID.String(d.msg.MessageID),
		)
		if v.settle == settleDeadLetter {
			attrs = append(attrs, tracing.DeadLetterReason.String(v.reason))
		}
		span.SetAttributes(attrs...)
	}
	return func(err error) {
		if err != nil {
			span.SetStatus(codes.Error, op+" failed")
			if isLockLost(err) {
				span.SetAttributes(attribute.String("error.type", "lock_lost"))
			}
		}
		span.End()
	}
}

// abandonOptions carries d's process span context to the redelivery
// (tracing.PreviousAttemptProperty), so it links to this delivery's trace.
func (d *delivery) abandonOptions() *azservicebus.AbandonMessageOptions {
	if d.tr == nil || !d.tr.span.SpanContext().IsValid() {
		return nil
	}
	return &azservicebus.AbandonMessageOptions{PropertiesToModify: map[string]any{
		tracing.PreviousAttemptProperty: tracing.Traceparent(d.tr.span.SpanContext()),
	}}
}

// endProcess ends d's process span with its verdict, and records
// messaging.process.duration.
func (p *Processor) endProcess(d *delivery, v verdict) {
	elapsed := time.Since(d.received)
	opts := []metric.RecordOption{p.tr.metAttrs}
	if v.result != ResultProcessed && v.result != ResultDuplicate {
		opts = append(opts, metric.WithAttributes(attribute.String("error.type", string(v.result))))
	}
	p.tr.duration.Record(context.Background(), elapsed.Seconds(), opts...)
	if d.tr == nil {
		return
	}
	span := d.tr.span
	if !span.IsRecording() {
		span.End()
		return
	}
	attrs := []attribute.KeyValue{tracing.Outcome.String(string(v.result))}
	if d.claimID != 0 {
		attrs = append(attrs, tracing.ClaimID.Int64(d.claimID))
	}
	if d.handler.Name != "" {
		attrs = append(attrs, tracing.Route.String(d.handler.Name))
	}
	if v.settle == settleDeadLetter {
		attrs = append(attrs, tracing.DeadLetterReason.String(v.reason))
	}
	span.SetAttributes(attrs...)
	switch v.result {
	case ResultUnknown, ResultConflict, ResultDeadLettered, ResultFailed, ResultFlagged, ResultLost, ResultReleased:
		span.SetStatus(codes.Error, string(v.result))
	}
	span.End()
}
