package sideeffects

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Backoff is a route's delayed-retry schedule: when an attempt was
// definitely not performed (retryable), or its outcome is unknown on a
// RecoveryAuto route, the processor defers the message and fetches it again
// after Delay(n), n being the claim's postponements so far. A downstream's
// Retry-After is honoured when it asks for longer. After Horizon since the
// first postponement the claim is flagged for operators instead.
//
// The zero value takes the defaults (DefaultBackoff); Off turns delayed
// retries off for the route (the message is abandoned and redelivered at
// once, each time burning a delivery).
type Backoff struct {
	First   time.Duration // the first delay (default 10s)
	Factor  float64       // each later delay is the one before × Factor (default 2)
	Max     time.Duration // no delay is longer (default 10m)
	Jitter  float64       // ± this fraction of each delay, at random (default 0.2)
	Horizon time.Duration // flag the claim this long after its first postponement (default 24h)
	Off     bool
}

// DefaultBackoff is the schedule of a route that sets none: 10s, 20s, 40s,
// ... up to 10 minutes, ±20%, for at most 24 hours.
var DefaultBackoff = Backoff{First: 10 * time.Second, Factor: 2, Max: 10 * time.Minute, Jitter: 0.2, Horizon: 24 * time.Hour}

// WithDefaults fills the zero fields from DefaultBackoff. A zero Jitter
// stays zero only when the other fields are set too (an explicit
// schedule); otherwise it takes the default.
func (b Backoff) WithDefaults() Backoff {
	d := DefaultBackoff
	if b.First == 0 && b.Factor == 0 && b.Max == 0 && b.Jitter == 0 && b.Horizon == 0 {
		d.Off = b.Off
		return d
	}
	if b.First == 0 {
		b.First = d.First
	}
	if b.Factor == 0 {
		b.Factor = d.Factor
	}
	if b.Max == 0 {
		b.Max = max(d.Max, b.First)
	}
	if b.Horizon == 0 {
		b.Horizon = d.Horizon
	}
	return b
}

// Validate reports a schedule that cannot work, naming the field.
func (b Backoff) Validate() error {
	switch {
	case b.First < 0:
		return fmt.Errorf("backoff first %s cannot be negative", b.First)
	case b.Factor != 0 && b.Factor < 1:
		return fmt.Errorf("backoff factor %g must be at least 1", b.Factor)
	case b.Max < 0 || (b.Max > 0 && b.Max < b.First):
		return fmt.Errorf("backoff max %s must be at least first %s", b.Max, b.First)
	case b.Jitter < 0 || b.Jitter >= 1:
		return fmt.Errorf("backoff jitter %g must be in [0, 1)", b.Jitter)
	case b.Horizon < 0:
		return fmt.Errorf("backoff horizon %s cannot be negative", b.Horizon)
	}
	return nil
}

// Delay is the n-th delay (n = 0 for the first postponement), jittered,
// and at least retryAfter (the downstream's Retry-After, 0 for none).
// Call it on a schedule WithDefaults filled.
func (b Backoff) Delay(n int, retryAfter time.Duration) time.Duration {
	d := float64(b.First) * math.Pow(b.Factor, float64(max(n, 0)))
	if d > float64(b.Max) || math.IsInf(d, 0) || math.IsNaN(d) {
		d = float64(b.Max)
	}
	if b.Jitter > 0 {
		d *= 1 + b.Jitter*(2*rand.Float64()-1)
	}
	return max(time.Duration(d), retryAfter)
}
