package brokertest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"

	"github.com/sbclaim/sbclaim/internal/testkit"
	"github.com/sbclaim/sbclaim/internal/testkit/membus/brokertest"
)

// Variables of the gated run. With the compose stack
// (docker compose up -d sqlserver servicebus) the defaults are the
// emulator's entities in emulator/Config.json; against a namespace, create
// a queue and a topic with two subscriptions of those names (a queue lock
// duration of at most 30s lets the lock-expiry cases run, and a small
// MaxDeliveryCount keeps the dead-letter case short).
const (
	connectionEnv = testkit.ServiceBusEnv
	queueEnv      = "SBCLAIM_TEST_SERVICEBUS_CONTRACT_QUEUE" // default brokertest
	topicEnv      = "SBCLAIM_TEST_SERVICEBUS_CONTRACT_TOPIC" // default brokertest-topic, subscriptions copy-a and copy-b
	// sessionQueueEnv names a session-enabled queue (requiresSession) for
	// the session cases; default brokertest-sessions.
	sessionQueueEnv = "SBCLAIM_TEST_SERVICEBUS_CONTRACT_SESSION_QUEUE"
)

// emulatorConfig is the emulator's entities (the compose file mounts
// it), which the gated run reads against the emulator. Every file the
// gated run opens is in fixtures: TestServiceBusContractFindsItsFixtures
// checks them on every test run, with or without Service Bus.
var (
	emulatorConfig = filepath.Join("..", "..", "..", "..", "emulator", "Config.json")
	fixtures       = []string{emulatorConfig}
)

// lockProbeTimeout bounds the wait for the lock-duration probe message.
const lockProbeTimeout = time.Minute

var subscriptions = []string{"copy-a", "copy-b"}

// mainQueue is the entity itself (the SDK names only its sub-queues).
const mainQueue azservicebus.SubQueue = 0

// TestServiceBusContract runs the contract suite against a real namespace
// or the emulator (internal/processor's TestServiceBus uses another queue,
// so both can run at once). The cases run one at a time on shared
// entities, each with its own message ids.
func TestServiceBusContract(t *testing.T) {
	cs := testkit.RequireOrSkip(t, "servicebus", connectionEnv)
	queue, topic := envOr(queueEnv, "brokertest"), envOr(topicEnv, "brokertest-topic")
	emulator := strings.Contains(strings.ToLower(strings.ReplaceAll(cs, " ", "")), "usedevelopmentemulator=true")

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	// A broker that is not there fails here, at once, naming the variable
	// and the cause, not in the middle of a case after the SDK's retries.
	if err := testkit.CheckServiceBus(ctx, cs, queue); err != nil {
		t.Fatal(err)
	}
	client, err := azservicebus.NewClientFromConnectionString(cs, nil)
	if err != nil {
		t.Fatalf("%s: the client rejected it", connectionEnv)
	}
	t.Cleanup(func() { client.Close(context.Background()) })

	queueDeliveries, subDeliveries := maxDeliveries(ctx, t, cs, emulator, queue, topic)
	sender := newSender(t, client, queue)
	topicSender := newSender(t, client, topic)

	sessionQueue := envOr(sessionQueueEnv, "brokertest-sessions")
	sessionSender := newSender(t, client, sessionQueue)
	// The emulator's brokertest-sessions queue has PT5S; a namespace's
	// queue its own (the expiry case waits it out up to MaxLockWait).
	sessionLock := 5 * time.Second
	if !emulator {
		sessionLock = time.Minute
	}

	qe := realEntity{client: client, queue: queue}
	queueLock := qe.lockDuration(ctx, t, sender)
	features := brokertest.Features{
		SecondSettlementIsNoOp: true,
		MaxDeliveryDescription: brokertest.ServiceBusMaxDeliveryDescription,
		// Our reading of the service (see the field); this run checks it.
		DeferredReceiveCounts: true,
	}
	if emulator {
		// The emulator's description of a max-delivery dead-letter is not
		// documented: require one, not this text.
		features.MaxDeliveryDescription = ""
	}
	brokertest.Exercise(t, brokertest.Harness{
		NewQueue: func(t *testing.T) brokertest.Entity {
			qe.drain(ctx, t)
			e := qe.entity(queueLock, queueDeliveries)
			e.Sender = sender
			return e
		},
		NewTopic: func(t *testing.T) brokertest.Topic {
			tp := brokertest.Topic{Sender: topicSender}
			for _, s := range subscriptions {
				se := realEntity{client: client, topic: topic, subscription: s}
				se.drain(ctx, t)
				// Subscriptions are only used for the fan-out case, which
				// waits for no lock; the emulator's minimum is PT1M.
				tp.Subscriptions = append(tp.Subscriptions, se.entity(time.Minute, subDeliveries))
			}
			return tp
		},
		NewSessionQueue: func(t *testing.T) brokertest.SessionEntity {
			// Each case uses its own session ids; acceptSession drains the
			// sessions earlier runs left.
			return brokertest.SessionEntity{
				Sender: sessionSender,
				AcceptNext: func(ctx context.Context) (brokertest.SessionReceiver, error) {
					return client.AcceptNextSessionForQueue(ctx, sessionQueue, nil)
				},
				LockDuration: sessionLock,
			}
		},
		Sequential: true,
		Features:   features,
	})
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func newSender(t *testing.T, c *azservicebus.Client, entity string) *azservicebus.Sender {
	t.Helper()
	s, err := c.NewSender(entity, nil)
	if err != nil {
		t.Fatalf("sender for %s: %v", entity, err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

// maxDeliveries reads the entities' MaxDeliveryCount: from
// emulator/Config.json for the emulator (whose management API the Go SDK
// cannot reach), with the administration client otherwise.
func maxDeliveries(ctx context.Context, t *testing.T, cs string, emulator bool, queue, topic string) (q, sub int) {
	t.Helper()
	if emulator {
		return emulatorDeliveries(t, queue, topic)
	}
	ac, err := admin.NewClientFromConnectionString(cs, nil)
	if err != nil {
		t.Fatalf("admin client: %v", err)
	}
	qp, err := ac.GetQueue(ctx, queue, nil)
	if err != nil || qp == nil || qp.MaxDeliveryCount == nil {
		t.Fatalf("reading queue %s (%s names it; the connection string needs Manage rights to read its settings): %v", queue, queueEnv, err)
	}
	sp, err := ac.GetSubscription(ctx, topic, subscriptions[0], nil)
	if err != nil || sp == nil || sp.MaxDeliveryCount == nil {
		t.Fatalf("reading subscription %s/%s: %v", topic, subscriptions[0], err)
	}
	return int(*qp.MaxDeliveryCount), int(*sp.MaxDeliveryCount)
}

func emulatorDeliveries(t *testing.T, queue, topic string) (q, sub int) {
	t.Helper()
	b, err := os.ReadFile(emulatorConfig)
	if err != nil {
		t.Fatalf("the emulator's entities: %v", err)
	}
	var c struct {
		UserConfig struct {
			Namespaces []struct {
				Queues []struct {
					Name       string
					Properties struct{ MaxDeliveryCount int }
				}
				Topics []struct {
					Name          string
					Subscriptions []struct {
						Name       string
						Properties struct{ MaxDeliveryCount int }
					}
				}
			}
		}
	}
	if err := json.Unmarshal(b, &c); err != nil || len(c.UserConfig.Namespaces) != 1 {
		t.Fatalf("emulator/Config.json: %v", err)
	}
	ns := c.UserConfig.Namespaces[0]
	for _, x := range ns.Queues {
		if x.Name == queue {
			q = x.Properties.MaxDeliveryCount
		}
	}
	for _, x := range ns.Topics {
		if x.Name == topic {
			for _, s := range x.Subscriptions {
				if s.Name == subscriptions[0] {
					sub = s.Properties.MaxDeliveryCount
				}
			}
		}
	}
	if q == 0 || sub == 0 {
		t.Fatalf("emulator/Config.json has no queue %q or topic %q with subscription %q (the emulator must run with the repository's Config.json)", queue, topic, subscriptions[0])
	}
	return q, sub
}

// realEntity is a queue, or a subscription of a topic, on a real broker.
type realEntity struct {
	client              *azservicebus.Client
	queue               string
	topic, subscription string
}

func (e realEntity) name() string {
	if e.queue != "" {
		return e.queue
	}
	return e.topic + "/" + e.subscription
}

func (e realEntity) receiver(t *testing.T, sub azservicebus.SubQueue) *azservicebus.Receiver {
	t.Helper()
	opts := &azservicebus.ReceiverOptions{SubQueue: sub}
	var r *azservicebus.Receiver
	var err error
	if e.queue != "" {
		r, err = e.client.NewReceiverForQueue(e.queue, opts)
	} else {
		r, err = e.client.NewReceiverForSubscription(e.topic, e.subscription, opts)
	}
	if err != nil {
		t.Fatalf("receiver for %s: %v", e.name(), err)
	}
	t.Cleanup(func() { r.Close(context.Background()) })
	return r
}

// drain completes what earlier runs left in the entity and its
// dead-letter queue (locked leftovers come back later; the suite
// completes them when they do).
func (e realEntity) drain(ctx context.Context, t *testing.T) {
	t.Helper()
	for _, sub := range []azservicebus.SubQueue{mainQueue, azservicebus.SubQueueDeadLetter} {
		r := e.receiver(t, sub)
		for {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			msgs, err := r.ReceiveMessages(rctx, 50, nil)
			cancel()
			if len(msgs) == 0 || (err != nil && !errors.Is(err, context.DeadlineExceeded)) {
				break
			}
			for _, m := range msgs {
				_ = r.CompleteMessage(ctx, m, nil)
			}
		}
	}
}

// lockDuration measures the entity's lock duration from a probe message
// (see probeLockDuration).
func (e realEntity) lockDuration(ctx context.Context, t *testing.T, s *azservicebus.Sender) time.Duration {
	t.Helper()
	e.drain(ctx, t)
	id := "bt-probe-" + time.Now().UTC().Format("20060102T150405.000000000")
	if err := s.SendMessage(ctx, &azservicebus.Message{MessageID: &id}, nil); err != nil {
		t.Fatalf("%s: sending the lock-duration probe: %v", e.name(), err)
	}
	d, err := probeLockDuration(ctx, e.receiver(t, mainQueue), id, lockProbeTimeout)
	if err != nil {
		t.Fatalf("%s: %v", e.name(), err)
	}
	t.Logf("%s: lock duration %v", e.name(), d)
	return d
}

// probeLockDuration receives until the probe message id comes back, for
// at most timeout, completing whatever it receives, and measures the lock
// duration from it (lockDurationOf). A probe that does not come back, or
// comes back without the properties the measure needs, is an error that
// says which: never a wait until the suite's own deadline.
func probeLockDuration(ctx context.Context, r brokertest.Receiver, id string, timeout time.Duration) (time.Duration, error) {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		msgs, err := r.ReceiveMessages(pctx, 1, nil)
		if err != nil {
			return 0, fmt.Errorf("the lock-duration probe %s did not come back within %s: %w", id, timeout, err)
		}
		for _, m := range msgs {
			_ = r.CompleteMessage(ctx, m, nil)
			if m.MessageID == id {
				return lockDurationOf(m)
			}
		}
	}
}

// lockDurationOf is a peek-locked message's LockedUntil - EnqueuedTime,
// both on the broker's clock, rounded down to the second (the probe
// waits in the queue for milliseconds). It names the property the broker
// left unset.
func lockDurationOf(m *azservicebus.ReceivedMessage) (time.Duration, error) {
	switch {
	case m.LockedUntil == nil:
		return 0, fmt.Errorf("the lock-duration probe %s came without LockedUntil: a peek-lock delivery must say until when it is locked", m.MessageID)
	case m.EnqueuedTime == nil:
		return 0, fmt.Errorf("the lock-duration probe %s came without EnqueuedTime", m.MessageID)
	}
	d := m.LockedUntil.Sub(*m.EnqueuedTime).Truncate(time.Second)
	if d <= 0 {
		return 0, fmt.Errorf("the lock-duration probe %s: LockedUntil %s is not a second after EnqueuedTime %s",
			m.MessageID, m.LockedUntil.Format(time.RFC3339Nano), m.EnqueuedTime.Format(time.RFC3339Nano))
	}
	return d, nil
}

func (e realEntity) entity(lock time.Duration, deliveries int) brokertest.Entity {
	return brokertest.Entity{
		NewReceiver: func(t *testing.T) brokertest.Receiver {
			return e.receiver(t, mainQueue)
		},
		DeadLetter: func(ctx context.Context, t *testing.T, id string) *azservicebus.ReceivedMessage {
			t.Helper()
			r := e.receiver(t, azservicebus.SubQueueDeadLetter)
			for {
				msgs, err := r.ReceiveMessages(ctx, 1, nil)
				if err != nil {
					t.Fatalf("%s is not in the dead-letter queue of %s: %v", id, e.name(), err)
				}
				for _, m := range msgs {
					_ = r.CompleteMessage(ctx, m, nil)
					if m.MessageID == id {
						return m
					}
				}
			}
		},
		Holds: func(ctx context.Context, t *testing.T, id string) bool {
			t.Helper()
			// Peeking shows active and locked messages alike, and locks
			// nothing.
			r := e.receiver(t, mainQueue)
			from := int64(0)
			for {
				msgs, err := r.PeekMessages(ctx, 100, &azservicebus.PeekMessagesOptions{FromSequenceNumber: &from})
				if err != nil {
					t.Fatalf("peeking %s: %v", e.name(), err)
				}
				if len(msgs) == 0 {
					return false
				}
				for _, m := range msgs {
					if m.MessageID == id {
						return true
					}
					if m.SequenceNumber != nil {
						from = *m.SequenceNumber + 1
					}
				}
			}
		},
		LockDuration:     lock,
		MaxDeliveryCount: deliveries,
	}
}
