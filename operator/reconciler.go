package operator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/bridge"
	"github.com/sbclaim/sbclaim/internal/reconciler"
)

// ReconcilerConfig configures a Reconciler. Store is required; every other
// field has a default.
type ReconcilerConfig struct {
	Store *sbclaim.Store
	// Routers are the processors' routers by consumer name (the "" entry
	// serves consumers without one of their own). With them the
	// reconciler recovers stale claims itself, running the same handlers
	// with the same idempotency keys; without them it flags every stale
	// claim for operators. A program that runs its own processor passes
	// the same Router here.
	Routers map[string]*sbclaim.Router
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
	// RecoveryConcurrency bounds the effects recovery runs at once
	// (default 8).
	RecoveryConcurrency int
	// FlagBatchSize bounds one flag statement (default 100); PurgeBatchSize
	// one purge DELETE (default 500); MaxPurgePerTick what one tick
	// deletes (default 100 × PurgeBatchSize), so a backlog is worked off
	// over several ticks.
	FlagBatchSize, PurgeBatchSize, MaxPurgePerTick int
	// Schedule is Run's cron spec (default "@every 1m"; 5 fields or
	// descriptors such as "@every 30s").
	Schedule string
	// QueryTimeout bounds each query (default 30s).
	QueryTimeout time.Duration
	// ShutdownTimeout bounds how long Run waits for a running tick once
	// its context ends (default 25s).
	ShutdownTimeout time.Duration
	// Host names this reconciler as a claim's holder (default
	// "reconciler@<host name>").
	Host   string
	Logger *slog.Logger
	// Registerer, when set, gets the reconciler's Prometheus metrics.
	Registerer prometheus.Registerer
	// TracerProvider makes the reconciler's OpenTelemetry spans (a
	// reconcile span per tick, a span per pass and per recovered claim,
	// with its effect attempts); nil: the global provider
	// (otel.GetTracerProvider()).
	TracerProvider trace.TracerProvider
}

// The reconciler's defaults.
const (
	DefaultSchedule            = "@every 1m"
	DefaultStaleAfter          = 5 * time.Minute
	DefaultRetention           = 7 * 24 * time.Hour
	DefaultRecoveryMaxAttempts = 5
	DefaultRecoveryBackoff     = time.Minute
	DefaultRecoveryBackoffMax  = time.Hour
	DefaultRecoveryConcurrency = 8
	DefaultFlagBatchSize       = 100
	DefaultPurgeBatchSize      = 500
	DefaultMaxPurgePerTick     = 100 * DefaultPurgeBatchSize
)

// ReconcilerLockName names the database lock a reconciler tick holds, so
// that one replica works per tick and the others skip quietly.
const ReconcilerLockName = "sbclaim-reconciler"

// CheckSchedule reports what is wrong with a cron spec for
// ReconcilerConfig.Schedule.
func CheckSchedule(spec string) error {
	_, err := reconciler.ParseSchedule(spec)
	return err
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
		return nil, errors.New("operator: ReconcilerConfig.Store is required (sbclaim.OpenStore)")
	}
	var routes reconciler.Routes
	if len(cfg.Routers) > 0 {
		routes = make(reconciler.Routes, len(cfg.Routers))
		for consumer, r := range cfg.Routers {
			if r == nil {
				return nil, fmt.Errorf("operator: ReconcilerConfig.Routers[%q] is nil", consumer)
			}
			routes[consumer] = bridge.RouterOf(r)
		}
	}
	var metrics *reconciler.Metrics
	if cfg.Registerer != nil {
		metrics = reconciler.NewMetrics(cfg.Registerer)
	}
	r, err := reconciler.New(bridge.StoreOf(cfg.Store), reconciler.Config{
		StaleAfter:          cfg.StaleAfter,
		Routes:              routes,
		RecoveryMaxAttempts: cfg.RecoveryMaxAttempts,
		RecoveryBackoff:     cfg.RecoveryBackoff,
		RecoveryBackoffMax:  cfg.RecoveryBackoffMax,
		RecoveryConcurrency: cfg.RecoveryConcurrency,
		HeartbeatInterval:   cfg.HeartbeatInterval,
		Retention:           cfg.Retention,
		FlagBatchSize:       cfg.FlagBatchSize,
		PurgeBatchSize:      cfg.PurgeBatchSize,
		MaxPurgePerTick:     cfg.MaxPurgePerTick,
		QueryTimeout:        cfg.QueryTimeout,
		Schedule:            cfg.Schedule,
		ShutdownTimeout:     cfg.ShutdownTimeout,
		Host:                cfg.Host,
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
	// Stats summarises the claims table at the end of the tick (nil when
	// it could not be read).
	Stats *ClaimStats
	// Duration is the tick's wall time.
	Duration time.Duration
}

// ClaimStats summarises the claims table: the claims waiting for an
// outcome (claimed, released), for an operator (flagged) and failed ones
// not yet purged, and when the oldest unfinished claim was claimed (nil:
// none), by the database clock (Now).
type ClaimStats struct {
	Now                                time.Time
	Claimed, Released, Flagged, Failed int64
	OldestUnfinished                   *time.Time
}

// RunOnce runs one tick now (for a scheduled job, or a test).
func (r *Reconciler) RunOnce(ctx context.Context) (TickResult, error) {
	res, err := r.r.RunOnce(ctx)
	if res == nil {
		return TickResult{}, err
	}
	out := TickResult{Locked: res.Locked, Recovered: res.Recovered, Postponed: res.Postponed, Failed: res.Failed,
		Flagged: len(res.Flagged), Purged: res.Purged, Duration: res.Duration}
	if s := res.Stats; s != nil {
		out.Stats = &ClaimStats{Now: s.Now, Claimed: s.Claimed, Released: s.Released, Flagged: s.Flagged, Failed: s.Failed,
			OldestUnfinished: s.OldestUnfinished}
	}
	return out, err
}
