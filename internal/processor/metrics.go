package processor

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Outcome is how the processor finished with one delivery of a message. It
// is the "outcome" label of sbclaim_messages_total and of each message's
// final log line.
type Outcome string

const (
	// OutcomeProcessed: claim won (or taken over), effect ok, claim marked
	// processed, message completed.
	OutcomeProcessed Outcome = "processed"
	// OutcomeDuplicate: another attempt holds or finished the claim; the
	// message was completed without running the effect.
	OutcomeDuplicate Outcome = "duplicate"
	// OutcomeConflict: same key, different payload; dead-lettered with
	// IdempotencyKeyConflict.
	OutcomeConflict Outcome = "conflict"
	// OutcomeReleased: the effect was definitely not performed and may
	// succeed later; claim released, message abandoned.
	OutcomeReleased Outcome = "released"
	// OutcomeDeadLettered: bad input, or an effect that can never succeed.
	OutcomeDeadLettered Outcome = "dead_lettered"
	// OutcomeUnknown: the effect's outcome is unknown after retries; the
	// claim is kept with its last error and the message abandoned. The
	// reconciler flags the claim.
	OutcomeUnknown Outcome = "unknown"
	// OutcomeAbandoned: nothing was claimed (store unavailable, shutdown);
	// the message was abandoned for redelivery.
	OutcomeAbandoned Outcome = "abandoned"
	// OutcomeFlagged: the effect ran but the reconciler had flagged the
	// claim in between; the claim stays flagged for an operator.
	OutcomeFlagged Outcome = "flagged"
	// OutcomeCrashed: a test hook stopped the attempt (chaos harness).
	OutcomeCrashed Outcome = "crashed"
)

// Metrics are the processor's Prometheus collectors.
type Metrics struct {
	Messages       *prometheus.CounterVec // outcome
	DeadLetters    *prometheus.CounterVec // reason
	EffectSeconds  *prometheus.HistogramVec
	LockRenewals   prometheus.Counter
	LockLosses     prometheus.Counter
	Heartbeats     prometheus.Counter
	ClaimsInFlight prometheus.Gauge
	Receivers      prometheus.Counter
}

// NewMetrics creates the collectors and registers them with reg (nil: not
// registered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sbclaim_messages_total",
			Help: "Messages finished, by outcome (processed, duplicate, conflict, released, dead_lettered, unknown, abandoned, flagged).",
		}, []string{"outcome"}),
		DeadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sbclaim_dead_letters_total",
			Help: "Messages dead-lettered by the processor, by DeadLetterReason.",
		}, []string{"reason"}),
		EffectSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sbclaim_effect_duration_seconds",
			Help:    "Time spent in an effect including retries, by route and effect outcome.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}, []string{"route", "outcome"}),
		LockRenewals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sbclaim_lock_renewals_total",
			Help: "Message locks renewed.",
		}),
		LockLosses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sbclaim_lock_losses_total",
			Help: "Message locks lost while the processor still held the message.",
		}),
		Heartbeats: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sbclaim_claim_heartbeats_total",
			Help: "Claim heartbeats written.",
		}),
		ClaimsInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sbclaim_claims_in_flight",
			Help: "Claims this replica holds whose effect is running.",
		}),
		Receivers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sbclaim_receivers_opened_total",
			Help: "Service Bus receivers opened (more than one means a receiver was recreated).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.Messages, m.DeadLetters, m.EffectSeconds, m.LockRenewals,
			m.LockLosses, m.Heartbeats, m.ClaimsInFlight, m.Receivers)
	}
	return m
}
