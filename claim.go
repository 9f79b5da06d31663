package sbclaim

import (
	"context"
	"iter"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// ClaimState is where a claim is in its life: claimed, processed,
// released, failed, flagged or resolved (see docs/design.md, States).
type ClaimState string

// The claim states.
const (
	StateClaimed   ClaimState = "claimed"
	StateProcessed ClaimState = "processed"
	StateReleased  ClaimState = "released"
	StateFailed    ClaimState = "failed"
	StateFlagged   ClaimState = "flagged"
	StateResolved  ClaimState = "resolved"
)

// ClaimStates returns every claim state, in lifecycle order.
func ClaimStates() []ClaimState {
	return []ClaimState{StateClaimed, StateProcessed, StateReleased, StateFailed, StateFlagged, StateResolved}
}

// Valid reports whether s is one of the claim states.
func (s ClaimState) Valid() bool { return claim.State(s).Valid() }

// TakeOverPath is who took a claim over from its previous holder.
type TakeOverPath string

// The take-over paths.
const (
	// TakeOverRedelivery: a delivery of the message found the claim
	// released, or held by an attempt whose heartbeat went silent.
	TakeOverRedelivery TakeOverPath = "redelivery"
	// TakeOverReconciler: the reconciler's recovery found the claim stale.
	TakeOverReconciler TakeOverPath = "reconciler"
	// TakeOverOperator: an operator's redrive or hand-off took a flagged
	// claim.
	TakeOverOperator TakeOverPath = "operator"
)

// Resolution is how an operator closed a flagged claim (operator.Resolve,
// operator.Redrive).
type Resolution string

const (
	// ResolutionDone: the operator checked that the effect happened.
	ResolutionDone Resolution = "done"
	// ResolutionDiscarded: the operator decided it must not happen.
	ResolutionDiscarded Resolution = "discarded"
	// ResolutionRedriven: a redrive re-ran the effect and it succeeded;
	// only a redrive resolves so (operator.Resolve refuses it).
	ResolutionRedriven Resolution = "redriven"
)

// Claim is a read-only view of one row of the claims table: everything the
// operator tools show about a claim. Times are the database clock's; a nil
// time means it never happened.
//
// The row keeps the last take-over, flag, key revision and resolution of
// a claim (earlier ones are counted, not kept).
type Claim struct {
	ID       int64
	DedupKey string
	Consumer string
	State    ClaimState
	Route    string
	// IdempotencyKey is the key the claim's effect is sent with: the
	// dedup key, or the key an operator's redrive under a new key chose.
	IdempotencyKey string
	// Attempts counts the failed attempts recorded; TakeOvers the times
	// another holder took the claim over.
	Attempts, TakeOvers int
	ClaimedBy           string
	LastError           string
	FlagReason          string
	FailReason          string
	ClaimedAt           time.Time
	ProcessedAt         *time.Time
	// LateSuccess is set when an attempt that had lost the claim saw its
	// effect succeed anyway (LateSuccessAt, LateSuccessBy).
	LateSuccess bool
	// Answer is the downstream's last answer recorded with an outcome
	// (Delivery.ReportAnswer, or the HTTP effect's), nil when none was;
	// AnswerAt is when it was recorded.
	Answer   *Answer
	AnswerAt *time.Time

	// Fingerprint is the effect fingerprint of Route the claim was taken
	// for: a take-over, recovery or redrive under another one is refused.
	Fingerprint string
	// Owner is the token of the attempt that holds the claim.
	Owner string

	// The message, as the claim keeps it for a redrive: its entity,
	// Subject, ContentType and application properties (as text), the
	// SHA-256 of its body, and the body itself (Payload; nil when it was
	// not stored, or once the claim is processed or failed).
	Entity      string
	Subject     string
	ContentType string
	Properties  map[string]string
	PayloadHash []byte
	Payload     []byte
	// SessionID is the message's session on a session-enabled entity
	// ("" otherwise).
	SessionID string
	// DeliveryCount is the delivery that won (or last took over) the
	// claim.
	DeliveryCount int

	// HeartbeatAt is the holder's last sign of life (set on claim,
	// take-over and release too).
	HeartbeatAt time.Time
	ReleasedAt  *time.Time
	// FlaggedAt is the last time the claim was flagged (kept after a
	// redrive).
	FlaggedAt *time.Time
	FailedAt  *time.Time
	// Recoveries counts the reconciler's recovery take-overs;
	// NextAttemptAt is when the next one may start (nil: now).
	Recoveries    int
	NextAttemptAt *time.Time

	// The last take-over: when, by which path and why, and who held the
	// claim before (ClaimedBy is the new holder). PreviousOwner is ""
	// until the first take-over.
	TakenOverAt    *time.Time
	TakeOverPath   TakeOverPath
	TakeOverReason string
	PreviousOwner  string
	PreviousHolder string

	// LateSuccessAt is when an attempt that had lost the claim saw its
	// effect succeed; LateSuccessBy names that attempt's holder.
	LateSuccessAt *time.Time
	LateSuccessBy string

	// DeadLetterSeq is the sequence number of the delivery that carries a
	// failed claim's message to the dead-letter queue; nil: none yet.
	DeadLetterSeq *int64

	// KeyRevision counts the redrives under a new idempotency key (0: the
	// key is the dedup key); KeyRevisedBy, KeyRevisedAt and
	// KeyRevisionNote say who chose the last one, when and why.
	KeyRevision     int
	KeyRevisedBy    string
	KeyRevisedAt    *time.Time
	KeyRevisionNote string
	// KeyForm is how IdempotencyKey is derived: "scoped" (the consumer
	// and the dedup key, escaped, so two consumers never send one key:
	// every claim taken since the form was recorded) or "raw" (the dedup
	// key itself: claims from before, and routes that opt out).
	KeyForm string
	// KeyFormNote says it in words, with the revision when there is one.
	KeyFormNote string

	// Delayed retries (Route.Backoff): DeferredSeq is the sequence number
	// of the claim's message while it is deferred at Service Bus (nil:
	// none); DueAt when it is fetched again (nil: not waiting);
	// Postponements how many times the effect was postponed, PostponedAt
	// the first time.
	DeferredSeq   *int64
	DueAt         *time.Time
	Postponements int
	PostponedAt   *time.Time
	// Deferred is true while the claim waits for its deferred message to
	// be due.
	Deferred bool

	// How the claim was resolved (by an operator, or a redrive), by whom
	// and why.
	ResolvedAt     *time.Time
	Resolution     Resolution
	ResolvedBy     string
	ResolutionNote string
}

// Answer is a downstream's answer as a claim keeps it: the status (0 when
// there was none), the step of a multi-step handler it answered, the few
// header and field values worth keeping, and whether it was cut to the
// bounds a claim keeps.
type Answer struct {
	Status    int
	Step      string
	Headers   map[string]string
	Fields    map[string]string
	Truncated bool
}

func publicClaim(c *claim.Claim) *Claim {
	pc := &Claim{ID: c.ID, DedupKey: c.MessageID, Consumer: c.Consumer, State: ClaimState(c.State), Route: c.Route,
		IdempotencyKey: c.Key(), Attempts: c.Attempts, TakeOvers: c.TakeOvers, ClaimedBy: c.ClaimedBy,
		LastError: c.LastError, FlagReason: c.FlagReason, FailReason: c.FailReason, ClaimedAt: c.ClaimedAt,
		ProcessedAt: c.ProcessedAt, LateSuccess: c.LateSuccessAt != nil, AnswerAt: c.AnswerAt,
		Fingerprint: c.Fingerprint, Owner: c.Owner.String(),
		Entity: c.Entity, SessionID: c.SessionID, Subject: c.Subject, ContentType: c.ContentType, Properties: c.Properties,
		PayloadHash: c.PayloadHash, Payload: c.Payload, DeliveryCount: c.DeliveryCount,
		HeartbeatAt: c.HeartbeatAt, ReleasedAt: c.ReleasedAt, FlaggedAt: c.FlaggedAt, FailedAt: c.FailedAt,
		Recoveries: c.Recoveries, NextAttemptAt: c.NextAttemptAt,
		TakenOverAt: c.TakenOverAt, TakeOverPath: TakeOverPath(c.TakeOverPath), TakeOverReason: c.TakeOverReason,
		PreviousHolder: c.PreviousHolder, LateSuccessAt: c.LateSuccessAt, LateSuccessBy: c.LateSuccessBy,
		DeadLetterSeq: c.DeadLetterSeq, KeyRevision: c.KeyRevision, KeyRevisedBy: c.KeyRevisedBy,
		KeyRevisedAt: c.KeyRevisedAt, KeyRevisionNote: c.KeyRevisionNote, ResolvedAt: c.ResolvedAt,
		Resolution: Resolution(c.Resolution), ResolvedBy: c.ResolvedBy, ResolutionNote: c.ResolutionNote,
		KeyForm: string(c.KeyForm), KeyFormNote: c.FormNote(),
		DeferredSeq: c.DeferredSeq, DueAt: c.DueAt, Postponements: c.Postponements, PostponedAt: c.PostponedAt, Deferred: c.Deferred()}
	if c.PreviousOwner != uuid.Nil {
		pc.PreviousOwner = c.PreviousOwner.String()
	}
	pc.Answer = publicAnswer(c.Answer)
	return pc
}

func publicAnswer(a *claim.Answer) *Answer {
	if a == nil {
		return nil
	}
	return &Answer{Status: a.Status, Step: a.Step, Headers: a.Headers, Fields: a.Fields, Truncated: a.Truncated}
}

// Claim returns one claim by id; the error wraps ErrNotFound when there
// is none.
func (s *Store) Claim(ctx context.Context, id int64) (*Claim, error) {
	c, err := s.s.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	return publicClaim(c), nil
}

// ClaimFilter selects claims for Store.Claims. Zero fields mean "any".
type ClaimFilter struct {
	Consumer string
	States   []ClaimState
	// OlderThan keeps claims claimed longer ago than this, by the
	// database clock.
	OlderThan time.Duration
	// Route keeps claims taken for exactly this route.
	Route string
	// SessionID keeps the claims of this session's messages.
	SessionID string
	// ReasonPrefix keeps claims whose FlagReason starts with it, compared
	// exactly (case-sensitive; % and _ are plain characters).
	ReasonPrefix string
	AfterID      int64 // keyset paging: only ids greater than this
	// Limit is the most claims one Claims call returns (default 100): a
	// page, not the whole answer. AllClaims reads every claim, a page of
	// Limit at a time.
	Limit int
}

// Claims returns ONE PAGE of claims, oldest id first: at most f.Limit
// (default 100), so a count over more claims than that is wrong. Read
// the next page with f.AfterID set to the last claim's ID, or range over
// AllClaims, which does that.
func (s *Store) Claims(ctx context.Context, f ClaimFilter) ([]*Claim, error) {
	p := &claim.ListParams{Consumer: f.Consumer, OlderThan: f.OlderThan, Route: f.Route, SessionID: f.SessionID, ReasonPrefix: f.ReasonPrefix,
		AfterID: f.AfterID, Limit: f.Limit}
	for _, st := range f.States {
		p.States = append(p.States, claim.State(st))
	}
	cs, err := s.s.List(ctx, p)
	if err != nil {
		return nil, err
	}
	out := make([]*Claim, len(cs))
	for i, c := range cs {
		out[i] = publicClaim(c)
	}
	return out, nil
}

// AllClaims returns every claim f selects, oldest id first, reading a
// page of f.Limit (default 100) at a time from f.AfterID on; it never
// stops short. A read that fails yields (nil, err) and ends the sequence.
//
//	for c, err := range store.AllClaims(ctx, sbclaim.ClaimFilter{States: ...}) {
//		if err != nil {
//			return err
//		}
//		...
//	}
func (s *Store) AllClaims(ctx context.Context, f ClaimFilter) iter.Seq2[*Claim, error] {
	return func(yield func(*Claim, error) bool) {
		for {
			page, err := s.Claims(ctx, f)
			if err != nil {
				yield(nil, err)
				return
			}
			for _, c := range page {
				if !yield(c, nil) {
					return
				}
			}
			if len(page) == 0 {
				return
			}
			f.AfterID = page[len(page)-1].ID
		}
	}
}

// Now returns the database clock (UTC): the clock every time on a claim
// was written by, for ages that compare.
func (s *Store) Now(ctx context.Context) (time.Time, error) { return s.s.Now(ctx) }

// ErrNotFound is wrapped by Store.Claim's error when no claim has the id.
var ErrNotFound = claim.ErrNotFound
