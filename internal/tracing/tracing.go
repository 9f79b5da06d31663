package tracing

import (
	"context"
	"fmt"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of sbclaim's spans and metrics.
const ScopeName = "github.com/sbclaim/sbclaim"

// Tracer returns sbclaim's tracer from tp, or from the global provider when
// tp is nil.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(ScopeName)
}

// Messaging semantic-convention attribute keys (OpenTelemetry semantic
// conventions, messaging spans and Azure Service Bus).
const (
	MessagingSystem             = attribute.Key("messaging.system")
	MessagingDestinationName    = attribute.Key("messaging.destination.name")
	MessagingSubscriptionName   = attribute.Key("messaging.destination.subscription.name")
	MessagingOperationType      = attribute.Key("messaging.operation.type")
	MessagingOperationName      = attribute.Key("messaging.operation.name")
	MessagingMessageID          = attribute.Key("messaging.message.id")
	MessagingBatchMessageCount  = attribute.Key("messaging.batch.message_count")
	ServiceBusDeliveryCount     = attribute.Key("messaging.servicebus.message.delivery_count")
	ServiceBusDispositionStatus = attribute.Key("messaging.servicebus.disposition_status")
	ServiceBusEnqueuedTime      = attribute.Key("messaging.servicebus.message.enqueued_time")
)

// sbclaim's own attribute keys.
const (
	ClaimID          = attribute.Key("sbclaim.claim.id")
	ClaimOutcome     = attribute.Key("sbclaim.claim.outcome") // won, duplicate, conflict
	ClaimState       = attribute.Key("sbclaim.claim.state")
	Consumer         = attribute.Key("sbclaim.consumer")
	Route            = attribute.Key("sbclaim.route")
	Outcome          = attribute.Key("sbclaim.outcome") // the delivery's result (processed, duplicate, ...)
	EffectOutcome    = attribute.Key("sbclaim.effect.outcome")
	Attempt          = attribute.Key("sbclaim.effect.attempt")
	DeadLetterReason = attribute.Key("sbclaim.dead_letter.reason")
	TakeOverPath     = attribute.Key("sbclaim.takeover.path")
	PreviousHolder   = attribute.Key("sbclaim.takeover.previous_holder")
	OutcomeWrite     = attribute.Key("sbclaim.outcome_write") // processed, released, failed, ...
	Pass             = attribute.Key("sbclaim.reconciler.pass")
	Count            = attribute.Key("sbclaim.count")
)

// System is messaging.system for Azure Service Bus.
var System = MessagingSystem.String("servicebus")

// Destination returns the destination attributes of an entity: a queue
// name, or "topic/subscription".
func Destination(entity string) []attribute.KeyValue {
	if topic, sub, ok := strings.Cut(entity, "/"); ok {
		return []attribute.KeyValue{MessagingDestinationName.String(topic), MessagingSubscriptionName.String(sub)}
	}
	return []attribute.KeyValue{MessagingDestinationName.String(entity)}
}

// DestinationName is the name in span names: the queue or topic.
func DestinationName(entity string) string {
	topic, _, _ := strings.Cut(entity, "/")
	return topic
}

// PreviousAttemptProperty is the application property a delivery that
// abandons its message sets to its process span's traceparent, so the
// redelivery (which may take its claim over) links to its trace.
const PreviousAttemptProperty = "sbclaim-traceparent"

var traceContext = propagation.TraceContext{}

// ProducerContext is the producer's span context carried by msg: its
// traceparent (and tracestate) application properties, else its
// Diagnostic-Id (the Azure SDKs' name for the same traceparent). It is
// invalid when the message carries neither, or an unparsable value.
func ProducerContext(msg *azservicebus.ReceivedMessage) trace.SpanContext {
	if msg == nil {
		return trace.SpanContext{}
	}
	if sc := fromProperty(msg, "traceparent", "tracestate"); sc.IsValid() {
		return sc
	}
	return fromProperty(msg, "Diagnostic-Id", "")
}

// PreviousAttempt is the span context of the delivery that abandoned msg
// last (PreviousAttemptProperty), invalid when none did.
func PreviousAttempt(msg *azservicebus.ReceivedMessage) trace.SpanContext {
	if msg == nil {
		return trace.SpanContext{}
	}
	return fromProperty(msg, PreviousAttemptProperty, "")
}

func fromProperty(msg *azservicebus.ReceivedMessage, parent, state string) trace.SpanContext {
	v, ok := msg.ApplicationProperties[parent]
	if !ok {
		return trace.SpanContext{}
	}
	carrier := propagation.MapCarrier{"traceparent": text(v)}
	if state != "" {
		if s, ok := msg.ApplicationProperties[state]; ok {
			carrier["tracestate"] = text(s)
		}
	}
	return trace.SpanContextFromContext(traceContext.Extract(context.Background(), carrier))
}

// Traceparent renders sc as a W3C traceparent ("" when invalid).
func Traceparent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	traceContext.Inject(trace.ContextWithSpanContext(context.Background(), sc), carrier)
	return carrier["traceparent"]
}

func text(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return fmt.Sprint(v)
}

// Links returns a link to each valid span context, with its kind as the
// sbclaim.link attribute ("producer", "previous_attempt", ...).
func Links(kinds []string, scs ...trace.SpanContext) []trace.Link {
	var links []trace.Link
	for i, sc := range scs {
		if sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attribute.String("sbclaim.link", kinds[i])}})
		}
	}
	return links
}
