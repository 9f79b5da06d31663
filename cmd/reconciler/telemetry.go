package main

import (
	"context"
	"time"

	"github.com/sbclaim/sbclaim/internal/telemetry"
)

// setupTelemetry installs OpenTelemetry from the OTEL_* variables (off
// unless an OTLP endpoint is set: internal/telemetry); the returned flush
// exports what is buffered, bounded, on the way out.
func setupTelemetry(ctx context.Context, getenv func(string) string) (telemetry.Settings, func(), error) {
	s, shutdown, err := telemetry.Setup(ctx, "sbclaim-reconciler", getenv)
	return s, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = shutdown(sctx)
	}, err
}
