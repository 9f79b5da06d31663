package membus

import (
	"context"
	"slices"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// Deferral, as Service Bus does it (the processor's delayed retries rely
// on each point; the broker contract suite checks them):
//
//   - DeferMessage settles a locked delivery: the message stays in its
//     queue or subscription but ReceiveMessages no longer delivers it.
//     Only ReceiveDeferredMessages, by its sequence number, does. Other
//     subscriptions of a topic are not concerned: each holds its own copy.
//   - A delivery whose DeliveryCount has reached MaxDeliveryCount cannot be
//     deferred: it is dead-lettered with MaxDeliveryCountExceeded instead
//     (Azure/azure-service-bus#375: with MaxDeliveryCount 1, deferring
//     dead-letters).
//   - ReceiveDeferredMessages is a delivery: it counts (DeliveryCount + 1)
//     and locks the message under a new lock token for the lock duration;
//     the message is settled and renewed like any other. A lock that ends
//     without settlement (abandon, expiry) puts it back among the deferred
//     messages — or dead-letters it once DeliveryCount has reached
//     MaxDeliveryCount.
//   - A sequence number that names no deferred message (never deferred,
//     already received, completed, or expired) fails the call with
//     CodeNotFound and locks nothing (the service answers 404, which the
//     SDK maps to CodeNotFound). A deferred message whose time to live
//     ran out (ExpireDeferred) is dead-lettered when it is asked for, as
//     the service does: deferred messages expire on access, not on their
//     own.

// DeferMessage defers a locked delivery (see the package's deferral
// notes).
func (r *Receiver) DeferMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.DeferMessageOptions) error {
	return r.settle(ctx, "defer", message, func(q *Queue, e *entry) {
		if options != nil {
			e.msg.ApplicationProperties = mergeProps(e.msg.ApplicationProperties, options.PropertiesToModify)
		}
		q.stats.Deferrals++
		e.lockToken = [16]byte{}
		if e.msg.DeliveryCount >= q.maxDelivery {
			e.deferred = false
			q.releaseLocked(e) // dead-letters it
			return
		}
		e.deferred = true
		e.msg.State = azservicebus.MessageStateDeferred
		q.deferred[*e.msg.SequenceNumber] = e
		q.notifyLocked()
	})
}

// ReceiveDeferredMessages delivers the deferred messages with the given
// sequence numbers, each under a new lock (see the package's deferral
// notes). All or nothing: one number that names no deferred message fails
// the call with CodeNotFound.
func (r *Receiver) ReceiveDeferredMessages(ctx context.Context, sequenceNumbers []int64, _ *azservicebus.ReceiveDeferredMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
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
		return nil, sbError(azservicebus.CodeConnectionLost, "queue %s: receive deferred: broker unreachable", q.name)
	}
	if q.failReceives > 0 {
		q.failReceives--
		q.stats.ReceiveFaults++
		return nil, sbError(q.failReceiveCode, "queue %s: receive deferred: injected fault", q.name)
	}
	now := time.Now()
	q.expireLocked(now)
	for _, seq := range sequenceNumbers {
		e, ok := q.deferred[seq]
		if !ok {
			return nil, sbError(azservicebus.CodeNotFound, "queue %s: receive deferred: no deferred message has sequence number %d", q.name, seq)
		}
		if e.expired {
			delete(q.deferred, seq)
			q.deadLetterLocked(e, "TTLExpiredException", "The message expired and was dead lettered.")
			return nil, sbError(azservicebus.CodeNotFound, "queue %s: receive deferred: the message with sequence number %d expired", q.name, seq)
		}
	}
	out := make([]*azservicebus.ReceivedMessage, 0, len(sequenceNumbers))
	for _, seq := range slices.Compact(slices.Sorted(slices.Values(sequenceNumbers))) {
		e := q.deferred[seq]
		delete(q.deferred, seq)
		q.stats.DeferredReceives++
		out = append(out, q.lockLocked(e, now))
	}
	return out, nil
}

// DeferredSequenceNumbers returns the sequence numbers of the messages
// deferred now, in order.
func (q *Queue) DeferredSequenceNumbers() []int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.expireLocked(time.Now())
	out := make([]int64, 0, len(q.deferred))
	for seq := range q.deferred {
		out = append(out, seq)
	}
	slices.Sort(out)
	return out
}

// ExpireDeferred runs out the time to live of the deferred message with
// sequence number seq: the next ReceiveDeferredMessages that asks for it
// dead-letters it and fails with CodeNotFound. It reports whether such a
// message was deferred.
func (q *Queue) ExpireDeferred(seq int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	e, ok := q.deferred[seq]
	if ok {
		e.expired = true
	}
	return ok
}
