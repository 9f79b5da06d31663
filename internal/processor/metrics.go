package processor

// The instruments the processor records to, as small as its call sites
// need: a labelled family takes its label values as fixed arguments, so a
// call passes strings, not a variadic slice, through the interface (the
// adapter makes the one call the Prometheus client would have had).
type (
	// Counter only goes up.
	Counter interface{ Inc() }
	// Gauge is set, or moved by one.
	Gauge interface {
		Set(v float64)
		Inc()
		Dec()
	}
	// Observer records a sample (a histogram's).
	Observer interface{ Observe(v float64) }
	// CounterVec is a family of counters by one label.
	CounterVec interface{ With(label string) Counter }
	// CounterVec2 is a family of counters by two labels.
	CounterVec2 interface{ With(a, b string) Counter }
	// GaugeVec is a family of gauges by one label.
	GaugeVec interface{ With(label string) Gauge }
	// HistogramVec2 is a family of histograms by two labels.
	HistogramVec2 interface{ With(a, b string) Observer }
)

// Metrics are the processor's instruments, by the names of their
// Prometheus metrics in internal/metricreg (ProcessorMetrics), or
// NopMetrics; every field is set. The processor never imports a metrics
// library itself, so a program that exports none links none.
type Metrics struct {
	Messages            CounterVec    // outcome
	DeadLetters         CounterVec    // reason
	EffectSeconds       HistogramVec2 // route, outcome
	TakeOvers           CounterVec    // path
	LockRenewals        Counter
	LockRenewalFailures Counter
	LockLosses          Counter
	Heartbeats          Counter
	HeartbeatFailures   Counter
	DuplicateWaits      Counter
	LateEffects         Counter
	ClaimsInFlight      Gauge
	Receivers           Counter
	StoreBreakerOpen    Gauge
	StoreBreakerTrips   CounterVec // class
	BrokerReachable     Gauge
	// Delayed retries: postponements by route, the due claims the last
	// poll found, and what became of each fetch of a deferred message
	// (fetched, guard: another replica took it first, gone, error).
	Postponed       CounterVec // route
	DeferredDue     Gauge
	DeferredFetches CounterVec // result
	// Stranded deferred messages: finished claims whose fetched message
	// was never settled (its holder died), by result.
	StrandedMessages CounterVec // result
	// A breaker per route: open (1) or closed (0), and its trips by
	// reason (failures, probe, config).
	RouteBreakerOpen  GaugeVec    // route
	RouteBreakerTrips CounterVec2 // route, reason
	// The outbox (outbox.go): follow-ups pending in the store and the age
	// of the oldest (the sweep's last look), sends by result (sent,
	// failed, lost: sent but the lease was lost before the mark), and
	// resends (a send of a follow-up leased before: the earlier send may
	// have reached Service Bus, which drops the copy by its MessageId).
	FollowUpsPending      Gauge
	FollowUpOldestSeconds Gauge
	FollowUpSends         CounterVec // result
	FollowUpResends       Counter
	// Session mode: sessions held for an operator now (a failure on a
	// route with HoldSessionOnFailure).
	SessionsHeld Gauge
}

// NopMetrics records nothing (a processor configured without metrics).
func NopMetrics() *Metrics {
	var (
		c  nop
		v  nopCounterVec
		v2 nopCounterVec2
	)
	return &Metrics{
		Messages: v, DeadLetters: v, EffectSeconds: nopHistogramVec2{}, TakeOvers: v,
		LockRenewals: c, LockRenewalFailures: c, LockLosses: c, Heartbeats: c, HeartbeatFailures: c,
		DuplicateWaits: c, LateEffects: c, ClaimsInFlight: c, Receivers: c,
		StoreBreakerOpen: c, StoreBreakerTrips: v, BrokerReachable: c,
		Postponed: v, DeferredDue: c, DeferredFetches: v, StrandedMessages: v,
		RouteBreakerOpen: nopGaugeVec{}, RouteBreakerTrips: v2,
		FollowUpsPending: c, FollowUpOldestSeconds: c, FollowUpSends: v, FollowUpResends: c,
		SessionsHeld: c,
	}
}

// nop is every instrument, recording nothing; the nop families hand it out.
type (
	nop              struct{}
	nopCounterVec    struct{}
	nopCounterVec2   struct{}
	nopGaugeVec      struct{}
	nopHistogramVec2 struct{}
)

func (nop) Inc()                                      {}
func (nop) Dec()                                      {}
func (nop) Set(float64)                               {}
func (nop) Observe(float64)                           {}
func (nopCounterVec) With(string) Counter             { return nop{} }
func (nopCounterVec2) With(string, string) Counter    { return nop{} }
func (nopGaugeVec) With(string) Gauge                 { return nop{} }
func (nopHistogramVec2) With(string, string) Observer { return nop{} }
