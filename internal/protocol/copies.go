package protocol

import (
	"fmt"
	"time"
)

// LostStep is the step of a delivery whose claim was taken over, flagged
// or resolved by someone else while its effect ran (a write refused on
// the owner token): Now is the claim as it is now.
type LostStep struct {
	Now State
	// Fetched: this delivery's message was fetched by its sequence
	// number; LastDelivery: it is on its last delivery; NowPayload: the
	// claim, as it is now, stored its payload.
	Fetched, LastDelivery, NowPayload bool
	// NamesThisMessage: the claim names this very message as its
	// deferred one (a poller took it to fetch it, or flagged it: this
	// holder looked silent).
	NamesThisMessage bool
	// Messageless: held by the reconciler's recovery or an operator's
	// redrive, which have no message of their own.
	Messageless bool
}

// Lost decides how a delivery that lost its claim settles its message.
// Nothing more is written to the claim (a late success is noted by the
// driver before it asks).
//
//	released (work remains, nobody holds it)        ─► keep
//	fetched, the claim names this message            ─► keep (the poller looks again)
//	held by the reconciler or a redrive (no message) ─► abandon (a final answer
//	                                                    they reach needs a copy)
//	failed                                           ─► as a copy of a failed claim
//	flagged, no payload, it names this message       ─► dead-letter ClaimFlagged
//	                                                    (as the stranded sweep would)
//	otherwise (finished, or another holder's)        ─► complete
//
// keep hands the message back to the broker for the claim's next attempt,
// except a fetched message on its last delivery with a stored payload:
// an abandon would dead-letter it, and the payload carries the work.
// FailedCopy is true when the failed claim's copy rule decides.
func Lost(s LostStep) (d Decision, failedCopy bool) {
	keep := func(why string) Decision {
		if s.Fetched && s.NowPayload && s.LastDelivery {
			return Decision{Settle: Complete, Result: ResultLost, Why: "the message's last delivery: its claim's stored payload carries the work"}
		}
		return Decision{Settle: Abandon, Result: ResultLost, Why: why}
	}
	switch {
	case s.Now == Released:
		return keep("the claim was released: work remains"), false
	case s.Fetched && (s.Now == Claimed || s.Now == Released) && s.NamesThisMessage:
		return keep("a poller took the claim to fetch this message: back to deferred"), false
	case s.Messageless:
		return Decision{Settle: Abandon, Result: ResultLost, Why: "held without a message: kept for its outcome"}, false
	case s.Now == Failed:
		return Decision{}, true
	case s.Now == Flagged && !s.NowPayload && s.NamesThisMessage:
		// The claim's own deferred message, flagged meanwhile (a poller
		// that took it from this holder, silent, could not tell its
		// outcome): settled as the stranded sweep settles it, so the
		// dead-letter queue keeps the body nothing else stored.
		return Decision{Settle: DeadLetter, DeadLetterReason: ReasonClaimFlagged, Result: ResultLost,
			Why: "the claim was flagged and stored no payload: the dead-letter queue keeps its message"}, false
	}
	return Decision{Settle: Complete, Result: ResultLost, Why: "the claim is decided, or another attempt holds it"}, false
}

// FailedCopyStep is a delivery of a failed claim's key.
type FailedCopyStep struct {
	// HasSeq: the message has a sequence number; NamedHere: the claim's
	// DeadLetterSeq is this message's; NamedNone: the claim names none
	// (the reconciler or a redrive failed it, with no message at hand).
	HasSeq, NamedHere, NamedNone bool
	FailReason, LastError        string
}

// FailedCopy decides a delivery of a failed claim's key: the key is
// dead-lettered once — by the delivery the claim names (the one that
// failed it, delivered again only when its dead letter did not land), or,
// when it names none, by the first delivery that records itself
// (TakeDeadLetter) — and every other copy completes without calling the
// downstream.
func FailedCopy(s FailedCopyStep) Decision {
	dl := Decision{Settle: DeadLetter, DeadLetterReason: s.FailReason, Description: s.LastError, Result: ResultFailed}
	switch {
	case s.HasSeq && s.NamedHere:
		dl.Why = "redelivery of the message that failed its claim: dead-lettering it now"
		return dl
	case s.HasSeq && s.NamedNone:
		dl.Write, dl.OnRefused, dl.OnWriteError = TakeDeadLetter, Complete, Abandon
		dl.Why = "claim failed without a message to dead-letter (reconciler or redrive): dead-lettering this delivery"
		return dl
	}
	return Decision{Settle: Complete, Result: ResultDuplicate, Why: "a copy of a failed claim's key"}
}

// StrandedStep is a stranded deferred message (its claim finished while
// it stayed deferred) that the sweep fetched.
type StrandedStep struct {
	State         State
	KeyMatches    bool // the message's dedup key is the claim's
	PayloadStored bool
	FlagReason    string
}

// Stranded decides how the sweep settles a stranded message: as a copy of
// the finished claim would be. The effect never runs again.
//
//	another key ─► abandon (back to deferred), forgotten by the claim
//	failed      ─► as a copy of a failed claim (failedCopy is true)
//	flagged     ─► complete with a stored payload, else dead-letter ClaimFlagged
//	otherwise   ─► complete
func Stranded(s StrandedStep) (d Decision, failedCopy bool) {
	switch {
	case !s.KeyMatches:
		return Decision{Settle: Abandon, Result: ResultAbandoned, Why: "stranded claim's sequence number names another message"}, false
	case s.State == Failed:
		return Decision{}, true
	case s.State == Flagged && !s.PayloadStored:
		return Decision{Settle: DeadLetter, DeadLetterReason: ReasonClaimFlagged, Description: s.FlagReason, Result: ResultFlagged}, false
	}
	return Decision{Settle: Complete, Result: ResultDuplicate, Why: "stranded deferred message of a finished claim"}, false
}

// ClaimMessage is what a claim says of its deferred message.
type ClaimMessage struct {
	State     State
	Seq       *int64     // DeferredSeq
	DueAt     *time.Time // nil: not deferred yet, or fetched
	Path      string     // TakeOverPath
	ClaimedBy string
}

// Elsewhere says why a delivery (sequence number seq, nil when it has
// none) must leave its claim to the message the claim names — released
// with its message deferred under another sequence number, or held by a
// replica that fetched that message — or "" when it need not. The store's
// take-over guard refuses the delivery anyway; this says so without a
// write.
func Elsewhere(c ClaimMessage, seq *int64) string {
	if c.Seq == nil || (seq != nil && *seq == *c.Seq) {
		return ""
	}
	switch {
	case c.State == Released && c.DueAt != nil:
		return fmt.Sprintf("the claim's message (sequence number %d) is deferred until %s and carries the work", *c.Seq, c.DueAt.Format(time.RFC3339))
	case c.State == Released:
		return fmt.Sprintf("the claim's message (sequence number %d) is being deferred and carries the work", *c.Seq)
	case c.State == Claimed && c.Path != "redelivery":
		return fmt.Sprintf("the claim is held by %s (%s), and its message (sequence number %d) stays deferred until it is settled", c.ClaimedBy, c.Path, *c.Seq)
	case c.State == Claimed:
		// Its holder fetched the claim's deferred message. If it died, the
		// message goes back to deferred when its lock ends and a poller
		// takes the claim again once the holder is silent.
		return fmt.Sprintf("the claim's deferred message (sequence number %d) was fetched by %s and carries the work", *c.Seq, c.ClaimedBy)
	}
	return ""
}

// DuplicateAction is what a delivery whose claim another attempt holds
// or finished does next.
type DuplicateAction int

// The duplicate actions.
const (
	DupComplete         DuplicateAction = iota // complete: finished, an operator's, or carried elsewhere
	DupFailedCopy                              // a failed claim's copy (FailedCopy)
	DupFlagRouteChanged                        // flag: the route is not the claim's
	DupLeave                                   // complete: a manual route's silent holder is the reconciler's to flag
	DupFlagKeyExpired                          // flag: the key is older than the downstream keeps keys
	DupTakeOver                                // take it over (guarded: refuses a live holder) and run it
	DupWait                                    // wait for the live holder's outcome, then look again
	DupPeek                                    // peek the broker for the claim's message (Carrier), then decide again
	DupForget                                  // forget the claim's message, gone from the broker (ClearDeferred), then look again
	// DupFlagSilentManual: in a session, a manual route's silent holder is
	// flagged at once (guarded: refuses a live holder) instead of left to
	// the reconciler: the session's next message must not run while the
	// claim's outcome is open.
	DupFlagSilentManual
)

var dupNames = [...]string{"complete", "failed copy", "flag route changed", "leave to the reconciler", "flag key expired", "take over", "wait",
	"peek", "forget its message", "flag silent holder (session)"}

// Carrier is what a peek at the broker (from the claim's sequence number)
// said of the claim's message, when a copy would be completed on that
// message's behalf and the claim stored no payload: then that message is
// the only other copy of the body.
type Carrier int

// The carriers.
const (
	CarrierUnchecked Carrier = iota // not peeked
	CarrierThere                    // at the broker, not on its last delivery
	CarrierAtRisk                   // at the broker on its last delivery: the end of its lock dead-letters it
	CarrierGone                     // not at the broker: settled, or dead-lettered
	CarrierUnknown                  // the peek failed
)

var carrierNames = [...]string{"unchecked", "there", "on its last delivery", "gone", "unknown"}

func (c Carrier) String() string { return carrierNames[c] }

func (a DuplicateAction) String() string { return dupNames[a] }

// DuplicateStep is one look at the claim by a delivery that did not win
// it.
type DuplicateStep struct {
	State State
	// Elsewhere: the claim's own message carries the work (Elsewhere).
	Elsewhere string
	// PayloadStored: the claim stored its payload, which carries the work
	// whatever becomes of its message; without it, Carrier is what a
	// peek said of that message (read only when Elsewhere).
	PayloadStored bool
	Carrier       Carrier
	// RouteChanged: the delivery routes elsewhere than the claim was
	// taken for; Manual: its route is recovery manual.
	RouteChanged, Manual bool
	// Quiet: released, or its holder silent for the take-over window by
	// the database clock; KeyExpired: the claim's key is older than the
	// route's key lifetime. Both read only when NeedsClock.
	Quiet      bool
	KeyExpired bool
	// Session: the delivery came through a session receiver: the
	// session's next message waits for this one's outcome.
	Session bool
}

// NeedsClock reports whether a DuplicateStep needs the database clock
// (its holder's silence or its key's age) before Duplicate decides.
func NeedsClock(state State, manual, routeChanged, keyLifetime bool) bool {
	return state != Released && (manual || routeChanged) || keyLifetime
}

// Duplicate decides a delivery's next move on a claim another attempt
// holds or finished.
//
//	processed, resolved, flagged             ─► complete
//	failed                                   ─► failed copy
//	its message carries the work elsewhere,
//	  with a stored payload                  ─► complete
//	  without: not peeked yet                ─► peek
//	           at the broker                 ─► complete
//	           gone from the broker          ─► forget it, look again
//	           last delivery, or peek failed ─► wait (the copy may be the
//	                                            only body left)
//	route changed, holder gone               ─► flag
//	manual route, holder silent              ─► complete (the reconciler flags it)
//	key expired, holder gone                 ─► flag
//	released, or an auto route's holder      ─► take over (the guard refuses a live one)
//	otherwise                                ─► wait for the holder
func Duplicate(s DuplicateStep) DuplicateAction {
	switch s.State {
	case Processed, Resolved, Flagged:
		return DupComplete
	case Failed:
		return DupFailedCopy
	}
	if s.Elsewhere != "" {
		// A copy completed on another message's behalf must leave the
		// body somewhere: the claim's payload, or that message for sure.
		switch {
		case s.PayloadStored || s.Carrier == CarrierThere:
			return DupComplete
		case s.Carrier == CarrierUnchecked:
			return DupPeek
		case s.Carrier == CarrierGone:
			return DupForget
		}
		return DupWait
	}
	released := s.State == Released
	switch {
	case s.RouteChanged && s.Quiet:
		return DupFlagRouteChanged
	case s.Manual && s.Quiet && !released && s.Session:
		return DupFlagSilentManual
	case s.Manual && s.Quiet && !released:
		return DupLeave
	case !s.RouteChanged && s.KeyExpired && s.Quiet:
		return DupFlagKeyExpired
	case !s.RouteChanged && !s.KeyExpired && (released || !s.Manual):
		return DupTakeOver
	}
	return DupWait
}

// MessageLeaves reports whether a fetched (deferred) message, once
// settled so, is no longer deferred at the broker, so its claim must
// forget it (ClearDeferred): completed or dead-lettered; or abandoned on
// its last delivery, which the broker dead-letters. A claim that went on
// naming a message gone to the dead-letter queue would take a
// re-submitted copy of it for a second message moving for the claim, and
// complete the copy unprocessed.
func MessageLeaves(s Settle, lastDelivery bool) bool {
	return s == Complete || s == DeadLetter || (s == Abandon && lastDelivery)
}

// WatchEnded decides a duplicate delivery that waited for a live holder
// to the end of its lock-renewal window, the holder still alive:
//
//	the holder has no message (the reconciler's recovery, an operator's
//	redrive) ─► abandon: a final answer it reaches can only be
//	            dead-lettered by a copy, and the redelivery watches again
//	the claim stored no payload and its message is not surely at the
//	broker (Carrier) ─► abandon: this copy may be the only body left
//	otherwise ─► complete: the claim is the trace, the holder settles its
//	            own message, and if it dies the reconciler recovers it
func WatchEnded(messageless, unsureCarrier bool) Decision {
	if unsureCarrier {
		return Decision{Settle: Abandon, Result: ResultAbandoned,
			Why: "the claim stored no payload and its message was not surely at the broker at the end of the lock-renewal window: this copy is kept"}
	}
	if messageless {
		return Decision{Settle: Abandon, Result: ResultAbandoned,
			Why: "holder without a message (recovery or redrive) still alive at the end of the lock-renewal window: the message is kept for its outcome"}
	}
	return Decision{Settle: Complete, Result: ResultDuplicate, Why: "holder still alive at the end of the lock-renewal window"}
}

// Refusal is why a claim's effect, its outcome unknown, may not be
// repeated under its key by the route it routes to now.
type Refusal int

// The refusals.
const (
	MayRepeat     Refusal = iota // recovery auto, the route it was taken for, its key fresh
	Unroutable                   // no route takes what the claim stored
	Transactional                // the route is database-only: it cannot run alone
	RouteChanged                 // another route or effect than the claim was taken for
	ManualUnknown                // a manual route and the outcome unknown (claimed)
	KeyExpired                   // the key is older than the downstream keeps keys
)

var refusalNames = [...]string{"may repeat", "unroutable", "transactional", "route changed", "manual, outcome unknown", "key expired"}

func (r Refusal) String() string { return refusalNames[r] }

// RepeatStep is what Repeat needs of a claim and the route it routes to.
type RepeatStep struct {
	Unroutable    bool
	Transactional bool
	RouteChanged  bool
	Manual        bool
	// Unknown: the outcome of an earlier attempt is unknown (the claim is
	// claimed by a silent holder); a released claim's was not performed.
	Unknown    bool
	KeyExpired bool
}

// Repeat decides whether a claim's effect may be repeated under its key:
// the one rule behind a poller's give-back of a silent holder's claim
// and the reconciler's recovery of a stale one.
func Repeat(s RepeatStep) Refusal {
	switch {
	case s.Unroutable:
		return Unroutable
	case s.Transactional:
		return Transactional
	case s.RouteChanged:
		return RouteChanged
	case s.Manual && s.Unknown:
		return ManualUnknown
	case s.KeyExpired:
		return KeyExpired
	}
	return MayRepeat
}
