package operator

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/bridge"
)

// HistoryEntry is one row of a claim's audit history: one change of its
// owner or state, written in the same transaction as the change, kept as
// long as the claim.
type HistoryEntry struct {
	ID   int64
	At   time.Time // the database clock
	What string    // claimed, taken over, redriven, released, attempt, processed, failed, flagged, resolved, dead letter taken
	// From and To are the states before ("" for the first claim) and
	// after the change.
	From, To sbclaim.ClaimState
	// By is who made the change: a processor's host, the reconciler, or
	// "operator:<name>".
	By string
	// Path is a take-over's path (redelivery, reconciler, operator).
	Path sbclaim.TakeOverPath
	// Reason is why: the take-over or flag reason, the error of a release
	// or attempt, the fail reason, the resolution's note.
	Reason string
	// PreviousOwner and Owner are the owner tokens before (take-overs
	// only) and after the change.
	PreviousOwner, Owner string
	// Key is the idempotency key the claim is sent with after the change.
	Key string
	// Detail says all of it in one line, as `reconciler show` prints it.
	Detail string
}

// History returns a claim's history, oldest first (empty for a claim
// taken before the history was kept).
func History(ctx context.Context, s *sbclaim.Store, id int64) ([]HistoryEntry, error) {
	h, err := bridge.StoreOf(s).History(ctx, id)
	if err != nil {
		return nil, err
	}
	out := make([]HistoryEntry, len(h))
	for i, e := range h {
		out[i] = HistoryEntry{ID: e.ID, At: e.At, What: string(e.What), From: sbclaim.ClaimState(e.From), To: sbclaim.ClaimState(e.To), By: e.By,
			Path: sbclaim.TakeOverPath(e.Path), Reason: e.Reason, Owner: e.Owner.String(), Key: e.Key, Detail: e.Detail()}
		if e.PreviousOwner != uuid.Nil {
			out[i].PreviousOwner = e.PreviousOwner.String()
		}
	}
	return out, nil
}
