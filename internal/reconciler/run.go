package reconciler

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/robfig/cron/v3"
)

// ParseSchedule parses a cron spec the way Run does (robfig/cron's standard
// parser: 5 fields, or descriptors such as "@every 1m" and "@hourly").
func ParseSchedule(spec string) (cron.Schedule, error) {
	return cron.ParseStandard(spec)
}

// Run ticks on the configured cron schedule until ctx ends. Ticks never
// overlap (a tick that is still running when the next is due makes the
// next one skip) and a panicking tick is logged and recovered.
//
// When ctx ends, Run stops scheduling and waits for a running tick to
// finish, at most ShutdownTimeout; then it cancels the tick's context and
// waits for it to return. Tick errors are logged and counted, not returned:
// the daemon keeps going and the next tick retries.
func (r *Reconciler) Run(ctx context.Context) error {
	schedule, err := ParseSchedule(r.cfg.Schedule)
	if err != nil {
		return fmt.Errorf("reconciler schedule %q: %w", r.cfg.Schedule, err)
	}
	// Ticks must not be cut short by the shutdown signal itself: they get
	// a context of their own, cancelled only when the drain times out.
	tickCtx, cancelTicks := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelTicks()

	cl := cronLogger{r.logger}
	c := cron.New(
		cron.WithLogger(cl),
		cron.WithChain(cron.SkipIfStillRunning(cl), cron.Recover(cl)), // Recover innermost
	)
	c.Schedule(schedule, cron.FuncJob(func() {
		_, err := r.RunOnce(tickCtx)
		switch {
		case err == nil:
		case tickCtx.Err() != nil:
			// Cancelled by the shutdown timeout: not a failure to alert on.
			r.logger.Warn("reconciler tick cancelled by shutdown", "err", err)
		default:
			r.logger.Error("reconciler tick failed", "err", err)
		}
	}))
	c.Start()
	r.logger.Info("reconciler started", "schedule", r.cfg.Schedule,
		"stale_after", r.cfg.StaleAfter, "retention", r.cfg.Retention)

	<-ctx.Done()
	r.logger.Info("reconciler stopping; waiting for a running tick", "timeout", r.cfg.ShutdownTimeout)
	done := c.Stop().Done()
	timer := time.NewTimer(r.cfg.ShutdownTimeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		r.logger.Warn("shutdown timeout: cancelling the running tick", "timeout", r.cfg.ShutdownTimeout)
		cancelTicks()
		<-done // queries take their context; the tick returns promptly
	}
	r.logger.Info("reconciler stopped")
	return nil
}

// cronLogger adapts slog to cron.Logger. cron's routine messages ("start",
// "schedule", "wake", "run") go to Debug; a skipped tick is a Warn (a tick
// outlived its interval); errors (recovered panics) are Errors.
type cronLogger struct{ l *slog.Logger }

func (c cronLogger) Info(msg string, kv ...any) {
	if msg == "skip" {
		c.l.Warn("reconciler tick skipped: the previous tick is still running")
		return
	}
	c.l.Debug("cron: "+msg, kv...)
}

func (c cronLogger) Error(err error, msg string, kv ...any) {
	c.l.Error("cron: "+msg, append(kv, "err", err)...)
}
