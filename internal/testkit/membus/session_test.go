package membus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

func code(err error) azservicebus.Code {
	var sbErr *azservicebus.Error
	if errors.As(err, &sbErr) {
		return sbErr.Code
	}
	return ""
}

// What the session contract cases cannot show on a real broker: the
// accept timeout (the queue's, or shortened by a ctx deadline, as the SDK
// passes it to the service), a send without a session id, and receivers
// of the wrong kind.
func TestSessionAcceptAndMisuse(t *testing.T) {
	t.Parallel()
	q := membus.NewQueue("s", membus.QueueOptions{RequiresSession: true, AcceptTimeout: 50 * time.Millisecond})
	ctx := t.Context()
	if _, err := q.AcceptNextSession(ctx); code(err) != azservicebus.CodeTimeout {
		t.Errorf("accept on an empty queue: %v, want CodeTimeout after the queue's AcceptTimeout", err)
	}
	long := membus.NewQueue("l", membus.QueueOptions{RequiresSession: true, AcceptTimeout: time.Hour})
	dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err := long.AcceptNextSession(dctx)
	cancel()
	if code(err) != azservicebus.CodeTimeout {
		t.Errorf("accept with a 50ms deadline: %v, want CodeTimeout just before it (the service's timeout is the deadline)", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := long.AcceptNextSession(cctx); !errors.Is(err, context.Canceled) {
		t.Errorf("accept with a cancelled context: %v", err)
	}
	id := "m1"
	if err := q.SendMessage(ctx, &azservicebus.Message{MessageID: &id}, nil); err == nil {
		t.Error("a session-enabled queue took a message without a SessionID")
	}
	if _, err := q.NewReceiver().ReceiveMessages(ctx, 1, nil); err == nil {
		t.Error("a plain receiver received from a session-enabled queue")
	}
	plain := membus.NewQueue("p", membus.QueueOptions{})
	if _, err := plain.AcceptNextSession(ctx); err == nil {
		t.Error("accepted a session on a queue without sessions")
	}
	q.SetUnreachable(true)
	if _, err := q.AcceptNextSession(ctx); code(err) != azservicebus.CodeConnectionLost {
		t.Errorf("accept while unreachable: %v, want CodeConnectionLost", err)
	}
}

// TestSessionCloseOfAStaleReceiverKeepsTheNewHolder: a receiver whose
// session lock ran out, closed after another accepted the session, does
// not release the new holder's lock.
func TestSessionCloseOfAStaleReceiverKeepsTheNewHolder(t *testing.T) {
	t.Parallel()
	q := membus.NewQueue("s", membus.QueueOptions{RequiresSession: true, AcceptTimeout: 50 * time.Millisecond})
	ctx := t.Context()
	id, session := "m1", "A"
	if err := q.SendMessage(ctx, &azservicebus.Message{MessageID: &id, SessionID: &session}, nil); err != nil {
		t.Fatal(err)
	}
	old, err := q.AcceptNextSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	q.ExpireSessionLock(session)
	holder, err := q.AcceptNextSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = old.Close(ctx)
	msgs, err := holder.ReceiveMessages(ctx, 1, nil)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("the new holder receives %d messages (%v) after the stale receiver closed", len(msgs), err)
	}
	if err := holder.CompleteMessage(ctx, msgs[0], nil); err != nil {
		t.Fatalf("the new holder's settlement: %v", err)
	}
}
