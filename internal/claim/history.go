package claim

import (
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Change is what one row of a claim's history records.
type Change string

// The changes of a claim's owner or state. Each is written by the store
// in the same statement or transaction as the guarded write that made it,
// and only when that write changed the claim: a refused write leaves no
// history. A heartbeat and a late-success note change neither owner nor
// state and leave none.
const (
	// ChangeClaimed: a delivery inserted the claim (ClaimBatch), or the
	// one-phase path inserted it already processed (ClaimTx).
	ChangeClaimed Change = "claimed"
	// ChangeTakenOver: a redelivery or the reconciler's recovery took the
	// claim from a holder that released it or went silent (Path says
	// which).
	ChangeTakenOver Change = "taken over"
	// ChangeRedriven: an operator's redrive took a flagged claim (Path
	// operator), under its key or a new one (Key).
	ChangeRedriven Change = "redriven"
	// ChangeRetried: an operator's retry took a failed claim (Path
	// operator), under its key or a new one (Key); Reason names the
	// failure it retries (FailedAt and FailReason stay on the claim).
	ChangeRetried Change = "retried"
	// ChangeReleased: the holder released the claim (the effect was not
	// performed).
	ChangeReleased Change = "released"
	// ChangeAttempt: the holder recorded an effect attempt whose outcome is
	// unknown; the claim stays claimed.
	ChangeAttempt Change = "attempt"
	// ChangeProcessed: the holder recorded the effect's success.
	ChangeProcessed Change = "processed"
	// ChangeFailed: the holder recorded a final answer that is not a
	// success.
	ChangeFailed Change = "failed"
	// ChangeFlagged: the claim was handed to operators.
	ChangeFlagged Change = "flagged"
	// ChangeResolved: an operator closed the claim, or a redrive that
	// succeeded did (Reason names the resolution).
	ChangeResolved Change = "resolved"
	// ChangeDeadLetter: a delivery took the dead letter of a claim failed
	// without a message at hand (TakeDeadLetter).
	ChangeDeadLetter Change = "dead letter taken"
)

// HistoryEntry is one row of a claim's audit history: one change of its
// owner or state. The history is append-only and lives as long as its
// claim: PurgeProcessed deletes it with the claim.
type HistoryEntry struct {
	ID      int64 // increases with every entry of the table
	ClaimID int64
	At      time.Time // the database clock
	What    Change
	From    State // the state before ("" for ChangeClaimed)
	To      State // the state after
	// By is who made the change: a processor's host, the reconciler's
	// holder name or "reconciler", or "operator:<name>".
	By string
	// Path is the take-over path of ChangeTakenOver and ChangeRedriven.
	Path TakeOverPath
	// Reason is why: the take-over or flag reason, the error of a release
	// or attempt, the fail reason and error, the resolution and note.
	Reason string
	// PreviousOwner is the owner before a take-over (uuid.Nil otherwise);
	// Owner the owner after the change.
	PreviousOwner uuid.UUID
	Owner         uuid.UUID
	// Key is the idempotency key the claim is sent with after the change.
	Key string
}

// MaxHistoryReason bounds HistoryEntry.Reason (the width of the SQL
// Server column), in characters; longer reasons are cut.
const MaxHistoryReason = 2000

// ReconcilerBy is the By of a change made by the reconciler's flag pass
// (FlagStale) when its params name nobody.
const ReconcilerBy = "reconciler"

// Detail describes the entry for a person, after its What and By: the
// states it moved between, the take-over path and the owners, the reason
// and the key. The console's claim page and `reconciler show` print it.
func (e *HistoryEntry) Detail() string {
	var b strings.Builder
	if e.From != "" && e.From != e.To {
		fmt.Fprintf(&b, "%s → %s", e.From, e.To)
	} else {
		b.WriteString(string(e.To))
	}
	if e.Path != "" {
		fmt.Fprintf(&b, " via %s", e.Path)
	}
	if e.PreviousOwner != uuid.Nil {
		fmt.Fprintf(&b, ", owner %s → %s", e.PreviousOwner, e.Owner)
	}
	if e.Reason != "" {
		b.WriteString(": " + e.Reason)
	}
	fmt.Fprintf(&b, " (key %s)", e.Key)
	return b.String()
}

// FormNote says in words where a claim's key comes from: its form and,
// after a new-key redrive, its revision.
func (c *Claim) FormNote() string {
	var s string
	if c.KeyForm == KeyFormScoped {
		s = "scoped: consumer and message id"
	} else {
		s = "raw: the message id"
	}
	if c.KeyRevision > 0 {
		s += fmt.Sprintf(", revision %d chosen by %s", c.KeyRevision, c.KeyRevisedBy)
	}
	return s
}

// HistorySwitch is implemented by the stores whose history writes the
// benchmark can turn off, to measure what they cost (the physical limit
// with history against without). It is for that benchmark only: a store
// with history off breaks the audit promise.
type HistorySwitch interface {
	// SetHistoryForBench turns the history writes of ClaimBatch and
	// WriteOutcomes on (the default) or off.
	SetHistoryForBench(on bool)
}
