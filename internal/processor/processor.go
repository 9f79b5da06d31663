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
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/groupcommit"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/tracing"
)

// Options configure a Processor. Store, Router, Consumer and NewReceiver
// (or, for a session-enabled entity, AcceptSession) are required; every
// other field has a default.
type Options struct {
	Consumer    string // the consumer name in claims
	Entity      string // queue, or topic/subscription (recorded on claims)
	Store       claim.Store
	Router      sideeffects.Router
	NewReceiver NewReceiverFunc

	// Session mode (session.go), for a session-enabled queue or
	// subscription: AcceptSession accepts the next session (set it instead
	// of NewReceiver); up to MaxConcurrentSessions sessions are worked at
	// once (default 8), one message at a time each, and a session without
	// a message for SessionIdleTimeout (default 1m) is released for
	// another. Messages are never deferred in session mode.
	AcceptSession         AcceptSessionFunc
	MaxConcurrentSessions int
	SessionIdleTimeout    time.Duration

	// Key extracts the dedup key. Default: the MessageId.
	Key KeyFunc
	// MaxConcurrentCalls is how many messages are worked on at once; the
	// processor asks ReceiveMessages for no more than its free slots.
	// Default 16.
	MaxConcurrentCalls int
	// MaxLockRenewal bounds how long a message's lock is renewed after it
	// was received (like the .NET processor's MaxAutoLockRenewalDuration).
	// Default DefaultMaxLockRenewal; negative switches lock renewal off.
	// It is also how long a redelivery may watch a live holder's claim, so
	// it must exceed TakeoverAfter + HeartbeatInterval: a shorter window
	// would complete a dead holder's redelivered message instead of taking
	// its claim over.
	MaxLockRenewal time.Duration
	// LockDuration is the entity's lock duration (Service Bus: 1m by
	// default, at most 5m). Required when lock renewal is off: a
	// redelivery then watches a live holder until its lock nearly expires
	// (LockDuration - SettleTimeout), which must exceed TakeoverAfter +
	// HeartbeatInterval, as MaxLockRenewal must with renewal on.
	LockDuration time.Duration
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

	// Delayed retries (deferral.go). NoDeferral turns them off: a
	// retryable outcome releases the claim and abandons the message, as
	// before. MaxDeliveryCount is the entity's (default 10): a message
	// whose DeliveryCount has reached it cannot be deferred again (the
	// broker would dead-letter it), so its claim is handed to the
	// reconciler with its stored payload. DeferPollInterval is how often
	// the processor looks for due claims (default 5s); DeferGrace how long
	// past due the reconciler leaves a deferred claim to its message
	// (default 1h).
	NoDeferral        bool
	MaxDeliveryCount  int
	DeferPollInterval time.Duration
	DeferGrace        time.Duration
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
	// context ends. Default 15s: with SettleTimeout and one StoreTimeout
	// write after it, it must fit the platform's grace period (Container
	// Apps' 30s): see TerminationGracePeriod.
	ShutdownTimeout time.Duration
	// TerminationGracePeriod is the platform's time between SIGTERM and
	// SIGKILL. When set, ShutdownTimeout + SettleTimeout + StoreTimeout
	// (the last outcome write) must fit it, or New refuses the options: a
	// SIGKILL must not land between an effect and its record.
	TerminationGracePeriod time.Duration
	// BrokerProbeInterval is how long Service Bus may go without
	// answering (a receive that returned messages, or a probe) before the
	// processor probes it (a peek) to keep Ready honest; default 10s.
	// BrokerProbeTimeout (default 5s) bounds each probe. Ready turns false
	// within BrokerProbeInterval + BrokerProbeTimeout of Service Bus's
	// last answer, so of it becoming unreachable. It is also how often a
	// processor that cannot reach Service Bus or its store repeats its
	// warning, from the first failed probe on (at start: within
	// BrokerProbeTimeout or StoreTimeout), until it can.
	BrokerProbeInterval, BrokerProbeTimeout time.Duration

	// GroupCommit tunes the group commit of outcome writes: the heartbeats,
	// attempts, releases and processed marks of messages finishing at the
	// same time are written together, one statement and one commit per
	// batch (see internal/groupcommit), when Store is a claim.BatchWriter
	// (every dialect's store; a wrapper that embeds one is not, and keeps
	// writing one by one). A lone write is never delayed. Its Timeout
	// defaults to StoreTimeout.
	GroupCommit groupcommit.Options
	// NoGroupCommit writes every outcome on its own.
	NoGroupCommit bool
	// Host is recorded as ClaimedBy. Default: os.Hostname.
	Host string

	Logger *slog.Logger
	// Metrics are the instruments it records to (nil: NopMetrics).
	Metrics *Metrics
	// TracerProvider makes the processor's spans and MeterProvider its
	// semantic-convention metrics; nil: the global ones (otel).
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider

	// Hooks are seams for fault injection (the chaos harness). nil hooks
	// are skipped.
	Hooks Hooks

	// Outbox sends the follow-up messages handlers publish (outbox.go).
	Outbox OutboxOptions
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
	// AfterDeferRecorded: the claim records that its message is deferred
	// (released, DeferredSeq, DueAt), the message not yet deferred at the
	// broker; its lock runs out and the broker redelivers it, and that
	// delivery takes its claim back.
	AfterDeferRecorded func(ctx context.Context, msg *azservicebus.ReceivedMessage) error
}

func (h Hooks) set() bool {
	return h.AfterClaim != nil || h.AfterEffect != nil || h.AfterMarkProcessed != nil || h.AfterFail != nil || h.AfterDeferRecorded != nil
}

type hooksKey struct{}

// WithHooks returns ctx carrying hooks for Run: the chaos harness builds
// its replicas through the public API, which has no hooks, and injects its
// faults this way. Hooks in Options take precedence.
func WithHooks(ctx context.Context, h Hooks) context.Context {
	return context.WithValue(ctx, hooksKey{}, h)
}

// ErrCrash is returned by a hook to stop an attempt dead.
var ErrCrash = errors.New("processor: simulated crash")

// Processor receives messages, claims them and runs their effects. It is
// safe to run several processors (replicas) on one entity and one store.
type Processor struct {
	opts    Options
	log     *slog.Logger
	metrics *Metrics
	tr      *procTracing

	receiverOpen atomic.Bool  // a receiver is open
	brokerOK     atomic.Bool  // the broker answered recently (a receive or a probe)
	lastAnswer   atomic.Int64 // unix nanos of the broker's last answer (a receive with messages, a probe's start)

	breaker breaker        // the store-wide failure breaker
	routes  *routeBreakers // a breaker per route

	// Repeated warnings, at most one per BrokerProbeInterval each.
	brokerWarn, storeWarn, openWarn, routeWarn warning

	mu  sync.Mutex
	cur Receiver // the open receiver, for the broker probe

	inflight sync.WaitGroup // per-message workers

	deferrer claim.Deferrer               // the store's delayed retries; nil: off
	relay    *relay                       // the outbox's relay; nil: off (outbox.go)
	live     atomic.Pointer[liveReceiver] // the open receiver, for the deferral poller
}

// New checks opts and fills defaults.
func New(opts Options) (*Processor, error) {
	switch {
	case opts.Store == nil:
		return nil, errors.New("processor: Store is required")
	case opts.Router == nil:
		return nil, errors.New("processor: Router is required")
	case opts.NewReceiver == nil && opts.AcceptSession == nil:
		return nil, errors.New("processor: NewReceiver (or, for a session-enabled entity, AcceptSession) is required")
	case opts.Consumer == "":
		return nil, errors.New("processor: Consumer is required")
	}
	for name, d := range map[string]time.Duration{
		"LockDuration": opts.LockDuration, "HeartbeatInterval": opts.HeartbeatInterval,
		"SettleTimeout": opts.SettleTimeout, "StoreTimeout": opts.StoreTimeout, "ShutdownTimeout": opts.ShutdownTimeout,
		"RecordRetryWindow": opts.RecordRetryWindow, "TakeoverAfter": opts.TakeoverAfter, "StaleAfter": opts.StaleAfter,
		"TerminationGracePeriod": opts.TerminationGracePeriod, "BrokerProbeInterval": opts.BrokerProbeInterval,
		"BrokerProbeTimeout": opts.BrokerProbeTimeout,
	} {
		if d < 0 {
			return nil, fmt.Errorf("processor: %s cannot be negative (got %s)", name, d)
		}
	}
	if opts.MaxConcurrentCalls < 0 || opts.MaxPayloadBytes < 0 {
		return nil, fmt.Errorf("processor: MaxConcurrentCalls and MaxPayloadBytes cannot be negative (got %d, %d)", opts.MaxConcurrentCalls, opts.MaxPayloadBytes)
	}
	if err := opts.checkSessions(); err != nil {
		return nil, err
	}
	if err := opts.Retry.Validate(); err != nil {
		return nil, fmt.Errorf("processor: %w", err)
	}
	opts.MaxLockRenewal = cmp.Or(opts.MaxLockRenewal, DefaultMaxLockRenewal)
	if budget := opts.Retry.EffectiveBudget(); opts.MaxLockRenewal > 0 && budget >= opts.MaxLockRenewal {
		return nil, fmt.Errorf("processor: Retry.Budget (%s) must be below MaxLockRenewal (%s): retries must end while the message is still locked",
			budget, opts.MaxLockRenewal)
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
	if err := opts.checkWatch(); err != nil {
		return nil, err
	}
	opts.StoreTimeout = cmp.Or(opts.StoreTimeout, DefaultStoreTimeout)
	opts.RecordRetryWindow = cmp.Or(opts.RecordRetryWindow, 30*time.Second)
	opts.ShutdownTimeout = cmp.Or(opts.ShutdownTimeout, DefaultShutdownTimeout)
	opts.BrokerProbeInterval = cmp.Or(opts.BrokerProbeInterval, 10*time.Second)
	opts.BrokerProbeTimeout = cmp.Or(opts.BrokerProbeTimeout, 5*time.Second)
	if g := opts.TerminationGracePeriod; g > 0 {
		if need := opts.ShutdownTimeout + opts.SettleTimeout + opts.StoreTimeout; need >= g {
			return nil, fmt.Errorf("processor: ShutdownTimeout + SettleTimeout + StoreTimeout = %s + %s + %s = %s must be less than TerminationGracePeriod (%s): "+
				"after SIGTERM the last effects may run for ShutdownTimeout, their outcome write for StoreTimeout and their settlement for SettleTimeout before the platform's SIGKILL",
				opts.ShutdownTimeout, opts.SettleTimeout, opts.StoreTimeout, need, g)
		}
	}
	opts.MaxDeliveryCount = cmp.Or(opts.MaxDeliveryCount, 10)
	opts.DeferPollInterval = cmp.Or(opts.DeferPollInterval, 5*time.Second)
	opts.DeferGrace = cmp.Or(opts.DeferGrace, time.Hour)
	if opts.MaxDeliveryCount < 0 || opts.DeferPollInterval < 0 || opts.DeferGrace < 0 {
		return nil, fmt.Errorf("processor: MaxDeliveryCount, DeferPollInterval and DeferGrace cannot be negative (got %d, %s, %s)",
			opts.MaxDeliveryCount, opts.DeferPollInterval, opts.DeferGrace)
	}
	// The group-commit wrapper passes on only claim.Store: keep the
	// store's Deferrer.
	deferrer, _ := opts.Store.(claim.Deferrer)
	if opts.NoDeferral {
		deferrer = nil
	}
	outbox, err := opts.outbox()
	if err != nil {
		return nil, err
	}
	if !opts.NoGroupCommit {
		opts.GroupCommit.Timeout = cmp.Or(opts.GroupCommit.Timeout, opts.StoreTimeout)
		st, err := groupcommit.Wrap(opts.Store, opts.GroupCommit)
		if err != nil {
			return nil, fmt.Errorf("processor: %w", err)
		}
		opts.Store = st
	}
	if opts.Host == "" {
		opts.Host, _ = os.Hostname()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = NopMetrics()
	}
	p := &Processor{
		opts:     opts,
		log:      tracing.Logger(opts.Logger).With("consumer", opts.Consumer),
		metrics:  opts.Metrics,
		tr:       newProcTracing(opts),
		deferrer: deferrer,
		routes:   newRouteBreakers(opts.Router),
	}
	if outbox != nil {
		p.relay = newRelay(p, outbox, opts.Outbox)
	}
	return p, nil
}

// Defaults of the store and shutdown timeouts: 15s + 5s (settle) + 5s
// fit Container Apps' 30s grace period with room to spare.
const (
	DefaultShutdownTimeout = 15 * time.Second
	DefaultStoreTimeout    = 5 * time.Second
)

// DefaultMaxLockRenewal is MaxLockRenewal's default (as the command's
// SBCLAIM_MAX_LOCK_RENEWAL).
const DefaultMaxLockRenewal = 5 * time.Minute

// checkWatch checks that a redelivery can watch a silent holder's claim
// long enough to take it over: its window (MaxLockRenewal, or with
// renewal off LockDuration - SettleTimeout: see watchUntil) must exceed
// TakeoverAfter plus one poll of the claim (at most HeartbeatInterval).
// Otherwise the redelivery of a dead holder's message would be completed
// at the end of its window, the claim left to the reconciler.
func (o *Options) checkWatch() error {
	need := o.TakeoverAfter + o.HeartbeatInterval
	if o.MaxLockRenewal > 0 {
		if o.MaxLockRenewal <= need {
			return fmt.Errorf("processor: MaxLockRenewal (%s) must exceed TakeoverAfter + HeartbeatInterval (%s + %s = %s): "+
				"a redelivery watches a silent holder's claim only while it renews its message's lock, and would complete a dead holder's message instead of taking its claim over",
				o.MaxLockRenewal, o.TakeoverAfter, o.HeartbeatInterval, need)
		}
		return nil
	}
	if o.LockDuration <= 0 {
		return fmt.Errorf("processor: with lock renewal off (MaxLockRenewal %s), LockDuration (the entity's lock duration) is required: "+
			"a redelivery watches a silent holder's claim until its lock nearly expires, which must outlast TakeoverAfter (%s)", o.MaxLockRenewal, o.TakeoverAfter)
	}
	if window := o.LockDuration - o.SettleTimeout; window <= need {
		return fmt.Errorf("processor: with lock renewal off, LockDuration - SettleTimeout (%s - %s = %s) must exceed TakeoverAfter + HeartbeatInterval (%s + %s = %s): "+
			"a redelivery watches a silent holder's claim only until its lock nearly expires, and would complete a dead holder's message instead of taking its claim over; turn lock renewal on or lengthen the lock",
			o.LockDuration, o.SettleTimeout, window, o.TakeoverAfter, o.HeartbeatInterval, need)
	}
	return nil
}

// Ready reports whether the processor can work (for /readyz): a receiver
// is open, Service Bus answered recently (a receive returned messages, or
// the periodic probe succeeded), the claim store's breaker is closed, and
// not every route's breaker is open.
func (p *Processor) Ready() bool {
	allOpen, _ := p.routes.allOpen()
	return p.receiverOpen.Load() && p.brokerOK.Load() && !p.breaker.isOpen() && !allOpen
}

// NotReadyReason says why Ready is false ("" when it is true).
func (p *Processor) NotReadyReason() string {
	switch {
	case !p.receiverOpen.Load():
		return "no Service Bus receiver is open"
	case !p.brokerOK.Load():
		return "Service Bus did not answer the last probe"
	case p.breaker.isOpen():
		return "the claim store refuses work (" + p.breaker.class().String() + "): receiving is paused"
	}
	if allOpen, why := p.routes.allOpen(); allOpen {
		return "every route's breaker is open (" + why + "): receiving is paused until a probe is due"
	}
	return ""
}

// Run receives and processes messages until ctx ends, then shuts down
// gracefully: it stops receiving, lets in-flight effects finish for up to
// ShutdownTimeout, and returns nil. It returns an error only when it cannot
// work at all.
func (p *Processor) Run(ctx context.Context) error {
	if h, ok := ctx.Value(hooksKey{}).(Hooks); ok && !p.opts.Hooks.set() {
		p.opts.Hooks = h
	}
	if p.opts.AcceptSession != nil {
		return p.runSessions(ctx)
	}
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
	probeNow := make(chan struct{}, 1)
	probeDone := make(chan struct{})
	go func() { defer close(probeDone); p.probeBroker(ctx, probeNow) }()
	pollDone := make(chan struct{})
	go func() { defer close(pollDone); p.pollDeferred(ctx, work) }()
	stopRelay := p.startRelay(work)
	defer func() {
		p.receiverOpen.Store(false)
		<-probeDone
		<-pollDone // it starts workers: no more once it returned
		p.inflight.Wait()
		stopRelay()
		p.waitForBatches()
		if cur != nil {
			cur.retire(p.opts.SettleTimeout)
		}
	}()

	storeChecked := false
	for ctx.Err() == nil {
		if cur == nil {
			r, err := p.openReceiver(ctx)
			if err != nil {
				break // ctx ended while retrying
			}
			cur = r
			p.setReceiver(r.r)
			p.live.Store(r)
			select { // the SDK connects lazily: ask the broker now
			case probeNow <- struct{}{}:
			default:
			}
		}
		if !storeChecked {
			// Before the first receive, while the broker probe runs: a
			// store that refuses writes at start is said so at once, and
			// no message is taken only to be abandoned.
			storeChecked = true
			p.checkStore(ctx)
		}

		// While the store refuses work (unreachable, read-only, full, no
		// grant), receiving would only abandon messages and burn their
		// delivery counts: wait until it accepts writes again.
		if p.breaker.isOpen() {
			p.waitForStore(ctx)
			continue
		}
		// While every route's breaker is open, receiving would only
		// postpone messages: wait until a probe is due.
		if wait := p.routes.pause(); wait > 0 {
			p.waitForRoutes(ctx, wait)
			continue
		}
		p.routeWarn.reset()

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
		if len(msgs) > 0 {
			p.brokerAnswered(time.Now())
		}
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
				p.setReceiver(nil)
				p.brokerFailed(err)
				p.live.Store(nil)
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

// waitForBatches waits for the group commit's batches still being written
// (once nothing writes any more): Run returns only when nothing it started
// still uses the store.
func (p *Processor) waitForBatches() {
	if gc, ok := p.opts.Store.(*groupcommit.Store); ok {
		gc.Wait()
	}
}

// liveReceiver is a receiver and the messages it delivered that are not yet
// settled: a recreated receiver's predecessor is closed only once its
// messages are settled (settlement goes through the link that received).
type liveReceiver struct {
	r       Receiver
	pending sync.WaitGroup

	mu      sync.Mutex
	retired bool // set by retire; the deferral poller then starts no more work on it
}

// acquire counts one more delivery settled on l, unless l was retired
// (the deferral poller, which runs beside the loop that retires it).
func (l *liveReceiver) acquire() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.retired {
		return false
	}
	l.pending.Add(1)
	return true
}

func (l *liveReceiver) retire(timeout time.Duration) {
	l.mu.Lock()
	l.retired = true
	l.mu.Unlock()
	go func() {
		l.pending.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_ = l.r.Close(ctx)
	}()
}

// setReceiver records the open receiver (nil: none) for the broker probe.
func (p *Processor) setReceiver(r Receiver) {
	p.mu.Lock()
	p.cur = r
	p.mu.Unlock()
	p.receiverOpen.Store(r != nil)
}

func (p *Processor) receiver() Receiver {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// brokerAnswered records that Service Bus answered at the time given (a
// receive that returned messages, a probe that succeeded, at its start).
func (p *Processor) brokerAnswered(at time.Time) {
	for {
		last := p.lastAnswer.Load()
		if last >= at.UnixNano() || p.lastAnswer.CompareAndSwap(last, at.UnixNano()) {
			break
		}
	}
	p.brokerWarn.reset()
	if !p.brokerOK.Swap(true) {
		p.log.Info("Service Bus answers: ready")
		p.metrics.BrokerReachable.Set(1)
	}
}

// brokerFailed records that Service Bus did not answer: not ready. It
// warns at once when the broker answered before (or never did: at
// start), then at most once per BrokerProbeInterval while it still does
// not answer.
func (p *Processor) brokerFailed(err error) {
	p.brokerOK.Store(false)
	p.metrics.BrokerReachable.Set(0)
	if since, ok := p.brokerWarn.due(p.opts.BrokerProbeInterval); ok {
		p.log.Warn("Service Bus does not answer: not ready", "for", since.Round(time.Millisecond).String(), "error", err)
	}
}

// probeBroker keeps brokerOK honest (an idle receiver and an unreachable
// broker look alike from ReceiveMessages, which blocks while the SDK
// retries its connection): it peeks one message (no lock, nothing
// changes) within BrokerProbeTimeout whenever Service Bus has not
// answered for BrokerProbeInterval, and when asked on now. A probe
// therefore starts at most BrokerProbeInterval after the broker's last
// answer, and Ready turns false at most BrokerProbeInterval +
// BrokerProbeTimeout after it. While the broker does not answer, it
// probes again BrokerProbeInterval after each failed probe.
func (p *Processor) probeBroker(ctx context.Context, now <-chan struct{}) {
	interval := p.opts.BrokerProbeInterval
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// Due one interval after the last answer: later if the broker
			// answered since the timer was set.
			if due := time.Until(time.Unix(0, p.lastAnswer.Load()).Add(interval)); due > 0 && p.brokerOK.Load() {
				t.Reset(due)
				continue
			}
		case <-now:
		}
		r := p.receiver()
		if r == nil {
			t.Reset(interval)
			continue
		}
		start := time.Now()
		pctx, cancel := context.WithTimeout(ctx, p.opts.BrokerProbeTimeout)
		_, err := r.PeekMessages(pctx, 1, nil)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			p.brokerFailed(err)
			t.Reset(interval)
			continue
		}
		p.brokerAnswered(start)
		t.Reset(time.Until(start.Add(interval)))
	}
}

// warning limits a repeated warning to one per interval.
type warning struct {
	mu          sync.Mutex
	first, last time.Time // of the current run of failures; zero: none
}

// due reports whether to warn now (the first failure of a run, or an
// interval after the last warning) and how long the run has lasted.
func (w *warning) due(interval time.Duration) (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	if w.first.IsZero() {
		w.first, w.last = now, now
		return 0, true
	}
	if now.Sub(w.last) < interval {
		return now.Sub(w.first), false
	}
	w.last = now
	return now.Sub(w.first), true
}

// reset ends a run of failures: the next one warns at once.
func (w *warning) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.first, w.last = time.Time{}, time.Time{}
}

// storeErr trips the breaker when err says the whole store refuses work
// (claim.StoreWide: unreachable, failing over, read-only, out of space,
// missing grant) and reports whether it did.
func (p *Processor) storeErr(err error) bool {
	if !claim.StoreWide(err) {
		return false
	}
	if p.breaker.trip(err) {
		class := claim.ClassOf(err)
		p.metrics.StoreBreakerTrips.With(class.String()).Inc()
		p.metrics.StoreBreakerOpen.Set(1)
		p.storeWarn.reset()
		p.storeWarn.due(p.opts.BrokerProbeInterval)
		p.log.Warn("claim store refuses work: pausing receives until it accepts writes again",
			"class", class.String(), "error", err)
	}
	return true
}

// checkStore probes the store once, as waitForStore does, and trips the
// breaker when it refuses writes store-wide.
func (p *Processor) checkStore(ctx context.Context) {
	if err := p.probeStore(ctx); err != nil {
		p.storeErr(err)
	}
}

// probeStore writes a heartbeat of a claim that does not exist: a store
// that accepts writes answers ErrStateChanged (the guarded UPDATE ran and
// matched nothing); a read-only, full or unreachable one answers a
// store-wide error, which probeStore returns. A ping would not do: a
// read-only database after a failover answers reads.
func (p *Processor) probeStore(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, p.opts.StoreTimeout)
	defer cancel()
	err := p.opts.Store.Heartbeat(pctx, &claim.HeartbeatParams{ID: -1, Owner: uuid.New()})
	if claim.StoreWide(err) {
		return err
	}
	return nil
}

// waitForStore probes the store (probeStore) with backoff until it
// accepts a write or ctx ends, then closes the breaker. Meanwhile it
// repeats the breaker's warning at most once per BrokerProbeInterval.
func (p *Processor) waitForStore(ctx context.Context) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = 10 * time.Second
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		err := p.probeStore(ctx)
		if err != nil && ctx.Err() == nil {
			if since, ok := p.storeWarn.due(p.opts.BrokerProbeInterval); ok {
				p.log.Warn("claim store still refuses work: not receiving",
					"class", claim.ClassOf(err).String(), "for", since.Round(time.Millisecond).String(), "error", err)
			}
		}
		return struct{}{}, err
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(0))
	if err == nil {
		p.storeBack()
	}
}

// storeBack closes the store breaker: the store accepts writes again.
func (p *Processor) storeBack() {
	p.breaker.reset()
	p.storeWarn.reset()
	p.metrics.StoreBreakerOpen.Set(0)
	p.log.Info("claim store accepts writes again: receiving")
}

// waitForRoutes waits for wait (until a route's probe is due) or until
// ctx ends.
func (p *Processor) waitForRoutes(ctx context.Context, wait time.Duration) {
	if since, ok := p.routeWarn.due(p.opts.BrokerProbeInterval); ok {
		_, why := p.routes.allOpen()
		p.log.Warn("every route's breaker is open: not receiving until a probe is due",
			"for", since.Round(time.Millisecond).String(), "probe_in", wait.Round(time.Millisecond).String(), "why", why)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// breaker is open while the claim store refuses work store-wide.
type breaker struct {
	mu    sync.Mutex
	open  bool
	cls   claim.Class
	shut  chan struct{} // closed when the open breaker closes
	ready chan struct{} // an already closed channel
}

// trip opens the breaker; it reports whether it was closed before.
func (b *breaker) trip(err error) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	was := b.open
	b.open, b.cls = true, claim.ClassOf(err)
	if !was {
		b.shut = make(chan struct{})
	}
	return !was
}

func (b *breaker) reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open {
		close(b.shut)
	}
	b.open = false
}

// closed returns a channel closed once the breaker is closed (at once
// when it is).
func (b *breaker) closed() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open {
		return b.shut
	}
	if b.ready == nil {
		b.ready = make(chan struct{})
		close(b.ready)
	}
	return b.ready
}

func (b *breaker) isOpen() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}

func (b *breaker) class() claim.Class {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cls
}

func (p *Processor) openReceiver(ctx context.Context) (*liveReceiver, error) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 200 * time.Millisecond
	b.MaxInterval = 30 * time.Second
	r, err := backoff.Retry(ctx, func() (Receiver, error) {
		r, err := p.opts.NewReceiver(ctx)
		if err != nil {
			if since, ok := p.openWarn.due(p.opts.BrokerProbeInterval); ok {
				p.log.Warn("cannot open a Service Bus receiver: retrying", "for", since.Round(time.Millisecond).String(), "error", err)
			}
		}
		return r, err
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(0))
	if err != nil {
		return nil, fmt.Errorf("open receiver: %w", err)
	}
	p.openWarn.reset()
	p.metrics.Receivers.Inc()
	return &liveReceiver{r: r}, nil
}
