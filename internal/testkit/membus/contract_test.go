package membus_test

import (
	"context"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/testkit/membus"
	"github.com/sbclaim/sbclaim/internal/testkit/membus/brokertest"
)

// TestContract runs the broker contract suite against membus: the same
// cases internal/testkit/membus/brokertest's gated TestServiceBusContract runs
// against a real namespace or the emulator.
func TestContract(t *testing.T) {
	t.Parallel()
	// A lock long enough never to run out by itself on a loaded machine:
	// every expiry in the suite is an ExpireLock.
	opts := membus.QueueOptions{LockDuration: time.Minute, MaxDeliveryCount: 3}
	brokertest.Exercise(t, brokertest.Harness{
		NewQueue: func(t *testing.T) brokertest.Entity {
			q := membus.NewQueue("contract", opts)
			e := entity(q, opts)
			e.Sender = q
			return e
		},
		NewTopic: func(t *testing.T) brokertest.Topic {
			tp := membus.NewTopic("contract-topic")
			return brokertest.Topic{Sender: tp, Subscriptions: []brokertest.Entity{
				entity(tp.Subscription("copy-a", opts), opts),
				entity(tp.Subscription("copy-b", opts), opts),
			}}
		},
		NewSessionQueue: func(t *testing.T) brokertest.SessionEntity {
			so := opts
			so.RequiresSession = true
			q := membus.NewQueue("contract-sessions", so)
			return brokertest.SessionEntity{
				Sender: q,
				AcceptNext: func(ctx context.Context) (brokertest.SessionReceiver, error) {
					return q.AcceptNextSession(ctx)
				},
				ExpireSessionLock: func(t *testing.T, r brokertest.SessionReceiver) {
					t.Helper()
					if q.ExpireSessionLock(r.SessionID()) == 0 {
						t.Fatalf("ExpireSessionLock(%s) expired no lock", r.SessionID())
					}
				},
				LockDuration: so.LockDuration,
			}
		},
		Features: brokertest.Features{
			// membus refuses a second settlement with CodeLockLost; the
			// SDK makes it a no-op (see the field's comment).
			SecondSettlementIsNoOp: false,
			MaxDeliveryDescription: brokertest.ServiceBusMaxDeliveryDescription,
			DeferredReceiveCounts:  true,
			DeferredNotFoundCode:   azservicebus.CodeNotFound,
		},
	})
}

// entity adapts a membus queue (or subscription). Each case gets a fresh
// one, so Holds can count: the case's message is the only one.
func entity(q *membus.Queue, opts membus.QueueOptions) brokertest.Entity {
	return brokertest.Entity{
		NewReceiver: func(t *testing.T) brokertest.Receiver {
			r := q.NewReceiver()
			t.Cleanup(func() { r.Close(context.Background()) })
			return r
		},
		DeadLetter: func(_ context.Context, t *testing.T, id string) *azservicebus.ReceivedMessage {
			t.Helper()
			// membus dead-letters synchronously: nothing to wait for.
			for _, m := range q.DeadLetters() {
				if m.MessageID == id {
					return m
				}
			}
			t.Fatalf("%s is not in the dead-letter queue of %s", id, q.Name())
			return nil
		},
		Holds: func(_ context.Context, _ *testing.T, _ string) bool {
			s := q.Stats()
			return s.Active+s.Locked+s.Deferred > 0
		},
		ExpireLock: func(t *testing.T, m *azservicebus.ReceivedMessage) {
			t.Helper()
			if q.ExpireLock(m.MessageID) == 0 {
				t.Fatalf("ExpireLock(%s) expired no lock", m.MessageID)
			}
		},
		LockDuration:     opts.LockDuration,
		MaxDeliveryCount: opts.MaxDeliveryCount,
	}
}
