package metricreg

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sbclaim/sbclaim/internal/processor"
)

// processorCollectors are the Prometheus collectors behind processor.Metrics.
type processorCollectors struct {
	Messages              *prometheus.CounterVec
	DeadLetters           *prometheus.CounterVec
	EffectSeconds         *prometheus.HistogramVec
	TakeOvers             *prometheus.CounterVec
	LockRenewals          prometheus.Counter
	LockRenewalFailures   prometheus.Counter
	LockLosses            prometheus.Counter
	Heartbeats            prometheus.Counter
	HeartbeatFailures     prometheus.Counter
	DuplicateWaits        prometheus.Counter
	LateEffects           prometheus.Counter
	ClaimsInFlight        prometheus.Gauge
	Receivers             prometheus.Counter
	StoreBreakerOpen      prometheus.Gauge
	StoreBreakerTrips     *prometheus.CounterVec
	BrokerReachable       prometheus.Gauge
	Postponed             *prometheus.CounterVec
	DeferredDue           prometheus.Gauge
	DeferredFetches       *prometheus.CounterVec
	StrandedMessages      *prometheus.CounterVec
	RouteBreakerOpen      *prometheus.GaugeVec
	RouteBreakerTrips     *prometheus.CounterVec
	FollowUpsPending      prometheus.Gauge
	FollowUpOldestSeconds prometheus.Gauge
	FollowUpSends         *prometheus.CounterVec
	FollowUpResends       prometheus.Counter
	SessionsHeld          prometheus.Gauge
}

// ProcessorMetrics creates the processor's collectors, registers them
// with reg (nil: not registered, for tests) and returns the processor's
// instruments backed by them. The names, labels and help texts are the
// ones docs/operating.md, the alerts and the dashboards use.
func ProcessorMetrics(reg prometheus.Registerer) *processor.Metrics {
	m := &processorCollectors{
		Messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sbclaim_messages_total",
			Help: "Messages finished, by outcome (processed, duplicate, conflict, released, dead_lettered, failed, unknown, abandoned, lost, flagged).",
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
		TakeOvers: NewTakeOversCounter(),
		LockRenewals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sbclaim_lock_renewals_total",
			Help: "Message locks renewed.",
		}),
		LockRenewalFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sbclaim_lock_renewal_failures_total",
			Help: "Message lock renewals that failed for another reason than a lost lock (retried before the lock expires).",
		}),
		LockLosses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sbclaim_lock_losses_total",
			Help: "Message locks lost while the processor still held the message.",
		}),
		Heartbeats: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sbclaim_claim_heartbeats_total",
			Help: "Claim heartbeats written.",
		}),
		HeartbeatFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sbclaim_claim_heartbeat_failures_total",
			Help: "Claim heartbeats that could not be written (the claim lost, or the store failing).",
		}),
		DuplicateWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sbclaim_duplicate_waits_total",
			Help: "Deliveries that found their claim held by a live attempt and waited for its outcome.",
		}),
		LateEffects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sbclaim_late_effects_total",
			Help: "Effects that succeeded after their claim was lost (taken over, flagged or resolved meanwhile); noted on the claim.",
		}),
		ClaimsInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sbclaim_claims_in_flight",
			Help: "Claims this replica holds whose effect is running.",
		}),
		Receivers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sbclaim_receivers_opened_total",
			Help: "Service Bus receivers opened (more than one means a receiver was recreated).",
		}),
		StoreBreakerOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sbclaim_store_breaker_open",
			Help: "1 while the claim store refuses work store-wide and receiving is paused.",
		}),
		StoreBreakerTrips: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sbclaim_store_breaker_trips_total",
			Help: "Times receiving was paused because the claim store refused work, by failure class (connection, busy, failover, timeout, read_only, no_space, permission).",
		}, []string{"class"}),
		BrokerReachable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sbclaim_servicebus_reachable",
			Help: "1 while Service Bus answered the last receive or probe.",
		}),
		Postponed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sbclaim_postponed_total",
			Help: "Messages deferred for a delayed retry (their effect not performed, or unknown on a recovery-auto route), by route.",
		}, []string{"route"}),
		DeferredDue: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sbclaim_deferred_claims_due",
			Help: "Claims of this consumer whose deferred message was due at the last poll (at most one page).",
		}),
		DeferredFetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sbclaim_deferred_fetches_total",
			Help: "Due claims this replica tried to take and fetch, by result (fetched, guard: another replica took it first, gone: the message was not deferred any more, unsure: not found while its previous holder may still lock it, looked for again after the lock duration, error).",
		}, []string{"result"}),
		StrandedMessages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sbclaim_stranded_messages_total",
			Help: "Deferred messages of finished claims that a replica fetched and settled after their holder died before settling them, by result (fetched: fetched to be settled, gone: nothing left to settle, guard: another replica took it first, error).",
		}, []string{"result"}),
		RouteBreakerOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sbclaim_route_breaker_open",
			Help: "1 while the route's breaker is open: its messages are postponed without calling the effect, one probe at a time let through.",
		}, []string{"route"}),
		RouteBreakerTrips: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sbclaim_route_breaker_trips_total",
			Help: "Times a route's breaker opened, by route and reason (failures: failing deliveries in a row; probe: a probe failed; config: a configuration answer such as 401).",
		}, []string{"route", "reason"}),
		FollowUpsPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sbclaim_followups_pending",
			Help: "Follow-up messages recorded and not yet sent (the outbox), at the relay's last sweep.",
		}),
		FollowUpOldestSeconds: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sbclaim_followup_oldest_pending_seconds",
			Help: "Age of the oldest follow-up message not yet sent, at the relay's last sweep (0: none).",
		}),
		FollowUpSends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sbclaim_followup_sends_total",
			Help: "Follow-up messages sent by the relay, by result (sent; failed: Service Bus refused it, retried with backoff; unmarked: sent, but its mark failed or its lease was lost: sent again with the same MessageId).",
		}, []string{"result"}),
		FollowUpResends: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sbclaim_followup_resends_total",
			Help: "Follow-up messages sent again after an earlier lease of them (a crash, a failed send or mark): the same MessageId, which duplicate detection drops.",
		}),
		SessionsHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sbclaim_sessions_held",
			Help: "Sessions this processor holds for an operator: a claim of theirs failed or was flagged on a route with HoldSessionOnFailure.",
		}),
	}
	if reg != nil {
		// Shared with other processors (and the reconciler's take-overs)
		// registered on the same registry: see metricreg.
		m.Messages = Register(reg, m.Messages)
		m.DeadLetters = Register(reg, m.DeadLetters)
		m.EffectSeconds = Register(reg, m.EffectSeconds)
		m.TakeOvers = Register(reg, m.TakeOvers)
		m.LockRenewals = Register(reg, m.LockRenewals)
		m.LockRenewalFailures = Register(reg, m.LockRenewalFailures)
		m.LockLosses = Register(reg, m.LockLosses)
		m.Heartbeats = Register(reg, m.Heartbeats)
		m.HeartbeatFailures = Register(reg, m.HeartbeatFailures)
		m.DuplicateWaits = Register(reg, m.DuplicateWaits)
		m.LateEffects = Register(reg, m.LateEffects)
		m.ClaimsInFlight = Register(reg, m.ClaimsInFlight)
		m.Receivers = Register(reg, m.Receivers)
		m.StoreBreakerOpen = Register(reg, m.StoreBreakerOpen)
		m.StoreBreakerTrips = Register(reg, m.StoreBreakerTrips)
		m.BrokerReachable = Register(reg, m.BrokerReachable)
		m.Postponed = Register(reg, m.Postponed)
		m.DeferredDue = Register(reg, m.DeferredDue)
		m.DeferredFetches = Register(reg, m.DeferredFetches)
		m.StrandedMessages = Register(reg, m.StrandedMessages)
		m.RouteBreakerOpen = Register(reg, m.RouteBreakerOpen)
		m.RouteBreakerTrips = Register(reg, m.RouteBreakerTrips)
		m.FollowUpsPending = Register(reg, m.FollowUpsPending)
		m.FollowUpOldestSeconds = Register(reg, m.FollowUpOldestSeconds)
		m.FollowUpSends = Register(reg, m.FollowUpSends)
		m.FollowUpResends = Register(reg, m.FollowUpResends)
		m.SessionsHeld = Register(reg, m.SessionsHeld)
	}
	return m.instruments()
}

// instruments are m as the processor's instruments.
func (m *processorCollectors) instruments() *processor.Metrics {
	return &processor.Metrics{
		Messages:              counterVec{m.Messages},
		DeadLetters:           counterVec{m.DeadLetters},
		EffectSeconds:         histogramVec2{m.EffectSeconds},
		TakeOvers:             counterVec{m.TakeOvers},
		LockRenewals:          m.LockRenewals,
		LockRenewalFailures:   m.LockRenewalFailures,
		LockLosses:            m.LockLosses,
		Heartbeats:            m.Heartbeats,
		HeartbeatFailures:     m.HeartbeatFailures,
		DuplicateWaits:        m.DuplicateWaits,
		LateEffects:           m.LateEffects,
		ClaimsInFlight:        m.ClaimsInFlight,
		Receivers:             m.Receivers,
		StoreBreakerOpen:      m.StoreBreakerOpen,
		StoreBreakerTrips:     counterVec{m.StoreBreakerTrips},
		BrokerReachable:       m.BrokerReachable,
		Postponed:             counterVec{m.Postponed},
		DeferredDue:           m.DeferredDue,
		DeferredFetches:       counterVec{m.DeferredFetches},
		StrandedMessages:      counterVec{m.StrandedMessages},
		RouteBreakerOpen:      gaugeVec{m.RouteBreakerOpen},
		RouteBreakerTrips:     counterVec2{m.RouteBreakerTrips},
		FollowUpsPending:      m.FollowUpsPending,
		FollowUpOldestSeconds: m.FollowUpOldestSeconds,
		FollowUpSends:         counterVec{m.FollowUpSends},
		FollowUpResends:       m.FollowUpResends,
		SessionsHeld:          m.SessionsHeld,
	}
}

// The label families as the processor's instruments: each With makes the
// one WithLabelValues call the processor made before it had its own
// interfaces.
type (
	counterVec    struct{ v *prometheus.CounterVec }
	counterVec2   struct{ v *prometheus.CounterVec }
	gaugeVec      struct{ v *prometheus.GaugeVec }
	histogramVec2 struct{ v *prometheus.HistogramVec }
)

func (f counterVec) With(l string) processor.Counter        { return f.v.WithLabelValues(l) }
func (f counterVec2) With(a, b string) processor.Counter    { return f.v.WithLabelValues(a, b) }
func (f gaugeVec) With(l string) processor.Gauge            { return f.v.WithLabelValues(l) }
func (f histogramVec2) With(a, b string) processor.Observer { return f.v.WithLabelValues(a, b) }

// NewTakeOversCounter is sbclaim_takeovers_total, by path (redelivery,
// reconciler, operator): the processor counts redeliveries, the reconciler
// its recoveries and operators' redrives.
func NewTakeOversCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sbclaim_takeovers_total",
		Help: "Claims taken over from their previous holder, by path (redelivery, reconciler, operator).",
	}, []string{"path"})
}
