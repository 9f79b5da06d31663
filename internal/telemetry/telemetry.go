// Package telemetry installs OpenTelemetry in sbclaim's binaries the
// ecosystem's way: from the standard OTEL_* environment variables, read by
// the SDK and go.opentelemetry.io/contrib/exporters/autoexport (OTLP over
// http/protobuf or grpc: OTEL_EXPORTER_OTLP_PROTOCOL; OTEL_TRACES_SAMPLER,
// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, ...).
//
// It is off unless an OTLP endpoint is configured
// (OTEL_EXPORTER_OTLP_ENDPOINT, or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT for
// traces and OTEL_EXPORTER_OTLP_METRICS_ENDPOINT for metrics), and off
// whatever else is set when OTEL_SDK_DISABLED is true. Off, the global
// providers stay OpenTelemetry's no-op ones and sbclaim's spans cost next
// to nothing.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// Settings is what Setup decided from the environment.
type Settings struct {
	Traces, Metrics bool
}

// String says what is on, for the binary's start-up log line.
func (s Settings) String() string {
	switch {
	case s.Traces && s.Metrics:
		return "traces and metrics (OTLP)"
	case s.Traces:
		return "traces (OTLP)"
	case s.Metrics:
		return "metrics (OTLP)"
	}
	return "off"
}

// FromEnv decides what to turn on from getenv (see the package
// documentation).
func FromEnv(getenv func(string) string) Settings {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return Settings{}
	}
	any := getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
	return Settings{
		Traces:  (any || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "") && getenv("OTEL_TRACES_EXPORTER") != "none",
		Metrics: (any || getenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") != "") && getenv("OTEL_METRICS_EXPORTER") != "none",
	}
}

// Setup installs the global tracer and meter providers and the W3C trace
// context propagator as the environment asks (getenv decides what is on;
// the exporters read the process environment themselves). service is the
// default service.name (OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES
// override it). shutdown flushes and stops what was installed; call it on
// the way out, with a bounded context.
func Setup(ctx context.Context, service string, getenv func(string) string) (s Settings, shutdown func(context.Context) error, err error) {
	s = FromEnv(getenv)
	shutdown = func(context.Context) error { return nil }
	if !s.Traces && !s.Metrics {
		return s, shutdown, nil
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
		resource.WithTelemetrySDK(),
		resource.WithHost(),
	)
	if err != nil {
		return s, shutdown, fmt.Errorf("telemetry: resource: %w", err)
	}
	var downs []func(context.Context) error
	if s.Traces {
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return s, shutdown, fmt.Errorf("telemetry: span exporter (OTEL_EXPORTER_OTLP_*): %w", err)
		}
		// The sampler comes from OTEL_TRACES_SAMPLER and
		// OTEL_TRACES_SAMPLER_ARG (default parentbased_always_on).
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		otel.SetTracerProvider(tp)
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
		downs = append(downs, tp.Shutdown)
	}
	if s.Metrics {
		reader, err := autoexport.NewMetricReader(ctx)
		if err != nil {
			return s, shutdown, errors.Join(fmt.Errorf("telemetry: metric reader (OTEL_EXPORTER_OTLP_*): %w", err), down(ctx, downs))
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader), sdkmetric.WithResource(res))
		otel.SetMeterProvider(mp)
		downs = append(downs, mp.Shutdown)
	}
	return s, func(ctx context.Context) error { return down(ctx, downs) }, nil
}

func down(ctx context.Context, downs []func(context.Context) error) error {
	var errs []error
	for _, d := range downs {
		errs = append(errs, d(ctx))
	}
	return errors.Join(errs...)
}
