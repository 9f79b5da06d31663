package telemetry

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want Settings
	}{
		{"nothing set: off", nil, Settings{}},
		{"endpoint: both", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, Settings{Traces: true, Metrics: true}},
		{"traces endpoint only", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, Settings{Traces: true}},
		{"metrics endpoint only", map[string]string{"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4318/v1/metrics"}, Settings{Metrics: true}},
		{"disabled wins", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"}, Settings{}},
		{"exporter none", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, Settings{Metrics: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := FromEnv(env(tc.env)); got != tc.want {
				t.Errorf("FromEnv = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestSetupOffLeavesGlobals(t *testing.T) {
	before := otel.GetTracerProvider()
	s, shutdown, err := Setup(t.Context(), "sbclaim-test", env(nil))
	if err != nil || s.Traces || s.Metrics {
		t.Fatalf("Setup = %+v, %v; want off", s, err)
	}
	if otel.GetTracerProvider() != before {
		t.Error("Setup off replaced the global tracer provider")
	}
	if err := shutdown(t.Context()); err != nil {
		t.Error(err)
	}
}

func TestSetupOnInstallsSDK(t *testing.T) {
	// The exporter connects lazily: an endpoint nobody listens on is fine
	// until the first export, and shutdown is bounded by its context.
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_SERVICE_NAME", "")
	before := otel.GetTracerProvider()
	t.Cleanup(func() { otel.SetTracerProvider(before) })
	s, shutdown, err := Setup(t.Context(), "sbclaim-test", env(map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1"}))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Traces || s.Metrics {
		t.Fatalf("Setup = %+v, want traces only", s)
	}
	if _, ok := otel.GetTracerProvider().(*sdktrace.TracerProvider); !ok {
		t.Fatalf("global tracer provider is %T, want the SDK's", otel.GetTracerProvider())
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // nothing to flush; do not wait for the dead endpoint
	_ = shutdown(ctx)
}
