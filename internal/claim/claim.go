package claim

import (
	"crypto/sha256"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// State is where a claim is in its life:
//
//	claimed ──► processed
//	   ├──► failed (a final answer: rejected, permanent or conflict)
//	   ├──► released ──► claimed again (taken over by the next delivery,
//	   │                 or by the reconciler's recovery)
//	   ├──► claimed under a new owner (taken over: the holder went silent)
//	   └──► flagged (recovery cannot settle it: a human must decide)
//	          ├──► claimed by an operator's redrive ──► resolved (redriven)
//	          │                                     ├─► failed (a final answer)
//	          │                                     └─► flagged again
//	          └──► resolved (done | discarded)
//
// Processed, failed and resolved are finished: nothing takes them over,
// flags them or runs their effect again, and the purge deletes them after
// the retention.
type State string

const (
	// StateClaimed: a replica committed the marker and owns the effect.
	StateClaimed State = "claimed"
	// StateProcessed: the effect happened and its outcome is committed.
	StateProcessed State = "processed"
	// StateReleased: the effect was definitely not performed; the next
	// delivery may take the claim over.
	StateReleased State = "released"
	// StateFailed: the downstream gave a final answer that is not a
	// success: rejected (a business decision such as a card decline: the
	// downstream may have recorded it), permanent (not performed, never
	// will be) or conflict (the key is held by another payload). The
	// effect is finished and never repeated; the message is dead-lettered
	// once (FailReason is its reason) and later copies complete.
	StateFailed State = "failed"
	// StateFlagged: a human must decide: the reconciler could not recover
	// the claim (no routes, no stored payload, a manual or changed route,
	// recovery ended permanent or still unknown), or a redrive failed.
	StateFlagged State = "flagged"
	// StateResolved: an operator (or a redrive) closed a flagged claim.
	StateResolved State = "resolved"
)

// States lists every state in lifecycle order.
var States = []State{StateClaimed, StateProcessed, StateReleased, StateFailed, StateFlagged, StateResolved}

// Valid reports whether s is one of the known states.
func (s State) Valid() bool {
	for _, v := range States {
		if s == v {
			return true
		}
	}
	return false
}

// Unfinished reports whether the claim still needs an outcome (claimed or
// released). Unfinished claims are what the reconciler scans.
func (s State) Unfinished() bool { return s == StateClaimed || s == StateReleased }

// Finished reports whether the claim's effect is settled for good
// (processed, failed or resolved): a delivery that finds it completes.
func (s State) Finished() bool {
	return s == StateProcessed || s == StateFailed || s == StateResolved
}

// Fail reasons: why a claim failed, and the dead-letter reason of the
// message that carries the failure (FailParams.Reason, Claim.FailReason).
const (
	// FailRejected: the downstream's final business answer (a decline).
	FailRejected = "EffectRejected"
	// FailPermanent: the downstream refused the request for good; not
	// performed.
	FailPermanent = "EffectFailed"
	// FailConflict: the downstream says the key was used with another
	// payload.
	FailConflict = "IdempotencyKeyConflict"
)

// MaxFailReasonLength bounds FailParams.Reason (the width of the SQL
// Server column).
const MaxFailReasonLength = 64

// TakeOverPath is who took a claim over from its previous holder.
type TakeOverPath string

const (
	// PathRedelivery: a delivery of the message found the claim released,
	// or held by an attempt whose heartbeat went silent.
	PathRedelivery TakeOverPath = "redelivery"
	// PathReconciler: the reconciler's recovery pass found the claim stale.
	PathReconciler TakeOverPath = "reconciler"
	// PathOperator: an operator's redrive took a flagged claim.
	PathOperator TakeOverPath = "operator"
)

// Valid reports whether p is one of the known paths.
func (p TakeOverPath) Valid() bool {
	return p == PathRedelivery || p == PathReconciler || p == PathOperator
}

// Resolution is how an operator closed a flagged claim.
type Resolution string

const (
	// ResolutionRedriven: the effect was re-run with the same idempotency
	// key and succeeded; the claim is processed.
	ResolutionRedriven Resolution = "redriven"
	// ResolutionDone: an operator checked that the effect happened.
	ResolutionDone Resolution = "done"
	// ResolutionDiscarded: an operator decided the effect must not happen.
	ResolutionDiscarded Resolution = "discarded"
)

// Valid reports whether r is one of the known resolutions.
func (r Resolution) Valid() bool {
	return r == ResolutionRedriven || r == ResolutionDone || r == ResolutionDiscarded
}

// MaxMessageIDLength is the longest dedup key a claim accepts; it is the
// width of the MessageId column and Service Bus's own MessageId limit.
const MaxMessageIDLength = 128

// Claim is one row of the claims table: the marker that says which attempt
// owns the effect of (MessageID, Consumer), and what became of it.
//
// Every time in a Claim was written by the database clock, never by a
// replica's clock, so times from different replicas compare.
type Claim struct {
	ID        int64
	MessageID string // the dedup key (MessageId by default)
	Consumer  string
	// Owner is the token of the attempt that holds the claim. Every guarded
	// update names it, so a replica that lost the claim cannot change it.
	Owner uuid.UUID
	State State

	Entity string // queue, or topic/subscription
	// SessionID is the message's session on a session-enabled entity
	// ("" otherwise): the console filters by it.
	SessionID     string
	Subject       string            // the message's Subject (routes match on it)
	ContentType   string            // the message's ContentType
	Properties    map[string]string // application properties, stringified (for redrive)
	PayloadHash   []byte            // SHA-256 of the body
	Payload       []byte            // the body, when stored; nil once processed
	DeliveryCount int               // the delivery that won (or last took over) the claim
	ClaimedBy     string            // who holds it: a replica's host, the reconciler, or "operator:<name>"

	// Route and Fingerprint are the route the claim was taken for and the
	// fingerprint of its effect (sideeffects.Handler). A take-over,
	// recovery or redrive under another route or fingerprint is refused.
	Route       string
	Fingerprint string

	ClaimedAt   time.Time
	HeartbeatAt time.Time // last heartbeat; set on claim, take-over and release
	ProcessedAt *time.Time
	ReleasedAt  *time.Time
	Attempts    int    // failed effect attempts recorded so far
	LastError   string // the last failed attempt's error, if any

	// The last take-over (TakeOvers counts them all): when, by which path
	// and why, and who held the claim before (ClaimedBy is the new holder).
	TakeOvers      int
	TakenOverAt    *time.Time
	TakeOverPath   TakeOverPath
	TakeOverReason string
	PreviousOwner  uuid.UUID // uuid.Nil until the first take-over
	PreviousHolder string

	// Recoveries counts the reconciler's recovery take-overs; NextAttemptAt
	// is when the next recovery may start (its backoff), nil for "now".
	Recoveries    int
	NextAttemptAt *time.Time

	// LateSuccessAt is set when an attempt that had lost the claim (it was
	// taken over, flagged or resolved meanwhile) saw its effect succeed
	// anyway; LateSuccessBy names that attempt's holder.
	LateSuccessAt *time.Time
	LateSuccessBy string

	FlaggedAt  *time.Time // the last time the claim was flagged (kept after a redrive)
	FlagReason string

	// FailedAt and FailReason are set when the claim failed (a final
	// answer); FailReason is the message's dead-letter reason (FailRejected,
	// FailPermanent or FailConflict) and LastError its description.
	FailedAt   *time.Time
	FailReason string
	// DeadLetterSeq is the broker SequenceNumber of the delivery that
	// carries a failed claim to the dead-letter queue: the delivery that
	// failed it, or, when the reconciler or a redrive failed it (no
	// message at hand), the first later delivery that took the dead letter
	// (TakeDeadLetter). nil: nobody has yet. Every other delivery of the
	// key completes, so the key is dead-lettered once.
	DeadLetterSeq *int64

	// Answer is the downstream's last answer recorded with an outcome
	// (status, recorded headers and JSON fields), AnswerAt when it was
	// recorded; nil when no answer was ever recorded.
	Answer   *Answer
	AnswerAt *time.Time

	// KeyRevision counts the operator's redrives under a new idempotency
	// key (0: the claim's original key); EffectKey is the key its effect
	// is sent with ("" for a raw claim's MessageID: see Key),
	// KeyRevisedBy, KeyRevisedAt and KeyRevisionNote who chose it, when
	// and why.
	KeyRevision int
	EffectKey   string
	// KeyForm is how the claim's keys are derived (KeyFormScoped for new
	// claims; KeyFormRaw for claims taken before forms were recorded and
	// for routes that opt out).
	KeyForm         KeyForm
	KeyRevisedBy    string
	KeyRevisedAt    *time.Time
	KeyRevisionNote string

	ResolvedAt     *time.Time
	ResolvedBy     string
	Resolution     Resolution
	ResolutionNote string

	// Delayed retries (Deferrer): DeferredSeq is the broker sequence
	// number of the claim's message while it is deferred (or fetched by a
	// holder), DueAt when it is due to be fetched (nil once fetched).
	// Postponements counts the deferrals, PostponedAt is the first one
	// (the start of the route's horizon).
	DeferredSeq   *int64
	DueAt         *time.Time
	Postponements int
	PostponedAt   *time.Time
}

// Key is the idempotency key the claim's effect is sent with: EffectKey
// (the key the store recorded when the claim was taken, or when an
// operator's redrive chose a new one), else the key its form derives (a
// raw claim's MessageID). Every attempt, take-over, recovery and redrive
// of the claim uses it.
func (c *Claim) Key() string {
	if c.EffectKey != "" {
		return c.EffectKey
	}
	return KeyFor(c.KeyForm, c.Consumer, c.MessageID, c.KeyRevision)
}

// NextKey is the key an operator's redrive under a new key would give
// the claim: revision KeyRevision+1 in the claim's form.
func (c *Claim) NextKey() string {
	return KeyFor(c.KeyForm, c.Consumer, c.MessageID, c.KeyRevision+1)
}

// RouteDiffers reports whether the claim was taken for another route or
// effect fingerprint than route and fingerprint: then its key must not be
// sent to that effect. A claim that recorded no route (taken before routes
// were recorded) differs from none.
func (c *Claim) RouteDiffers(route, fingerprint string) bool {
	return c.Route != "" && (c.Route != route || c.Fingerprint != fingerprint)
}

// HashPayload returns the SHA-256 of a message body: the payload hash that
// tells a duplicate (same key, same body) from a conflict (same key, other
// body).
func HashPayload(body []byte) []byte {
	sum := sha256.Sum256(body)
	return sum[:]
}

// Storable makes producer-controlled text storable in every database:
// PostgreSQL refuses NUL in text and JSON, and no column takes invalid
// UTF-8. One such property would otherwise fail a whole claim batch.
func Storable(s string) string {
	if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	}
	return s
}

// MaxErrorText bounds an error stored on a claim (LastError), in bytes.
const MaxErrorText = 2000

// ErrorText is an error as stored on a claim: storable and at most
// MaxErrorText bytes, cut on a UTF-8 boundary.
func ErrorText(err error) string {
	if err == nil {
		return ""
	}
	s := Storable(err.Error())
	if len(s) > MaxErrorText {
		s = strings.ToValidUTF8(s[:MaxErrorText], "") + "…"
	}
	return s
}

// Answer is a downstream's answer as a claim keeps it: the same JSON shape
// as sideeffects.Answer (status, step, headers, fields, truncated), which
// the processor and the reconciler convert from. The stores keep it as
// JSON text and bound it (MaxAnswerBytes).
type Answer struct {
	Status    int               `json:"status"`
	Step      string            `json:"step,omitempty"`
	Headers   map[string]string `json:"headers,omitempty"`
	Fields    map[string]string `json:"fields,omitempty"`
	Truncated bool              `json:"truncated,omitempty"`
}

// MaxAnswerBytes bounds an Answer stored on a claim, as JSON. The
// sideeffects package bounds answers to 2 KiB already; a larger one (an
// effect that built its own) is stored without its headers and fields,
// marked truncated.
const MaxAnswerBytes = 4096
