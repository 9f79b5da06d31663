package sbclaim

import (
	"time"

	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// Backoff is a route's delayed-retry schedule. When a handler returns
// NotPerformed (or, on a RecoveryAuto route, an unknown outcome), the
// processor records on the claim when to try again and defers the message
// at Service Bus; it fetches it by its sequence number when due, without
// a redelivery storm. A downstream's Retry-After wins when it asks for
// longer: an HTTP route's answers honour the header (docs/answers.md), a
// Go handler passes one with NotPerformedAfter or through HTTPOutcome,
// and a route's breaker asks for its probe time. After Horizon since the
// first postponement the claim is flagged for an operator, with a reason
// naming the route.
//
// The zero value is DefaultBackoff: 10s, ×2, at most 10m, ±20%, for 24h.
// Fields left zero in a partly set Backoff take those values; Off turns
// delayed retries off for the route (the message is abandoned and
// redelivered at once).
type Backoff struct {
	First   time.Duration // the first delay
	Factor  float64       // each later delay is the one before × Factor (at least 1)
	Max     time.Duration // the longest delay
	Jitter  float64       // ± this fraction of each delay, at random, in [0, 1)
	Horizon time.Duration // flag the claim this long after its first postponement
	Off     bool
}

// DefaultBackoff is the schedule of a route that sets none.
var DefaultBackoff = Backoff{First: 10 * time.Second, Factor: 2, Max: 10 * time.Minute, Jitter: 0.2, Horizon: 24 * time.Hour}

func (b Backoff) internal() sideeffects.Backoff { return sideeffects.Backoff(b) }

// Breaker is a route's breaker. After Failures deliveries in a row whose
// handler failed for want of the downstream (NotPerformed or Unknown with
// no answer, or with a 5xx or 429 answer: see Delivery.ReportAnswer), or
// at once when a handler returns Misconfigured, the route opens: its
// messages are postponed like a delayed retry (Backoff) without calling
// the handler. ProbeAfter after it opened one delivery at a time is let
// through; the route closes when that probe's downstream answers, and
// opens again when it fails. When every route of a processor is open, it
// stops receiving until a probe is due, and its readiness names the
// routes.
//
// The zero value is DefaultBreaker: 5 failures, a probe after 30s. Off
// turns the breaker off for the route.
type Breaker struct {
	Failures   int           // failing deliveries in a row that open it
	ProbeAfter time.Duration // how long it stays open before a probe
	Off        bool
}

// DefaultBreaker is the breaker of a route that sets none.
var DefaultBreaker = Breaker{Failures: 5, ProbeAfter: 30 * time.Second}

func (b Breaker) internal() sideeffects.Breaker { return sideeffects.Breaker(b) }
