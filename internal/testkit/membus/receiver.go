package membus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// maxMessagesLimit is the SDK's cap on one ReceiveMessages call.
const maxMessagesLimit = 5000

// defaultTimeAfterFirstMessage is the SDK's peek-lock gather window.
const defaultTimeAfterFirstMessage = 20 * time.Millisecond

// Receiver is a peek-lock receiver on a Queue. It has the methods, argument
// types and error codes of *azservicebus.Receiver that a consumer uses.
type Receiver struct {
	q         *Queue
	receiving atomic.Bool
	closeOnce sync.Once
	closed    chan struct{}
}

// ReceiveMessages blocks until at least one message is available, then
// gathers more for up to options.TimeAfterFirstMessage (default 20ms) or
// until maxMessages were received, like the SDK. When ctx ends before any
// message arrived it returns ctx.Err(); messages already gathered are
// returned with a nil error. Calls on one Receiver must not overlap.
func (r *Receiver) ReceiveMessages(ctx context.Context, maxMessages int, options *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	done, err := startReceive(&r.receiving, maxMessages)
	if err != nil {
		return nil, err
	}
	defer done()
	if err := r.checkOpen(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err // lock nothing for a caller that has stopped
	}
	if r.q.sessions != nil {
		return nil, fmt.Errorf("membus: queue %s requires sessions: receive through AcceptNextSession", r.q.name)
	}
	return r.q.receive(ctx, r.closed, maxMessages, options, func(now time.Time) (*entry, error) {
		if len(r.q.available) == 0 {
			return nil, nil
		}
		return r.q.available[0], nil
	}, nil)
}

// receive is ReceiveMessages of a receiver whose close channel is closed:
// pick returns the next entry it may deliver (nil: none now) or an error
// that ends the receive (a lost session lock); next, when set, adds a
// time to wake at (a session lock's expiry). Both run under q.mu.
func (q *Queue) receive(ctx context.Context, closed <-chan struct{}, maxMessages int, options *azservicebus.ReceiveMessagesOptions,
	pick func(now time.Time) (*entry, error), next func() time.Time) ([]*azservicebus.ReceivedMessage, error) {
	gather := defaultTimeAfterFirstMessage
	if options != nil && options.TimeAfterFirstMessage > 0 {
		gather = options.TimeAfterFirstMessage
	}

	q.mu.Lock()
	if q.failReceives > 0 {
		q.failReceives--
		q.stats.ReceiveFaults++
		code := q.failReceiveCode
		q.mu.Unlock()
		return nil, sbError(code, "queue %s: receive: injected fault", q.name)
	}
	q.mu.Unlock()

	var out []*azservicebus.ReceivedMessage
	var gatherDone <-chan time.Time
	for {
		q.mu.Lock()
		now := time.Now()
		q.expireLocked(now)
		var perr error
		for len(out) < maxMessages && !q.unreachable {
			e, err := pick(now)
			if err != nil {
				perr = err
				break
			}
			if e == nil {
				break
			}
			out = append(out, q.deliverLocked(e, now))
		}
		changed, wake := q.changed, q.nextExpiryLocked()
		if next != nil {
			if t := next(); !t.IsZero() && (wake.IsZero() || t.Before(wake)) {
				wake = t
			}
		}
		q.mu.Unlock()
		if perr != nil {
			if len(out) > 0 {
				return out, nil
			}
			return nil, perr
		}
		if len(out) == maxMessages {
			return out, nil
		}
		if len(out) > 0 && gatherDone == nil {
			t := time.NewTimer(gather)
			defer t.Stop()
			gatherDone = t.C
		}
		if err := wait(ctx, changed, wake, closed, gatherDone); err != nil {
			switch {
			case len(out) > 0:
				return out, nil
			case errors.Is(err, errReceiverClosed):
				return nil, sbError(azservicebus.CodeClosed, "queue %s: receive", q.name)
			default:
				return nil, err
			}
		}
	}
}

// PeekMessages returns copies of up to maxMessageCount messages without
// locking them (the SDK's peek: no lock token, nothing changes), from
// options.FromSequenceNumber on: available, locked and deferred ones
// (State says which is deferred), never dead-lettered or settled ones, as
// Service Bus's message browsing does. Unlike the SDK it keeps no peek
// cursor: a call without FromSequenceNumber starts at the head. It fails
// with CodeConnectionLost while the broker is unreachable: a cheap probe
// of the connection.
func (r *Receiver) PeekMessages(ctx context.Context, maxMessageCount int, options *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if err := r.checkOpen(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	q := r.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.unreachable {
		return nil, sbError(azservicebus.CodeConnectionLost, "queue %s: peek: broker unreachable", q.name)
	}
	q.expireLocked(time.Now())
	// As Service Bus browses its log: every message still in the entity —
	// available, locked by a receiver, or deferred — in sequence order
	// from FromSequenceNumber; never a dead-lettered or settled one.
	var from int64
	if options != nil && options.FromSequenceNumber != nil {
		from = *options.FromSequenceNumber
	}
	all := make([]*entry, 0, len(q.available)+len(q.locked)+len(q.deferred))
	all = append(all, q.available...)
	for _, e := range q.locked {
		all = append(all, e)
	}
	for _, e := range q.deferred {
		all = append(all, e)
	}
	slices.SortFunc(all, func(a, b *entry) int { return cmp.Compare(*a.msg.SequenceNumber, *b.msg.SequenceNumber) })
	var out []*azservicebus.ReceivedMessage
	for _, e := range all {
		if len(out) == maxMessageCount {
			break
		}
		if *e.msg.SequenceNumber < from {
			continue
		}
		out = append(out, peeked(e))
	}
	return out, nil
}

// peeked is what a peek returns of e: a copy, with no lock, State saying
// whether it is deferred.
func peeked(e *entry) *azservicebus.ReceivedMessage {
	m := *e.msg
	m.Body = slices.Clone(e.msg.Body)
	m.ApplicationProperties = maps.Clone(e.msg.ApplicationProperties)
	m.LockToken, m.LockedUntil = [16]byte{}, nil
	if e.deferred {
		m.State = azservicebus.MessageStateDeferred
	}
	return &m
}

// startReceive checks a ReceiveMessages call's arguments and that no
// other call of the receiver is receiving; done ends the call.
func startReceive(receiving *atomic.Bool, maxMessages int) (done func(), err error) {
	if maxMessages <= 0 || maxMessages > maxMessagesLimit {
		return nil, fmt.Errorf("membus: maxMessages must be in 1..%d, got %d", maxMessagesLimit, maxMessages)
	}
	if !receiving.CompareAndSwap(false, true) {
		return nil, errors.New("membus: receiver is already receiving messages. ReceiveMessages() cannot be called concurrently")
	}
	return func() { receiving.Store(false) }, nil
}

// completeEntry, abandonEntry and deadLetterEntry are what a settlement
// does to a locked entry, for both kinds of receiver (the queue's lock
// held).
func completeEntry(q *Queue, e *entry) {
	if !q.forget {
		q.completed = append(q.completed, e.msg.MessageID)
	}
	q.stats.Completed++
	q.notifyLocked()
}

func abandonEntry(options *azservicebus.AbandonMessageOptions) func(*Queue, *entry) {
	return func(q *Queue, e *entry) {
		if options != nil {
			e.msg.ApplicationProperties = mergeProps(e.msg.ApplicationProperties, options.PropertiesToModify)
		}
		q.stats.Abandoned++
		q.releaseLocked(e)
	}
}

func deadLetterEntry(options *azservicebus.DeadLetterOptions) func(*Queue, *entry) {
	return func(q *Queue, e *entry) {
		var reason, desc string
		if options != nil {
			reason, desc = deref(options.Reason), deref(options.ErrorDescription)
			e.msg.ApplicationProperties = mergeProps(e.msg.ApplicationProperties, options.PropertiesToModify)
		}
		q.deadLetterLocked(e, reason, desc)
	}
}

// CompleteMessage removes the message from the queue.
func (r *Receiver) CompleteMessage(ctx context.Context, message *azservicebus.ReceivedMessage, _ *azservicebus.CompleteMessageOptions) error {
	return r.settle(ctx, "complete", message, completeEntry)
}

// AbandonMessage makes the message available again at once; the next
// delivery has DeliveryCount+1, or the message is dead-lettered with
// ReasonMaxDeliveryCountExceeded when this was its last allowed delivery.
func (r *Receiver) AbandonMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.AbandonMessageOptions) error {
	return r.settle(ctx, "abandon", message, abandonEntry(options))
}

// DeadLetterMessage moves the message to the dead-letter queue with
// options.Reason and options.ErrorDescription.
func (r *Receiver) DeadLetterMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.DeadLetterOptions) error {
	return r.settle(ctx, "dead-letter", message, deadLetterEntry(options))
}

// RenewMessageLock extends the delivery's lock by the queue's lock duration
// from now and updates message.LockedUntil.
func (r *Receiver) RenewMessageLock(ctx context.Context, message *azservicebus.ReceivedMessage, _ *azservicebus.RenewMessageLockOptions) error {
	e, err := r.lookup(ctx, "renew lock", message, &r.q.failRenewals, &r.q.stats.RenewFaults)
	if err != nil {
		return err
	}
	defer r.q.mu.Unlock()
	e.lockedUntil = time.Now().Add(r.q.lockDuration)
	lockedUntil := e.lockedUntil.UTC()
	message.LockedUntil = &lockedUntil
	r.q.stats.Renewals++
	return nil
}

// Close closes the receiver: a blocked ReceiveMessages returns, and every
// later call fails with CodeClosed. Locks it handed out are not released;
// they run out like a crashed replica's.
func (r *Receiver) Close(context.Context) error {
	r.closeOnce.Do(func() { close(r.closed) })
	return nil
}

func (r *Receiver) checkOpen() error {
	select {
	case <-r.closed:
		return sbError(azservicebus.CodeClosed, "queue %s: receiver closed", r.q.name)
	default:
		return nil
	}
}

func (r *Receiver) settle(ctx context.Context, op string, m *azservicebus.ReceivedMessage, apply func(*Queue, *entry)) error {
	e, err := r.lookup(ctx, op, m, &r.q.failSettlements, &r.q.stats.SettleFaults)
	if err != nil {
		return err
	}
	defer r.q.mu.Unlock()
	delete(r.q.locked, e.lockToken)
	apply(r.q, e)
	return nil
}

// lookup finds the entry locked by m's lock token. On success it returns
// with q.mu held; on error q.mu is not held. Like the SDK since 1.10, only
// the lock token matters, so any receiver on the queue may settle.
func (r *Receiver) lookup(ctx context.Context, op string, m *azservicebus.ReceivedMessage, fail, faults *int) (*entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := r.checkOpen(); err != nil {
		return nil, err
	}
	q := r.q
	q.mu.Lock()
	if q.unreachable {
		q.mu.Unlock()
		return nil, sbError(azservicebus.CodeConnectionLost, "queue %s: %s message %s: broker unreachable", q.name, op, m.MessageID)
	}
	if *fail > 0 {
		*fail--
		*faults++
		q.mu.Unlock()
		return nil, sbError(azservicebus.CodeConnectionLost, "queue %s: %s message %s: injected fault", q.name, op, m.MessageID)
	}
	q.expireLocked(time.Now())
	e, ok := q.locked[m.LockToken]
	if !ok {
		q.stats.LockLosses++
		q.mu.Unlock()
		return nil, sbError(azservicebus.CodeLockLost, "queue %s: %s message %s", q.name, op, m.MessageID)
	}
	return e, nil
}

// sbError wraps an *azservicebus.Error with context; callers use errors.As.
func sbError(code azservicebus.Code, format string, args ...any) error {
	return fmt.Errorf("membus: "+format+": %w", append(args, &azservicebus.Error{Code: code})...)
}

func mergeProps(dst, src map[string]any) map[string]any {
	if len(src) == 0 {
		return dst
	}
	if dst == nil {
		dst = make(map[string]any, len(src))
	}
	maps.Copy(dst, src)
	return dst
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
