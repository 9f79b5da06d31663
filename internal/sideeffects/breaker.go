package sideeffects

import (
	"errors"
	"fmt"
	"time"
)

// Breaker is a route's breaker: after Failures consecutive deliveries
// whose effect failed for want of the downstream (a connection failure, a
// timeout, a 5xx or a 429: a retryable or unknown outcome with such an
// answer or none), or at once on a configuration answer (Misconfigured:
// 401, 403, 407 by default), the route opens: its messages are postponed
// without calling the effect. One probe at a time is let through
// ProbeAfter after it opened; a probe the downstream answers closes it,
// a failed one opens it again.
//
// The zero value takes the defaults (DefaultBreaker); Off turns the
// breaker off for the route.
type Breaker struct {
	Failures   int           // consecutive failures that open it (default 5)
	ProbeAfter time.Duration // how long it stays open before a probe (default 30s)
	Off        bool
}

// DefaultBreaker is the breaker of a route that sets none.
var DefaultBreaker = Breaker{Failures: 5, ProbeAfter: 30 * time.Second}

// WithDefaults fills the zero fields from DefaultBreaker.
func (b Breaker) WithDefaults() Breaker {
	if b.Failures == 0 {
		b.Failures = DefaultBreaker.Failures
	}
	if b.ProbeAfter == 0 {
		b.ProbeAfter = DefaultBreaker.ProbeAfter
	}
	return b
}

// Validate names the first field that is out of range.
func (b Breaker) Validate() error {
	switch {
	case b.Failures < 0:
		return fmt.Errorf("failures cannot be negative, got %d", b.Failures)
	case b.ProbeAfter < 0:
		return fmt.Errorf("probeAfter cannot be negative, got %s", b.ProbeAfter)
	}
	return nil
}

// DefaultConfigErrors are the statuses an HTTP route treats as a
// configuration answer (Misconfigured) unless its routes file entry sets
// configErrors: given before the downstream's idempotency layer, they say
// the request was refused, not performed.
var DefaultConfigErrors = []int{401, 403, 407}

// Misconfigured marks err as an answer about sbclaim's configuration, not
// about the request (a 401 after a key rotation, a 403, a 407 from a
// proxy): the effect was not performed, and repeating it cannot succeed
// until someone fixes the configuration. The retry loop stops at it; the
// processor opens the route's breaker at once (the claim is released and
// its message postponed, never failed), and a probe closes it after the
// fix.
func Misconfigured(err error) error {
	inner := err
	if e, ok := err.(*Error); ok && e.Err != nil {
		inner = e.Err // one outcome in the text: "retryable: HTTP 401: ..."
	}
	return &Error{Outcome: OutcomeRetryable, Answer: AnswerOf(err), Config: true, Err: inner}
}

// IsMisconfigured reports whether err was marked Misconfigured: the first
// *Error in its chain has Config set.
func IsMisconfigured(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Config
}
