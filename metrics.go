package sbclaim

import (
	"github.com/sbclaim/sbclaim/internal/bridge"
	"github.com/sbclaim/sbclaim/internal/processor"
)

func init() {
	bridge.NewMetrics = func(m *processor.Metrics) any { return &Metrics{m: m} }
}

// Metrics is where a processor records its metrics
// (ProcessorConfig.Metrics): sbclaim_messages_total and the others listed
// in docs/operating.md. Package prommetrics makes one that exports them to
// a Prometheus registry (prommetrics.New); a nil *Metrics records nothing.
// The root package links no metrics library of its own.
type Metrics struct {
	m *processor.Metrics
}

// internal returns the processor's instruments (nil: none).
func (m *Metrics) internal() *processor.Metrics {
	if m == nil {
		return nil
	}
	return m.m
}
