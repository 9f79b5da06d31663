package reconciler

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/held"
)

// Metrics are the reconciler's Prometheus metrics. A nil *Metrics is valid
// and records nothing (tests and the chaos harness need none).
type Metrics struct {
	Flagged          prometheus.Counter
	Recovered        prometheus.Counter
	RecoveryAttempts *prometheus.CounterVec // outcome of each recovery attempt
	TakeOvers        *prometheus.CounterVec // path: reconciler (recovery), operator (redrive)
	Purged           prometheus.Counter
	TickDuration     prometheus.Histogram
	TickErrors       prometheus.Counter
	Unfinished       prometheus.Gauge
	OldestUnfinished prometheus.Gauge
	FlaggedNow       prometheus.Gauge
}

// NewMetrics creates the reconciler's metrics and registers them with reg
// (the binary passes its own registry, never the global one).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Flagged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sbclaim_reconciler_flagged_total",
			Help: "Claims the reconciler flagged for operators (what recovery cannot settle; every stale claim when recovery is off).",
		}),
		Recovered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sbclaim_reconciler_recovered_total",
			Help: "Stale claims the reconciler took over, re-ran with the same idempotency key and marked processed.",
		}),
		RecoveryAttempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sbclaim_reconciler_recovery_attempts_total",
			Help: "Recovery attempts by effect outcome (ok, retryable, unknown, permanent, ...).",
		}, []string{"outcome"}),
		TakeOvers: held.NewTakeOversCounter(),
		Purged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sbclaim_reconciler_purged_total",
			Help: "Finished claims deleted after the retention period.",
		}),
		TickDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sbclaim_reconciler_tick_duration_seconds",
			Help:    "Duration of reconciler ticks (flag pass, purge pass, stats).",
			Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 10), // 5ms .. ~19s
		}),
		TickErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sbclaim_reconciler_tick_errors_total",
			Help: "Reconciler ticks that failed.",
		}),
		Unfinished: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sbclaim_claims_unfinished",
			Help: "Claims claimed or released and not yet processed or flagged, at the last tick.",
		}),
		OldestUnfinished: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sbclaim_claims_oldest_unfinished_age_seconds",
			Help: "Age of the oldest unfinished claim by the database clock (0 when none), at the last tick.",
		}),
		FlaggedNow: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sbclaim_claims_flagged",
			Help: "Flagged claims waiting for an operator, at the last tick.",
		}),
	}
	reg.MustRegister(m.Flagged, m.Recovered, m.RecoveryAttempts, m.TakeOvers, m.Purged, m.TickDuration, m.TickErrors,
		m.Unfinished, m.OldestUnfinished, m.FlaggedNow)
	return m
}

func (m *Metrics) observeStats(s *claim.Stats) {
	if m == nil || s == nil {
		return
	}
	m.Unfinished.Set(float64(s.Claimed + s.Released))
	m.FlaggedNow.Set(float64(s.Flagged))
	age := 0.0
	if s.OldestUnfinished != nil {
		age = max(s.Now.Sub(*s.OldestUnfinished).Seconds(), 0)
	}
	m.OldestUnfinished.Set(age)
}
