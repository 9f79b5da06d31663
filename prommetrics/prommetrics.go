// Package prommetrics exports a processor's metrics to Prometheus:
//
//	reg := prometheus.NewRegistry()
//	p, err := sbclaim.NewProcessor(sbclaim.ProcessorConfig{..., Metrics: prommetrics.New(reg)})
//
// The metrics (sbclaim_messages_total, sbclaim_effect_duration_seconds,
// ...) are listed in docs/operating.md. The root package links no metrics
// library; a program imports this package, and the Prometheus client with
// it, only to export them.
package prommetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/bridge"
	"github.com/sbclaim/sbclaim/internal/metricreg"
)

// New creates a processor's metrics and registers them with reg. Several
// processors (and a reconciler's take-over counter, see
// operator.ReconcilerConfig) may register on one registry: they share its
// collectors. A nil reg creates them unregistered, like promauto.With(nil):
// recorded, but exported nowhere. A name registered on reg before with
// other labels or help panics, as prometheus.MustRegister does.
func New(reg prometheus.Registerer) *sbclaim.Metrics {
	return bridge.NewMetrics(metricreg.ProcessorMetrics(reg)).(*sbclaim.Metrics)
}
