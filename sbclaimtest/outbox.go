package sbclaimtest

import (
	"context"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// Outbox is an in-memory namespace for the follow-ups handlers publish
// (sbclaim.Delivery.Publish): give Config() to ProcessorConfig.Outbox,
// then read what the processor sent to each target with Sent. A target is
// any name; each keeps every message sent to it, resends included (the
// relay resends with the same MessageId after a crash or a failed send).
type Outbox struct {
	ns      *membus.Namespace
	targets map[string]*membus.Queue
}

// NewOutbox returns an outbox whose targets are the given names, each a
// queue with duplicate detection on. A send to another name fails as
// Service Bus answers for an entity that does not exist.
func NewOutbox(targets ...string) *Outbox {
	o := &Outbox{ns: membus.NewNamespace(), targets: map[string]*membus.Queue{}}
	for _, t := range targets {
		q := membus.NewQueue(t, membus.QueueOptions{})
		o.ns.AddQueue(q, true)
		o.targets[t] = q
	}
	return o
}

// Config is the processor's outbox configuration, with short test
// intervals (a 50ms sweep).
func (o *Outbox) Config() sbclaim.OutboxConfig {
	return sbclaim.OutboxConfig{
		NewSender:     func(target string) (sbclaim.Sender, error) { return o.ns.NewSender(target) },
		Lease:         2 * time.Second,
		SendTimeout:   time.Second,
		SweepInterval: 50 * time.Millisecond,
		MaxBackoff:    100 * time.Millisecond,
	}
}

// Sent returns the messages sent to target so far, in order.
func (o *Outbox) Sent(target string) []*azservicebus.Message { return o.ns.Sent(target) }

// WaitSent waits until target got at least n messages (resends counted)
// or ctx ends, and returns them.
func (o *Outbox) WaitSent(ctx context.Context, target string, n int) ([]*azservicebus.Message, error) {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		if sent := o.ns.Sent(target); len(sent) >= n {
			return sent, nil
		}
		select {
		case <-ctx.Done():
			return o.ns.Sent(target), ctx.Err()
		case <-t.C:
		}
	}
}
