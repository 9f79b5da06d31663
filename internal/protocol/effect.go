package protocol

import (
	"fmt"
	"time"
)

// Effect is an attempt's classified outcome, as the driver read it.
type Effect struct {
	Outcome Outcome
	// ForOperator: the downstream's answer needs a person (a failure it
	// stored under the key and replays to every repeat); OperatorReason
	// is the flag reason that says so.
	ForOperator    bool
	OperatorReason string
	// Error is the attempt's error as a claim stores it; FailDescription
	// the dead-letter description of a final answer.
	Error           string
	FailDescription string
	// Delay is the route's next delay: its backoff after the claim's
	// postponements, at least the downstream's Retry-After.
	Delay time.Duration
}

// EffectStep is the step after an effect attempt by a holder that kept
// its claim (held.Run did not report it lost).
type EffectStep struct {
	Claim    Claim
	Delivery Delivery
	Route    Route
	Effect   Effect
}

// AfterEffect decides what an attempt's outcome does to the claim and the
// message:
//
//	ok                          ─► mark processed ─► complete
//	retryable                   ─► postpone (defer) | hand off | release ─► abandon
//	rejected, permanent, conflict ─► fail ─► dead-letter once
//	unknown, needs an operator  ─► flag
//	unknown, auto route         ─► postpone | hand off | keep ─► abandon
//	unknown, manual, fetched    ─► flag (the poller would fetch it again)
//	unknown, manual             ─► keep ─► abandon (the reconciler flags it)
//
// In a session (Delivery.Session) it decides as afterSessionEffect does.
func AfterEffect(s EffectStep) Decision {
	if s.Delivery.Session {
		return afterSessionEffect(s)
	}
	e := s.Effect
	switch e.Outcome {
	case OK:
		return Decision{Write: MarkProcessed, Settle: Complete, Result: ResultProcessed, OnWriteError: Abandon,
			Why: "effect done"}
	case Retryable:
		if d, ok := postpone(s); ok {
			return d
		}
		return Decision{Write: Release, Reason: e.Error, Settle: Abandon, Result: ResultReleased, OnWriteError: Abandon,
			Why: "effect not performed: released for the next delivery"}
	case Rejected, Permanent, Conflict:
		reason := FailReason(e.Outcome)
		return Decision{Write: Fail, Reason: reason, Settle: DeadLetter, DeadLetterReason: reason, Description: e.FailDescription,
			Result: ResultFailed, OnWriteError: Abandon, Why: "a final answer"}
	}
	// Unknown.
	switch {
	case e.ForOperator:
		d := flagHeld(s.Claim, e.OperatorReason, ReasonClaimFlagged)
		d.Why = "the downstream's answer needs a person"
		return d
	case !s.Route.Manual:
		// The route lets the key be repeated: later, like a retryable
		// outcome.
		if d, ok := postpone(s); ok {
			return d
		}
		return keep("effect outcome unknown after retries; the next delivery takes the claim over once it is silent")
	case s.Delivery.Fetched:
		// A deferred message's holder may not leave the claim silent: the
		// poller would fetch the message again and repeat what a manual
		// route forbids.
		return flagHeld(s.Claim, fmt.Sprintf("route %q (recovery manual): effect outcome unknown after a delayed retry: %s", s.Route.Name, e.Error), ReasonClaimFlagged)
	}
	return keep("effect outcome unknown on a manual route; the reconciler flags the claim for an operator")
}

// postpone decides a delayed retry of a held claim whose effect was not
// performed (or, on an auto route, whose outcome is unknown): ok is false
// when deferral does not apply (the message cannot be deferred, or its
// deliveries are spent and no payload can carry the claim).
//
//	past the route's horizon             ─► flag
//	second-to-last delivery or later,
//	  the claim stored its payload       ─► hand off (released, due after
//	                                         the delay) ─► complete
//	last delivery, no payload            ─► (not ok: release or keep, abandon:
//	                                         the broker dead-letters it)
//	otherwise                            ─► defer (due after the delay)
//
// From the second-to-last delivery on, a deferral's fetch would be the
// last delivery, and a replica dying while it holds a last delivery
// leaves the message to a lock that ends in a dead letter: the stored
// payload carries the claim to the reconciler's recovery instead. Without
// one, deferring on it is still better than abandoning. The claim's
// stored payload decides, not the replica's option (the replica that
// took the claim may have stored none).
func postpone(s EffectStep) (Decision, bool) {
	if !s.Delivery.CanDefer {
		return Decision{}, false
	}
	cause := s.Effect.Error
	if s.Effect.Outcome != Retryable {
		cause = "outcome unknown (repeated later with the same key): " + cause
	}
	if reason := pastHorizon(s.Route, s.Claim, cause); reason != "" {
		return flagHeld(s.Claim, reason, ReasonRetryHorizon), true
	}
	n, max, stored := s.Delivery.Count, s.Delivery.Max, s.Claim.PayloadStored
	if n >= max || (stored && n >= max-1) {
		if !stored {
			return Decision{}, false // nothing else can carry the claim: let the broker dead-letter it
		}
		return Decision{Write: HandOff, Wait: s.Effect.Delay, Settle: Complete, Result: ResultHandedOff, OnWriteError: Abandon,
			Reason: fmt.Sprintf("the message's deliveries are spent (delivery %d of %d): its stored payload carries the claim to the reconciler's recovery: %s", n, max, cause),
			Why:    "the message's deliveries are spent: its stored payload carries the claim; the reconciler repeats it when due"}, true
	}
	return Decision{Write: Defer, Wait: s.Effect.Delay, Reason: cause, Settle: DeferMessage, Result: ResultPostponed, OnWriteError: Abandon,
		Why: "postponed: the message is deferred until the claim is due"}, true
}
