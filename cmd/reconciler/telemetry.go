package main

import (
	"context"
	"time"

	"github.com/sbclaim/sbclaim/otelsetup"
)

// setupTelemetry installs OpenTelemetry from the OTEL_* variables (off
// unless an OTLP endpoint is set: otelsetup.Setup); the returned
// flush exports what is buffered, bounded, on the way out.
func setupTelemetry(ctx context.Context, getenv func(string) string) (on string, flush func(), err error) {
	on, shutdown, err := otelsetup.Setup(ctx, "sbclaim-reconciler", getenv)
	return on, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = shutdown(sctx)
	}, err
}
