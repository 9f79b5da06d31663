package sbclaim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/processor"
)

// FollowUp is a message a handler publishes as part of its effect (a
// payment consumer's "payment.charged"): see Delivery.Publish.
type FollowUp struct {
	// To is the target queue or topic (required).
	To string
	// Body is the message body (at most 192 KiB).
	Body []byte
	// Subject, ContentType and CorrelationID are the message's own
	// fields; CorrelationID defaults to the handled message's dedup key.
	Subject       string
	ContentType   string
	CorrelationID string
	// SessionID is required by a target that uses sessions.
	SessionID string
	// Properties are the message's application properties (strings).
	Properties map[string]string
	// ScheduledAt, when set, is the scheduled enqueue time.
	ScheduledAt time.Time
}

// ErrNoOutbox is what Publish returns where follow-ups cannot be
// published: the processor has no outbox (ProcessorConfig.Outbox), or the
// handler is not run by sbclaim.
var ErrNoOutbox = claim.ErrNoOutbox

// Publish adds a follow-up message to the delivery. It is not sent now:
// it is recorded with the claim's outcome — in the claim's transaction
// for a TxHandlerFunc, in the write that marks the claim processed for a
// HandlerFunc — so it exists if and only if the effect is recorded as
// performed; the processor sends it right after, and again until it is
// sent (the outbox). A handler that returns an error publishes nothing:
// the next attempt publishes again.
//
// Each follow-up's MessageId is derived from the claim's key and its
// position among the delivery's follow-ups (FollowUpMessageID): a repeat
// of the effect under the same key publishes the same MessageIds, and a
// resend after a crash carries the same one, which the target's duplicate
// detection drops — and which the next sbclaim consumer deduplicates on
// in any case. Publish the same follow-ups in the same order on every
// attempt.
//
// An invalid follow-up (no target, a body over 192 KiB, more than 32 per
// delivery) is an error, and so is publishing without an outbox
// (ErrNoOutbox).
func (d *Delivery) Publish(f FollowUp) error {
	if d.outbox == nil {
		return ErrNoOutbox
	}
	fu := claim.FollowUp{To: f.To, Body: f.Body, Subject: f.Subject, ContentType: f.ContentType,
		CorrelationID: f.CorrelationID, SessionID: f.SessionID, Properties: f.Properties}
	if fu.CorrelationID == "" {
		fu.CorrelationID = d.dedupKey
	}
	if !f.ScheduledAt.IsZero() {
		t := f.ScheduledAt
		fu.ScheduledAt = &t
	}
	if err := d.outbox.Publish(fu); err != nil {
		return fmt.Errorf("sbclaim: publish: %w", err)
	}
	return nil
}

// FollowUpMessageID is the MessageId of the n-th follow-up (1-based) a
// consumer's handler published for the message with dedup key dedupKey:
// "sbclaim-fu:" and the hex SHA-256 of the escaped consumer and dedup key,
// ":" and n. It never changes for a claim, so a resend is a duplicate.
func FollowUpMessageID(consumer, dedupKey string, n int) string {
	return claim.FollowUpMessageID(consumer, dedupKey, n)
}

// Sender sends to one queue or topic: *azservicebus.Sender
// (Client.NewSender) satisfies it.
type Sender interface {
	SendMessage(ctx context.Context, message *azservicebus.Message, options *azservicebus.SendMessageOptions) error
	Close(ctx context.Context) error
}

var _ Sender = (*azservicebus.Sender)(nil)

// OutboxConfig configures the outbox: how the processor sends the
// follow-ups handlers publish. It is on when NewSender is set:
//
//	Outbox: sbclaim.OutboxConfig{NewSender: func(to string) (sbclaim.Sender, error) {
//		return client.NewSender(to, nil)
//	}},
//
// The processor's identity needs Azure Service Bus Data Sender on every
// target, and each target should have duplicate detection on (see
// docs/outbox.md).
type OutboxConfig struct {
	// NewSender opens a sender to a target queue or topic; the processor
	// keeps one per target.
	NewSender func(target string) (Sender, error)
	// Lease is how long the relay holds a follow-up it sends (default
	// 1m; more than SendTimeout): a replica that dies holding one leaves
	// it to another once the lease ends.
	Lease time.Duration
	// SendTimeout bounds each send (default 10s).
	SendTimeout time.Duration
	// SweepInterval is how often each replica looks for follow-ups left
	// unsent by a crash or a Service Bus outage (default 5s).
	SweepInterval time.Duration
	// MaxBackoff bounds the wait after failed sends (default 5m).
	MaxBackoff time.Duration
}

func (c OutboxConfig) internal() processor.OutboxOptions {
	o := processor.OutboxOptions{Lease: c.Lease, SendTimeout: c.SendTimeout, SweepInterval: c.SweepInterval, MaxBackoff: c.MaxBackoff}
	if c.NewSender != nil {
		o.NewSender = func(target string) (processor.Sender, error) {
			s, err := c.NewSender(target)
			if err != nil {
				return nil, err
			}
			if s == nil {
				return nil, errors.New("sbclaim: OutboxConfig.NewSender returned no sender")
			}
			return s, nil
		}
	}
	return o
}

// SentFollowUp is one follow-up of a claim as the store keeps it, for
// operators (Store.FollowUps, `reconciler show`, the console).
type SentFollowUp struct {
	Position  int    // 1, 2, … in the order the handler published them
	MessageID string // FollowUpMessageID
	To        string
	Subject   string
	SessionID string
	// Sent is set once the relay sent it and recorded so (SentAt).
	Sent   bool
	SentAt *time.Time
	// Attempts counts the relay's tries (leases); LastError is the last
	// failed send's error; NextAttemptAt when a failed send is retried.
	Attempts      int
	LastError     string
	NextAttemptAt *time.Time
	CreatedAt     time.Time
	ScheduledAt   *time.Time
}

// FollowUps returns claim id's follow-ups by position (none: empty; a
// store without an outbox has none).
func (s *Store) FollowUps(ctx context.Context, id int64) ([]SentFollowUp, error) {
	ob, ok := s.s.(claim.Outbox)
	if !ok {
		return nil, nil
	}
	fus, err := ob.FollowUps(ctx, id)
	if err != nil {
		return nil, err
	}
	out := make([]SentFollowUp, len(fus))
	for i, f := range fus {
		out[i] = SentFollowUp{Position: f.Position, MessageID: f.MessageID, To: f.To, Subject: f.Subject, SessionID: f.SessionID,
			Sent: f.State == claim.FollowUpSent, SentAt: f.SentAt, Attempts: f.Attempts, LastError: f.LastError,
			NextAttemptAt: f.NextAttemptAt, CreatedAt: f.CreatedAt, ScheduledAt: f.ScheduledAt}
	}
	return out, nil
}

// FollowUpTargets returns the queues and topics the file's routes publish
// follow-ups to (followUps), sorted; none when its routes publish none. A
// processor running such routes needs ProcessorConfig.Outbox, and its
// identity Data Sender on each target.
func (f *RoutesFile) FollowUpTargets() []string { return f.r.FollowUpTargets() }
