package membus

import (
	"context"
	"sync"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// Topic is an in-memory Service Bus topic: every message sent to it is
// copied to each subscription that exists at send time. Filters and rules
// are not modelled.
type Topic struct {
	name string
	mu   sync.Mutex
	subs map[string]*Queue
}

// NewTopic returns a topic without subscriptions.
func NewTopic(name string) *Topic {
	return &Topic{name: name, subs: make(map[string]*Queue)}
}

// Subscription returns the named subscription, creating it with opts if it
// does not exist yet (opts are ignored for an existing one).
func (t *Topic) Subscription(name string, opts QueueOptions) *Queue {
	t.mu.Lock()
	defer t.mu.Unlock()
	q, ok := t.subs[name]
	if !ok {
		q = NewQueue(t.name+"/Subscriptions/"+name, opts)
		t.subs[name] = q
	}
	return q
}

// SendMessage sends msg to every subscription, with the signature of
// (*azservicebus.Sender).SendMessage.
func (t *Topic) SendMessage(ctx context.Context, msg *azservicebus.Message, _ *azservicebus.SendMessageOptions) error {
	return t.SendMessages(ctx, []*azservicebus.Message{msg})
}

// SendMessages sends msgs to every subscription. A generated MessageID is
// the same in every subscription's copy.
func (t *Topic) SendMessages(ctx context.Context, msgs []*azservicebus.Message) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	fixed := make([]*azservicebus.Message, len(msgs))
	for i, m := range msgs {
		if m != nil && m.MessageID == nil {
			c := *m
			c.MessageID = newMessageID()
			m = &c
		}
		fixed[i] = m
	}
	for _, q := range t.subs {
		if err := q.SendMessages(ctx, fixed); err != nil {
			return err
		}
	}
	return nil
}
