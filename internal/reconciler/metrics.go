package reconciler

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/metricreg"
)

// Metrics are the reconciler's Prometheus metrics. A nil *Metrics is valid
// and records nothing (tests and the chaos harness need none).
type Metrics struct {
	Flagged          prometheus.Counter
	Recovered        prometheus.Counter
	Failed           prometheus.Counter     // recoveries that got a final answer: claim failed
	RecoveryAttempts *prometheus.CounterVec // outcome of each recovery attempt
	TakeOvers        *prometheus.CounterVec // path: reconciler (recovery), operator (redrive)
	Purged           prometheus.Counter
	TickDuration     prometheus.Histogram
	TickErrors       prometheus.Counter
	Unfinished       prometheus.Gauge
	OldestUnfinished prometheus.Gauge
	FlaggedNow       prometheus.Gauge
	FailedNow        prometheus.Gauge
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
		Failed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sbclaim_reconciler_failed_total",
			Help: "Stale claims whose re-run got a final answer that is not a success (rejected, permanent, conflict): failed, not flagged.",
		}),
		RecoveryAttempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sbclaim_reconciler_recovery_attempts_total",
			Help: "Recovery attempts by effect outcome (ok, retryable, unknown, permanent, ...).",
		}, []string{"outcome"}),
		TakeOvers: metricreg.NewTakeOversCounter(),
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
		FailedNow: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sbclaim_claims_failed",
			Help: "Failed claims (a final answer: rejected, permanent, conflict) not yet purged, at the last tick.",
		}),
	}
	// The take-over counter is the processors' too when they share reg.
	m.Flagged = metricreg.Register(reg, m.Flagged)
	m.Recovered = metricreg.Register(reg, m.Recovered)
	m.Failed = metricreg.Register(reg, m.Failed)
	m.RecoveryAttempts = metricreg.Register(reg, m.RecoveryAttempts)
	m.TakeOvers = metricreg.Register(reg, m.TakeOvers)
	m.Purged = metricreg.Register(reg, m.Purged)
	m.TickDuration = metricreg.Register(reg, m.TickDuration)
	m.TickErrors = metricreg.Register(reg, m.TickErrors)
	m.Unfinished = metricreg.Register(reg, m.Unfinished)
	m.OldestUnfinished = metricreg.Register(reg, m.OldestUnfinished)
	m.FlaggedNow = metricreg.Register(reg, m.FlaggedNow)
	m.FailedNow = metricreg.Register(reg, m.FailedNow)
	return m
}

func (m *Metrics) observeStats(s *claim.Stats) {
	if m == nil || s == nil {
		return
	}
	m.Unfinished.Set(float64(s.Claimed + s.Released))
	m.FlaggedNow.Set(float64(s.Flagged))
	m.FailedNow.Set(float64(s.Failed))
	age := 0.0
	if s.OldestUnfinished != nil {
		age = max(s.Now.Sub(*s.OldestUnfinished).Seconds(), 0)
	}
	m.OldestUnfinished.Set(age)
}
