package claim

import (
	"context"
	"database/sql"
	"time"

	"github.com/google/uuid"
)

// Store is the claims table. One implementation per database lives in a
// sub-package (mssql, postgres, sqlite); all of them pass the conformance
// suite in claimtest.
//
// Every method translates driver errors into this package's sentinels:
// ErrUnavailable when the database cannot be reached (the processor abandons
// the message for redelivery), ErrStateChanged when a guarded update found
// the claim no longer in the expected state or owned by another attempt,
// ErrNotFound when no claim has the given ID.
//
// Every change of a claim's owner or state is one guarded UPDATE whose
// precondition (owner, state, staleness by the database clock) is in its
// own WHERE, so a caller that lost a race changes nothing. Each such
// change also appends one row to the claim's history (History), in the
// same statement or transaction, only when the guarded write changed the
// claim.
type Store interface {
	// ClaimBatch inserts one marker per message in one round trip (a batch
	// of one is the single-message path; PostgreSQL takes a second to read
	// the rows of keys that already existed, only when there are any) and
	// reports, per message and in
	// the same order, whether this call won it, found a duplicate, or found
	// a conflict (same key, other payload hash). The claims unique index on
	// (MessageID, Consumer) is the only arbiter. Each message carries the
	// owner token its row gets: an existing row with that token that is
	// still claimed with the same payload hash is this attempt's own (a
	// retried or partly committed batch) and is Won. In any other state
	// (released, processed, failed, flagged, resolved) the row has moved on
	// and is a Duplicate, as anyone else's row would be; another payload
	// hash is a Conflict whatever the token. A won claim may share its
	// message's Payload and Properties with params (sqlstore.Inserted): the
	// caller must not change them afterwards.
	ClaimBatch(ctx context.Context, params *ClaimBatchParams) ([]ClaimResult, error)

	// ClaimTx is the one-phase path for a database-only effect: in one
	// transaction it inserts the marker already processed and calls fn with
	// that transaction. The marker and fn's writes commit together or not at
	// all. A duplicate or conflict rolls back without calling fn.
	ClaimTx(ctx context.Context, params *ClaimTxParams, fn func(ctx context.Context, tx *sql.Tx) error) (ClaimResult, error)

	// TakeOver gives a claim to a new owner: the one primitive behind a
	// redelivery that finds its claim released or its holder silent, the
	// reconciler's recovery and an operator's redrive. It is one guarded
	// UPDATE: the row must still have PreviousOwner and qualify for
	// params.Path (see TakeOverParams), judged by the database clock, and
	// its recorded route and fingerprint must be the caller's. Exactly one
	// of concurrent callers wins. The take-over is recorded on the row
	// (TakenOverAt, TakeOverPath, TakeOverReason, PreviousOwner,
	// PreviousHolder, TakeOvers: the last one) and in the claim's history
	// (every one).
	//
	// When it refuses, it returns the claim as it is now (when it could
	// read it) together with ErrStateChanged (another owner, another state,
	// a holder that is not silent) or ErrRouteChanged; ErrNotFound when the
	// claim is gone.
	TakeOver(ctx context.Context, params *TakeOverParams) (*Claim, error)

	// Flag hands a claim to operators with a reason. It is guarded on the
	// claim's owner and state and, when SilentFor is set, on its heartbeat
	// being older than SilentFor by the database clock (so a holder that
	// just showed life is not flagged). ErrStateChanged when the guard
	// fails.
	Flag(ctx context.Context, params *FlagParams) (*Claim, error)

	// FindStale returns, oldest heartbeat first, claims that are claimed or
	// released with no heartbeat (or release) for StaleAfter and whose
	// next attempt is due: the candidates of the reconciler's recovery. It
	// changes nothing; every action on a candidate is guarded again.
	FindStale(ctx context.Context, params *FindStaleParams) ([]*Claim, error)

	// RecordLateSuccess notes on the claim that an attempt which had lost
	// it (By names that attempt's holder) saw its effect succeed anyway.
	// It changes no owner or state.
	RecordLateSuccess(ctx context.Context, params *LateSuccessParams) error

	// Heartbeat refreshes HeartbeatAt of a claimed claim held by Owner.
	Heartbeat(ctx context.Context, params *HeartbeatParams) error

	// MarkProcessed moves a claimed claim held by Owner to processed and
	// nulls its stored payload.
	//
	// MarkProcessed, Release, RecordAttempt, Fail and Resolve (redriven)
	// record the downstream's answer (params.Answer, with AnswerAt by the
	// database clock) in the same write; a nil Answer keeps the one the
	// claim has (the attempt got none: a timeout).
	MarkProcessed(ctx context.Context, params *MarkProcessedParams) error

	// Release moves a claimed claim held by Owner to released, recording the
	// error that made the effect not happen. Only for effects that were
	// definitely not performed.
	Release(ctx context.Context, params *ReleaseParams) error

	// RecordAttempt counts one effect attempt and records its error on a
	// claimed claim held by Owner, leaving it claimed (outcome unknown).
	RecordAttempt(ctx context.Context, params *RecordAttemptParams) error

	// Fail moves a claimed claim held by Owner to failed: the downstream
	// gave a final answer that is not a success (rejected, permanent,
	// conflict). It records FailedAt, FailReason (the message's
	// dead-letter reason), the error as LastError, the answer, and the
	// delivery that dead-letters the message (DeadLetterSeq). It keeps the
	// stored payload, for an operator's retry (TakeOver with Retry). A
	// failed claim is finished: never taken over (but by that retry),
	// flagged or re-run by itself; it is purged like a processed one (by
	// FailedAt).
	// ErrStateChanged when the claim is not claimed by Owner.
	Fail(ctx context.Context, params *FailParams) error

	// TakeDeadLetter records that the delivery with broker sequence number
	// Seq carries a failed claim to the dead-letter queue, when no delivery
	// does yet (the reconciler or a redrive failed it): guarded on the
	// claim being failed with no DeadLetterSeq, so of concurrent copies one
	// dead-letters and the others complete. ErrStateChanged otherwise,
	// ErrNotFound when the claim is gone.
	TakeDeadLetter(ctx context.Context, params *TakeDeadLetterParams) error

	// FlagStale flags, in one bounded batch, claims that are claimed with no
	// heartbeat for StaleAfter, or released and not taken over for
	// StaleAfter. The staleness test is in the UPDATE itself, so a claim
	// processed (or heartbeated) between a scan and the update is never
	// flagged. It returns the claims it flagged.
	FlagStale(ctx context.Context, params *FlagStaleParams) ([]*Claim, error)

	// List returns claims for operators, oldest ID first, keyset-paged.
	List(ctx context.Context, params *ListParams) ([]*Claim, error)

	// Get returns one claim by ID, or ErrNotFound.
	Get(ctx context.Context, id int64) (*Claim, error)

	// History returns a claim's audit history, oldest first: one entry per
	// change of its owner or state (see Change), written in the same
	// statement or transaction as the change. ErrNotFound when the claim
	// is gone (its history goes with it).
	History(ctx context.Context, id int64) ([]HistoryEntry, error)

	// Resolve closes a claim with an audited resolution. Without Owner it
	// is guarded on the claim being flagged (an operator's "done" or
	// "discarded"); with Owner — only for ResolutionRedriven — on the claim
	// being claimed by that owner (the redrive that took it over). Either
	// way ErrStateChanged otherwise. ResolutionRedriven also marks the
	// claim processed.
	Resolve(ctx context.Context, params *ResolveParams) (*Claim, error)

	// PurgeProcessed deletes at most Limit finished claims (processed,
	// failed or resolved) whose ProcessedAt / FailedAt / ResolvedAt is older
	// than OlderThan by the database clock, and returns how many it
	// deleted. It never deletes a claimed, released or flagged claim. A
	// claim's history is deleted with it, in the same transaction, and the
	// purge leaves no trace of its own in any history (the reconciler logs
	// how many claims each pass purged).
	// Callers loop until a batch deletes fewer than Limit.
	PurgeProcessed(ctx context.Context, params *PurgeParams) (int64, error)

	// Stats summarises the table for metrics.
	Stats(ctx context.Context) (*Stats, error)

	// Overview summarises the open work for the operator console (see
	// OverviewParams and Overview): counts of claimed, released and flagged
	// claims, by consumer and by flag reason, flagged claims per hour and
	// the ages of unfinished claims. It reads only the rows of the partial
	// indexes of unfinished and flagged claims, so its cost grows with the
	// open work, never with the processed history.
	Overview(ctx context.Context, params *OverviewParams) (*Overview, error)

	// TryLock takes a database-wide named lock without waiting ("one
	// reconciler per tick"): sp_getapplock, pg_try_advisory_lock, or a
	// process-wide lock on SQLite. ok is false when someone else holds it.
	// unlock releases it and must be called when ok is true.
	TryLock(ctx context.Context, name string) (unlock func(context.Context) error, ok bool, err error)

	// Now returns the database clock (UTC).
	Now(ctx context.Context) (time.Time, error)

	// Ping checks the database is reachable (readiness).
	Ping(ctx context.Context) error

	// Close releases the store's resources.
	Close() error
}

// ClaimParams describes one received message to claim.
type ClaimParams struct {
	MessageID string // dedup key, 1..MaxMessageIDLength characters
	Consumer  string
	// Owner is the token the row gets if this attempt wins (required). The
	// caller generates it before claiming, so a retry of the same attempt
	// recognises its own row.
	Owner uuid.UUID
	// Route and Fingerprint name the effect the claim is taken for.
	Route       string
	Fingerprint string
	Entity      string
	// SessionID is the message's session (at most MaxMessageIDLength
	// characters; "" when the entity has none).
	SessionID     string
	Subject       string
	ContentType   string
	Properties    map[string]string
	PayloadHash   []byte // HashPayload(body)
	Payload       []byte // nil when payload storage is off
	DeliveryCount int
	// KeyForm is how the claim's idempotency keys are derived; "" is
	// KeyFormScoped. The store records it, and the key it derives as
	// EffectKey.
	KeyForm KeyForm
}

// ClaimBatchParams is the input of ClaimBatch.
type ClaimBatchParams struct {
	Host   string // recorded as ClaimedBy on won claims
	Claims []ClaimParams
}

// ClaimTxParams is the input of ClaimTx.
type ClaimTxParams struct {
	Host  string
	Claim ClaimParams
}

// Outcome is what a claim attempt found.
type Outcome int

const (
	// OutcomeWon: this call inserted the marker and owns the effect.
	OutcomeWon Outcome = iota + 1
	// OutcomeDuplicate: a claim with the same key and payload hash exists.
	OutcomeDuplicate
	// OutcomeConflict: a claim with the same key but another payload hash
	// exists (a producer bug: dead-letter, never complete silently).
	OutcomeConflict
)

func (o Outcome) String() string {
	switch o {
	case OutcomeWon:
		return "won"
	case OutcomeDuplicate:
		return "duplicate"
	case OutcomeConflict:
		return "conflict"
	}
	return "unknown"
}

// MarshalText implements encoding.TextMarshaler, so logs and JSON say
// "won", never 1.
func (o Outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// ClaimResult is the outcome for one message of a batch. Claim is the new
// claim when Won (with its ID, Owner and times), and the existing claim when
// Duplicate or Conflict (with at least ID, State, Owner and PayloadHash).
type ClaimResult struct {
	Outcome Outcome
	Claim   *Claim
}

// TakeOverParams is the input of TakeOver.
type TakeOverParams struct {
	ID int64
	// PreviousOwner is the owner the caller saw on the claim; the row must
	// still have it.
	PreviousOwner uuid.UUID
	// Owner is the new owner token (the caller generates it).
	Owner uuid.UUID
	// Path decides which claims qualify, by the database clock:
	//   - PathRedelivery: released, or claimed with a heartbeat older than
	//     SilentFor (a holder that went silent; SilentFor > 0);
	//   - PathReconciler: claimed or released with a heartbeat (or release)
	//     older than SilentFor, and its next attempt due;
	//   - PathOperator: flagged (failed with Retry).
	Path      TakeOverPath
	SilentFor time.Duration
	// By is the new holder, recorded as ClaimedBy: a replica's host, the
	// reconciler's, or "operator:<name>".
	By string
	// Reason is recorded as TakeOverReason.
	Reason string
	// DeliveryCount, when positive, is recorded (the delivery that took
	// the claim over).
	DeliveryCount int
	// Route and Fingerprint are the effect the caller is about to run. A
	// claim that recorded another route or fingerprint is refused with
	// ErrRouteChanged; one that recorded none (taken before routes were
	// recorded) gets these.
	Route       string
	Fingerprint string
	// Seq (PathRedelivery) is the broker sequence number of the taking
	// delivery. A claim that names another message (DeferredSeq: deferred,
	// being deferred, or fetched by its holder) is refused: that message
	// carries the claim. A take-over clears DueAt; a take-over by
	// redelivery (the claim's own message) also clears DeferredSeq, the
	// reconciler's and an operator's keep it (the message is still
	// deferred: see Deferrer).
	Seq *int64
	// NewKey (PathOperator only) moves the claim to a new idempotency key
	// in the same guarded write: KeyRevision + 1, EffectKey the claim's
	// NextKey() (revision KeyRevision+1 in its KeyForm), KeyRevisedBy By,
	// KeyRevisionNote Reason, KeyRevisedAt now. The taker then runs the
	// effect with the returned claim's Key(), as does every later
	// take-over. The caller checks the route allows it.
	NewKey bool
	// Retry (PathOperator only) is an operator's retry of a failed claim,
	// after fixing what made the downstream refuse it: the claim must be
	// failed instead of flagged. The take-over clears DeadLetterSeq (a new
	// failure dead-letters the next delivery again), keeps FailedAt and
	// FailReason on the row, and is recorded as ChangeRetried (path
	// operator), from failed.
	Retry bool
}

// FlagParams is the input of Flag.
type FlagParams struct {
	ID    int64
	Owner uuid.UUID // the row must still have this owner
	State State     // ... and this state (claimed or released)
	// SilentFor, when positive, also requires the heartbeat (or release)
	// to be older than this by the database clock.
	SilentFor time.Duration
	Reason    string
	// By is who flags it, recorded in the claim's history: the
	// reconciler's name, a processor's host, "operator:<name>" (a redrive
	// that failed); "" records the claim's holder.
	By string
}

// FindStaleParams is the input of FindStale.
type FindStaleParams struct {
	StaleAfter time.Duration
	Limit      int // 0 means a default of 100
}

// LateSuccessParams is the input of RecordLateSuccess.
type LateSuccessParams struct {
	ID    int64
	Owner uuid.UUID // the token of the attempt that lost the claim (logged in the note)
	By    string    // that attempt's holder
}

// HeartbeatParams is the input of Heartbeat.
type HeartbeatParams struct {
	ID    int64
	Owner uuid.UUID
}

// MarkProcessedParams is the input of MarkProcessed.
type MarkProcessedParams struct {
	ID     int64
	Owner  uuid.UUID
	Answer *Answer // the downstream's answer; nil keeps the claim's
	// FollowUps, numbered (NumberFollowUps), are written with the outcome,
	// in the same transaction (see Outbox); a store without an outbox
	// refuses them.
	FollowUps []FollowUp
}

// ReleaseParams is the input of Release.
type ReleaseParams struct {
	ID    int64
	Owner uuid.UUID
	Error string // why the effect was not performed
	// NextAttemptIn, when positive, sets NextAttemptAt to the database
	// clock plus this (the reconciler's backoff); otherwise it is cleared.
	NextAttemptIn time.Duration
	Answer        *Answer // the downstream's answer; nil keeps the claim's
}

// RecordAttemptParams is the input of RecordAttempt.
type RecordAttemptParams struct {
	ID    int64
	Owner uuid.UUID
	Error string // empty for an attempt without error
	// NextAttemptIn, when positive, sets NextAttemptAt to the database
	// clock plus this (the reconciler's backoff after an unknown outcome).
	NextAttemptIn time.Duration
	Answer        *Answer // the attempt's answer; nil keeps the claim's
}

// FailParams is the input of Fail.
type FailParams struct {
	ID    int64
	Owner uuid.UUID
	// Reason is the message's dead-letter reason (FailRejected,
	// FailPermanent or FailConflict; at most MaxFailReasonLength
	// characters); required.
	Reason string
	// Error is the final answer as text (ErrorText), kept as LastError and
	// used as the dead-letter description.
	Error  string
	Answer *Answer // the downstream's answer; nil keeps the claim's
	// DeadLetterSeq is the broker sequence number of the delivery that
	// fails the claim and dead-letters its message; nil when there is no
	// message (the reconciler, a redrive): a later delivery takes the dead
	// letter (TakeDeadLetter).
	DeadLetterSeq *int64
}

// TakeDeadLetterParams is the input of TakeDeadLetter.
type TakeDeadLetterParams struct {
	ID  int64
	Seq int64 // the delivery's broker sequence number
	// By is the host of the delivery, recorded in the claim's history.
	By string
}

// FlagStaleParams is the input of FlagStale.
type FlagStaleParams struct {
	StaleAfter time.Duration
	Limit      int // at most this many claims per call
	// By is recorded in each flagged claim's history ("" is
	// ReconcilerBy).
	By string
}

// ListParams filters List. Zero values mean "any".
type ListParams struct {
	States    []State
	Consumer  string
	OlderThan time.Duration // ClaimedAt older than now (database clock) minus this
	AfterID   int64         // keyset paging: only IDs greater than this
	Limit     int           // 0 means a default of 100
	// Route, when set, keeps claims taken for exactly this route.
	Route string
	// SessionID, when set, keeps the claims of this session's messages;
	// InSession keeps the claims of any session's messages.
	SessionID string
	InSession bool
	// ReasonPrefix, when set, keeps claims whose FlagReason starts with it,
	// compared exactly (case-sensitive; % and _ are plain characters).
	ReasonPrefix string
}

// ResolveParams is the input of Resolve.
type ResolveParams struct {
	ID         int64
	Resolution Resolution
	By         string
	Note       string
	// Owner, for ResolutionRedriven only, is the token of the redrive that
	// holds the claim; uuid.Nil resolves a flagged claim.
	Owner uuid.UUID
	// Answer, for ResolutionRedriven only, is the downstream's answer to
	// the redrive; nil keeps the claim's.
	Answer *Answer
	// FollowUps, for a redrive's own resolution only (Owner set), are the
	// follow-ups its effect published, numbered (NumberFollowUps): written
	// in the same transaction, as with MarkProcessed.
	FollowUps []FollowUp
}

// PurgeParams is the input of PurgeProcessed.
type PurgeParams struct {
	OlderThan time.Duration
	Limit     int
}

// Stats is a summary of the claims table, for metrics. Times are from the
// database clock.
type Stats struct {
	Now              time.Time
	Claimed          int64
	Released         int64
	Flagged          int64
	Failed           int64
	OldestUnfinished *time.Time // ClaimedAt of the oldest claimed or released claim
}

type txClaimKey struct{}

// WithTxClaim returns ctx carrying the claim ClaimTx inserted, for the
// callback it runs in the same transaction (TxClaimOf reads it). Every
// store's ClaimTx passes it, so a database-only effect knows its claim.
func WithTxClaim(ctx context.Context, c *Claim) context.Context {
	return context.WithValue(ctx, txClaimKey{}, c)
}

// TxClaimOf returns the claim ClaimTx inserted (nil outside a ClaimTx
// callback).
func TxClaimOf(ctx context.Context) *Claim {
	c, _ := ctx.Value(txClaimKey{}).(*Claim)
	return c
}
