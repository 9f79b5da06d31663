package sbclaim

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbclaim/sbclaim/internal/groupcommit"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// Receiver is the part of *azservicebus.Receiver the processor uses; the
// SDK's receiver satisfies it as it is, and so does sbclaimtest's
// in-memory broker.
type Receiver interface {
	ReceiveMessages(ctx context.Context, maxMessages int, options *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	CompleteMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.CompleteMessageOptions) error
	AbandonMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.AbandonMessageOptions) error
	DeadLetterMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.DeadLetterOptions) error
	RenewMessageLock(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.RenewMessageLockOptions) error
	// DeferMessage and ReceiveDeferredMessages carry delayed retries (see
	// Backoff): a message whose effect must wait is deferred and fetched
	// again by its sequence number when due.
	DeferMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.DeferMessageOptions) error
	ReceiveDeferredMessages(ctx context.Context, sequenceNumbers []int64, options *azservicebus.ReceiveDeferredMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	PeekMessages(ctx context.Context, maxMessageCount int, options *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	Close(ctx context.Context) error
}

var _ Receiver = (*azservicebus.Receiver)(nil)

// DedupKeyFunc returns a message's dedup key, or an error for a message
// without a usable one (it is dead-lettered MissingDedupKey).
type DedupKeyFunc func(msg *azservicebus.ReceivedMessage) (string, error)

// ParseDedupKey turns a key spec into a DedupKeyFunc: "message-id" (the
// default), "property:<name>" (an application property), or "cloudevents"
// (ce_source, path-escaped, "/" ce_id). Never CorrelationId, the delivery
// count, the lock token or the sequence number: they are not stable across
// redeliveries.
func ParseDedupKey(spec string) (DedupKeyFunc, error) {
	f, err := processor.ParseKeySpec(spec)
	if err != nil {
		return nil, err
	}
	return DedupKeyFunc(f), nil
}

// DefaultRetryBudget is the time budget of an effect's attempts within
// one delivery when RetryPolicy.Budget is zero, and the processor
// command's default (SBCLAIM_EFFECT_RETRY_BUDGET): long enough for a
// downstream's brief hiccup; a longer outage is carried by delayed
// retries (Backoff), which free the message and the worker instead of
// holding them.
const DefaultRetryBudget = 30 * time.Second

// DefaultEffectMaxAttempts is the attempts of an effect within one
// delivery when RetryPolicy.MaxAttempts is zero, and the processor
// command's default (SBCLAIM_EFFECT_MAX_ATTEMPTS).
const DefaultEffectMaxAttempts = 5

// RetryPolicy bounds the retries of an effect within one delivery: by
// attempts and by a time budget, whichever ends first, with exponential
// backoff and jitter, every attempt with the same idempotency key. Zero
// fields take defaults (DefaultEffectMaxAttempts, 200ms doubling to 5s,
// DefaultRetryBudget), the same as the processor command's.
type RetryPolicy struct {
	MaxAttempts     int
	InitialInterval time.Duration
	MaxInterval     time.Duration
	// Budget bounds the loop; it must stay below MaxLockRenewal, so the
	// processor still holds the message when the loop ends.
	Budget time.Duration
}

// GroupCommit tunes the group commit of outcome writes: the processed
// marks, releases, attempts and heartbeats of messages that finish at the
// same time are written in one statement and one commit. A lone write is
// never delayed.
type GroupCommit struct {
	Disabled    bool
	MaxBatch    int           // writes per batch at most (default DefaultGroupCommitMaxBatch, at most MaxGroupCommitBatch)
	MaxInFlight int           // batches written at once (default DefaultGroupCommitMaxInFlight; SQLite: 1)
	Window      time.Duration // how long a batch waits for more writes (default 0)
}

// Group commit's bounds and defaults.
const (
	DefaultGroupCommitMaxBatch    = 128
	DefaultGroupCommitMaxInFlight = 2
	MaxGroupCommitBatch           = 250
)

// ProcessorConfig configures a Processor. Consumer, Store, Router and
// NewReceiver (or, for a session-enabled entity, Sessions) are required;
// every other field has a default that suits Azure Container Apps.
type ProcessorConfig struct {
	// Consumer names this consumer in claims: claims are unique per
	// (dedup key, consumer), so several consumers of one topic each
	// perform a message's effect once.
	Consumer string
	// Entity is the queue, or topic/subscription, recorded on claims.
	Entity      string
	Store       *Store
	Router      *Router
	NewReceiver func(ctx context.Context) (Receiver, error)
	// Sessions, for a session-enabled queue or subscription, replaces
	// NewReceiver: sessions are accepted and worked in order.
	Sessions *Sessions
	// DedupKey extracts the dedup key (default: the MessageId).
	DedupKey DedupKeyFunc

	// MaxConcurrentCalls is how many messages are worked on at once
	// (default 16).
	MaxConcurrentCalls int
	// MaxLockRenewal bounds how long a message's lock is renewed after it
	// was received (default 5m when zero; negative turns renewal off).
	// It is also how long a duplicate may wait for a live holder, so it
	// must exceed TakeoverAfter + HeartbeatInterval.
	MaxLockRenewal time.Duration
	// LockDuration is the entity's lock duration, required when lock
	// renewal is off: a duplicate then waits for a live holder only until
	// shortly before its lock expires, and LockDuration - SettleTimeout
	// must exceed TakeoverAfter + HeartbeatInterval. Give the entity's
	// real value: the wait itself follows each message's lock.
	LockDuration time.Duration
	// HeartbeatInterval is how often a held claim's heartbeat is written
	// (default 30s).
	HeartbeatInterval time.Duration
	// TakeoverAfter is how long a claim's holder must be silent, by the
	// database clock, before a redelivery takes its claim over and repeats
	// the effect with the same key (default 3 × HeartbeatInterval, the
	// least allowed).
	TakeoverAfter time.Duration
	// StaleAfter is the reconciler's window, when known: TakeoverAfter
	// must not exceed it.
	StaleAfter time.Duration
	Retry      RetryPolicy
	// NoPayload keeps message bodies off claims (for PII); a flagged claim
	// can then only be resolved by hand, not redriven.
	NoPayload bool
	// MaxPayloadBytes dead-letters larger bodies (default 256 KiB).
	MaxPayloadBytes int
	// Delayed retries (Route.Backoff). MaxDeliveryCount is the entity's
	// MaxDeliveryCount (default DefaultMaxDeliveryCount): each fetch of a
	// deferred message counts as a delivery, so a message near it is not
	// deferred again — its claim is handed to the reconciler with its
	// stored payload and the message completed. It must be the entity's
	// real value: CheckMaxDeliveryCount reads it where the identity may. DeferPollInterval is how often a
	// processor looks for due claims (default 5s); DeferGrace how long
	// past due the reconciler leaves a deferred claim to its message
	// (default 1h). NoDeferral turns delayed retries off for every route.
	MaxDeliveryCount  int
	DeferPollInterval time.Duration
	DeferGrace        time.Duration
	NoDeferral        bool
	// StoreTimeout bounds each claims-store call (default 5s);
	// SettleTimeout each settlement (default 5s); ShutdownTimeout how long
	// effects in flight may run after Run's context ends (default 15s).
	StoreTimeout, SettleTimeout, ShutdownTimeout time.Duration
	// TerminationGracePeriod is the platform's SIGTERM-to-SIGKILL time;
	// when set, ShutdownTimeout + SettleTimeout + StoreTimeout must fit it.
	TerminationGracePeriod time.Duration
	GroupCommit            GroupCommit
	// Host is recorded as the holder of the claims (default: the host
	// name).
	Host   string
	Logger *slog.Logger
	// Metrics, when set, gets the processor's metrics
	// (sbclaim_messages_total, ...): prommetrics.New(registry) exports them
	// to Prometheus. nil: none recorded.
	Metrics *Metrics
	// TracerProvider makes the processor's OpenTelemetry spans (a process
	// span per delivery, with its claim, effect attempts, outcome write and
	// settlement; see docs/tracing.md); nil: the global provider
	// (otel.GetTracerProvider()), which makes no-op spans until a program
	// installs an SDK.
	TracerProvider trace.TracerProvider
	// MeterProvider gets the semantic-convention metrics
	// messaging.process.duration and messaging.client.consumed.messages;
	// nil: the global provider (otel.GetMeterProvider()).
	MeterProvider metric.MeterProvider
	// Outbox sends the follow-up messages handlers publish
	// (Delivery.Publish); see OutboxConfig. Off (Publish fails) unless
	// Outbox.NewSender is set.
	Outbox OutboxConfig
}

// Processor receives messages, claims each, runs its route's handler with
// the idempotency key, records the outcome and settles the message. Run
// several (replicas) on one entity and one store: the claims table's
// unique index decides who performs each effect.
type Processor struct {
	p *processor.Processor
}

// NewProcessor checks cfg and returns a processor, or an error naming the
// setting that is wrong and its value.
func NewProcessor(cfg ProcessorConfig) (*Processor, error) {
	if cfg.Store == nil {
		return nil, errNilStore
	}
	if cfg.Router == nil || len(cfg.Router.entries) == 0 {
		return nil, errors.New("sbclaim: a Router with at least one route is required")
	}
	switch {
	case cfg.NewReceiver == nil && cfg.Sessions == nil:
		return nil, errors.New("sbclaim: NewReceiver (or, for a session-enabled entity, Sessions) is required")
	case cfg.NewReceiver != nil && cfg.Sessions != nil:
		return nil, errors.New("sbclaim: set NewReceiver or Sessions, not both: an entity either requires sessions or does not")
	case cfg.Sessions != nil && cfg.Sessions.AcceptNext == nil:
		return nil, errors.New("sbclaim: Sessions.AcceptNext is required")
	}
	opts := processor.Options{
		Consumer: cfg.Consumer,
		Entity:   cfg.Entity,
		Store:    cfg.Store.s,
		Router:   cfg.Router.internal(),
		NewReceiver: func(ctx context.Context) (processor.Receiver, error) {
			r, err := cfg.NewReceiver(ctx)
			if err != nil {
				return nil, err
			}
			return r, nil
		},
		Key:                    processor.KeyFunc(cfg.DedupKey),
		MaxConcurrentCalls:     cfg.MaxConcurrentCalls,
		MaxLockRenewal:         cfg.MaxLockRenewal,
		LockDuration:           cfg.LockDuration,
		HeartbeatInterval:      cfg.HeartbeatInterval,
		TakeoverAfter:          cfg.TakeoverAfter,
		StaleAfter:             cfg.StaleAfter,
		Retry:                  cfg.Retry.internal(),
		StorePayload:           !cfg.NoPayload,
		MaxPayloadBytes:        cfg.MaxPayloadBytes,
		MaxDeliveryCount:       cfg.MaxDeliveryCount,
		DeferPollInterval:      cfg.DeferPollInterval,
		DeferGrace:             cfg.DeferGrace,
		NoDeferral:             cfg.NoDeferral,
		StoreTimeout:           cfg.StoreTimeout,
		SettleTimeout:          cfg.SettleTimeout,
		ShutdownTimeout:        cfg.ShutdownTimeout,
		TerminationGracePeriod: cfg.TerminationGracePeriod,
		GroupCommit: groupcommit.Options{
			MaxBatch: cfg.GroupCommit.MaxBatch, MaxInFlight: cfg.GroupCommit.MaxInFlight, Window: cfg.GroupCommit.Window,
		},
		NoGroupCommit:  cfg.GroupCommit.Disabled,
		Host:           cfg.Host,
		Logger:         cfg.Logger,
		Metrics:        cfg.Metrics.internal(),
		TracerProvider: cfg.TracerProvider,
		MeterProvider:  cfg.MeterProvider,
		Outbox:         cfg.Outbox.internal(),
	}
	if cfg.Sessions != nil {
		opts.NewReceiver = nil
		cfg.Sessions.sessionOptions(&opts)
	}
	p, err := processor.New(opts)
	if err != nil {
		return nil, err
	}
	return &Processor{p: p}, nil
}

// Run receives and processes messages until ctx ends, then shuts down
// gracefully: it stops receiving, lets the effects in flight finish for up
// to ShutdownTimeout, and returns nil. It returns an error only when it
// cannot work at all.
func (p *Processor) Run(ctx context.Context) error { return p.p.Run(ctx) }

// Ready reports whether the processor can work (for a readiness probe): a
// receiver is open, Service Bus answered recently and the claims store
// takes writes. When it cannot, reason says why.
func (p *Processor) Ready() (ok bool, reason string) {
	if p.p.Ready() {
		return true, ""
	}
	return false, p.p.NotReadyReason()
}

func (r RetryPolicy) internal() sideeffects.RetryPolicy {
	return sideeffects.RetryPolicy{MaxAttempts: r.MaxAttempts, InitialInterval: r.InitialInterval, MaxInterval: r.MaxInterval, Budget: r.Budget}
}
