// Package sbclaimtest helps test sbclaim handlers without Service Bus and
// without a database server: an in-memory queue that behaves like Service
// Bus (peek-lock, lock expiry, redelivery with a growing DeliveryCount,
// dead-lettering at MaxDeliveryCount, deferral, the SDK's own message
// types and errors), a migrated SQLite claims store in the test's
// temporary directory, and a processor run for the length of a test with
// short delays everywhere (see Start) and its logs in the test's output,
// with faults: a crash right after the effect, before its outcome is
// recorded.
//
// A unit test runs one message through the real protocol and checks what
// happened (Work):
//
//	res := sbclaimtest.Work(t, sbclaim.ProcessorConfig{Router: router}, sbclaimtest.Message(t, "order-42", "", order))
//	// res.Settlement, res.Outcome, res.Err, res.Claim, res.History
//
// A handler test sends messages (duplicates too), waits until the queue is
// idle, and checks what the handler did and the claims:
//
//	store := sbclaimtest.NewStore(t)
//	queue := sbclaimtest.NewQueue(nil)
//	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "billing", Store: store, Router: router}, queue)
//	queue.SendAndWait(t, sbclaimtest.Message(t, "order-42", "", order))
//	c := sbclaimtest.ClaimByKey(t, store, "order-42")
package sbclaimtest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/bridge"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
	_ "github.com/sbclaim/sbclaim/store/sqlite"
)

// NewStore returns a migrated SQLite claims store in t's temporary
// directory, closed when the test ends.
func NewStore(t testing.TB) *sbclaim.Store {
	t.Helper()
	url := "sqlite:" + filepath.Join(t.TempDir(), "claims.db")
	ctx := context.Background()
	if err := sbclaim.Migrate(ctx, url); err != nil {
		t.Fatalf("sbclaimtest: %v", err)
	}
	st, err := sbclaim.OpenStore(ctx, url)
	if err != nil {
		t.Fatalf("sbclaimtest: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// QueueOptions configure a Queue. Zero values take short test defaults.
type QueueOptions struct {
	// LockDuration is how long a delivery's lock lasts (default 2s): a
	// message whose processor crashed is redelivered after it.
	LockDuration time.Duration
	// MaxDeliveryCount is how many deliveries a message gets before the
	// queue dead-letters it (default 10, as Service Bus).
	MaxDeliveryCount int
	// Sessions makes the queue session-enabled: every message needs a
	// SessionID, and Start runs the processor in session mode
	// (ProcessorConfig.Sessions).
	Sessions bool
}

// Queue is an in-memory Service Bus queue.
type Queue struct {
	q *membus.Queue
}

// NewQueue returns an empty queue.
func NewQueue(opts *QueueOptions) *Queue {
	o := QueueOptions{LockDuration: 2 * time.Second}
	if opts != nil {
		o.LockDuration = max(opts.LockDuration, 0)
		if o.LockDuration == 0 {
			o.LockDuration = 2 * time.Second
		}
		o.MaxDeliveryCount = opts.MaxDeliveryCount
		o.Sessions = opts.Sessions
	}
	return &Queue{q: membus.NewQueue("sbclaimtest", membus.QueueOptions{LockDuration: o.LockDuration, MaxDeliveryCount: o.MaxDeliveryCount,
		RequiresSession: o.Sessions, AcceptTimeout: 100 * time.Millisecond})}
}

// Send enqueues messages as a producer would; sending one MessageId twice
// is a duplicate delivery.
func (q *Queue) Send(ctx context.Context, msgs ...*azservicebus.Message) error {
	return q.q.SendMessages(ctx, msgs)
}

// NewReceiver opens a receiver on the queue: ProcessorConfig.NewReceiver.
func (q *Queue) NewReceiver(context.Context) (sbclaim.Receiver, error) { return q.q.NewReceiver(), nil }

// AcceptNextSession accepts the next session of a session-enabled queue
// (QueueOptions.Sessions): ProcessorConfig.Sessions.AcceptNext. With no
// session available it fails after 100ms with CodeTimeout, as the SDK
// does after a minute.
func (q *Queue) AcceptNextSession(ctx context.Context) (sbclaim.SessionReceiver, error) {
	r, err := q.q.AcceptNextSession(ctx)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// WaitIdle waits until every message was completed or dead-lettered and
// none is locked, or ctx ends.
func (q *Queue) WaitIdle(ctx context.Context) error {
	if err := q.q.WaitIdle(ctx); err != nil {
		return fmt.Errorf("sbclaimtest: queue not idle: %w (%+v)", err, q.q.Stats())
	}
	return nil
}

// Completed returns the MessageIds of the completed messages, in order (a
// duplicate that was completed appears twice).
func (q *Queue) Completed() []string { return q.q.Completed() }

// DeadLetters returns the dead-lettered messages, with their
// DeadLetterReason and DeadLetterErrorDescription.
func (q *Queue) DeadLetters() []*azservicebus.ReceivedMessage { return q.q.DeadLetters() }

// Deliveries returns how many deliveries the queue made, redeliveries
// included.
func (q *Queue) Deliveries() int { return q.q.Stats().Deliveries }

// Pending returns how many messages are neither completed nor
// dead-lettered: available, locked by a receiver or deferred. They live
// only in memory: a program that stops loses them.
func (q *Queue) Pending() int {
	s := q.q.Stats()
	return s.Active + s.Locked + s.Deferred
}

// ExpireLocks ends the lock of every message being worked on, as if its
// holder had hung: the broker redelivers them.
func (q *Queue) ExpireLocks() int { return q.q.ExpireAllLocks() }

// Option changes how Start runs a processor.
type Option func(*options)

type options struct {
	crashes int
}

// CrashAfterEffect makes the first n successful effects end as if the
// replica died right after the effect and before its outcome was
// recorded: no write, no settlement. The claim's holder goes silent, the
// message's lock expires, and its redelivery takes the claim over after
// TakeoverAfter and repeats the effect with the same idempotency key,
// which the handler must be ready for. It applies to HandlerFunc routes;
// a TxHandlerFunc's effect commits with its claim, so there is no "after"
// to crash in.
func CrashAfterEffect(n int) Option { return func(o *options) { o.crashes = n } }

// Start runs a processor on queue until the test ends. cfg.NewReceiver is
// set to the queue's (on a session-enabled queue, cfg.Sessions.AcceptNext,
// with a 200ms IdleTimeout unless cfg.Sessions sets one), and everything left zero gets a short test value, so
// no test waits on a production delay:
//
//   - heartbeat 100ms; take-over after 2s (long enough that a loaded
//     machine running -race never takes a live holder's claim over, short
//     enough for CrashAfterEffect);
//   - the in-delivery retry: 10ms first interval, a 1s budget;
//   - delayed retries: a deferred message is looked for every 20ms
//     (DeferPollInterval), and a route that sets no Backoff waits 10ms,
//     doubling to at most 100ms (instead of 10s to 10m);
//   - a route that sets no Breaker probes 50ms after it opened (instead
//     of 30s);
//   - the processor's logs go to the test's output (t.Log), shown for a
//     failed test or with -v.
func Start(t testing.TB, cfg sbclaim.ProcessorConfig, queue *Queue, opts ...Option) {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	cfg = testConfig(t, cfg)
	if queue.q.RequiresSession() {
		s := sbclaim.Sessions{IdleTimeout: 200 * time.Millisecond}
		if cfg.Sessions != nil {
			s = *cfg.Sessions
		}
		s.AcceptNext = queue.AcceptNextSession
		cfg.NewReceiver, cfg.Sessions = nil, &s
	} else {
		cfg.NewReceiver = queue.NewReceiver
	}
	t.Cleanup(run(t, cfg, o))
}

// testConfig fills cfg's zero fields with the kit's short test values.
func testConfig(t testing.TB, cfg sbclaim.ProcessorConfig) sbclaim.ProcessorConfig {
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = 100 * time.Millisecond
	}
	if cfg.TakeoverAfter == 0 {
		cfg.TakeoverAfter = max(2*time.Second, 3*cfg.HeartbeatInterval)
	}
	if cfg.Retry.Budget == 0 {
		cfg.Retry.Budget = time.Second
	}
	if cfg.Retry.InitialInterval == 0 {
		cfg.Retry.InitialInterval = 10 * time.Millisecond
	}
	if cfg.DeferPollInterval == 0 {
		cfg.DeferPollInterval = 20 * time.Millisecond
	}
	if cfg.Consumer == "" {
		cfg.Consumer = "test"
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	if cfg.Router != nil {
		cfg.Router = bridge.NewRouter(fastRouter{inner: bridge.RouterOf(cfg.Router)}).(*sbclaim.Router)
	}
	return cfg
}

// run starts a processor with cfg; the function it returns stops it and
// waits until it returned.
func run(t testing.TB, cfg sbclaim.ProcessorConfig, o options) (stop func()) {
	t.Helper()
	p, err := sbclaim.NewProcessor(cfg)
	if err != nil {
		t.Fatalf("sbclaimtest: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if o.crashes > 0 {
		var mu sync.Mutex
		left := o.crashes
		ctx = processor.WithHooks(ctx, processor.Hooks{AfterEffect: func(context.Context, *azservicebus.ReceivedMessage) error {
			mu.Lock()
			defer mu.Unlock()
			if left > 0 {
				left--
				return processor.ErrCrash
			}
			return nil
		}})
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	return sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("sbclaimtest: processor: %v", err)
		}
	})
}
