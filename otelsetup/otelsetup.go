// Package otelsetup installs OpenTelemetry's SDK and exporters (OTLP over
// gRPC or HTTP) from the standard OTEL_* environment variables. It is a
// package of its own so that the root package keeps only the OpenTelemetry
// API (spans and metrics cost nothing until a program installs an SDK) and
// a program that exports nothing links no exporter.
package otelsetup

import (
	"context"
	"os"

	"github.com/sbclaim/sbclaim/internal/telemetry"
)

// Setup installs OpenTelemetry as the ecosystem configures
// it, from the standard OTEL_* environment variables read through getenv
// (nil: os.Getenv): the OTLP exporter (OTEL_EXPORTER_OTLP_ENDPOINT,
// _PROTOCOL, the per-signal _TRACES_/_METRICS_ endpoints), the sampler
// (OTEL_TRACES_SAMPLER, _ARG), the resource (OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES; service defaults it) and OTEL_SDK_DISABLED.
// It is off unless an OTLP endpoint is set: then it installs nothing and
// the processor's and reconciler's spans cost nothing. It sets the global
// tracer and meter providers and the W3C trace-context propagator, which
// sbclaim.ProcessorConfig and the reconciler use unless given their own.
//
// on says what it turned on ("off", "traces (OTLP)", "metrics (OTLP)",
// "traces and metrics (OTLP)"), for a start-up log line; shutdown
// flushes and stops what it installed: call it on the way out, with a
// bounded context.
func Setup(ctx context.Context, service string, getenv func(string) string) (on string, shutdown func(context.Context) error, err error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	s, shutdown, err := telemetry.Setup(ctx, service, getenv)
	return s.String(), shutdown, err
}
