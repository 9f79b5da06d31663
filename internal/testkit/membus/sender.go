package membus

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// Namespace routes sends by entity name to the queues and topics added to
// it, as a Service Bus namespace does for a producer's senders
// (Client.NewSender), and keeps every message sent to each entity (Sent).
// An entity added with duplicate detection drops a message whose
// MessageId it has taken before (the window is the whole run), as the
// service does within its detection window; the drop is counted
// (Dropped) and the send succeeds. Scheduled messages are enqueued at
// once (scheduling is not modelled); Sent keeps their scheduled time.
type Namespace struct {
	mu       sync.Mutex
	entities map[string]*nsEntity
	failing  int  // FailSends
	down     bool // SetUnreachable
}

type nsEntity struct {
	target interface {
		SendMessages(ctx context.Context, msgs []*azservicebus.Message) error
	}
	detect  bool
	seen    map[string]bool
	sent    []*azservicebus.Message
	dropped int
}

// NewNamespace returns a namespace without entities.
func NewNamespace() *Namespace { return &Namespace{entities: map[string]*nsEntity{}} }

// AddQueue makes q a send target under its name.
func (n *Namespace) AddQueue(q *Queue, duplicateDetection bool) {
	n.add(q.Name(), q, duplicateDetection)
}

// AddTopic makes t a send target under its name.
func (n *Namespace) AddTopic(t *Topic, duplicateDetection bool) { n.add(t.name, t, duplicateDetection) }

func (n *Namespace) add(name string, target interface {
	SendMessages(ctx context.Context, msgs []*azservicebus.Message) error
}, detect bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.entities[name] = &nsEntity{target: target, detect: detect, seen: map[string]bool{}}
}

// FailSends makes the next n sends fail with CodeConnectionLost, sending
// nothing.
func (n *Namespace) FailSends(count int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.failing = count
}

// SetUnreachable, while on, fails every send with CodeConnectionLost.
func (n *Namespace) SetUnreachable(on bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.down = on
}

// Sent returns copies of the messages sent to entity, in order, including
// those duplicate detection dropped.
func (n *Namespace) Sent(entity string) []*azservicebus.Message {
	n.mu.Lock()
	defer n.mu.Unlock()
	e := n.entities[entity]
	if e == nil {
		return nil
	}
	out := make([]*azservicebus.Message, len(e.sent))
	for i, m := range e.sent {
		c := *m
		out[i] = &c
	}
	return out
}

// Dropped returns how many sends to entity duplicate detection dropped.
func (n *Namespace) Dropped(entity string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if e := n.entities[entity]; e != nil {
		return e.dropped
	}
	return 0
}

// NewSender returns a sender to entity, with the signature of
// (*azservicebus.Client).NewSender's result's methods. An entity the
// namespace does not have fails each send with CodeNotFound, as the
// service answers (the SDK opens its link lazily).
func (n *Namespace) NewSender(entity string) (*Sender, error) {
	return &Sender{n: n, entity: entity}, nil
}

// Sender sends to one entity of a Namespace.
type Sender struct {
	n      *Namespace
	entity string
	mu     sync.Mutex
	closed bool
}

// SendMessage sends msg, with the signature of
// (*azservicebus.Sender).SendMessage.
func (s *Sender) SendMessage(ctx context.Context, msg *azservicebus.Message, _ *azservicebus.SendMessageOptions) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return sbError(azservicebus.CodeClosed, "send to %s", s.entity)
	}
	if msg == nil {
		return fmt.Errorf("membus: send to %s: nil message", s.entity)
	}
	n := s.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.down {
		return sbError(azservicebus.CodeConnectionLost, "send to %s", s.entity)
	}
	if n.failing > 0 {
		n.failing--
		return sbError(azservicebus.CodeConnectionLost, "send to %s", s.entity)
	}
	e := n.entities[s.entity]
	if e == nil {
		return sbError(azservicebus.CodeNotFound, "send to %s: no such entity", s.entity)
	}
	c := *msg
	c.Body = slices.Clone(msg.Body)
	e.sent = append(e.sent, &c)
	if e.detect && c.MessageID != nil {
		if e.seen[*c.MessageID] {
			e.dropped++
			return nil
		}
		e.seen[*c.MessageID] = true
	}
	q := c
	q.ScheduledEnqueueTime = nil
	return e.target.SendMessages(ctx, []*azservicebus.Message{&q})
}

// Close closes the sender: later sends fail with CodeClosed.
func (s *Sender) Close(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}
