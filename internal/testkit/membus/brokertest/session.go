package brokertest

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// The session cases (see the package documentation). Each case uses its
// own session id, so a shared entity's other sessions do not disturb it.

func (s *suite) sessionQueue(t *testing.T) (SessionEntity, context.Context) {
	t.Helper()
	if s.h.NewSessionQueue == nil {
		t.Skip("the harness has no session-enabled queue (Harness.NewSessionQueue)")
	}
	e := s.h.NewSessionQueue(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute+2*e.LockDuration)
	t.Cleanup(cancel)
	return e, ctx
}

func sendInSession(ctx context.Context, t *testing.T, snd Sender, session string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		err := snd.SendMessage(ctx, &azservicebus.Message{MessageID: &id, SessionID: &session, Body: []byte(id)}, nil)
		if err != nil {
			t.Fatalf("send %s in session %s: %v", id, session, err)
		}
	}
}

// acceptSession accepts sessions until it gets the one named (other
// sessions, left by earlier runs in a shared entity, are drained: their
// messages completed).
func acceptSession(ctx context.Context, t *testing.T, e SessionEntity, session string) SessionReceiver {
	t.Helper()
	for {
		r, err := e.AcceptNext(ctx)
		if err != nil {
			t.Fatalf("accepting session %s: %v", session, err)
		}
		if r.SessionID() == session {
			t.Cleanup(func() { r.Close(context.Background()) })
			return r
		}
		t.Logf("draining a leftover session %s", r.SessionID())
		for {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			msgs, err := r.ReceiveMessages(rctx, 50, nil)
			cancel()
			for _, m := range msgs {
				_ = r.CompleteMessage(ctx, m, nil)
			}
			if len(msgs) == 0 || err != nil {
				break
			}
		}
		_ = r.Close(ctx)
	}
}

func receiveOne(ctx context.Context, t *testing.T, r SessionReceiver) *azservicebus.ReceivedMessage {
	t.Helper()
	msgs, err := r.ReceiveMessages(ctx, 1, nil)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("session %s: receive: %d messages, error %v", r.SessionID(), len(msgs), err)
	}
	return msgs[0]
}

func wantMessage(t *testing.T, m *azservicebus.ReceivedMessage, id string, count uint32) {
	t.Helper()
	if m.MessageID != id || m.DeliveryCount != count {
		t.Fatalf("got %s (DeliveryCount %d), want %s (DeliveryCount %d)", m.MessageID, m.DeliveryCount, id, count)
	}
	if m.SessionID == nil {
		t.Fatalf("%s came without its SessionID", id)
	}
}

func (s *suite) sessionOrder(t *testing.T) {
	e, ctx := s.sessionQueue(t)
	session := newID(t)
	a, b, c := session+"-1", session+"-2", session+"-3"
	sendInSession(ctx, t, e.Sender, session, a, b, c)
	r := acceptSession(ctx, t, e, session)

	m := receiveOne(ctx, t, r)
	wantMessage(t, m, a, 1)
	ok(t, "abandon "+a, r.AbandonMessage(ctx, m, nil))
	m = receiveOne(ctx, t, r)
	wantMessage(t, m, a, 2) // the abandoned message is the session's next again
	ok(t, "complete "+a, r.CompleteMessage(ctx, m, nil))
	for _, id := range []string{b, c} {
		m = receiveOne(ctx, t, r)
		wantMessage(t, m, id, 1)
		ok(t, "complete "+id, r.CompleteMessage(ctx, m, nil))
	}
}

func (s *suite) sessionExclusive(t *testing.T) {
	e, ctx := s.sessionQueue(t)
	session := newID(t)
	a, b := session+"-1", session+"-2"
	sendInSession(ctx, t, e.Sender, session, a, b)
	r := acceptSession(ctx, t, e, session)
	m := receiveOne(ctx, t, r)
	wantMessage(t, m, a, 1)

	// While r holds the session, no other accept gets it (a shared entity
	// may hand out other sessions: they are closed again at once).
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	for {
		other, err := e.AcceptNext(wctx)
		if err != nil {
			var sbErr *azservicebus.Error
			if !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &sbErr) && sbErr.Code == azservicebus.CodeTimeout) {
				cancel()
				t.Fatalf("second accept: %v, want no session (CodeTimeout or the context's deadline)", err)
			}
			break
		}
		_ = other.Close(ctx)
		if other.SessionID() == session {
			cancel()
			t.Fatalf("a second receiver accepted session %s while the first held it", session)
		}
	}
	cancel()

	ok(t, "complete "+a, r.CompleteMessage(ctx, m, nil))
	ok(t, "close", r.Close(ctx))
	// Closing releases the session at once: the next accept gets it, with
	// the message that remains.
	r2 := acceptSession(ctx, t, e, session)
	m = receiveOne(ctx, t, r2)
	wantMessage(t, m, b, 1)
	ok(t, "complete "+b, r2.CompleteMessage(ctx, m, nil))
}

func (s *suite) sessionState(t *testing.T) {
	e, ctx := s.sessionQueue(t)
	session := newID(t)
	a := session + "-1"
	sendInSession(ctx, t, e.Sender, session, a)
	r := acceptSession(ctx, t, e, session)
	state, err := r.GetSessionState(ctx, nil)
	ok(t, "get state", err)
	if len(state) != 0 {
		t.Fatalf("a new session's state is %q, want none", state)
	}
	want := []byte(`{"held":42}`)
	ok(t, "set state", r.SetSessionState(ctx, want, nil))
	ok(t, "close", r.Close(ctx))

	r2 := acceptSession(ctx, t, e, session)
	state, err = r2.GetSessionState(ctx, nil)
	ok(t, "get state", err)
	if !bytes.Equal(state, want) {
		t.Fatalf("the next holder reads state %q, want %q", state, want)
	}
	ok(t, "clear state", r2.SetSessionState(ctx, nil, nil))
	state, err = r2.GetSessionState(ctx, nil)
	ok(t, "get state", err)
	if len(state) != 0 {
		t.Fatalf("state after clearing it is %q, want none", state)
	}
	m := receiveOne(ctx, t, r2)
	ok(t, "complete "+a, r2.CompleteMessage(ctx, m, nil))
}

func (s *suite) sessionRenew(t *testing.T) {
	e, ctx := s.sessionQueue(t)
	session := newID(t)
	a := session + "-1"
	sendInSession(ctx, t, e.Sender, session, a)
	r := acceptSession(ctx, t, e, session)
	before := r.LockedUntil()
	if before.IsZero() {
		t.Fatal("an accepted session has no LockedUntil")
	}
	// LockedUntil has a whole-millisecond resolution at most: wait past it.
	time.Sleep(20 * time.Millisecond)
	ok(t, "renew session lock", r.RenewSessionLock(ctx, nil))
	if after := r.LockedUntil(); !after.After(before) {
		t.Fatalf("LockedUntil %v after renewal, was %v: want later", after, before)
	}
	m := receiveOne(ctx, t, r)
	ok(t, "complete "+a, r.CompleteMessage(ctx, m, nil))
}

func (s *suite) sessionExpiry(t *testing.T) {
	e, ctx := s.sessionQueue(t)
	if e.ExpireSessionLock == nil && e.LockDuration > s.h.MaxLockWait {
		t.Skipf("the session queue's lock duration %v is longer than Harness.MaxLockWait %v and it cannot expire a lock on request", e.LockDuration, s.h.MaxLockWait)
	}
	session := newID(t)
	a := session + "-1"
	sendInSession(ctx, t, e.Sender, session, a)
	r := acceptSession(ctx, t, e, session)
	m := receiveOne(ctx, t, r)
	wantMessage(t, m, a, 1)
	if e.ExpireSessionLock != nil {
		e.ExpireSessionLock(t, r)
	} else {
		t.Logf("waiting for the %v session lock to run out", e.LockDuration)
	}
	// The session goes to the next accept, with its unsettled message.
	r2 := acceptSession(ctx, t, e, session)
	m2 := receiveOne(ctx, t, r2)
	wantMessage(t, m2, a, 2)
	wantCode(t, "complete through the receiver that lost the session", r.CompleteMessage(ctx, m, nil), azservicebus.CodeLockLost)
	ok(t, "complete "+a, r2.CompleteMessage(ctx, m2, nil))
}
