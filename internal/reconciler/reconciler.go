package reconciler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/tracing"
)

// LockName is the database lock a tick holds, so that one reconciler
// replica works per tick and the others skip quietly.
const LockName = "sbclaim-reconciler"

// Defaults for Config's zero values.
const (
	DefaultStaleAfter      = 5 * time.Minute
	DefaultRetention       = 7 * 24 * time.Hour
	DefaultFlagBatchSize   = 100
	DefaultPurgeBatchSize  = 500
	DefaultMaxPurgePerTick = 100 * DefaultPurgeBatchSize
	DefaultQueryTimeout    = 30 * time.Second
	DefaultSchedule        = "@every 1m"
	DefaultShutdownTimeout = 25 * time.Second // under Container Apps' 30 s grace period

	DefaultRecoveryMaxAttempts = 5
	DefaultRecoveryBackoff     = time.Minute
	DefaultRecoveryBackoffMax  = time.Hour
	DefaultRecoveryConcurrency = 8
	DefaultHeartbeatInterval   = 30 * time.Second
)

// Config tunes a Reconciler. Zero values take the defaults above. The
// binary validates the operator-facing rules (retention against the
// broker's redelivery window, stale-after against the heartbeat interval);
// Config itself only needs positive values.
type Config struct {
	// StaleAfter: a claimed claim without a heartbeat, or a released claim
	// not taken over, for this long is recovered (or, when it cannot be,
	// flagged).
	StaleAfter time.Duration
	// Routes are the processors' routers by consumer. With none, recovery
	// is off and the tick flags every stale claim for operators (the flag
	// pass).
	Routes Routes
	// RecoveryMaxAttempts is how many recovery attempts may end with an
	// unknown outcome before the claim is flagged.
	RecoveryMaxAttempts int
	// RecoveryBackoff is the wait after a recovery attempt that did not
	// settle the claim, doubled per attempt up to RecoveryBackoffMax
	// (NextAttemptAt on the claim).
	RecoveryBackoff, RecoveryBackoffMax time.Duration
	// RecoveryConcurrency bounds the effects the recovery pass runs at once.
	RecoveryConcurrency int
	// MaxRecoverPerTick bounds the stale claims one tick looks at.
	MaxRecoverPerTick int
	// HeartbeatInterval is how often the reconciler's heartbeat is written
	// on a claim it holds while re-running its effect: the processors'
	// SBCLAIM_HEARTBEAT_INTERVAL, so their TakeoverAfter sees it alive.
	HeartbeatInterval time.Duration
	// Host names the reconciler as a claim's holder ("reconciler@<host>").
	Host string
	// Retention: finished claims older than this are purged.
	Retention time.Duration
	// FlagBatchSize bounds one FlagStale call; the flag pass loops until a
	// batch comes back short.
	FlagBatchSize int
	// PurgeBatchSize bounds one PurgeProcessed call (one bounded DELETE);
	// the purge pass loops until a batch comes back short.
	PurgeBatchSize int
	// MaxPurgePerTick bounds the rows one tick deletes, so a backlog after
	// an outage is worked off over several ticks instead of one long one.
	MaxPurgePerTick int
	// QueryTimeout bounds every single query of a tick.
	QueryTimeout time.Duration
	// Schedule is the cron spec Run ticks on (robfig/cron standard parser:
	// 5 fields or descriptors such as "@every 1m").
	Schedule string
	// ShutdownTimeout bounds how long Run waits for a running tick once
	// its context ends; then the tick's context is cancelled.
	ShutdownTimeout time.Duration
	// TracerProvider makes the ticks' spans; nil: the global one.
	TracerProvider trace.TracerProvider
}

func (c Config) withDefaults() Config {
	c.StaleAfter = cmp.Or(c.StaleAfter, DefaultStaleAfter)
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.FlagBatchSize = cmp.Or(c.FlagBatchSize, DefaultFlagBatchSize)
	c.PurgeBatchSize = cmp.Or(c.PurgeBatchSize, DefaultPurgeBatchSize)
	c.MaxPurgePerTick = cmp.Or(c.MaxPurgePerTick, 100*c.PurgeBatchSize)
	c.QueryTimeout = cmp.Or(c.QueryTimeout, DefaultQueryTimeout)
	c.Schedule = cmp.Or(c.Schedule, DefaultSchedule)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.RecoveryMaxAttempts = cmp.Or(c.RecoveryMaxAttempts, DefaultRecoveryMaxAttempts)
	c.RecoveryBackoff = cmp.Or(c.RecoveryBackoff, DefaultRecoveryBackoff)
	c.RecoveryBackoffMax = cmp.Or(c.RecoveryBackoffMax, max(DefaultRecoveryBackoffMax, c.RecoveryBackoff))
	c.RecoveryConcurrency = cmp.Or(c.RecoveryConcurrency, DefaultRecoveryConcurrency)
	c.MaxRecoverPerTick = cmp.Or(c.MaxRecoverPerTick, 10*c.FlagBatchSize)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, DefaultHeartbeatInterval)
	if c.Host == "" {
		h, _ := os.Hostname()
		c.Host = "reconciler@" + cmp.Or(h, "unknown")
	}
	return c
}

// Validate reports the first setting that is out of range (after defaults).
func (c Config) Validate() error {
	c = c.withDefaults()
	for name, d := range map[string]time.Duration{
		"StaleAfter": c.StaleAfter, "Retention": c.Retention, "QueryTimeout": c.QueryTimeout, "ShutdownTimeout": c.ShutdownTimeout,
		"RecoveryBackoff": c.RecoveryBackoff, "RecoveryBackoffMax": c.RecoveryBackoffMax, "HeartbeatInterval": c.HeartbeatInterval,
	} {
		if d <= 0 {
			return fmt.Errorf("reconciler: %s must be positive, got %s", name, d)
		}
	}
	for name, n := range map[string]int{
		"FlagBatchSize": c.FlagBatchSize, "PurgeBatchSize": c.PurgeBatchSize, "MaxPurgePerTick": c.MaxPurgePerTick,
		"RecoveryMaxAttempts": c.RecoveryMaxAttempts, "RecoveryConcurrency": c.RecoveryConcurrency, "MaxRecoverPerTick": c.MaxRecoverPerTick,
	} {
		if n <= 0 {
			return fmt.Errorf("reconciler: %s must be at least 1, got %d", name, n)
		}
	}
	if c.RecoveryBackoffMax < c.RecoveryBackoff {
		return fmt.Errorf("reconciler: RecoveryBackoffMax (%s) cannot be less than RecoveryBackoff (%s)", c.RecoveryBackoffMax, c.RecoveryBackoff)
	}
	if c.StaleAfter < 3*c.HeartbeatInterval {
		return fmt.Errorf("reconciler: StaleAfter (%s) must be at least 3 × HeartbeatInterval (%s): a live holder that missed two heartbeats would be taken over",
			c.StaleAfter, 3*c.HeartbeatInterval)
	}
	if _, err := ParseSchedule(c.Schedule); err != nil {
		return fmt.Errorf("reconciler: Schedule %q: %w", c.Schedule, err)
	}
	return nil
}

// Recovering reports whether the tick recovers stale claims (routes are
// configured) rather than flagging them all.
func (c Config) Recovering() bool { return len(c.Routes) > 0 }

// Routes are the processors' routers by consumer name; the "" entry serves
// consumers that have no entry of their own.
type Routes map[string]sideeffects.Router

// For returns the router of consumer's claims, nil when there is none.
func (r Routes) For(consumer string) sideeffects.Router {
	if rt, ok := r[consumer]; ok {
		return rt
	}
	return r[""]
}

// Reconciler flags stale claims and purges old finished ones, one tick at
// a time. It is safe for concurrent use: ticks of several Reconcilers (or
// replicas) on one database serialise on the database lock, and every state
// change is a guarded update in the store.
type Reconciler struct {
	store   claim.Store
	cfg     Config
	logger  *slog.Logger
	metrics *Metrics
}

// New returns a Reconciler over store, or an error naming the first
// setting out of range. logger and metrics may be nil.
func New(store claim.Store, cfg Config, logger *slog.Logger, metrics *Metrics) (*Reconciler, error) {
	if store == nil {
		return nil, errors.New("reconciler: a store is required")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Reconciler{store: store, cfg: cfg.withDefaults(), logger: tracing.Logger(logger), metrics: metrics}, nil
}

// Config returns the configuration in effect (defaults filled in).
func (r *Reconciler) Config() Config { return r.cfg }

// TickResult is what one tick did.
type TickResult struct {
	// Locked is false when another reconciler held the lock: the tick did
	// nothing else.
	Locked bool
	// Flagged are the claims this tick flagged.
	Flagged []*claim.Claim
	// Recovered counts the claims the recovery pass re-ran and marked
	// processed; Postponed those it re-ran without settling them (retried
	// later, by backoff); Failed those whose re-run got a final answer that
	// is not a success (rejected, permanent, conflict): failed, not flagged.
	Recovered, Postponed, Failed int
	// RecoveryBatches counts the recovery pass's FindStale calls.
	RecoveryBatches int
	// Purged is how many finished claims this tick deleted.
	Purged int64
	// FlagBatches and PurgeBatches count the store calls of each pass.
	FlagBatches, PurgeBatches int
	// Stats is the table summary read at the end of the tick (nil if the
	// read failed).
	Stats *claim.Stats
	// Duration is the tick's wall time.
	Duration time.Duration
}

// RunOnce runs one tick: under the database lock, the recovery pass (or,
// with no routes configured, the flag pass) then the purge pass, then it
// reads the table's stats for the gauges. When the lock is held elsewhere
// it returns a result with Locked false and no error.
//
// A failing recovery or flag pass does not stop the purge pass (they touch
// disjoint rows); the errors are joined.
func (r *Reconciler) RunOnce(ctx context.Context) (res *TickResult, err error) {
	start := time.Now()
	res = &TickResult{}
	ctx, endSpan := r.startTick(ctx)
	defer func() { endSpan(res, err) }()
	defer func() {
		res.Duration = time.Since(start)
		if r.metrics != nil {
			r.metrics.TickDuration.Observe(res.Duration.Seconds())
			if err != nil {
				r.metrics.TickErrors.Inc()
			}
		}
	}()

	var (
		unlock func(context.Context) error
		ok     bool
	)
	if err := r.query(ctx, "try lock", func(ctx context.Context) error {
		var err error
		unlock, ok, err = r.store.TryLock(ctx, LockName)
		return err
	}); err != nil {
		return res, err
	}
	if !ok {
		r.logger.Debug("reconciler lock held by another replica; skipping tick", "lock", LockName)
		r.readStats(ctx, res)
		return res, nil
	}
	res.Locked = true
	defer func() {
		// Unlock even when ctx ended: a held lock would stall every replica.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.QueryTimeout)
		defer cancel()
		if uerr := unlock(uctx); uerr != nil {
			err = errors.Join(err, fmt.Errorf("release reconciler lock: %w", uerr))
		}
	}()

	var flagErr error
	if r.cfg.Recovering() {
		flagErr = r.pass(ctx, "recover", func(ctx context.Context) error { return r.recoverPass(ctx, res) })
	} else {
		flagErr = r.pass(ctx, "flag", func(ctx context.Context) error { return r.flagPass(ctx, res) })
	}
	var purgeErr error
	if ctx.Err() == nil {
		purgeErr = r.pass(ctx, "purge", func(ctx context.Context) error { return r.purgePass(ctx, res) })
	}
	r.readStats(ctx, res)

	if len(res.Flagged) > 0 || res.Purged > 0 || res.Recovered > 0 || res.Postponed > 0 || res.Failed > 0 {
		r.logger.Info("reconciler tick",
			"recovered", res.Recovered, "postponed", res.Postponed, "failed", res.Failed, "flagged", len(res.Flagged), "purged", res.Purged,
			"duration", time.Since(start))
	}
	return res, errors.Join(flagErr, purgeErr)
}

func (r *Reconciler) logFlagged(c *claim.Claim) {
	r.logger.Warn("claim flagged for operators",
		"claim_id", c.ID, "message_id", c.MessageID, "consumer", c.Consumer,
		"reason", c.FlagReason, "claimed_by", c.ClaimedBy, "last_error", c.LastError)
}

// flagPass flags stale claims in bounded batches until a batch is short.
// Each FlagStale call re-checks staleness in its UPDATE, so a claim that was
// processed or heartbeated meanwhile is never flagged.
func (r *Reconciler) flagPass(ctx context.Context, res *TickResult) error {
	limit := r.cfg.FlagBatchSize
	for {
		var batch []*claim.Claim
		err := r.query(ctx, "flag stale claims", func(ctx context.Context) error {
			var err error
			batch, err = r.store.FlagStale(ctx, &claim.FlagStaleParams{StaleAfter: r.cfg.StaleAfter, Limit: limit, By: r.cfg.Host})
			return err
		})
		if err != nil {
			return fmt.Errorf("flag pass, batch %d: %w", res.FlagBatches+1, err)
		}
		res.FlagBatches++
		res.Flagged = append(res.Flagged, batch...)
		if r.metrics != nil {
			r.metrics.Flagged.Add(float64(len(batch)))
		}
		for _, c := range batch {
			r.logFlagged(c)
		}
		if len(batch) < limit || ctx.Err() != nil {
			return nil
		}
	}
}

// purgePass deletes finished claims older than the retention in bounded
// batches until a batch is short or the per-tick maximum is reached.
func (r *Reconciler) purgePass(ctx context.Context, res *TickResult) error {
	for res.Purged < int64(r.cfg.MaxPurgePerTick) {
		limit := int(min(int64(r.cfg.PurgeBatchSize), int64(r.cfg.MaxPurgePerTick)-res.Purged))
		var n int64
		err := r.query(ctx, "purge finished claims", func(ctx context.Context) error {
			var err error
			n, err = r.store.PurgeProcessed(ctx, &claim.PurgeParams{OlderThan: r.cfg.Retention, Limit: limit})
			return err
		})
		if err != nil {
			return fmt.Errorf("purge pass, batch %d: %w", res.PurgeBatches+1, err)
		}
		res.PurgeBatches++
		res.Purged += n
		if r.metrics != nil {
			r.metrics.Purged.Add(float64(n))
		}
		if n < int64(limit) || ctx.Err() != nil {
			return nil
		}
	}
	return nil
}

func (r *Reconciler) readStats(ctx context.Context, res *TickResult) {
	err := r.query(ctx, "read claim stats", func(ctx context.Context) error {
		s, err := r.store.Stats(ctx)
		res.Stats = s
		return err
	})
	if err != nil {
		// Stats only feed gauges; a failure here is not the tick's failure.
		r.logger.Warn("read claim stats", "err", err)
		return
	}
	r.metrics.observeStats(res.Stats)
}

// query runs fn with its own named timeout. When that timeout (not the
// caller's context) ends the query, the error says which query timed out
// and after how long.
func (r *Reconciler) query(ctx context.Context, name string, fn func(context.Context) error) error {
	cause := fmt.Errorf("%s: query timeout %s exceeded", name, r.cfg.QueryTimeout)
	qctx, cancel := context.WithTimeoutCause(ctx, r.cfg.QueryTimeout, cause)
	defer cancel()
	err := fn(qctx)
	if err != nil && ctx.Err() == nil && qctx.Err() != nil {
		return fmt.Errorf("%w: %w", context.Cause(qctx), err)
	}
	return err // stores name the operation in their errors
}
