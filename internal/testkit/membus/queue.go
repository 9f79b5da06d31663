package membus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/google/uuid"
)

const (
	// DefaultLockDuration is the lock duration Service Bus gives a new queue.
	DefaultLockDuration = 60 * time.Second
	// DefaultMaxDeliveryCount is the max delivery count Service Bus gives a new queue.
	DefaultMaxDeliveryCount = 10
	// ReasonMaxDeliveryCountExceeded is the DeadLetterReason the service sets
	// on a message it dead-letters after too many deliveries.
	ReasonMaxDeliveryCountExceeded = "MaxDeliveryCountExceeded"
)

// QueueOptions configures a Queue. Zero values take the Service Bus defaults.
type QueueOptions struct {
	// LockDuration is how long a delivery's peek-lock lasts (default 60s).
	LockDuration time.Duration
	// MaxDeliveryCount is how many deliveries a message gets before it is
	// dead-lettered with ReasonMaxDeliveryCountExceeded (default 10).
	MaxDeliveryCount int
	// ForgetCompleted keeps no record of completed messages (Completed
	// returns nothing): for long benchmarks, whose memory must not grow
	// with the messages that went through.
	ForgetCompleted bool
	// RequiresSession makes the queue session-enabled (see session.go):
	// every message must carry a SessionID, and only session receivers
	// (AcceptNextSession) receive.
	RequiresSession bool
	// AcceptTimeout is how long AcceptNextSession waits for a session
	// before it fails with CodeTimeout (default DefaultAcceptTimeout).
	AcceptTimeout time.Duration
}

// Queue is an in-memory Service Bus queue (or topic subscription). All
// methods are safe for concurrent use.
type Queue struct {
	name         string
	lockDuration time.Duration
	maxDelivery  uint32

	mu          sync.Mutex
	changed     chan struct{} // closed and replaced on every state change
	seq         int64
	available   []*entry // sorted by sequence number
	locked      map[[16]byte]*entry
	deferred    map[int64]*entry // by sequence number (deferral.go)
	deadLetters []*azservicebus.ReceivedMessage
	completed   []string
	forget      bool // QueueOptions.ForgetCompleted
	stats       Stats

	duplicateSends  bool
	failReceives    int
	failReceiveCode azservicebus.Code
	unreachable     bool // SetUnreachable: the broker cannot be reached
	failSettlements int
	failRenewals    int

	// Sessions (session.go): nil unless QueueOptions.RequiresSession.
	sessions      map[string]*session
	acceptTimeout time.Duration
}

// entry is a stored message. msg holds the broker-owned properties; each
// delivery hands out a copy of it.
type entry struct {
	msg         *azservicebus.ReceivedMessage
	lockToken   [16]byte
	lockedUntil time.Time
	// deferred: the message was deferred; a delivery of it (by sequence
	// number) goes back to the deferred set when its lock ends without
	// settlement. expired: ExpireDeferred ran out its time to live.
	deferred, expired bool
}

// NewQueue returns an empty queue.
func NewQueue(name string, opts QueueOptions) *Queue {
	if opts.LockDuration <= 0 {
		opts.LockDuration = DefaultLockDuration
	}
	if opts.MaxDeliveryCount <= 0 {
		opts.MaxDeliveryCount = DefaultMaxDeliveryCount
	}
	q := &Queue{
		name:         name,
		lockDuration: opts.LockDuration,
		maxDelivery:  uint32(opts.MaxDeliveryCount),
		forget:       opts.ForgetCompleted,
		changed:      make(chan struct{}),
		locked:       make(map[[16]byte]*entry),
		deferred:     make(map[int64]*entry),
		stats:        Stats{DeadLetterReasons: map[string]int{}},
	}
	if opts.RequiresSession {
		q.sessions = make(map[string]*session)
		q.acceptTimeout = cmp.Or(opts.AcceptTimeout, DefaultAcceptTimeout)
	}
	return q
}

// Name returns the queue's name.
func (q *Queue) Name() string { return q.name }

// SendMessage enqueues msg, with the signature of
// (*azservicebus.Sender).SendMessage. A nil MessageID gets a generated one,
// as the service does. Scheduled messages are rejected (not modelled).
func (q *Queue) SendMessage(ctx context.Context, msg *azservicebus.Message, _ *azservicebus.SendMessageOptions) error {
	return q.SendMessages(ctx, []*azservicebus.Message{msg})
}

// SendMessages enqueues msgs in order, atomically.
func (q *Queue) SendMessages(ctx context.Context, msgs []*azservicebus.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, m := range msgs {
		if m == nil {
			return errors.New("membus: nil message")
		}
		if m.ScheduledEnqueueTime != nil {
			return errors.New("membus: scheduled messages are not modelled")
		}
		if q.sessions != nil && (m.SessionID == nil || *m.SessionID == "") {
			return fmt.Errorf("membus: queue %s: send: the entity requires sessions and message %s has no SessionID", q.name, deref(m.MessageID))
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, m := range msgs {
		q.enqueueLocked(m)
		if q.duplicateSends {
			q.enqueueLocked(m) // a producer retry after a lost ack
		}
	}
	q.notifyLocked()
	return nil
}

func (q *Queue) enqueueLocked(m *azservicebus.Message) {
	q.seq++
	seq, now := q.seq, time.Now().UTC()
	idp := m.MessageID
	if idp == nil {
		idp = newMessageID()
	}
	q.available = append(q.available, &entry{msg: &azservicebus.ReceivedMessage{
		MessageID:             *idp,
		Body:                  slices.Clone(m.Body),
		ApplicationProperties: maps.Clone(m.ApplicationProperties),
		ContentType:           clonePtr(m.ContentType),
		CorrelationID:         clonePtr(m.CorrelationID),
		Subject:               clonePtr(m.Subject),
		PartitionKey:          clonePtr(m.PartitionKey),
		ReplyTo:               clonePtr(m.ReplyTo),
		ReplyToSessionID:      clonePtr(m.ReplyToSessionID),
		SessionID:             clonePtr(m.SessionID),
		To:                    clonePtr(m.To),
		TimeToLive:            clonePtr(m.TimeToLive),
		SequenceNumber:        &seq,
		EnqueuedTime:          &now,
		State:                 azservicebus.MessageStateActive,
	}})
	q.stats.Sent++
}

// NewReceiver returns a peek-lock receiver on the queue. Any number of
// receivers may compete on one queue, like replicas on a real one. On a
// session-enabled queue its receives fail: use AcceptNextSession.
func (q *Queue) NewReceiver() *Receiver {
	return &Receiver{q: q, closed: make(chan struct{})}
}

func (q *Queue) notifyLocked() {
	close(q.changed)
	q.changed = make(chan struct{})
}

// expireLocked returns every delivery whose lock has run out to the queue.
func (q *Queue) expireLocked(now time.Time) {
	q.expireSessionsLocked(now)
	for tok, e := range q.locked {
		if !now.Before(e.lockedUntil) {
			delete(q.locked, tok)
			q.stats.LockExpiries++
			q.releaseLocked(e)
		}
	}
}

// nextExpiryLocked returns the earliest lock expiry (of a message or a
// session), or zero if none.
func (q *Queue) nextExpiryLocked() time.Time {
	var next time.Time
	for _, e := range q.locked {
		if next.IsZero() || e.lockedUntil.Before(next) {
			next = e.lockedUntil
		}
	}
	for _, s := range q.sessions {
		if s.holder != nil && (next.IsZero() || s.lockedUntil.Before(next)) {
			next = s.lockedUntil
		}
	}
	return next
}

// releaseLocked makes an unlocked entry available again, or dead-letters it
// when its delivery count has reached the maximum.
func (q *Queue) releaseLocked(e *entry) {
	e.lockToken = [16]byte{}
	if e.msg.DeliveryCount >= q.maxDelivery {
		q.deadLetterLocked(e, ReasonMaxDeliveryCountExceeded,
			fmt.Sprintf("Message could not be consumed after %d delivery attempts.", q.maxDelivery))
		return
	}
	if e.deferred {
		q.deferred[*e.msg.SequenceNumber] = e
		q.notifyLocked()
		return
	}
	i, _ := slices.BinarySearchFunc(q.available, *e.msg.SequenceNumber, func(a *entry, seq int64) int {
		return cmp.Compare(*a.msg.SequenceNumber, seq)
	})
	q.available = slices.Insert(q.available, i, e)
	q.notifyLocked()
}

func (q *Queue) deadLetterLocked(e *entry, reason, description string) {
	dl := *e.msg
	dl.LockToken, dl.LockedUntil = [16]byte{}, nil
	if reason != "" {
		dl.DeadLetterReason = &reason
	}
	if description != "" {
		dl.DeadLetterErrorDescription = &description
	}
	q.deadLetters = append(q.deadLetters, &dl)
	q.stats.DeadLettered++
	q.stats.DeadLetterReasons[reason]++
	q.notifyLocked()
}

// deliverLocked takes e, an available entry, out of the available list,
// locks it and returns a new delivery.
func (q *Queue) deliverLocked(e *entry, now time.Time) *azservicebus.ReceivedMessage {
	if i := slices.Index(q.available, e); i == 0 {
		q.available = q.available[1:]
	} else {
		q.available = slices.Delete(q.available, i, i+1)
	}
	return q.lockLocked(e, now)
}

// lockLocked counts a delivery of e, locks it under a new token and
// returns the delivery (ReceiveMessages, ReceiveDeferredMessages).
func (q *Queue) lockLocked(e *entry, now time.Time) *azservicebus.ReceivedMessage {
	e.msg.DeliveryCount++
	e.lockToken = uuid.New()
	e.lockedUntil = now.Add(q.lockDuration)
	if s := q.sessionOfLocked(e); s != nil {
		e.lockedUntil = s.lockedUntil // a session's message lock is its session's lock
	}
	q.locked[e.lockToken] = e
	q.stats.Deliveries++
	if e.msg.DeliveryCount > 1 {
		q.stats.Redeliveries++
	}
	d := *e.msg
	d.Body = slices.Clone(e.msg.Body)
	d.ApplicationProperties = maps.Clone(e.msg.ApplicationProperties)
	d.LockToken = e.lockToken
	lockedUntil := e.lockedUntil.UTC()
	d.LockedUntil = &lockedUntil
	return &d
}

// wait blocks until the queue changes, the earliest lock expires, ctx ends
// or stop is closed. It must be called without q.mu held; changed and next
// are read under it beforehand.
func wait(ctx context.Context, changed <-chan struct{}, next time.Time, stop <-chan struct{}, extra <-chan time.Time) error {
	var expiry <-chan time.Time
	if !next.IsZero() {
		t := time.NewTimer(time.Until(next))
		defer t.Stop()
		expiry = t.C
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-stop:
		return errReceiverClosed
	case <-extra:
		return errGatherDone
	case <-changed:
	case <-expiry:
	}
	return nil
}

var (
	errReceiverClosed = errors.New("receiver closed")
	errGatherDone     = errors.New("gather window over")
)

// newMessageID returns an ID like the ones the service generates.
func newMessageID() *string {
	id := strings.ReplaceAll(uuid.NewString(), "-", "")
	return &id
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
