package membus_test

import (
	"context"
	"errors"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

func TestNamespaceSendsKeepsAndDeduplicates(t *testing.T) {
	ctx := context.Background()
	ns := membus.NewNamespace()
	q := membus.NewQueue("receipts", membus.QueueOptions{})
	plain := membus.NewQueue("audit", membus.QueueOptions{})
	topic := membus.NewTopic("events")
	sub := topic.Subscription("all", membus.QueueOptions{})
	ns.AddQueue(q, true)
	ns.AddQueue(plain, false)
	ns.AddTopic(topic, true)
	id := "m-1"
	send := func(entity string) error {
		s, err := ns.NewSender(entity)
		if err != nil {
			t.Fatal(err)
		}
		return s.SendMessage(ctx, &azservicebus.Message{MessageID: &id, Body: []byte("x")}, nil)
	}
	for _, entity := range []string{"receipts", "receipts", "audit", "audit", "events", "events"} {
		if err := send(entity); err != nil {
			t.Fatalf("send to %s: %v", entity, err)
		}
	}
	// Duplicate detection drops the second copy; without it both arrive.
	if got := q.Stats().Sent; got != 1 {
		t.Fatalf("receipts enqueued %d, want 1", got)
	}
	if got := plain.Stats().Sent; got != 2 {
		t.Fatalf("audit enqueued %d, want 2", got)
	}
	if got := sub.Stats().Sent; got != 1 {
		t.Fatalf("the topic's subscription got %d, want 1", got)
	}
	if len(ns.Sent("receipts")) != 2 || ns.Dropped("receipts") != 1 || ns.Dropped("audit") != 0 {
		t.Fatalf("sent %d, dropped %d", len(ns.Sent("receipts")), ns.Dropped("receipts"))
	}
	var sbErr *azservicebus.Error
	if err := send("nowhere"); !errors.As(err, &sbErr) || sbErr.Code != azservicebus.CodeNotFound {
		t.Fatalf("send to an unknown entity: %v", err)
	}
	ns.FailSends(1)
	if err := send("audit"); !errors.As(err, &sbErr) || sbErr.Code != azservicebus.CodeConnectionLost {
		t.Fatalf("a failing send: %v", err)
	}
	if got := plain.Stats().Sent; got != 2 {
		t.Fatalf("a failed send enqueued: %d", got)
	}
	s, _ := ns.NewSender("audit")
	_ = s.Close(ctx)
	if err := s.SendMessage(ctx, &azservicebus.Message{}, nil); !errors.As(err, &sbErr) || sbErr.Code != azservicebus.CodeClosed {
		t.Fatalf("send on a closed sender: %v", err)
	}
}
