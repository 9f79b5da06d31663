package membus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// DefaultAcceptTimeout is how long AcceptNextSession waits for a session
// with messages before it fails with CodeTimeout: the service's wait
// behind the SDK's AcceptNextSessionForQueue is about a minute.
const DefaultAcceptTimeout = time.Minute

// Sessions, as Service Bus does them on a session-enabled entity
// (QueueOptions.RequiresSession); the broker contract suite checks each
// point the processor's session mode relies on:
//
//   - Every message carries a SessionID (a send without one fails), and
//     only a session receiver receives: AcceptNextSession locks the
//     session of the oldest available message whose session nobody holds,
//     or waits for one (up to the queue's AcceptTimeout, then CodeTimeout,
//     as the SDK's AcceptNextSessionForQueue does; a ctx deadline shortens
//     the wait, as the SDK passes it to the service as the accept timeout,
//     which answers CodeTimeout just before it; ctx.Err() when ctx ends
//     otherwise).
//   - One receiver holds a session at a time, and it receives that
//     session's messages only, in sequence-number order (FIFO per
//     session). An abandoned message goes back to its place: it is the
//     session's next message again.
//   - The session lock lasts the queue's lock duration from the accept or
//     the last RenewSessionLock, and it is the lock of every message the
//     receiver holds (their LockedUntil is the session's). When it runs
//     out (or ExpireLock expires one of its messages), the session is free
//     for another AcceptNextSession, its unsettled messages are available
//     again (DeliveryCount + 1 on their next delivery), and every call of
//     the old receiver that needs the lock — receive, settle, renew,
//     session state — fails with CodeLockLost.
//   - Close releases the session at once (the link is detached): another
//     receiver may accept it, and the messages it held are available
//     again.
//   - Session state is a byte blob kept with the session, whoever holds
//     it next: GetSessionState / SetSessionState (nil clears it).
//
// Deferral within a session is not modelled (the processor never defers
// in session mode: a deferred message would let the next one overtake it).

// session is the broker's record of one session.
type session struct {
	id          string
	holder      *SessionReceiver // nil: free
	lockedUntil time.Time
	state       []byte
}

// SessionReceiver is a receiver locked to one session, with the methods,
// argument types and error codes of *azservicebus.SessionReceiver that a
// consumer uses.
type SessionReceiver struct {
	q         *Queue
	s         *session
	receiving atomic.Bool
	closeOnce sync.Once
	closed    chan struct{}
}

// AcceptNextSession locks the next session with an available message and
// returns its receiver (see the package's session notes). It fails with
// CodeTimeout when no session became available within the queue's
// AcceptTimeout, with CodeConnectionLost while the broker is unreachable,
// and with ctx.Err() when ctx ends first.
func (q *Queue) AcceptNextSession(ctx context.Context) (*SessionReceiver, error) {
	if q.sessions == nil {
		return nil, fmt.Errorf("membus: queue %s is not session-enabled (QueueOptions.RequiresSession)", q.name)
	}
	limit := q.acceptTimeout
	if deadline, ok := ctx.Deadline(); ok {
		// The SDK sends the deadline as the service's timeout, less a
		// little jitter: the service answers first.
		limit = min(limit, max(time.Until(deadline)-time.Until(deadline)/100, 0))
	}
	timeout := time.NewTimer(limit)
	defer timeout.Stop()
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		q.mu.Lock()
		if q.unreachable {
			q.mu.Unlock()
			return nil, sbError(azservicebus.CodeConnectionLost, "queue %s: accept next session: broker unreachable", q.name)
		}
		now := time.Now()
		q.expireLocked(now)
		for _, e := range q.available {
			s := q.sessionLocked(*e.msg.SessionID)
			if s.holder != nil {
				continue
			}
			r := &SessionReceiver{q: q, s: s, closed: make(chan struct{})}
			s.holder, s.lockedUntil = r, now.Add(q.lockDuration)
			q.stats.SessionsAccepted++
			q.mu.Unlock()
			return r, nil
		}
		changed, next := q.changed, q.nextExpiryLocked()
		q.mu.Unlock()
		if err := wait(ctx, changed, next, nil, timeout.C); err != nil {
			if errors.Is(err, errGatherDone) {
				return nil, sbError(azservicebus.CodeTimeout, "queue %s: accept next session: no session available within %s", q.name, limit)
			}
			return nil, err
		}
	}
}

// sessionLocked returns the record of session id, creating it.
func (q *Queue) sessionLocked(id string) *session {
	s, ok := q.sessions[id]
	if !ok {
		s = &session{id: id}
		q.sessions[id] = s
	}
	return s
}

// sessionOfLocked returns the record of e's session, nil on a queue
// without sessions.
func (q *Queue) sessionOfLocked(e *entry) *session {
	if q.sessions == nil || e.msg.SessionID == nil {
		return nil
	}
	return q.sessionLocked(*e.msg.SessionID)
}

// expireSessionsLocked frees every session whose lock has run out; the
// locks of its messages ran out with it (they carry the same time).
func (q *Queue) expireSessionsLocked(now time.Time) {
	for _, s := range q.sessions {
		if s.holder != nil && !now.Before(s.lockedUntil) {
			q.releaseSessionLocked(s, now)
			q.stats.SessionLockExpiries++
		}
	}
}

// releaseSessionLocked frees session s and makes the messages its holder
// had not settled available again.
func (q *Queue) releaseSessionLocked(s *session, now time.Time) {
	s.holder = nil
	s.lockedUntil = now
	for tok, e := range q.locked {
		if e.msg.SessionID != nil && *e.msg.SessionID == s.id {
			delete(q.locked, tok)
			q.stats.LockExpiries++
			q.releaseLocked(e)
		}
	}
	q.notifyLocked()
}

// SessionID returns the session this receiver holds.
func (r *SessionReceiver) SessionID() string { return r.s.id }

// LockedUntil returns when the session lock runs out, unless renewed.
func (r *SessionReceiver) LockedUntil() time.Time {
	r.q.mu.Lock()
	defer r.q.mu.Unlock()
	return r.s.lockedUntil
}

// heldLocked checks, under q.mu, that r still holds its session.
func (r *SessionReceiver) heldLocked(op string) error {
	if r.s.holder != r {
		r.q.stats.LockLosses++
		return sbError(azservicebus.CodeLockLost, "queue %s: session %s: %s: session lock lost", r.q.name, r.s.id, op)
	}
	return nil
}

func (r *SessionReceiver) checkOpen() error {
	select {
	case <-r.closed:
		return sbError(azservicebus.CodeClosed, "queue %s: session %s: receiver closed", r.q.name, r.s.id)
	default:
		return nil
	}
}

// ReceiveMessages receives the session's next messages in order, like
// Receiver.ReceiveMessages. It fails with CodeLockLost once the session
// lock is lost. Calls must not overlap.
func (r *SessionReceiver) ReceiveMessages(ctx context.Context, maxMessages int, options *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	done, err := startReceive(&r.receiving, maxMessages)
	if err != nil {
		return nil, err
	}
	defer done()
	if err := r.checkOpen(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	q := r.q
	return q.receive(ctx, r.closed, maxMessages, options, func(time.Time) (*entry, error) {
		if err := r.heldLocked("receive"); err != nil {
			return nil, err
		}
		for _, e := range q.available {
			if *e.msg.SessionID == r.s.id {
				return e, nil
			}
		}
		return nil, nil
	}, func() time.Time {
		if r.s.holder == r {
			return r.s.lockedUntil
		}
		return time.Time{}
	})
}

// PeekMessages returns copies of up to maxMessageCount of the session's
// available messages without locking them.
func (r *SessionReceiver) PeekMessages(ctx context.Context, maxMessageCount int, _ *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
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
	var out []*azservicebus.ReceivedMessage
	for _, e := range q.available {
		if len(out) == maxMessageCount {
			break
		}
		if *e.msg.SessionID != r.s.id {
			continue
		}
		out = append(out, peeked(e))
	}
	return out, nil
}

// CompleteMessage removes the message from the queue.
func (r *SessionReceiver) CompleteMessage(ctx context.Context, message *azservicebus.ReceivedMessage, _ *azservicebus.CompleteMessageOptions) error {
	return r.settle(ctx, "complete", message, completeEntry)
}

// AbandonMessage puts the message back at its place in the session, or
// dead-letters it when this was its last allowed delivery.
func (r *SessionReceiver) AbandonMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.AbandonMessageOptions) error {
	return r.settle(ctx, "abandon", message, abandonEntry(options))
}

// DeadLetterMessage moves the message to the dead-letter queue with
// options.Reason and options.ErrorDescription.
func (r *SessionReceiver) DeadLetterMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.DeadLetterOptions) error {
	return r.settle(ctx, "dead-letter", message, deadLetterEntry(options))
}

// RenewSessionLock extends the session lock (and the locks of the
// messages held in it) by the lock duration from now.
func (r *SessionReceiver) RenewSessionLock(ctx context.Context, _ *azservicebus.RenewSessionLockOptions) error {
	unlock, err := r.op(ctx, "renew session lock", &r.q.failRenewals, &r.q.stats.RenewFaults)
	if err != nil {
		return err
	}
	defer unlock()
	q, now := r.q, time.Now()
	r.s.lockedUntil = now.Add(q.lockDuration)
	for _, e := range q.locked {
		if *e.msg.SessionID == r.s.id {
			e.lockedUntil = r.s.lockedUntil
		}
	}
	q.stats.Renewals++
	return nil
}

// GetSessionState returns the session's state (nil when none was set).
func (r *SessionReceiver) GetSessionState(ctx context.Context, _ *azservicebus.GetSessionStateOptions) ([]byte, error) {
	unlock, err := r.op(ctx, "get session state", nil, nil)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return slices.Clone(r.s.state), nil
}

// SetSessionState replaces the session's state; nil clears it.
func (r *SessionReceiver) SetSessionState(ctx context.Context, state []byte, _ *azservicebus.SetSessionStateOptions) error {
	unlock, err := r.op(ctx, "set session state", &r.q.failSettlements, &r.q.stats.SettleFaults)
	if err != nil {
		return err
	}
	defer unlock()
	r.s.state = slices.Clone(state)
	return nil
}

// Close releases the session (see the package's session notes); every
// later call fails with CodeClosed.
func (r *SessionReceiver) Close(context.Context) error {
	r.closeOnce.Do(func() {
		close(r.closed)
		q := r.q
		q.mu.Lock()
		defer q.mu.Unlock()
		if r.s.holder == r {
			q.releaseSessionLocked(r.s, time.Now())
		}
	})
	return nil
}

// op checks that a call may run (open, ctx alive, broker reachable, no
// injected fault, session still held) and returns with q.mu held; on error
// q.mu is not held.
func (r *SessionReceiver) op(ctx context.Context, what string, fail, faults *int) (unlock func(), err error) {
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
		return nil, sbError(azservicebus.CodeConnectionLost, "queue %s: session %s: %s: broker unreachable", q.name, r.s.id, what)
	}
	if fail != nil && *fail > 0 {
		*fail--
		*faults++
		q.mu.Unlock()
		return nil, sbError(azservicebus.CodeConnectionLost, "queue %s: session %s: %s: injected fault", q.name, r.s.id, what)
	}
	q.expireLocked(time.Now())
	if err := r.heldLocked(what); err != nil {
		q.mu.Unlock()
		return nil, err
	}
	return q.mu.Unlock, nil
}

func (r *SessionReceiver) settle(ctx context.Context, what string, m *azservicebus.ReceivedMessage, apply func(*Queue, *entry)) error {
	unlock, err := r.op(ctx, what, &r.q.failSettlements, &r.q.stats.SettleFaults)
	if err != nil {
		return err
	}
	defer unlock()
	q := r.q
	e, ok := q.locked[m.LockToken]
	if !ok || e.msg.SessionID == nil || *e.msg.SessionID != r.s.id {
		q.stats.LockLosses++
		return sbError(azservicebus.CodeLockLost, "queue %s: session %s: %s message %s", q.name, r.s.id, what, m.MessageID)
	}
	delete(q.locked, e.lockToken)
	apply(q, e)
	return nil
}

// Sessions returns the ids of the sessions the queue has seen, with
// whether each is held now and its state, sorted by id (for tests).
func (q *Queue) Sessions() []SessionInfo {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.expireLocked(time.Now())
	out := make([]SessionInfo, 0, len(q.sessions))
	for _, s := range q.sessions {
		out = append(out, SessionInfo{ID: s.id, Held: s.holder != nil, State: slices.Clone(s.state)})
	}
	slices.SortFunc(out, func(a, b SessionInfo) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return out
}

// SessionInfo is a session as Sessions reports it.
type SessionInfo struct {
	ID    string
	Held  bool
	State []byte
}

// ExpireSessionLock ends the lock of session id now, as if it had run out
// (its messages' locks with it), and reports how many sessions it expired
// (0 or 1).
func (q *Queue) ExpireSessionLock(id string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	s, ok := q.sessions[id]
	if !ok || s.holder == nil {
		return 0
	}
	now := time.Now()
	s.lockedUntil = now
	q.expireLocked(now)
	return 1
}

// RequiresSession reports whether the queue is session-enabled.
func (q *Queue) RequiresSession() bool { return q.sessions != nil }
