package tracinghttp

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbclaim/sbclaim/internal/tracing"
)

// TestTransportScrubs: the client span keeps the method, host, port,
// scheme and status, never the path, query, headers or an error text;
// the request carries the client span's traceparent.
func TestTransportScrubs(t *testing.T) {
	var got string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Get("traceparent")
		w.WriteHeader(http.StatusTeapot)
	}))
	defer srv.Close()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	ctx, parent := tp.Tracer("t").Start(context.Background(), "attempt")
	client := &http.Client{Transport: Transport(nil)}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/hook/s3cret?code=k3y", strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// A failing request: its error quotes the URL.
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1:1/hook/s3cret?code=k3y", nil)
	if _, err := client.Do(req); err == nil {
		t.Fatal("request to port 1 succeeded")
	}
	parent.End()

	var spans []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == "POST" {
			spans = append(spans, s)
		}
	}
	if len(spans) != 2 {
		t.Fatalf("%d POST spans, want 2", len(spans))
	}
	ok := spans[0]
	if ok.Parent().SpanID() != parent.SpanContext().SpanID() || ok.SpanKind() != trace.SpanKindClient {
		t.Errorf("HTTP span parent %s kind %s, want the attempt, client", ok.Parent().SpanID(), ok.SpanKind())
	}
	if !strings.Contains(got, ok.SpanContext().SpanID().String()) {
		t.Errorf("downstream got traceparent %q, want the HTTP span %s", got, ok.SpanContext().SpanID())
	}
	keys := map[attribute.Key]bool{}
	for _, s := range spans {
		for _, kv := range s.Attributes() {
			keys[kv.Key] = true
			if v := kv.Value.String(); strings.Contains(v, "s3cret") || strings.Contains(v, "k3y") || strings.Contains(v, "tok") {
				t.Errorf("attribute %s = %q leaks the URL or a header", kv.Key, v)
			}
		}
		if d := s.Status().Description; strings.Contains(d, "s3cret") {
			t.Errorf("status %q leaks the URL", d)
		}
		for _, e := range s.Events() {
			t.Errorf("event %q recorded (an error text may quote the URL)", e.Name)
		}
	}
	for _, k := range []attribute.Key{"http.request.method", "http.response.status_code", "server.address", "server.port"} {
		if !keys[k] {
			t.Errorf("no %s on the HTTP spans", k)
		}
	}
	if keys["url.full"] || keys["url.path"] || keys["url.query"] {
		t.Error("url.full, url.path or url.query kept")
	}
}

// seenRequest is a base transport that keeps the request it was given.
type seenRequest struct{ got *http.Request }

func (s *seenRequest) RoundTrip(r *http.Request) (*http.Response, error) {
	s.got = r
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
}

// TestTransportSkipsOtelhttpWhenOff: with no span in the request's
// context and no global provider installed (these tests install none), the
// request goes to the base transport as it is — otelhttp, which clones
// it, is skipped; a request inside a span (recording, or sampled out with
// a valid context) still goes through otelhttp and carries a traceparent.
func TestTransportSkipsOtelhttpWhenOff(t *testing.T) {
	if tracing.GlobalTracing() {
		t.Fatal("a global tracer provider is installed in this test binary")
	}
	base := &seenRequest{}
	client := &http.Client{Transport: Transport(base)}
	send := func(ctx context.Context) *http.Request {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://downstream.invalid/x", nil)
		resp, err := client.Transport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if base.got == nil {
			t.Fatal("the base transport saw no request")
		}
		if base.got == req {
			return req
		}
		return nil
	}
	if send(context.Background()) == nil {
		t.Error("no span: the request was cloned (went through otelhttp)")
	}
	if base.got.Header.Get("traceparent") != "" {
		t.Errorf("no span: traceparent %q sent", base.got.Header.Get("traceparent"))
	}
	for name, tp := range map[string]*sdktrace.TracerProvider{
		"recording":   sdktrace.NewTracerProvider(),
		"sampled out": sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())),
	} {
		ctx, span := tp.Tracer("t").Start(context.Background(), "attempt")
		if send(ctx) != nil {
			t.Errorf("%s span: the request skipped otelhttp", name)
		}
		if !strings.Contains(base.got.Header.Get("traceparent"), span.SpanContext().TraceID().String()) {
			t.Errorf("%s span: traceparent %q, want trace %s", name, base.got.Header.Get("traceparent"), span.SpanContext().TraceID())
		}
		span.End()
	}
}
