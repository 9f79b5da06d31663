package claim

import "errors"

// Sentinel errors. Stores wrap them (errors.Is works); callers never inspect
// driver errors.
var (
	// ErrUnavailable: the database could not be reached or the connection
	// broke. Nothing is known to have been written; the processor abandons
	// the message for redelivery.
	ErrUnavailable = errors.New("claim store unavailable")

	// ErrStateChanged: a guarded update matched no row because the claim is
	// no longer in the expected state or is held by another owner.
	ErrStateChanged = errors.New("claim state changed or owned by another attempt")

	// ErrRouteChanged: a take-over, recovery or redrive was asked to run
	// another route (or another version of the route's effect) than the
	// one the claim was taken for. The claim is left as it was.
	ErrRouteChanged = errors.New("claim was taken for another route or effect fingerprint")

	// ErrNotFound: no claim has that ID.
	ErrNotFound = errors.New("claim not found")

	// ErrDuplicate: an insert hit the claims unique index on (MessageId,
	// Consumer) — and only that index. Stores use it internally to turn a
	// unique violation into OutcomeDuplicate/OutcomeConflict.
	ErrDuplicate = errors.New("claim already exists")
)
