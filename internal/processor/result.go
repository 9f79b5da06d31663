package processor

import "github.com/sbclaim/sbclaim/internal/protocol"

// Result is how the processor finished with one delivery of a message. It
// is the "outcome" label of sbclaim_messages_total and of each message's
// final log line.
type Result = protocol.Result

const (
	// ResultProcessed: claim won (or taken over), effect ok, claim marked
	// processed, message completed.
	ResultProcessed = protocol.ResultProcessed
	// ResultDuplicate: another attempt finished the claim (or an operator
	// has it); the message was completed without running the effect.
	ResultDuplicate = protocol.ResultDuplicate
	// ResultConflict: same key, different payload; dead-lettered with
	// IdempotencyKeyConflict.
	ResultConflict = protocol.ResultConflict
	// ResultReleased: the effect was definitely not performed and may
	// succeed later; claim released, message abandoned.
	ResultReleased = protocol.ResultReleased
	// ResultDeadLettered: bad input (never claimed), or a transactional
	// effect that can never succeed (rolled back, no claim).
	ResultDeadLettered = protocol.ResultDeadLettered
	// ResultFailed: the downstream gave a final answer that is not a
	// success (rejected, permanent, conflict): the claim is failed and this
	// delivery dead-lettered the message (EffectRejected, EffectFailed or
	// IdempotencyKeyConflict). Once per key: later copies are duplicates.
	ResultFailed = protocol.ResultFailed
	// ResultUnknown: the effect's outcome is unknown after retries (or
	// known but not recordable); the claim is kept with its last error and
	// the message abandoned. Its redelivery takes the claim over once the
	// claim is silent (auto routes), or the reconciler flags it (manual).
	ResultUnknown = protocol.ResultUnknown
	// ResultAbandoned: nothing was claimed (store unavailable, shutdown),
	// or a copy watched a claim held by the reconciler's recovery or a
	// redrive (no message of its own) to the end of its window; the
	// message was abandoned for redelivery.
	ResultAbandoned = protocol.ResultAbandoned
	// ResultLost: the claim was taken over, flagged or resolved by someone
	// else while this delivery's effect ran; the effect was cancelled (a
	// success that still arrived is noted on the claim).
	ResultLost = protocol.ResultLost
	// ResultFlagged: this delivery flagged the claim for operators (its
	// route is not the one the claim was taken for).
	ResultFlagged = protocol.ResultFlagged
	// ResultPostponed: the effect was not performed (or, on a RecoveryAuto
	// route, its outcome is unknown); the claim records the deferral and
	// the message was deferred at the broker, to be fetched by its
	// sequence number when due (the route's Backoff). No delivery burned.
	ResultPostponed = protocol.ResultPostponed
	// ResultHandedOff: as postponed, but the message's deliveries are
	// spent (DeliveryCount at MaxDeliveryCount): the claim was released
	// with its next attempt due and its stored payload, and the message
	// completed; the reconciler's recovery repeats the effect.
	ResultHandedOff = protocol.ResultHandedOff
	// ResultCrashed: a test hook stopped the attempt (chaos harness).
	ResultCrashed = protocol.ResultCrashed
)
