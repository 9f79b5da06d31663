package membus

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// Stats is a snapshot of a queue's state and counters.
type Stats struct {
	Sent         int // messages enqueued, duplicates included
	Active       int // available for delivery
	Locked       int // delivered, lock not yet settled or expired
	Completed    int
	DeadLettered int
	// DeadLetterReasons counts dead-lettered messages by DeadLetterReason.
	DeadLetterReasons map[string]int
	Deliveries        int // every delivery, first or not
	Redeliveries      int // deliveries with DeliveryCount > 1
	Abandoned         int
	Renewals          int
	LockExpiries      int // locks that ran out or were expired by ExpireLock
	LockLosses        int // settle/renew calls rejected with CodeLockLost
	ReceiveFaults     int // injected by FailReceives
	SettleFaults      int // injected by FailSettlements
	RenewFaults       int // injected by FailRenewals
	// Deferral (deferral.go): Deferred is the number of messages deferred
	// now; Deferrals counts DeferMessage calls, DeferredReceives the
	// deliveries by sequence number.
	Deferred         int
	Deferrals        int
	DeferredReceives int
	// Sessions (session.go): sessions accepted, and session locks that
	// ran out (or were expired by ExpireLock).
	SessionsAccepted    int
	SessionLockExpiries int
}

// Stats returns a snapshot. Expired locks are accounted for first.
func (q *Queue) Stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.expireLocked(time.Now())
	s := q.stats
	s.Active, s.Locked, s.Deferred = len(q.available), len(q.locked), len(q.deferred)
	s.DeadLetterReasons = maps.Clone(q.stats.DeadLetterReasons)
	return s
}

// DeadLetters returns copies of the dead-lettered messages, oldest first,
// with DeadLetterReason and DeadLetterErrorDescription set.
func (q *Queue) DeadLetters() []*azservicebus.ReceivedMessage {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.expireLocked(time.Now())
	out := make([]*azservicebus.ReceivedMessage, len(q.deadLetters))
	for i, m := range q.deadLetters {
		c := *m
		c.ApplicationProperties = maps.Clone(m.ApplicationProperties)
		out[i] = &c
	}
	return out
}

// Completed returns the MessageIDs of completed messages in completion
// order. A duplicate send that was completed too appears twice.
func (q *Queue) Completed() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.completed)
}

// Drained reports whether no message is active or locked.
func (q *Queue) Drained() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.expireLocked(time.Now())
	return len(q.available) == 0 && len(q.locked) == 0
}

// WaitIdle blocks until the queue is drained (every message completed or
// dead-lettered) or ctx ends. Lock expiries are noticed without polling.
func (q *Queue) WaitIdle(ctx context.Context) error {
	for {
		q.mu.Lock()
		q.expireLocked(time.Now())
		if len(q.available) == 0 && len(q.locked) == 0 && len(q.deferred) == 0 {
			q.mu.Unlock()
			return nil
		}
		changed, next := q.changed, q.nextExpiryLocked()
		q.mu.Unlock()
		if err := wait(ctx, changed, next, nil, nil); err != nil {
			return err
		}
	}
}

// FailReceives makes the next n ReceiveMessages calls on any receiver fail
// with an *azservicebus.Error carrying code (for example CodeConnectionLost).
func (q *Queue) FailReceives(n int, code azservicebus.Code) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.failReceives, q.failReceiveCode = n, code
}

// FailSettlements makes the next n Complete/Abandon/DeadLetter calls fail
// with CodeConnectionLost without settling: the lock stays held and runs
// out, as when the settlement never reached the service.
func (q *Queue) FailSettlements(n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.failSettlements = n
}

// FailRenewals makes the next n RenewMessageLock calls fail with
// CodeConnectionLost without extending the lock.
func (q *Queue) FailRenewals(n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.failRenewals = n
}

// SetUnreachable, while on, makes the broker unreachable, as a network
// partition or a namespace outage does: ReceiveMessages delivers nothing
// and blocks (the SDK keeps retrying its connection until the caller's
// context ends), PeekMessages fails with CodeConnectionLost, and
// settlements and renewals fail with CodeConnectionLost without effect.
// Locks keep running out meanwhile.
func (q *Queue) SetUnreachable(on bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.unreachable = on
	q.notifyLocked()
}

// DuplicateSends, while on, enqueues every sent message twice with the same
// MessageID (and its own SequenceNumber), as a producer retry after a lost
// send acknowledgement does.
func (q *Queue) DuplicateSends(on bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.duplicateSends = on
}

// ExpireLock ends the locks of every current delivery of messageID now, as
// if they had run out. It reports how many locks it expired. On a
// session-enabled queue it ends the lock of the message's session, and so
// of every message held in it.
func (q *Queue) ExpireLock(messageID string) int {
	return q.expireWhere(func(e *entry) bool { return e.msg.MessageID == messageID })
}

// ExpireAllLocks ends every current lock now and reports how many.
func (q *Queue) ExpireAllLocks() int {
	return q.expireWhere(func(*entry) bool { return true })
}

func (q *Queue) expireWhere(match func(*entry) bool) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	n := 0
	for _, e := range q.locked {
		if match(e) {
			e.lockedUntil = now
			if s := q.sessionOfLocked(e); s != nil && s.holder != nil {
				s.lockedUntil = now // a session message's lock is its session's
			}
			n++
		}
	}
	q.expireLocked(now)
	return n
}
