package protocol

import (
	"fmt"
	"time"
)

// FetchResult is what fetching a deferred message by its sequence number
// gave.
type FetchResult int

// The fetch results.
const (
	Found       FetchResult = iota
	NotFound                // not deferred at the broker: gone, or locked by another receiver
	BrokerError             // the broker did not answer
)

var fetchNames = [...]string{"found", "not found", "broker error"}

func (f FetchResult) String() string { return fetchNames[f] }

// FetchAction is what a poller does with a due claim it took, after the
// fetch.
type FetchAction int

// The fetch actions.
const (
	FetchRun      FetchAction = iota // run the fetched message (BeforeFetchedRun)
	FetchFlag                        // flag the claim (Reason): its outcome is unknown and its route may not repeat it
	FetchGiveBack                    // defer the claim again under the same sequence number, due in Wait
	FetchGone                        // forget the message and release the claim (Reason)
)

var fetchActionNames = [...]string{"run", "flag", "give back", "gone"}

func (a FetchAction) String() string { return fetchActionNames[a] }

// FetchStep is the step after a poller took a due claim (TakeDeferred)
// and fetched its message.
type FetchStep struct {
	Result FetchResult
	// State is the claim as the poller found it before taking it;
	// Deferred: released and due then (its holder recorded the deferral
	// and is gone). A claimed one was taken from a holder that went
	// silent: that holder may have performed the effect, and may still
	// lock the message.
	State    State
	Deferred bool
	// Unrepeatable says why the claim's route may not repeat its key
	// (MayRepeat), "" when it may. Only asked for a claim taken from a
	// silent holder whose message was not fetched.
	Unrepeatable string
	// HoldWait is how long a silent holder may still lock the message
	// (its lock renewal + the lock duration + a settle timeout);
	// PollInterval the pollers' interval.
	HoldWait, PollInterval time.Duration
	Seq                    int64
	Holder                 string // who held the claim before the poller
	Err                    string // the broker's error, if any
}

// FetchDecision is what a poller does after the fetch; Metric is the
// result label of sbclaim_deferred_fetches_total.
type FetchDecision struct {
	Action FetchAction
	Reason string
	Wait   time.Duration
	Metric string
}

// AfterFetch decides what the fetch of a due claim's message means.
//
//	found                                        ─► run
//	not found or broker error, taken from a silent
//	  holder whose route may not repeat the key   ─► flag (outcome unknown)
//	not found, taken from a silent holder         ─► give back, due once any
//	                                                  lock has ended (not final)
//	not found, taken while deferred and due       ─► gone: release
//	broker error                                  ─► give back, due at the
//	                                                  next poll (or once any lock
//	                                                  has ended)
//
// A give-back tells the next fetch the claim is released (not performed):
// a claim taken from a silent holder, whose outcome is unknown, is given
// back only when its route may repeat its key; otherwise it is flagged
// there and then (its message stays deferred: its holder settles it, or
// the stranded sweep does once its lock has ended).
func AfterFetch(s FetchStep) FetchDecision {
	switch {
	case s.Result == Found:
		return FetchDecision{Action: FetchRun, Metric: "fetched"}
	case s.Result == NotFound && !s.Deferred:
		if d, ok := unknownOutcome(s, "its deferred message was not found (its lock may still be held)"); ok {
			d.Metric = "unsure"
			return d
		}
		return FetchDecision{Action: FetchGiveBack, Wait: s.HoldWait, Metric: "unsure",
			Reason: fmt.Sprintf("the deferred message (sequence number %d) was not found; its previous holder may still have locked it", s.Seq)}
	case s.Result == NotFound:
		why := fmt.Sprintf("the deferred message (sequence number %d) could not be fetched: it expired or was settled", s.Seq)
		if s.Err != "" {
			why += ": " + s.Err
		}
		return FetchDecision{Action: FetchGone, Reason: why, Metric: "gone"}
	}
	// A broker error. Taken from a silent holder, the message may be
	// locked by it: the next look must wait as long as a "not found"
	// would, or a "not found" then would look final.
	wait := s.PollInterval
	if !s.Deferred {
		if d, ok := unknownOutcome(s, "fetching its deferred message failed: "+s.Err); ok {
			d.Metric = "error"
			return d
		}
		wait = s.HoldWait
	}
	return FetchDecision{Action: FetchGiveBack, Wait: wait, Metric: "error", Reason: "fetching the deferred message failed: " + s.Err}
}

// unknownOutcome flags a claim taken from a silent holder whose message
// was not fetched, when its route may not repeat its key.
func unknownOutcome(s FetchStep, why string) (FetchDecision, bool) {
	if s.State != Claimed || s.Unrepeatable == "" {
		return FetchDecision{}, false
	}
	return FetchDecision{Action: FetchFlag, Reason: fmt.Sprintf("%s: the holder of the deferred message (%s) went silent; its effect's outcome is unknown, and %s",
		s.Unrepeatable, s.Holder, why)}, true
}

// FetchedStep is the step before running a fetched deferred message whose
// claim the poller took.
type FetchedStep struct {
	Claim    Claim
	Delivery Delivery
	Route    Route
	Seq      int64
	// Invalid is why the message cannot be processed any more ("reason:
	// description"), "" when it can; OtherKey its dedup key when it is
	// not the claim's.
	Invalid  string
	OtherKey string
	// Transactional: its route became database-only; RouteChange says how
	// its route differs from the one the claim was taken for.
	Transactional bool
	RouteChange   string
	// PreviousHolder held the claim before the poller (FromSilent).
	PreviousHolder string
	// Delay is the route's next delay (a hand-off's next attempt).
	Delay time.Duration
}

// BeforeFetchedRun decides whether a fetched message runs its effect.
//
//	invalid now, another key, transactional, route changed ─► flag
//	taken from a silent holder, manual route               ─► flag (outcome unknown)
//	last delivery, payload stored                          ─► flag past the horizon,
//	                                                          else hand off unattempted
//	otherwise                                              ─► run
//
// A fetched message on its last delivery (the holder of the one before
// died) is handed to the reconciler's recovery without an attempt: a
// replica dying during it would leave the message to a lock that ends in
// a dead letter.
func BeforeFetchedRun(s FetchedStep) Decision {
	name := s.Route.Name
	switch {
	case s.Invalid != "":
		return flagHeld(s.Claim, fmt.Sprintf("the deferred message cannot be processed any more (%s)", s.Invalid), ReasonClaimFlagged)
	case s.OtherKey != "":
		return flagHeld(s.Claim, fmt.Sprintf("the deferred message (sequence number %d) has dedup key %q, not the claim's", s.Seq, s.OtherKey), ReasonClaimFlagged)
	case s.Transactional:
		return flagHeld(s.Claim, fmt.Sprintf("route %q became transactional while the claim's message was deferred", name), ReasonClaimFlagged)
	case s.RouteChange != "":
		return flagHeld(s.Claim, "route changed: "+s.RouteChange, ReasonClaimFlagged)
	case s.Delivery.FromSilent && s.Route.Manual:
		// The previous holder went silent with the effect possibly
		// performed; a manual route's downstream does not honour the key.
		return flagHeld(s.Claim, fmt.Sprintf("route %q (recovery manual): the holder of the deferred message (%s) went silent; its effect's outcome is unknown",
			name, s.PreviousHolder), ReasonClaimFlagged)
	case s.Claim.PayloadStored && s.Delivery.Last():
		if reason := pastHorizon(s.Route, s.Claim, s.Claim.LastError); reason != "" {
			return flagHeld(s.Claim, reason, ReasonRetryHorizon)
		}
		cause := fmt.Sprintf("the deferred message's deliveries are spent (delivery %d of %d): its stored payload carries the claim to the reconciler's recovery",
			s.Delivery.Count, s.Delivery.Max)
		// A failed write leaves the claim claimed and silent: the
		// reconciler's recovery takes it once stale. The message goes all
		// the same (an abandon would dead-letter it).
		return Decision{Write: HandOff, Wait: s.Delay, Reason: cause, Settle: Complete, Result: ResultHandedOff, OnWriteError: Complete, Why: cause}
	}
	return Decision{Run: true}
}
