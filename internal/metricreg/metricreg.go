// Package metricreg holds the processor's Prometheus collectors
// (ProcessorMetrics, behind package prommetrics: the processor itself
// records to small interfaces and links no metrics library) and registers
// collectors that several parts of one program may register on one
// registry: a processor and a reconciler in the same binary both count
// take-overs (sbclaim_takeovers_total, by path), and two processors share
// every processor metric. The second registration reuses the first
// collector instead of panicking.
package metricreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c with reg and returns the collector to use: c, or
// the identical collector registered before it. Any other registration
// error (a name reused with other labels or help) panics, as
// MustRegister does: it is a programming error.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	panic(err)
}
