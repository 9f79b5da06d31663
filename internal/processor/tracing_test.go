package processor_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/sideeffects/routesfile"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
	"github.com/sbclaim/sbclaim/internal/tracing"
)

// recorder is an SDK tracer provider that keeps every ended span in
// memory (always-on sampler).
func recorder(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	return tp, sr
}

type spans []sdktrace.ReadOnlySpan

func (ss spans) named(name string) spans {
	var out spans
	for _, s := range ss {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func (ss spans) one(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	got := ss.named(name)
	if len(got) != 1 {
		var names []string
		for _, s := range ss {
			names = append(names, s.Name())
		}
		t.Fatalf("%d spans named %q, want 1; spans: %v", len(got), name, names)
	}
	return got[0]
}

func (ss spans) childrenOf(parent sdktrace.ReadOnlySpan) spans {
	var out spans
	for _, s := range ss {
		if s.Parent().SpanID() == parent.SpanContext().SpanID() && s.Parent().TraceID() == parent.SpanContext().TraceID() {
			out = append(out, s)
		}
	}
	return out
}

func spanAttr(s sdktrace.ReadOnlySpan, key attribute.Key) attribute.Value {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[attribute.Key]any) {
	t.Helper()
	for k, v := range want {
		got := spanAttr(s, k)
		if got.Type() == attribute.EMPTY {
			t.Errorf("span %q has no %s, want %v", s.Name(), k, v)
			continue
		}
		if g := got.String(); g != toString(v) {
			t.Errorf("span %q %s = %s, want %v", s.Name(), k, g, v)
		}
	}
}

func toString(v any) string {
	b, _ := json.Marshal(v)
	return strings.Trim(string(b), `"`)
}

func linksTo(s sdktrace.ReadOnlySpan, sc trace.SpanContext) bool {
	for _, l := range s.Links() {
		if l.SpanContext.TraceID() == sc.TraceID() && l.SpanContext.SpanID() == sc.SpanID() {
			return true
		}
	}
	return false
}

// TestTraceOfOneMessage: one message through the HTTP effect makes a
// process span (CONSUMER, linked to the producer's traceparent) with the
// claim, the effect attempt (its HTTP client span a child, whose
// traceparent the downstream receives), the outcome write (linked to its
// group-committed batch) and the settlement as children, each with the
// messaging attributes; no attribute carries the secret header or the
// URL's path or query; the log lines carry the trace.
func TestTraceOfOneMessage(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", membus.QueueOptions{})
	tp, sr := recorder(t)

	const secret = "sk-live-8d1e2f-secret"
	var (
		mu       sync.Mutex
		received http.Header
	)
	// The downstream is instrumented too: its server span must be a
	// child of the attempt's HTTP client span.
	srv := httptest.NewServer(otelhttp.NewHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		received = r.Header.Clone()
		mu.Unlock()
		time.Sleep(20 * time.Millisecond) // a downstream's latency, for the waterfall
		w.WriteHeader(http.StatusOK)
	}), "downstream", otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(propagation.TraceContext{}),
		otelhttp.WithSpanNameFormatter(func(string, *http.Request) string { return "downstream POST /charges" })))
	t.Cleanup(srv.Close)
	router, err := routesfile.Parse([]byte(`version: 1
routes:
  - name: payments
    match: {subject: "*"}
    url: "`+srv.URL+`/hooks/s3cret-path?code=k3y-in-query"
    headers:
      Authorization: {fromEnv: PAY_TOKEN}
`), func(k string) string {
		if k == "PAY_TOKEN" {
			return "Bearer " + secret
		}
		return ""
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	opts := b.options()
	opts.Router = router
	opts.TracerProvider = tp
	_, stop := b.start(opts)

	producer := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x0a, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
		SpanID:  trace.SpanID{0x0b, 1, 2, 3, 4, 5, 6, 7}, TraceFlags: trace.FlagsSampled, Remote: true,
	})
	b.send("pay-1", "payment", `{"amount":100}`, map[string]any{"traceparent": tracing.Traceparent(producer)})
	b.waitIdle()
	stop()

	all := spans(sr.Ended())
	proc := all.one(t, "process orders")
	if proc.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("process span kind %s, want consumer", proc.SpanKind())
	}
	if proc.Parent().IsValid() {
		t.Errorf("process span has parent %s; want a root linked to the producer", proc.Parent().SpanID())
	}
	if !linksTo(proc, producer) {
		t.Errorf("process span links %v, want one to the producer %s", proc.Links(), producer.SpanID())
	}
	c := b.claimOf("pay-1")
	wantAttrs(t, proc, map[attribute.Key]any{
		tracing.MessagingSystem: "servicebus", tracing.MessagingDestinationName: "orders",
		tracing.MessagingOperationType: "process", tracing.MessagingMessageID: "pay-1",
		tracing.ServiceBusDeliveryCount: 1, tracing.Consumer: "billing", tracing.Route: "payments",
		tracing.ClaimID: c.ID, tracing.Outcome: "processed",
	})

	kids := all.childrenOf(proc)
	claimSpan := kids.one(t, "claim")
	wantAttrs(t, claimSpan, map[attribute.Key]any{tracing.ClaimOutcome: "won", tracing.ClaimID: c.ID})
	attempt := kids.one(t, "effect attempt")
	wantAttrs(t, attempt, map[attribute.Key]any{tracing.Attempt: 1, tracing.EffectOutcome: "ok", tracing.ClaimID: c.ID, tracing.Route: "payments"})
	httpSpan := all.childrenOf(attempt).one(t, "POST")
	if httpSpan.SpanKind() != trace.SpanKindClient {
		t.Errorf("HTTP span kind %s, want client", httpSpan.SpanKind())
	}
	wantAttrs(t, httpSpan, map[attribute.Key]any{"http.request.method": "POST", "http.response.status_code": 200, "server.address": "127.0.0.1"})
	server := all.childrenOf(httpSpan).one(t, "downstream POST /charges")
	if server.SpanKind() != trace.SpanKindServer {
		t.Errorf("downstream span kind %s, want server", server.SpanKind())
	}
	mu.Lock()
	got := received.Get("traceparent")
	mu.Unlock()
	sent := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(t.Context(), propagation.HeaderCarrier{"Traceparent": {got}}))
	if sent.TraceID() != proc.SpanContext().TraceID() || sent.SpanID() != httpSpan.SpanContext().SpanID() {
		t.Errorf("downstream got traceparent %q; want the attempt's HTTP span %s in trace %s", got, httpSpan.SpanContext().SpanID(), proc.SpanContext().TraceID())
	}

	outcome := kids.one(t, "outcome processed")
	batch := all.one(t, "write outcomes")
	if !linksTo(outcome, batch.SpanContext()) || !linksTo(batch, outcome.SpanContext()) {
		t.Errorf("outcome span and its group-commit batch are not linked both ways: %v / %v", outcome.Links(), batch.Links())
	}
	settle := kids.one(t, "complete orders")
	if settle.SpanKind() != trace.SpanKindClient {
		t.Errorf("settle span kind %s, want client", settle.SpanKind())
	}
	wantAttrs(t, settle, map[attribute.Key]any{tracing.MessagingOperationType: "settle", tracing.ServiceBusDispositionStatus: "complete"})

	// Nothing secret in any span: the header from the environment, the
	// URL's path and query, the body.
	for _, s := range all {
		if s.SpanKind() == trace.SpanKindServer {
			continue // the downstream's own instrumentation, not sbclaim's
		}
		kvs := append([]attribute.KeyValue{}, s.Attributes()...)
		for _, e := range s.Events() {
			kvs = append(kvs, e.Attributes...)
		}
		for _, kv := range kvs {
			v := kv.Value.String()
			for _, bad := range []string{secret, "s3cret-path", "k3y-in-query", "/hooks", "amount"} {
				if strings.Contains(v, bad) {
					t.Errorf("span %q attribute %s = %q contains %q", s.Name(), kv.Key, v, bad)
				}
			}
		}
		if strings.Contains(s.Status().Description, "hooks") {
			t.Errorf("span %q status %q names the URL path", s.Name(), s.Status().Description)
		}
	}

	// The final log line carries the process span's trace.
	var finished bool
	for line := range strings.Lines(b.logs.String()) {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["msg"] != "message finished" {
			continue
		}
		finished = true
		if rec["trace_id"] != proc.SpanContext().TraceID().String() || rec["span_id"] != proc.SpanContext().SpanID().String() {
			t.Errorf("final log line trace_id %v span_id %v, want the process span's %s %s", rec["trace_id"], rec["span_id"],
				proc.SpanContext().TraceID(), proc.SpanContext().SpanID())
		}
	}
	if !finished {
		t.Error("no \"message finished\" log line")
	}
	if path := os.Getenv("SBCLAIM_TRACE_HTML"); path != "" {
		writeWaterfall(t, path, all, proc)
	}
}

// TestTraceTakeOverLinksFirstDelivery: a delivery whose effect was not
// performed releases its claim and abandons the message, leaving its
// traceparent on it; the redelivery's take-over span (and its process
// span) link to the first delivery's trace.
func TestTraceTakeOverLinksFirstDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", membus.QueueOptions{})
	tp, sr := recorder(t)
	b.eff.behave = func(_, _ string, call int) error {
		if call == 1 {
			return sideeffects.Retryable(errors.New("503 from downstream"))
		}
		return nil
	}
	opts := b.options()
	opts.TracerProvider = tp
	opts.NoDeferral = true // the abandon path: the redelivery takes the claim over
	_, stop := b.start(opts)
	b.send("k-1", "", "x", nil)
	b.waitIdle()
	stop()

	all := spans(sr.Ended())
	procs := all.named("process orders")
	if len(procs) != 2 {
		t.Fatalf("%d process spans, want 2 (the first delivery and its redelivery)", len(procs))
	}
	first, second := procs[0], procs[1]
	if spanAttr(first, tracing.ServiceBusDeliveryCount).AsInt64() != 1 {
		first, second = second, first
	}
	wantAttrs(t, first, map[attribute.Key]any{tracing.Outcome: "released"})
	wantAttrs(t, second, map[attribute.Key]any{tracing.Outcome: "processed", tracing.ServiceBusDeliveryCount: 2})
	all.childrenOf(first).one(t, "abandon orders")
	all.childrenOf(first).one(t, "outcome released")
	take := all.childrenOf(second).one(t, "takeover")
	if !linksTo(take, first.SpanContext()) {
		t.Errorf("take-over span links %v, want one to the first delivery's process span %s", take.Links(), first.SpanContext().SpanID())
	}
	if !linksTo(second, first.SpanContext()) {
		t.Errorf("redelivery's process span links %v, want one to the first delivery's", second.Links())
	}
	wantAttrs(t, take, map[attribute.Key]any{tracing.TakeOverPath: "redelivery", tracing.ClaimState: "claimed"})
	if first.SpanContext().TraceID() == second.SpanContext().TraceID() {
		t.Error("both deliveries in one trace; want a trace each, linked")
	}
}

// TestTraceDeadLetterReason: the settle span of a dead-lettered message
// says why.
func TestTraceDeadLetterReason(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", membus.QueueOptions{})
	tp, sr := recorder(t)
	opts := b.options()
	opts.TracerProvider = tp
	_, stop := b.start(opts)
	b.send("dl-1", "noroute", "x", nil)
	b.waitIdle()
	stop()

	all := spans(sr.Ended())
	proc := all.one(t, "process orders")
	settle := all.childrenOf(proc).one(t, "dead_letter orders")
	wantAttrs(t, settle, map[attribute.Key]any{
		tracing.DeadLetterReason: sideeffects.ReasonNoRoute, tracing.ServiceBusDispositionStatus: "dead_letter",
		tracing.MessagingOperationName: "dead_letter",
	})
	wantAttrs(t, proc, map[attribute.Key]any{tracing.DeadLetterReason: sideeffects.ReasonNoRoute, tracing.Outcome: string(processor.ResultDeadLettered)})
}
