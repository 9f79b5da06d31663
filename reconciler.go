package sbclaim

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbclaim/sbclaim/internal/reconciler"
)

// ReconcilerConfig configures a Reconciler. Store is required; every other
// field has a default.
type ReconcilerConfig struct {
	Store *Store
	// Routers are the processors' routers by consumer name (the "" entry
	// serves consumers without one of their own). With them the
	// reconciler recovers stale claims itself, running the same handlers
	// with the same idempotency keys; without them it flags every stale
	// claim for operators. A program that runs its own processor passes
	// the same Router here.
	Routers map[string]*Router
	// StaleAfter: a claim whose holder showed no heartbeat, or a released
	// claim nobody took over, for this long is recovered (default 5m; at
	// least 3 × HeartbeatInterval and at least the processors'
	// TakeoverAfter).
	StaleAfter time.Duration
	// HeartbeatInterval is the processors' (default 30s): the reconciler
	// heartbeats the claims it recovers as often.
	HeartbeatInterval time.Duration
	// RecoveryMaxAttempts is how many recovery attempts may end unknown
	// before the claim is flagged (default 5); RecoveryBackoff the wait
	// after one (default 1m, doubled up to RecoveryBackoffMax, 1h).
	RecoveryMaxAttempts                 int
	RecoveryBackoff, RecoveryBackoffMax time.Duration
	// Retention: finished claims older than this are purged (default
	// 168h). Keep it longer than the broker can redeliver the original:
	// lock duration × max delivery count, plus the message TTL and time
	// for re-submissions from the dead-letter queue.
	Retention time.Duration
	// Schedule is Run's cron spec (default "@every 1m").
	Schedule string
	// QueryTimeout bounds each query (default 30s).
	QueryTimeout time.Duration
	Logger       *slog.Logger
	// Registerer, when set, gets the reconciler's Prometheus metrics.
	Registerer prometheus.Registerer
	// TracerProvider makes the reconciler's OpenTelemetry spans (a
	// reconcile span per tick, a span per pass and per recovered claim,
	// with its effect attempts); nil: the global provider
	// (otel.GetTracerProvider()).
	TracerProvider trace.TracerProvider
}

// Reconciler runs the periodic passes over the claims table: recovery of
// stale claims (re-run with the same key where the route allows it),
// flagging what a person must decide, and the purge of old finished
// claims. One reconciler works per tick, whatever the number of replicas:
// each tick takes a database-wide lock.
type Reconciler struct {
	r *reconciler.Reconciler
}

// NewReconciler checks cfg and returns a reconciler, or an error naming
// the setting out of range.
func NewReconciler(cfg ReconcilerConfig) (*Reconciler, error) {
	if cfg.Store == nil {
		return nil, errNilStore
	}
	var routes reconciler.Routes
	if len(cfg.Routers) > 0 {
		routes = make(reconciler.Routes, len(cfg.Routers))
		for consumer, r := range cfg.Routers {
			routes[consumer] = r.internal()
		}
	}
	var metrics *reconciler.Metrics
	if cfg.Registerer != nil {
		metrics = reconciler.NewMetrics(cfg.Registerer)
	}
	r, err := reconciler.New(cfg.Store.s, reconciler.Config{
		StaleAfter:          cfg.StaleAfter,
		Routes:              routes,
		RecoveryMaxAttempts: cfg.RecoveryMaxAttempts,
		RecoveryBackoff:     cfg.RecoveryBackoff,
		RecoveryBackoffMax:  cfg.RecoveryBackoffMax,
		HeartbeatInterval:   cfg.HeartbeatInterval,
		Retention:           cfg.Retention,
		QueryTimeout:        cfg.QueryTimeout,
		Schedule:            cfg.Schedule,
		TracerProvider:      cfg.TracerProvider,
	}, cfg.Logger, metrics)
	if err != nil {
		return nil, err
	}
	return &Reconciler{r: r}, nil
}

// Run ticks on the schedule until ctx ends, then lets a running tick
// finish (bounded). Tick errors are logged and counted, not returned.
func (r *Reconciler) Run(ctx context.Context) error { return r.r.Run(ctx) }

// TickResult is what one tick did.
type TickResult struct {
	// Locked is false when another replica held the tick's lock: this one
	// did nothing.
	Locked bool
	// Recovered claims were re-run and marked processed; Postponed were
	// re-run without settling (retried later); Failed got a final answer
	// that is not a success; Flagged were handed to operators; Purged
	// finished claims were deleted.
	Recovered, Postponed, Failed, Flagged int
	Purged                                int64
}

// RunOnce runs one tick now (for a scheduled job, or a test).
func (r *Reconciler) RunOnce(ctx context.Context) (TickResult, error) {
	res, err := r.r.RunOnce(ctx)
	if res == nil {
		return TickResult{}, err
	}
	return TickResult{Locked: res.Locked, Recovered: res.Recovered, Postponed: res.Postponed, Failed: res.Failed,
		Flagged: len(res.Flagged), Purged: res.Purged}, err
}
