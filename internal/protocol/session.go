package protocol

import "fmt"

// afterSessionEffect is AfterEffect for a message worked in a session
// (docs/design.md, "Sessions"). A session's messages must take effect in
// order, so a message whose effect was not performed is neither deferred
// nor abandoned for a later retry (either would let the session's next
// message run first): its holder keeps the claim and the message, waits
// the route's backoff (Retry-After included) holding the session, and runs
// it again.
//
//	ok                          ─► mark processed ─► complete
//	retryable, unknown (auto)   ─► hold ─► retry after the backoff
//	  past the route's horizon  ─► flag
//	  unknown, Max held retries spent ─► flag (a person decides, as the
//	                               reconciler's recovery would after the
//	                               message's deliveries were spent)
//	rejected, permanent, conflict ─► fail ─► dead-letter once
//	unknown, needs an operator  ─► flag
//	unknown, manual             ─► flag (nobody may repeat it, and the
//	                               session must not go on past it unseen)
//
// A fail or a flag lets the session go on, unless the route holds it
// (Route.HoldOnFailure: HoldSession). A retryable outcome (the request
// was not performed) holds until the route's horizon; an unknown one at
// most Delivery.Max times (Claim.Postponements counts the holds), the
// repeats a message's deliveries would give it without sessions.
func afterSessionEffect(s EffectStep) Decision {
	e := s.Effect
	hold := s.Route.HoldOnFailure
	switch e.Outcome {
	case OK:
		return Decision{Write: MarkProcessed, Settle: Complete, Result: ResultProcessed, OnWriteError: Abandon,
			Why: "effect done"}
	case Rejected, Permanent, Conflict:
		reason := FailReason(e.Outcome)
		return Decision{Write: Fail, Reason: reason, Settle: DeadLetter, DeadLetterReason: reason, Description: e.FailDescription,
			Result: ResultFailed, OnWriteError: Abandon, HoldSession: hold, Why: "a final answer"}
	case Retryable:
		return sessionRetry(s, e.Error)
	}
	// Unknown.
	switch {
	case e.ForOperator:
		d := flagHeld(s.Claim, e.OperatorReason, ReasonClaimFlagged)
		d.HoldSession, d.Why = hold, "the downstream's answer needs a person"
		return d
	case s.Route.Manual:
		d := flagHeld(s.Claim, fmt.Sprintf("route %q (recovery manual): effect outcome unknown in a session: %s", s.Route.Name, e.Error), ReasonClaimFlagged)
		d.HoldSession = hold
		return d
	}
	if n := s.Claim.Postponements; n >= s.Delivery.Max {
		d := flagHeld(s.Claim, fmt.Sprintf("route %q: effect outcome still unknown after %d retries holding its session: %s", s.Route.Name, n, e.Error), ReasonClaimFlagged)
		d.HoldSession, d.Why = hold, "effect outcome still unknown after the retries a message's deliveries would allow"
		return d
	}
	return sessionRetry(s, "outcome unknown (repeated later with the same key): "+e.Error)
}

// sessionRetry holds a session's message for a retry after the route's
// backoff, or flags its claim past the route's horizon.
func sessionRetry(s EffectStep, cause string) Decision {
	if reason := pastHorizon(s.Route, s.Claim, cause); reason != "" {
		d := flagHeld(s.Claim, reason, ReasonRetryHorizon)
		d.HoldSession = s.Route.HoldOnFailure
		return d
	}
	return Decision{Write: Hold, Wait: s.Effect.Delay, Reason: cause, Settle: Retry, Result: ResultPostponed, OnWriteError: Abandon,
		Why: "not performed: retried after the route's backoff, holding the session so that its next message waits"}
}
