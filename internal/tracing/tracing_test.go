package tracing

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

var (
	producerTrace = "0af7651916cd43dd8448eb211c80319c"
	producerSpan  = "b7ad6b7169203331"
	producer      = "00-" + producerTrace + "-" + producerSpan + "-01"
)

func TestProducerContext(t *testing.T) {
	for _, tc := range []struct {
		name  string
		props map[string]any
		want  string // trace id, "" for none
	}{
		{"traceparent", map[string]any{"traceparent": producer}, producerTrace},
		{"Diagnostic-Id fallback", map[string]any{"Diagnostic-Id": producer}, producerTrace},
		{"traceparent wins", map[string]any{"traceparent": producer, "Diagnostic-Id": "00-11111111111111111111111111111111-2222222222222222-01"}, producerTrace},
		{"bytes", map[string]any{"traceparent": []byte(producer)}, producerTrace},
		{"garbage", map[string]any{"traceparent": "not a traceparent"}, ""},
		{"none", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := ProducerContext(&azservicebus.ReceivedMessage{ApplicationProperties: tc.props})
			got := ""
			if sc.IsValid() {
				got = sc.TraceID().String()
				if sc.SpanID().String() != producerSpan || !sc.IsRemote() {
					t.Errorf("span %s remote %t, want %s remote", sc.SpanID(), sc.IsRemote(), producerSpan)
				}
			}
			if got != tc.want {
				t.Errorf("trace %q, want %q", got, tc.want)
			}
		})
	}
	if sc := PreviousAttempt(&azservicebus.ReceivedMessage{ApplicationProperties: map[string]any{PreviousAttemptProperty: producer}}); sc.TraceID().String() != producerTrace {
		t.Errorf("PreviousAttempt = %v", sc)
	}
	if got := Traceparent(ProducerContext(&azservicebus.ReceivedMessage{ApplicationProperties: map[string]any{"traceparent": producer}})); got != producer {
		t.Errorf("Traceparent round trip = %q, want %q", got, producer)
	}
}

func TestLogHandlerAddsTraceIDs(t *testing.T) {
	var buf bytes.Buffer
	log := Logger(slog.New(slog.NewJSONHandler(&buf, nil))).With("consumer", "billing")
	if Logger(log) != log {
		t.Error("Logger wrapped a wrapped logger again")
	}
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("t").Start(context.Background(), "s")
	defer span.End()
	bound := WithSpan(log, span.SpanContext())
	_, child := tp.Tracer("t").Start(ctx, "child")
	defer child.End()

	log.InfoContext(ctx, "in span")
	log.Info("no span")
	bound.Info("bound")
	bound.InfoContext(trace.ContextWithSpan(context.Background(), child), "child wins")

	var lines []map[string]any
	for l := range strings.Lines(buf.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, m)
	}
	sc, cc := span.SpanContext(), child.SpanContext()
	want := []struct{ trace, span any }{
		{sc.TraceID().String(), sc.SpanID().String()},
		{nil, nil},
		{sc.TraceID().String(), sc.SpanID().String()},
		{cc.TraceID().String(), cc.SpanID().String()},
	}
	for i, w := range want {
		if lines[i]["trace_id"] != w.trace || lines[i]["span_id"] != w.span || lines[i]["consumer"] != "billing" {
			t.Errorf("line %d (%s): trace_id %v span_id %v consumer %v, want %v %v billing", i, lines[i]["msg"], lines[i]["trace_id"], lines[i]["span_id"], lines[i]["consumer"], w.trace, w.span)
		}
	}
}

// TestOff: a span is Off only when it neither records nor carries a valid
// context.
func TestOff(t *testing.T) {
	if !Off(trace.SpanFromContext(context.Background())) {
		t.Error("the context's missing span is not Off")
	}
	_, rec := sdktrace.NewTracerProvider().Tracer("t").Start(context.Background(), "s")
	_, out := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())).Tracer("t").Start(context.Background(), "s")
	if Off(rec) || Off(out) {
		t.Errorf("Off(recording) = %v, Off(sampled out) = %v, want false, false", Off(rec), Off(out))
	}
}
