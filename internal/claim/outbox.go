package claim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// The outbox: follow-up messages a claim's effect publishes (a payment
// consumer's "payment.charged"). They are rows of the claim's
// (claim_followups), written in the same transaction as the claim's
// outcome (MarkProcessed, or ClaimTx for a transactional effect), so they
// exist if and only if the effect is recorded as performed. A relay sends
// each one with a deterministic MessageId (FollowUpMessageID) and marks it
// sent; a resend after a crash carries the same MessageId, which Service
// Bus duplicate detection and the next sbclaim consumer's claim both
// recognise. They live as long as their claim: the purge deletes them
// with it, and never purges a claim with a follow-up still pending.

// Bounds of a follow-up.
const (
	// MaxFollowUps bounds the follow-ups of one claim.
	MaxFollowUps = 32
	// MaxFollowUpBodyBytes bounds a follow-up's body (a Service Bus
	// standard tier message is at most 256 KB with its headers).
	MaxFollowUpBodyBytes = 192 << 10
	// MaxFollowUpTargetLength bounds a target's name: a queue or topic
	// name is at most 260 characters.
	MaxFollowUpTargetLength = 260
	// MaxFollowUpTextLength bounds Subject, ContentType, CorrelationID and
	// SessionID (Service Bus: 128 characters for a SessionId).
	MaxFollowUpTextLength = 128
	// MaxFollowUpPropertiesBytes bounds the application properties, as
	// JSON.
	MaxFollowUpPropertiesBytes = 16 << 10
)

// FollowUpMessageIDPrefix starts every follow-up's MessageId.
const FollowUpMessageIDPrefix = "sbclaim-fu:"

// FollowUpMessageID is the MessageId of follow-up n (1-based) of the claim
// of dedup key messageID under consumer:
//
//	sbclaim-fu:<hex SHA-256 of the escaped "<consumer>/<dedup key>">:<n>
//
// (EscapeKeyPart escapes each part, so two keys never hash the same
// text.) It depends only on the claim's key and the follow-up's
// position: a repeat of the effect under the same key produces the same
// MessageIds, and so does a resend. It is at most 79 characters (a
// Service Bus MessageId is at most 128, and so is a dedup key), and
// cannot be mistaken for an idempotency key sbclaim derives: a scoped key
// has no ':' before its first '/', a hashed one starts "sha256:", and a
// raw one is the producer's own MessageId.
func FollowUpMessageID(consumer, messageID string, n int) string {
	sum := sha256.Sum256([]byte(EscapeKeyPart(consumer) + "/" + EscapeKeyPart(messageID)))
	return FollowUpMessageIDPrefix + hex.EncodeToString(sum[:]) + ":" + strconv.Itoa(n)
}

// FollowUp is one follow-up message: what the effect publishes, and, once
// numbered (NumberFollowUps), its position and MessageId.
type FollowUp struct {
	// Position is the follow-up's place among its claim's (1-based), in
	// the order the effect published them; MessageID is derived from it
	// (FollowUpMessageID). Both are set by NumberFollowUps.
	Position  int
	MessageID string

	// To is the target queue or topic (required).
	To string
	// Body is the message body.
	Body []byte
	// Subject, ContentType and CorrelationID are the message's own fields.
	Subject       string
	ContentType   string
	CorrelationID string
	// SessionID is required by a target that uses sessions.
	SessionID string
	// Properties are the message's application properties.
	Properties map[string]string
	// ScheduledAt, when set, is the scheduled enqueue time.
	ScheduledAt *time.Time
}

// Validate checks a follow-up as the effect published it.
func (f *FollowUp) Validate() error {
	switch {
	case strings.TrimSpace(f.To) == "":
		return errors.New("follow-up: To (the target queue or topic) is required")
	case utf8.RuneCountInString(f.To) > MaxFollowUpTargetLength || strings.ContainsAny(f.To, "\x00\r\n"):
		return fmt.Errorf("follow-up to %.40q: not a queue or topic name (at most %d characters)", f.To, MaxFollowUpTargetLength)
	case len(f.Body) > MaxFollowUpBodyBytes:
		return fmt.Errorf("follow-up to %q: body of %d bytes exceeds %d", f.To, len(f.Body), MaxFollowUpBodyBytes)
	}
	for name, v := range map[string]string{"Subject": f.Subject, "ContentType": f.ContentType, "CorrelationID": f.CorrelationID, "SessionID": f.SessionID} {
		if utf8.RuneCountInString(v) > MaxFollowUpTextLength {
			return fmt.Errorf("follow-up to %q: %s is longer than %d characters", f.To, name, MaxFollowUpTextLength)
		}
		if !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
			return fmt.Errorf("follow-up to %q: %s is not valid text", f.To, name)
		}
	}
	n := 2
	for k, v := range f.Properties {
		if k == "" {
			return fmt.Errorf("follow-up to %q: an application property has an empty name", f.To)
		}
		if !utf8.ValidString(k) || !utf8.ValidString(v) || strings.ContainsRune(k+v, 0) {
			return fmt.Errorf("follow-up to %q: application property %q is not valid text", f.To, k)
		}
		n += len(k) + len(v) + 6
	}
	if n > MaxFollowUpPropertiesBytes {
		return fmt.Errorf("follow-up to %q: application properties of about %d bytes exceed %d", f.To, n, MaxFollowUpPropertiesBytes)
	}
	return nil
}

// NumberFollowUps returns copies of fus with their positions (1, 2, …)
// and MessageIds for the claim of messageID under consumer.
func NumberFollowUps(consumer, messageID string, fus []FollowUp) []FollowUp {
	out := make([]FollowUp, len(fus))
	for i, f := range fus {
		f.Position = i + 1
		f.MessageID = FollowUpMessageID(consumer, messageID, i+1)
		out[i] = f
	}
	return out
}

// ValidateNumbered checks follow-ups a store is about to write: each valid,
// numbered, positions distinct, at most MaxFollowUps.
func ValidateNumbered(claimID int64, fus []FollowUp) error {
	if len(fus) > MaxFollowUps {
		return fmt.Errorf("claim %d: %d follow-ups (at most %d)", claimID, len(fus), MaxFollowUps)
	}
	seen := map[int]bool{}
	for i := range fus {
		f := &fus[i]
		if err := f.Validate(); err != nil {
			return fmt.Errorf("claim %d: %w", claimID, err)
		}
		if f.Position < 1 || f.MessageID == "" || seen[f.Position] {
			return fmt.Errorf("claim %d: follow-up %d is not numbered (position %d, message id %q): use NumberFollowUps", claimID, i, f.Position, f.MessageID)
		}
		seen[f.Position] = true
	}
	return nil
}

// FollowUpState is where a follow-up is: pending until the relay sent it.
type FollowUpState string

// The follow-up states.
const (
	FollowUpPending FollowUpState = "pending"
	FollowUpSent    FollowUpState = "sent"
)

// StoredFollowUp is a follow-up row as the store has it.
type StoredFollowUp struct {
	ClaimID int64
	FollowUp
	State     FollowUpState
	CreatedAt time.Time
	// LeaseOwner and LeaseUntil: the relay that took the row to send it,
	// until when (database clock). uuid.Nil: never leased.
	LeaseOwner uuid.UUID
	LeaseUntil *time.Time
	// NextAttemptAt: a failed send's backoff (no lease is taken before).
	NextAttemptAt *time.Time
	// Attempts counts the leases taken (each one a send, or a try).
	Attempts  int
	LastError string
	SentAt    *time.Time
}

// Outbox is the part of a store behind follow-up messages (see the top of
// this file). The rows are written by MarkProcessed (FollowUps) and ClaimTx
// (the follow-ups its callback published into its context: see
// CollectFollowUps); Outbox leases, marks and lists them. Every change is
// one guarded UPDATE judged by the database clock. It is a separate
// interface, like Deferrer: a store without it has no outbox.
type Outbox interface {
	// LeaseFollowUps takes, oldest first, up to Limit pending follow-ups
	// that are due (no NextAttemptAt, or passed) and not leased (no
	// lease, or an expired one) — of claim ClaimID only when it is
	// positive — leasing each to Owner for For, counting an attempt. Of
	// concurrent callers each row goes to one.
	LeaseFollowUps(ctx context.Context, params *LeaseFollowUpsParams) ([]*StoredFollowUp, error)
	// MarkFollowUpSent moves a pending follow-up leased to Owner to sent.
	// ErrStateChanged when it is not (sent already, or leased to another
	// relay since the lease expired), ErrNotFound when it is gone.
	MarkFollowUpSent(ctx context.Context, params *FollowUpLeaseParams) error
	// RetryFollowUp gives back the lease of a pending follow-up leased to
	// Owner whose send failed: it records the error and makes the row due
	// again in RetryIn. ErrStateChanged when the lease is not Owner's.
	RetryFollowUp(ctx context.Context, params *RetryFollowUpParams) error
	// FollowUps returns a claim's follow-ups by position (none: empty).
	FollowUps(ctx context.Context, claimID int64) ([]*StoredFollowUp, error)
	// OutboxStats summarises the pending follow-ups, for metrics.
	OutboxStats(ctx context.Context) (*OutboxStats, error)
}

// LeaseFollowUpsParams is the input of LeaseFollowUps.
type LeaseFollowUpsParams struct {
	Owner   uuid.UUID     // the relay's token (required)
	For     time.Duration // the lease (required, positive)
	Limit   int           // 0: 100
	ClaimID int64         // positive: only this claim's
}

// Validate checks the params.
func (p *LeaseFollowUpsParams) Validate() error {
	switch {
	case p.Owner == uuid.Nil:
		return errors.New("lease follow-ups: Owner (the relay's token) is required")
	case p.For <= 0:
		return fmt.Errorf("lease follow-ups: For must be positive, got %s", p.For)
	case p.Limit < 0:
		return fmt.Errorf("lease follow-ups: Limit cannot be negative, got %d", p.Limit)
	}
	return nil
}

// FollowUpLeaseParams names one leased follow-up.
type FollowUpLeaseParams struct {
	ClaimID  int64
	Position int
	Owner    uuid.UUID // the lease's owner
}

// RetryFollowUpParams is the input of RetryFollowUp.
type RetryFollowUpParams struct {
	FollowUpLeaseParams
	Error   string
	RetryIn time.Duration
}

// OutboxStats summarises the outbox. Times are the database clock's.
type OutboxStats struct {
	Now           time.Time
	Pending       int64
	OldestPending *time.Time // CreatedAt of the oldest pending follow-up
}

// FollowUpSink collects the follow-ups an effect publishes (see
// CollectFollowUps). It is safe for concurrent use.
type FollowUpSink struct {
	mu  sync.Mutex
	fus []FollowUp
}

type sinkKey struct{}

// CollectFollowUps returns a context whose effect's follow-ups (Publish)
// go into the returned sink, replacing any sink ctx had: one per attempt,
// so a failed attempt's follow-ups are dropped with it.
func CollectFollowUps(ctx context.Context) (context.Context, *FollowUpSink) {
	s := &FollowUpSink{}
	return context.WithValue(ctx, sinkKey{}, s), s
}

// WithoutFollowUps returns ctx without a sink: an effect run with it
// cannot publish (Publish: ErrNoOutbox).
func WithoutFollowUps(ctx context.Context) context.Context {
	return context.WithValue(ctx, sinkKey{}, (*FollowUpSink)(nil))
}

// FollowUpSinkOf returns the sink of ctx (nil: follow-ups cannot be
// published here).
func FollowUpSinkOf(ctx context.Context) *FollowUpSink {
	s, _ := ctx.Value(sinkKey{}).(*FollowUpSink)
	return s
}

// ErrNoOutbox is returned by Publish where follow-ups cannot be published.
var ErrNoOutbox = errors.New("follow-ups cannot be published here: the effect runs without an outbox (the claims store has none, or the effect is not run by sbclaim)")

// Publish adds f to the sink (nil: ErrNoOutbox). f is validated, and
// copied: the caller may reuse it.
func (s *FollowUpSink) Publish(f FollowUp) error {
	if s == nil {
		return ErrNoOutbox
	}
	if err := f.Validate(); err != nil {
		return err
	}
	f.Body = append([]byte(nil), f.Body...)
	if f.Properties != nil {
		p := make(map[string]string, len(f.Properties))
		for k, v := range f.Properties {
			p[k] = v
		}
		f.Properties = p
	}
	if f.ScheduledAt != nil {
		t := f.ScheduledAt.UTC()
		f.ScheduledAt = &t
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.fus) >= MaxFollowUps {
		return fmt.Errorf("follow-up to %q: an effect publishes at most %d follow-ups", f.To, MaxFollowUps)
	}
	f.Position, f.MessageID = 0, ""
	s.fus = append(s.fus, f)
	return nil
}

// List returns what was published, in order (nil sink: none).
func (s *FollowUpSink) List() []FollowUp {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]FollowUp(nil), s.fus...)
}
