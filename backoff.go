package sbclaim

import (
	"time"

	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// Backoff is a route's delayed-retry schedule. When a handler returns
// NotPerformed (or, on a RecoveryAuto route, an unknown outcome), the
// processor records on the claim when to try again and defers the message
// at Service Bus; it fetches it by its sequence number when due, without
// a redelivery storm. A downstream's Retry-After (Error.RetryAfter) wins
// when it asks for longer. After Horizon since the first postponement the
// claim is flagged for an operator, with a reason naming the route.
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
var DefaultBackoff = Backoff(sideeffects.DefaultBackoff)

func (b Backoff) internal() sideeffects.Backoff { return sideeffects.Backoff(b) }
