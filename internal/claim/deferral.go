package claim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Deferrer is the part of a store behind delayed retries: a holder whose
// effect was not performed (retryable) records that its message is
// deferred at the broker and when it is due (Defer), and a processor of
// the same consumer and entity later finds the due claims (FindDue) and
// takes one (TakeDeferred) before it fetches the message by its sequence
// number. Each is one statement; Defer and TakeDeferred are guarded
// UPDATEs whose precondition is in their WHERE, judged by the database
// clock.
//
// A deferred claim is released (its effect was not performed) with
// DeferredSeq and DueAt set; its NextAttemptAt is DueAt plus a grace, so
// the reconciler's recovery (FindStale, TakeOver by PathReconciler), which
// honours NextAttemptAt, leaves it to its message until then. A
// redelivery by another message (TakeOver by PathRedelivery with another
// Seq) is refused while the claim's message is deferred: one message per
// claim moves.
//
// It is a separate interface, like BatchWriter, so a store without it
// (or a wrapper that does not pass it on) keeps the abandon behaviour.
type Deferrer interface {
	// Defer moves a claimed claim held by Owner to released, recording
	// the sequence number of the message about to be deferred
	// (DeferredSeq), NextAttemptAt (the database clock plus DueIn plus
	// Grace), the error and the answer; it counts one postponement
	// (Postponements, PostponedAt set on the first). DueAt stays NULL
	// until SetDue: the message is not deferred yet, and no processor may
	// look for it. ErrStateChanged when the claim is not claimed by Owner.
	Defer(ctx context.Context, params *DeferParams) error

	// SetDue records, once the message is deferred at the broker, when it
	// is due (DueAt: the database clock plus DueIn). Guarded on the claim
	// being released by Owner with DeferredSeq Seq and no DueAt yet.
	// ErrStateChanged otherwise.
	SetDue(ctx context.Context, params *SetDueParams) error

	// FindDue returns, earliest due first, the claims of Consumer and
	// Entity whose deferred message a processor should fetch: released
	// with DueAt passed; released with a DeferredSeq but no DueAt for
	// SilentFor (the holder died between Defer and SetDue: its message may
	// be deferred, or was never; or it released the claim of a fetched
	// message it handed back: the message carries the retry, whatever
	// NextAttemptAt says); or
	// claimed with a DeferredSeq by a processor that took it from its
	// message (TakeOverPath redelivery) and has been silent for SilentFor
	// (it fetched the message and died). A claim the reconciler or an
	// operator holds is theirs to finish: it keeps its message for the
	// stranded sweep. It changes nothing.
	FindDue(ctx context.Context, params *FindDueParams) ([]*Claim, error)

	// TakeDeferred gives a claim found by FindDue to a new owner, guarded
	// on PreviousOwner, on the DeferredSeq the caller will fetch, and on
	// FindDue's predicate, by the database clock: of concurrent callers
	// exactly one wins. It clears DueAt and NextAttemptAt, keeps
	// DeferredSeq (the message the holder fetches) and audits the
	// take-over (path redelivery). On refusal it returns the claim as it
	// is now (when it could read it) with ErrStateChanged.
	TakeDeferred(ctx context.Context, params *TakeDeferredParams) (*Claim, error)

	// FindStranded returns, longest silent first, the finished claims
	// (processed, failed, flagged, resolved) of Consumer and Entity that
	// still name a deferred message (DeferredSeq), whose last heartbeat
	// and the write that finished them are both older than SilentFor: a
	// holder that fetched the message,
	// finished the claim and died before it settled the message, which
	// then went back to deferred where no receive finds it. It changes
	// nothing.
	FindStranded(ctx context.Context, params *FindDueParams) ([]*Claim, error)

	// TakeStranded lets one caller settle a stranded claim's message: a
	// guarded UPDATE, on the claim still being in State with DeferredSeq
	// Seq and silent for SilentFor by the database clock, that sets
	// HeartbeatAt to now (the owner, the state and the outcome stay). Of
	// concurrent callers exactly one wins; the others, and any caller
	// once the claim changed, get ErrStateChanged.
	TakeStranded(ctx context.Context, params *TakeStrandedParams) error

	// ClearDeferred forgets the claim's deferred message once it was
	// completed or dead-lettered (or cannot be fetched any more): it sets
	// DeferredSeq to NULL where it is still Seq, whatever the state. A
	// claim that was waiting for that message (DueAt set) has no reason
	// to wait any more: DueAt and NextAttemptAt are cleared too, so the
	// reconciler's recovery takes it without waiting for the grace.
	// ErrStateChanged when the claim names no message or another one.
	ClearDeferred(ctx context.Context, params *ClearDeferredParams) error
}

// TakeStrandedParams is the input of TakeStranded.
type TakeStrandedParams struct {
	ID        int64
	Seq       int64 // the DeferredSeq the caller saw and will fetch
	State     State // the finished state the caller saw
	SilentFor time.Duration
}

// ClearDeferredParams is the input of ClearDeferred.
type ClearDeferredParams struct {
	ID  int64
	Seq int64
}

// ValidateTakeStranded checks a TakeStrandedParams.
func ValidateTakeStranded(p *TakeStrandedParams) error {
	switch {
	case p.ID <= 0:
		return errors.New("take stranded: ID is required")
	case !p.State.Valid() || p.State.Unfinished():
		return fmt.Errorf("take stranded: state %q is not finished", p.State)
	case p.SilentFor <= 0:
		return errors.New("take stranded: SilentFor must be positive")
	}
	return nil
}

// DeferParams is the input of Defer.
type DeferParams struct {
	ID    int64
	Owner uuid.UUID
	// Seq is the broker sequence number of the message being deferred.
	Seq int64
	// DueIn is how long from now (database clock) the message will be
	// due (SetDue records the due time once it is deferred); with Grace it
	// sets NextAttemptAt.
	DueIn time.Duration
	// Grace is how long after DueAt the reconciler's recovery may take
	// the claim over from its deferred message (NextAttemptAt).
	Grace  time.Duration
	Error  string  // why the effect was not performed
	Answer *Answer // the downstream's answer; nil keeps the claim's
}

// SetDueParams is the input of SetDue.
type SetDueParams struct {
	ID    int64
	Owner uuid.UUID
	Seq   int64
	DueIn time.Duration
}

// FindDueParams is the input of FindDue.
type FindDueParams struct {
	Consumer  string
	Entity    string
	SilentFor time.Duration // a holder of a fetched deferred message silent this long is gone
	Limit     int           // 0 means a default of 100
}

// TakeDeferredParams is the input of TakeDeferred.
type TakeDeferredParams struct {
	ID            int64
	PreviousOwner uuid.UUID
	Owner         uuid.UUID
	Seq           int64 // the DeferredSeq the caller saw and will fetch
	SilentFor     time.Duration
	By            string // the new holder (a replica's host)
	Reason        string
}

// ValidateDefer checks a DeferParams.
func ValidateDefer(p *DeferParams) error {
	switch {
	case p.ID <= 0:
		return errors.New("defer: ID is required")
	case p.Owner == uuid.Nil:
		return errors.New("defer: Owner is required")
	case p.DueIn < 0 || p.Grace < 0:
		return errors.New("defer: DueIn and Grace cannot be negative")
	}
	return nil
}

// ValidateFindDue checks a FindDueParams and returns its limit.
func ValidateFindDue(p *FindDueParams) (int, error) {
	switch {
	case p.Consumer == "":
		return 0, errors.New("find due: Consumer is required")
	case p.SilentFor <= 0:
		return 0, errors.New("find due: SilentFor must be positive")
	case p.Limit < 0:
		return 0, errors.New("find due: Limit cannot be negative")
	}
	if p.Limit == 0 {
		return 100, nil
	}
	return p.Limit, nil
}

// ValidateTakeDeferred checks a TakeDeferredParams.
func ValidateTakeDeferred(p *TakeDeferredParams) error {
	switch {
	case p.ID <= 0:
		return errors.New("take deferred: ID is required")
	case p.Owner == uuid.Nil || p.PreviousOwner == uuid.Nil:
		return errors.New("take deferred: Owner and PreviousOwner are required")
	case p.SilentFor <= 0:
		return errors.New("take deferred: SilentFor must be positive")
	}
	return nil
}

// Deferred reports whether the claim's message is deferred at the broker
// and waits for a processor to fetch it (released, DeferredSeq and DueAt
// set).
func (c *Claim) Deferred() bool {
	return c.State == StateReleased && c.DeferredSeq != nil && c.DueAt != nil
}
