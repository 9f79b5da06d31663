package claim

import "errors"

// Sentinel errors. Stores wrap them (errors.Is works); callers never inspect
// driver errors. See errclass.go for the error contract: which failure
// class wraps which sentinel, and whether it concerns one call or the whole
// store.
var (
	// ErrUnavailable: the store as a whole cannot serve calls right now, and
	// it is expected to come back by itself: the connection broke or cannot
	// be made, the server is throttling or out of workers, it is failing
	// over or restarting, or it did not answer before the deadline. Every
	// call will fail the same way for a while: stop taking new work and
	// probe. The outcome of the call in flight is not known (a COMMIT may
	// have reached the server before its answer was lost).
	ErrUnavailable = errors.New("claim store unavailable")

	// ErrAborted: the database aborted this one call and rolled it back:
	// it was chosen as a deadlock victim, failed a serialization check, or
	// timed out waiting for a lock or on its statement timeout. Nothing was
	// written and the store is healthy; the same call, retried soon, is
	// expected to succeed.
	ErrAborted = errors.New("claim store call aborted, nothing written")

	// ErrRefused: the store is reachable but refuses every write, and will
	// go on refusing until someone acts or a failover completes: the
	// database is read-only (a geo-secondary, a standby after a failover),
	// out of space or over its size quota, its log is full, or the identity
	// lacks a grant or its login is refused. Retrying the call does not
	// help; stop taking new work and probe with a write. Ping may well
	// succeed meanwhile (reads still work).
	ErrRefused = errors.New("claim store refuses writes")

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
