// Package protocol decides each step of sbclaim's delivery protocol: from
// the facts of one step (the claim as the store returned it, the
// delivery's position, the route's recovery kind, the effect's classified
// outcome, the time as the database clock read it) to one decision (the
// claim write to make, how to settle the message, how long to wait). It
// does no I/O: the processor's driver, the reconciler's recovery and the
// operator actions read the facts, ask, and perform what it decides,
// feeding what the store answered back as the next step's facts (the way
// etcd's raft takes messages in and hands back what to persist and send).
//
// It imports no store, broker, HTTP or metrics package (a test checks):
// its types mirror the domain's (State, Outcome) and the drivers convert.
// Every rule lives here once; the table in testdata/decisions.golden (and
// docs/decisions.md, generated from it) lists every combination of the
// facts that matter with its decision, so a new rule shows as a changed
// row.
package protocol

import (
	"fmt"
	"time"
)

// State mirrors claim.State.
type State string

// The claim states (claim.State's values).
const (
	Claimed   State = "claimed"
	Processed State = "processed"
	Released  State = "released"
	Failed    State = "failed"
	Flagged   State = "flagged"
	Resolved  State = "resolved"
)

// Outcome is an effect attempt's classified outcome (sideeffects.Outcome).
type Outcome int

// The outcomes, in sideeffects.Outcome's order.
const (
	OK Outcome = iota
	Retryable
	Rejected
	Permanent
	Conflict
	Unknown
)

var outcomeNames = [...]string{"ok", "retryable", "rejected", "permanent", "conflict", "unknown"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", int(o))
}

// Result is how a delivery ended: the "outcome" label of
// sbclaim_messages_total and of each message's final log line
// (processor.Result).
type Result string

// The results (see processor.Result for each one's meaning).
const (
	ResultProcessed    Result = "processed"
	ResultDuplicate    Result = "duplicate"
	ResultConflict     Result = "conflict"
	ResultReleased     Result = "released"
	ResultDeadLettered Result = "dead_lettered"
	ResultFailed       Result = "failed"
	ResultUnknown      Result = "unknown"
	ResultAbandoned    Result = "abandoned"
	ResultLost         Result = "lost"
	ResultFlagged      Result = "flagged"
	ResultPostponed    Result = "postponed"
	ResultHandedOff    Result = "handed_off"
	ResultCrashed      Result = "crashed"
)

// Fail reasons: a failed claim's reason and its message's dead-letter
// reason (claim.FailRejected, FailPermanent, FailConflict).
const (
	FailRejected  = "EffectRejected"
	FailPermanent = "EffectFailed"
	FailConflict  = "IdempotencyKeyConflict"
)

// Dead-letter reasons of flagged claims' messages.
const (
	// ReasonRetryHorizon: flagged at its route's retry horizon, no payload
	// stored (the dead-letter queue keeps the body).
	ReasonRetryHorizon = "RetryHorizonExceeded"
	// ReasonClaimFlagged: flagged for any other reason, no payload stored.
	ReasonClaimFlagged = "ClaimFlagged"
)

// FailReason is the fail (and dead-letter) reason of a final outcome, ""
// for the others.
func FailReason(o Outcome) string {
	switch o {
	case Rejected:
		return FailRejected
	case Permanent:
		return FailPermanent
	case Conflict:
		return FailConflict
	}
	return ""
}

// Write is the claim write a decision asks for. Each is one guarded write
// (its precondition in its WHERE, by the database clock); a refused one
// means the claim changed hands (Lost decides next), a failed one leaves
// the claim as it was, and its holder goes silent.
type Write int

// The writes.
const (
	NoWrite        Write = iota
	MarkProcessed        // processed: the effect happened
	Release              // released: not performed; the next delivery takes it over
	Defer                // released, naming the message, due in Wait (the message is then deferred)
	HandOff              // released, its next attempt in Wait: the stored payload carries the work
	Fail                 // failed with Reason: this delivery dead-letters the message
	Flag                 // flagged with Reason: a person decides
	TakeDeadLetter       // a failed claim without a dead letter names this delivery as the one
	Hold                 // stays claimed, the attempt recorded: the same delivery retries after Wait, holding its session
)

var writeNames = [...]string{"-", "mark processed", "release", "defer", "hand off", "fail", "flag", "take dead letter", "hold"}

func (w Write) String() string { return writeNames[w] }

// Settle is what happens to the delivery's message.
type Settle int

// The settlements.
const (
	SettleNone   Settle = iota // nothing (the effect runs: Decision.Run)
	Complete                   // done, or a duplicate of finished work
	Abandon                    // redeliver
	DeferMessage               // set aside until its claim is due
	DeadLetter                 // never processable, or a final answer
	Retry                      // keep the message (its session waits) and run it again after Wait
)

var settleNames = [...]string{"-", "complete", "abandon", "defer", "dead-letter", "retry"}

func (s Settle) String() string { return settleNames[s] }

// Decision is what one step does.
type Decision struct {
	// Run: attempt the effect holding the claim (then AfterEffect).
	Run bool
	// Write is the claim write, with Reason (the flag or fail reason, or
	// the error a release records) and Wait (Defer: due in; HandOff: next
	// attempt in).
	Write  Write
	Reason string
	Wait   time.Duration
	// Settle is how the message is settled once the write committed
	// (DeadLetterReason and Description for a dead letter), and Result
	// how the delivery is reported.
	Settle           Settle
	DeadLetterReason string
	Description      string
	Result           Result
	// OnWriteError is how the message is settled when the write failed
	// (the store did not answer or refused for another reason than a
	// changed claim): the claim stays as it was and its holder goes
	// silent; whoever takes it over decides again.
	OnWriteError Settle
	// OnRefused, when set, is how the message is settled when the write
	// was refused (TakeDeadLetter: another delivery took it); otherwise
	// a refusal means the claim was lost (Lost decides).
	OnRefused Settle
	// HoldSession: the message's session waits for an operator once the
	// message is settled (a session route with HoldSessionOnFailure whose
	// claim failed or was flagged): its next message must not run until
	// the claim is resolved or redriven.
	HoldSession bool
	// Why says why, for the delivery's final log line.
	Why string
}

// Claim is what a step needs of the claim as the store returned it.
type Claim struct {
	State         State
	PayloadStored bool
	Postponements int
	// SincePostponed is how long the claim has been postponed: from its
	// first postponement to when this attempt took it (both by the
	// database clock); Postponed is false when it never was.
	Postponed      bool
	SincePostponed time.Duration
	LastError      string
}

// Delivery is what a step needs of the message at hand.
type Delivery struct {
	Count int // its DeliveryCount
	Max   int // the entity's MaxDeliveryCount
	// Fetched: fetched by its sequence number (a deferred message);
	// FromSilent: whose claim was taken from a holder that had fetched it
	// and went silent (its outcome is unknown).
	Fetched, FromSilent bool
	// CanDefer: the message can be deferred (the store records
	// deferrals, the route allows them, the message has a sequence
	// number).
	CanDefer bool
	// Session: the message came through a session receiver. It is never
	// deferred or abandoned for a retry (the session's next message would
	// overtake it): its holder keeps it and retries after the route's
	// backoff (see SessionStep in session.go).
	Session bool
}

// Last reports whether this is the message's last delivery: an abandon,
// a deferral or a lock that ends dead-letters it.
func (d Delivery) Last() bool { return d.Count >= d.Max }

// Route is what a step needs of the route the message routes to.
type Route struct {
	Name    string
	Manual  bool          // recovery manual: the downstream does not honour the key
	Horizon time.Duration // flag a claim postponed this long; 0: never
	// HoldOnFailure: in a session, a failed or flagged claim holds its
	// session until an operator acts (HoldSessionOnFailure).
	HoldOnFailure bool
}

// pastHorizon says why claim c, postponed for longer than its route's
// horizon, is flagged, or "" when it is not.
func pastHorizon(r Route, c Claim, cause string) string {
	if !c.Postponed || r.Horizon <= 0 || c.SincePostponed < r.Horizon {
		return ""
	}
	return fmt.Sprintf("route %q: not performed after retrying for %s (%d postponements; horizon %s): %s",
		r.Name, c.SincePostponed.Round(time.Second), c.Postponements, r.Horizon, cause)
}

// FlagDecision is the decision to flag a claim (the one this delivery holds,
// or, from a duplicate delivery, one whose holder is gone) with reason,
// and settle the message at hand: completed when the claim stored its
// payload (an operator's redrive runs from it), dead-lettered
// ClaimFlagged otherwise (the dead-letter queue keeps the body).
func FlagDecision(c Claim, reason string) Decision { return flagHeld(c, reason, ReasonClaimFlagged) }

// flagHeld flags a claim this delivery holds and settles its message:
// completed when the claim stored its payload (an operator's redrive
// runs from it), dead-lettered otherwise (the dead-letter queue keeps the
// body) with dlReason. The claim's payload decides, never a replica's
// option.
func flagHeld(c Claim, reason, dlReason string) Decision {
	d := Decision{Write: Flag, Reason: reason, Result: ResultFlagged, Why: reason, OnWriteError: Abandon}
	if c.PayloadStored {
		d.Settle = Complete
	} else {
		d.Settle, d.DeadLetterReason, d.Description = DeadLetter, dlReason, reason
	}
	return d
}

// keep leaves the claim as it is (claimed, its last error recorded) and
// hands the message back: the next delivery takes the claim over once
// its holder is silent (auto routes), or the reconciler flags it.
func keep(why string) Decision {
	return Decision{Settle: Abandon, Result: ResultUnknown, Why: why}
}
