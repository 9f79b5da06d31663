package processor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/cenkalti/backoff/v5"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// Options configure a Processor. Store, Router, NewReceiver and Consumer are
// required; every other field has a default.
type Options struct {
	Consumer    string // the consumer name in claims
	Entity      string // queue, or topic/subscription (recorded on claims)
	Store       claim.Store
	Router      sideeffects.Router
	NewReceiver NewReceiverFunc

	// Key extracts the dedup key. Default: the MessageId.
	Key KeyFunc
	// MaxConcurrentCalls is how many messages are worked on at once; the
	// processor asks ReceiveMessages for no more than its free slots.
	// Default 16.
	MaxConcurrentCalls int
	// MaxLockRenewal bounds how long a message's lock is renewed after it
	// was received (like the .NET processor's MaxAutoLockRenewalDuration).
	// Zero or negative switches lock renewal off.
	MaxLockRenewal time.Duration
	// HeartbeatInterval is how often a held claim's heartbeat is written.
	// Default 30s. (Message locks are renewed on their own schedule, at
	// half of the lock's remaining time.)
	HeartbeatInterval time.Duration
	// TakeoverAfter is how long a claim's holder must show no heartbeat,
	// by the database clock, before a redelivery of its message takes the
	// claim over and repeats the effect with the same key. At least three
	// heartbeat intervals (a live holder that missed two heartbeats is not
	// taken over). Default 3 × HeartbeatInterval.
	TakeoverAfter time.Duration
	// StaleAfter is the reconciler's window (SBCLAIM_STALE_AFTER), when
	// known: TakeoverAfter must not exceed it, so that redeliveries, which
	// hold the message, get the first chance at a silent holder's claim.
	// Zero: not checked.
	StaleAfter time.Duration
	// Retry bounds effect retries. Its Budget should stay inside the lock
	// renewal window.
	Retry sideeffects.RetryPolicy
	// StorePayload keeps the body on the claim until it is processed, so a
	// flagged claim can be redriven.
	StorePayload bool
	// MaxPayloadBytes rejects (dead-letters) larger bodies. Default 256 KiB.
	MaxPayloadBytes int
	// SettleTimeout bounds each settlement call, on its own context.
	// Default 5s (ShutdownTimeout + SettleTimeout should fit the platform's
	// grace period: 25s + 5s for Container Apps' 30s).
	SettleTimeout time.Duration
	// StoreTimeout bounds each claim-store call. Default 10s.
	StoreTimeout time.Duration
	// RecordRetryWindow is how long recording a known outcome (mark
	// processed, release) retries a store outage. Default 30s.
	RecordRetryWindow time.Duration
	// ShutdownTimeout is how long in-flight effects may run after Run's
	// context ends. Default 25s (below Container Apps' 30 s grace period).
	ShutdownTimeout time.Duration
	// Host is recorded as ClaimedBy. Default: os.Hostname.
	Host string

	Logger  *slog.Logger
	Metrics *Metrics

	// Hooks are seams for fault injection (the chaos harness). nil hooks
	// are skipped.
	Hooks Hooks
}

// Hooks are called at the protocol's crash points. A hook that returns
// ErrCrash ends the attempt there as if the replica had died: no further
// store write and no settlement for that message. (The chaos harness also
// cuts the replica's store and receiver so its other work stops too.)
type Hooks struct {
	AfterClaim         func(ctx context.Context, msg *azservicebus.ReceivedMessage) error
	AfterEffect        func(ctx context.Context, msg *azservicebus.ReceivedMessage) error // a successful effect, before marking processed
	AfterMarkProcessed func(ctx context.Context, msg *azservicebus.ReceivedMessage) error
	// AfterFail: the claim is failed (a final answer), the message not yet
	// dead-lettered; its redelivery dead-letters it.
	AfterFail func(ctx context.Context, msg *azservicebus.ReceivedMessage) error
}

// ErrCrash is returned by a hook to stop an attempt dead.
var ErrCrash = errors.New("processor: simulated crash")

// Processor receives messages, claims them and runs their effects. It is
// safe to run several processors (replicas) on one entity and one store.
type Processor struct {
	opts    Options
	log     *slog.Logger
	metrics *Metrics

	ready     atomic.Bool // a receiver is open
	storeDown atomic.Bool // the last claim attempt found the store unavailable

	inflight sync.WaitGroup // per-message workers
}

// New checks opts and fills defaults.
func New(opts Options) (*Processor, error) {
	switch {
	case opts.Store == nil:
		return nil, errors.New("processor: Store is required")
	case opts.Router == nil:
		return nil, errors.New("processor: Router is required")
	case opts.NewReceiver == nil:
		return nil, errors.New("processor: NewReceiver is required")
	case opts.Consumer == "":
		return nil, errors.New("processor: Consumer is required")
	}
	for name, d := range map[string]time.Duration{
		"MaxLockRenewal": opts.MaxLockRenewal, "HeartbeatInterval": opts.HeartbeatInterval,
		"SettleTimeout": opts.SettleTimeout, "StoreTimeout": opts.StoreTimeout, "ShutdownTimeout": opts.ShutdownTimeout,
		"RecordRetryWindow": opts.RecordRetryWindow, "TakeoverAfter": opts.TakeoverAfter, "StaleAfter": opts.StaleAfter,
	} {
		if d < 0 {
			return nil, fmt.Errorf("processor: %s cannot be negative (got %s)", name, d)
		}
	}
	if opts.MaxConcurrentCalls < 0 || opts.MaxPayloadBytes < 0 {
		return nil, fmt.Errorf("processor: MaxConcurrentCalls and MaxPayloadBytes cannot be negative (got %d, %d)", opts.MaxConcurrentCalls, opts.MaxPayloadBytes)
	}
	if err := opts.Retry.Validate(); err != nil {
		return nil, fmt.Errorf("processor: %w", err)
	}
	if opts.Key == nil {
		opts.Key = messageIDKey
	}
	opts.MaxConcurrentCalls = cmp.Or(opts.MaxConcurrentCalls, 16)
	opts.HeartbeatInterval = cmp.Or(opts.HeartbeatInterval, 30*time.Second)
	opts.TakeoverAfter = cmp.Or(opts.TakeoverAfter, 3*opts.HeartbeatInterval)
	if opts.TakeoverAfter < 3*opts.HeartbeatInterval {
		return nil, fmt.Errorf("processor: TakeoverAfter (%s) must be at least 3 × HeartbeatInterval (%s): a live holder that missed two heartbeats would be taken over",
			opts.TakeoverAfter, 3*opts.HeartbeatInterval)
	}
	if opts.StaleAfter > 0 && opts.TakeoverAfter > opts.StaleAfter {
		return nil, fmt.Errorf("processor: TakeoverAfter (%s) must not exceed the reconciler's StaleAfter (%s): redeliveries, which hold the message, take a silent holder's claim over first",
			opts.TakeoverAfter, opts.StaleAfter)
	}
	opts.MaxPayloadBytes = cmp.Or(opts.MaxPayloadBytes, 256*1024)
	opts.SettleTimeout = cmp.Or(opts.SettleTimeout, 5*time.Second)
	opts.StoreTimeout = cmp.Or(opts.StoreTimeout, 10*time.Second)
	opts.RecordRetryWindow = cmp.Or(opts.RecordRetryWindow, 30*time.Second)
	opts.ShutdownTimeout = cmp.Or(opts.ShutdownTimeout, 25*time.Second)
	if opts.Host == "" {
		opts.Host, _ = os.Hostname()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(nil)
	}
	return &Processor{
		opts:    opts,
		log:     opts.Logger.With("consumer", opts.Consumer),
		metrics: opts.Metrics,
	}, nil
}

// Ready reports whether the processor has a receiver whose last receive
// did not fail (for /readyz, together with a store ping).
func (p *Processor) Ready() bool { return p.ready.Load() }

// Run receives and processes messages until ctx ends, then shuts down
// gracefully: it stops receiving, lets in-flight effects finish for up to
// ShutdownTimeout, and returns nil. It returns an error only when it cannot
// work at all.
func (p *Processor) Run(ctx context.Context) error {
	// Work (effects, store writes, settlement) must outlive ctx: a SIGTERM
	// stops receiving, not the effects already running. work is cancelled
	// ShutdownTimeout after ctx ends.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(p.opts.ShutdownTimeout, cancelWork)
		context.AfterFunc(work, func() { t.Stop() })
	})
	defer stop()

	slots := make(chan struct{}, p.opts.MaxConcurrentCalls)
	var cur *liveReceiver
	defer func() {
		p.ready.Store(false)
		p.inflight.Wait()
		if cur != nil {
			cur.retire(p.opts.SettleTimeout)
		}
	}()

	for ctx.Err() == nil {
		if cur == nil {
			r, err := p.openReceiver(ctx)
			if err != nil {
				break // ctx ended while retrying
			}
			cur = r
			p.ready.Store(true)
		}

		// While the store is down, receiving would only abandon messages
		// and burn their delivery counts: wait until it answers again.
		if p.storeDown.Load() {
			p.waitForStore(ctx)
			continue
		}

		// Wait for at least one free slot, then ask for exactly as many
		// messages as there are free slots.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			continue
		}
		free := 1
		for free < cap(slots) {
			select {
			case slots <- struct{}{}:
				free++
				continue
			default:
			}
			break
		}

		msgs, err := cur.r.ReceiveMessages(ctx, free, nil)
		// Ready while receives succeed: a receiver whose connection fails
		// (the SDK connects lazily) is not ready.
		p.ready.Store(err == nil || ctx.Err() != nil)
		if len(msgs) < free {
			for range free - len(msgs) {
				<-slots
			}
		}
		if len(msgs) > 0 {
			p.handleBatch(ctx, work, cur, msgs, slots)
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if needsNewReceiver(err) {
				p.log.Warn("receiver lost, recreating", "error", err)
				p.ready.Store(false)
				cur.retire(p.opts.SettleTimeout)
				cur = nil
				continue
			}
			p.log.Error("receive failed", "error", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

// liveReceiver is a receiver and the messages it delivered that are not yet
// settled: a recreated receiver's predecessor is closed only once its
// messages are settled (settlement goes through the link that received).
type liveReceiver struct {
	r       Receiver
	pending sync.WaitGroup
}

func (l *liveReceiver) retire(timeout time.Duration) {
	go func() {
		l.pending.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_ = l.r.Close(ctx)
	}()
}

// waitForStore pings the store with backoff until it answers or ctx ends.
func (p *Processor) waitForStore(ctx context.Context) {
	p.log.Warn("claim store unavailable: pausing receives until it answers")
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = 10 * time.Second
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		pctx, cancel := context.WithTimeout(ctx, p.opts.StoreTimeout)
		defer cancel()
		return struct{}{}, p.opts.Store.Ping(pctx)
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(0))
	if err == nil {
		p.storeDown.Store(false)
		p.log.Info("claim store answers again: receiving")
	}
}

func (p *Processor) openReceiver(ctx context.Context) (*liveReceiver, error) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 200 * time.Millisecond
	b.MaxInterval = 30 * time.Second
	r, err := backoff.Retry(ctx, func() (Receiver, error) {
		r, err := p.opts.NewReceiver(ctx)
		if err != nil {
			p.log.Warn("open receiver failed, retrying", "error", err)
		}
		return r, err
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(0))
	if err != nil {
		return nil, fmt.Errorf("open receiver: %w", err)
	}
	p.metrics.Receivers.Inc()
	return &liveReceiver{r: r}, nil
}
