package chaos

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// Sessions (Config.Sessions, -sessions): the queue is session-enabled,
// every message carries one of about Messages/SessionSize session ids
// (its copies, and its conflicting payload, the same one), and each
// replica works up to MaxConcurrentCalls sessions at once
// (sbclaim.Sessions). Besides the exactly-once checks, the report counts
// the messages that ran out of order: a message whose first effect
// request reached the downstream before the previous message of its
// session (in send order) reached a final outcome (its claim processed,
// failed or flagged, as the store answered the write). It must be 0.

// SessionSize is the number of distinct messages per session in a
// session run.
const SessionSize = 8

// sessionBook records what the order check needs: each routed message's
// session, each session's messages in send order, when each key's first
// effect request arrived, and when its claim reached a final outcome.
type sessionBook struct {
	mu      sync.Mutex
	of      map[string]string   // message ID → session
	order   map[string][]string // session → distinct routed IDs in send order
	attempt map[string]time.Time
	final   map[string]time.Time
}

func newSessionBook() *sessionBook {
	return &sessionBook{of: map[string]string{}, order: map[string][]string{}, attempt: map[string]time.Time{}, final: map[string]time.Time{}}
}

// sessionFor is the session of routed message i.
func sessionFor(i, messages int) string {
	return fmt.Sprintf("s-%04d", i%max(1, messages/SessionSize))
}

// sent records a routed message, in send order.
func (b *sessionBook) sent(id, session string) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.of[id]; ok {
		return
	}
	b.of[id] = session
	b.order[session] = append(b.order[session], id)
}

// attempted records an effect request for key that reached the
// downstream (at its arrival).
func (b *sessionBook) attempted(key string, at time.Time) {
	if b == nil || key == "" {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.attempt[key]; !ok {
		b.attempt[key] = at
	}
}

// finished records that key's claim reached a final outcome (the write
// returned: it committed no later).
func (b *sessionBook) finished(key string) {
	if b == nil || key == "" {
		return
	}
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.final[key]; !ok {
		b.final[key] = now
	}
}

// outOfOrder returns the messages whose first effect request arrived
// before the previous message of their session reached a final outcome,
// described, and the number of sessions.
func (b *sessionBook) outOfOrder() (bad []string, sessions int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for session, ids := range b.order {
		for i := 1; i < len(ids); i++ {
			prev, cur := ids[i-1], ids[i]
			at, ran := b.attempt[cur]
			if !ran {
				continue
			}
			done, ok := b.final[prev]
			if !ok || at.Before(done) {
				when := "never reached a final outcome"
				if ok {
					when = fmt.Sprintf("reached its final outcome %s later", done.Sub(at).Round(time.Microsecond))
				}
				bad = append(bad, fmt.Sprintf("session %s: %s's first effect request arrived while %s, before it in the session, %s", session, cur, prev, when))
			}
		}
	}
	return bad, len(b.order)
}

// acceptSession is the replica's sbclaim.Sessions.AcceptNext: the
// queue's next session, cut off when the replica dies.
func (r *replica) acceptSession(ctx context.Context) (sbclaim.SessionReceiver, error) {
	if r.dead.Load() {
		<-ctx.Done() // a dead process accepts nothing
		return nil, ctx.Err()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(r.killCtx, cancel)
	defer stop()
	s, err := r.h.queue.AcceptNextSession(ctx)
	if err != nil {
		if r.dead.Load() {
			return nil, replicaDeadError(r.id, "accept session")
		}
		return nil, err
	}
	return &killSessionReceiver{killSettle: killSettle{set: s, rep: r}, s: s}, nil
}

// killSessionReceiver is a session receiver of a replica that may be
// killed: once it is, every call fails at once and does nothing, and
// Close does not release the session (a dead process closes nothing: the
// session lock runs out).
type killSessionReceiver struct {
	killSettle
	s *membus.SessionReceiver
}

func (k *killSessionReceiver) SessionID() string      { return k.s.SessionID() }
func (k *killSessionReceiver) LockedUntil() time.Time { return k.s.LockedUntil() }

func (k *killSessionReceiver) ReceiveMessages(ctx context.Context, n int, o *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if k.rep.dead.Load() {
		return nil, k.lost("receive")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(k.rep.killCtx, cancel)
	defer stop()
	msgs, err := k.s.ReceiveMessages(ctx, n, o)
	if err != nil && k.rep.dead.Load() {
		return nil, k.lost("receive")
	}
	for _, m := range msgs {
		k.rep.h.sawDelivery(m)
		k.rep.received(m)
	}
	return msgs, err
}

func (k *killSessionReceiver) PeekMessages(ctx context.Context, n int, o *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if k.rep.dead.Load() {
		return nil, k.lost("peek")
	}
	return k.s.PeekMessages(ctx, n, o)
}

func (k *killSessionReceiver) RenewSessionLock(ctx context.Context, o *azservicebus.RenewSessionLockOptions) error {
	if k.rep.dead.Load() {
		return k.lost("renew session lock")
	}
	return k.s.RenewSessionLock(ctx, o)
}

func (k *killSessionReceiver) GetSessionState(ctx context.Context, o *azservicebus.GetSessionStateOptions) ([]byte, error) {
	if k.rep.dead.Load() {
		return nil, k.lost("get session state")
	}
	return k.s.GetSessionState(ctx, o)
}

func (k *killSessionReceiver) SetSessionState(ctx context.Context, state []byte, o *azservicebus.SetSessionStateOptions) error {
	if k.rep.dead.Load() {
		return k.lost("set session state")
	}
	return k.s.SetSessionState(ctx, state, o)
}

func (k *killSessionReceiver) Close(ctx context.Context) error {
	if k.rep.dead.Load() {
		return nil // the session lock runs out, as a crashed process's does
	}
	return k.s.Close(ctx)
}

// checkOrder adds the session lines' figures to rep, and a violation per
// message that ran out of order.
func (h *harness) checkOrder(rep *Report) {
	if h.sess == nil {
		return
	}
	bad, n := h.sess.outOfOrder()
	rep.Sessions, rep.OutOfOrder = n, len(bad)
	for _, b := range bad {
		rep.violate("out of order: %s", b)
	}
}

// planSessions gives every message its session: a routed message's (and
// its copies' and conflicting payload's) by its number, a poison
// message's by its place in the send order; and records each session's
// routed messages in send order.
func (h *harness) planSessions() {
	n := h.cfg.Messages
	index := make(map[string]int, len(h.ids))
	for i, id := range h.ids {
		index[id] = i
	}
	for k, s := range h.sent {
		id := *s.msg.MessageID
		i, routed := index[id]
		if !routed {
			i = k
		}
		session := sessionFor(i, n)
		s.msg.SessionID = &session
		if routed && *s.msg.Subject == EffectSubject && !h.isConflictPayload(id, s.msg.Body) {
			h.sess.sent(id, session)
		}
	}
}

// isConflictPayload reports whether body is the conflicting payload of id.
func (h *harness) isConflictPayload(id string, body []byte) bool {
	b, ok := h.conflictB[id]
	return ok && string(b) == string(body)
}
