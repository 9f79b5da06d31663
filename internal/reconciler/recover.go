package reconciler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/held"
	"github.com/sbclaim/sbclaim/internal/protocol"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// The recovery pass: claims stale for StaleAfter (claimed with no
// heartbeat, or released and not taken over) are taken over by the
// reconciler and their effect re-run with the same idempotency key, when
// that is safe without a person: the route allows automatic recovery, the
// payload is stored, the route is still the one the claim was taken for.
// A final answer that is not a success (rejected, permanent, conflict)
// fails the claim, as the processor does: it is finished, never flagged.
// Only what recovery cannot settle is flagged for operators: among them an
// answer that needs a person (sideeffects.NeedsOperator, an answer rule's
// outcome flag), flagged at once, and a claim whose key is older than its
// route's KeyLifetime, flagged instead of repeated.

// Flag reasons of the recovery pass. Each names what an operator must
// decide.
const (
	reasonNoRoutes       = "no routes for consumer %q: recovery needs the processors' routes file (SBCLAIM_ROUTES)"
	reasonNoPayload      = "no stored payload (payload storage was off when it was claimed): it cannot be re-run; check the downstream and resolve it by hand"
	reasonNoRoute        = "the routes file routes no effect to it: %v"
	reasonTransactional  = "route %q is a database-only (transactional) effect, which cannot be re-run alone"
	reasonRouteChanged   = "route changed: the claim was taken for route %q (fingerprint %s), the routes file now routes it to %q (fingerprint %s)"
	reasonManual         = "route %q is manual (its downstream does not honour the idempotency key) and the last attempt's outcome is unknown: check the downstream, then redrive or resolve"
	reasonRedriveStopped = "redrive by %s stopped without recording an outcome (no heartbeat since %s): check the downstream, then redrive or resolve"
	reasonStillUnknown   = "recovery: the outcome is still unknown after %d attempt(s): %s"
)

// recoverPass takes over and re-runs stale claims in bounded batches until
// a batch comes back short or MaxRecoverPerTick claims were looked at.
func (r *Reconciler) recoverPass(ctx context.Context, res *TickResult) error {
	var seen int
	for seen < r.cfg.MaxRecoverPerTick && ctx.Err() == nil {
		limit := min(r.cfg.FlagBatchSize, r.cfg.MaxRecoverPerTick-seen)
		var batch []*claim.Claim
		err := r.query(ctx, "find stale claims", func(ctx context.Context) error {
			var err error
			batch, err = r.store.FindStale(ctx, &claim.FindStaleParams{StaleAfter: r.cfg.StaleAfter, Limit: limit})
			return err
		})
		if err != nil {
			return fmt.Errorf("recovery pass, batch %d: %w", res.RecoveryBatches+1, err)
		}
		res.RecoveryBatches++
		seen += len(batch)

		var (
			wg  sync.WaitGroup
			mu  sync.Mutex
			sem = make(chan struct{}, r.cfg.RecoveryConcurrency)
		)
		for _, c := range batch {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				outcome, flagged := r.recoverTraced(ctx, c)
				mu.Lock()
				defer mu.Unlock()
				switch outcome {
				case recovered:
					res.Recovered++
				case postponed:
					res.Postponed++
				case failedFinal:
					res.Failed++
				case flaggedForOperators:
					res.Flagged = append(res.Flagged, flagged)
				}
			}()
		}
		wg.Wait()
		if len(batch) < limit {
			return nil
		}
	}
	return nil
}

type recoveryOutcome int

const (
	skipped             recoveryOutcome = iota // someone else acted (or the holder came back)
	recovered                                  // re-run and marked processed
	postponed                                  // not settled yet: next attempt later, by backoff
	failedFinal                                // a final answer: the claim is failed
	flaggedForOperators                        // a person must decide
)

// recoverOne decides what to do with one stale claim and does it, every
// step guarded on the claim being as the scan saw it.
func (r *Reconciler) recoverOne(ctx context.Context, c *claim.Claim) (recoveryOutcome, *claim.Claim) {
	log := spanLogger(ctx, r.logger).With("claim_id", c.ID, "message_id", c.MessageID, "consumer", c.Consumer)
	flag := func(reason string) (recoveryOutcome, *claim.Claim) {
		return r.flagStale(ctx, c, reason)
	}
	router := r.cfg.Routes.For(c.Consumer)
	// An operator's hand-off (HandOff) released the claim for the
	// reconciler that runs its route, in the user's binary. One without
	// the route leaves it to that one for HandOffGrace, then flags it
	// saying so, guarded on the claim's silence by the database clock.
	handedOff := c.State == claim.StateReleased && c.TakeOverPath == claim.PathOperator
	if router == nil {
		if handedOff {
			return r.flagHandedOff(ctx, c)
		}
		return flag(fmt.Sprintf(reasonNoRoutes, c.Consumer))
	}
	if c.State == claim.StateClaimed && c.TakeOverPath == claim.PathOperator {
		return flag(fmt.Sprintf(reasonRedriveStopped, c.ClaimedBy, stamp(&c.HeartbeatAt)))
	}
	if c.Payload == nil {
		return flag(reasonNoPayload)
	}
	msg := MessageFromClaim(c)
	h, err := router.Route(msg)
	// May its key be repeated (protocol.Repeat, the rule a processor's
	// poller follows too)? A claimed claim's outcome is unknown; released
	// claims of manual routes are recovered: their effect was definitely
	// not performed.
	step := protocol.RepeatStep{Unroutable: err != nil, Unknown: c.State == claim.StateClaimed}
	if err == nil {
		step.Transactional, step.RouteChanged, step.Manual = h.Effect == nil, c.RouteDiffers(h.Name, h.Fingerprint), h.Manual()
	}
	switch protocol.Repeat(step) {
	case protocol.Unroutable:
		if handedOff {
			return r.flagHandedOff(ctx, c)
		}
		return flag(fmt.Sprintf(reasonNoRoute, err))
	case protocol.Transactional:
		return flag(fmt.Sprintf(reasonTransactional, h.Name))
	case protocol.RouteChanged:
		return flag(fmt.Sprintf(reasonRouteChanged, c.Route, c.Fingerprint, h.Name, h.Fingerprint))
	case protocol.ManualUnknown:
		return flag(fmt.Sprintf(reasonManual, h.Name))
	}
	if h.KeyLifetime > 0 {
		// The downstream forgets keys: one older than that must not be
		// repeated (released or not: an earlier attempt may have reached
		// it).
		var now time.Time
		if err := r.query(ctx, "read the database clock", func(ctx context.Context) error {
			var err error
			now, err = r.store.Now(ctx)
			return err
		}); err != nil {
			log.Warn("recovery: reading the database clock failed; looked at again next tick", "error", err)
			return skipped, nil
		}
		reason, expired := held.KeyExpired(c, h.KeyLifetime, now)
		step.KeyExpired = expired
		if protocol.Repeat(step) == protocol.KeyExpired {
			return flag(reason)
		}
	}

	why := fmt.Sprintf("recovery: no heartbeat from %s since %s", c.ClaimedBy, stamp(&c.HeartbeatAt))
	if c.State == claim.StateReleased {
		why = fmt.Sprintf("recovery: released since %s and not taken over", stamp(&c.HeartbeatAt))
	}
	var taken *claim.Claim
	err = r.query(ctx, "take over a stale claim", func(ctx context.Context) error {
		var err error
		taken, err = r.store.TakeOver(ctx, &claim.TakeOverParams{
			ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(), Path: claim.PathReconciler,
			SilentFor: r.cfg.StaleAfter, By: r.cfg.Host, Reason: why,
			Route: h.Name, Fingerprint: h.Fingerprint,
		})
		return err
	})
	switch {
	case errors.Is(err, claim.ErrRouteChanged):
		return flag(fmt.Sprintf(reasonRouteChanged, c.Route, c.Fingerprint, h.Name, h.Fingerprint))
	case errors.Is(err, claim.ErrStateChanged), errors.Is(err, claim.ErrNotFound):
		log.Debug("stale claim changed before recovery could take it; left alone", "error", err)
		return skipped, nil
	case err != nil:
		log.Warn("recovery: take-over failed", "error", err)
		return skipped, nil
	}
	if r.metrics != nil {
		r.metrics.TakeOvers.WithLabelValues(string(claim.PathReconciler)).Inc()
	}
	log = log.With("route", h.Name, "recovery", taken.Recoveries)
	backoff := r.backoff(taken.Recoveries)
	retry := sideeffects.RetryPolicy{MaxAttempts: 1, StopOnUnknown: h.Manual()}
	// The claim's key: after an operator's redrive under a new key, that
	// one (a recovery never goes back to the old key).
	res := held.Run(ctx, held.Params{
		Store: r.store, Claim: taken, Effect: h.Effect, Message: msg, Key: taken.Key(), Retry: retry,
		HeartbeatInterval: r.cfg.HeartbeatInterval, StoreTimeout: r.cfg.QueryTimeout, Logger: log,
		NextAttemptIn: backoff, Outbox: hasOutbox(r.store),
	})
	if r.metrics != nil {
		r.metrics.RecoveryAttempts.WithLabelValues(res.Outcome.String()).Inc()
	}
	if res.Lost != nil {
		log.Info("recovery lost the claim while its effect ran (a redelivery or an operator took it)", "effect_outcome", res.Outcome.String())
		return skipped, nil
	}
	write := func(what string, fn func(ctx context.Context) error) error {
		err := held.Write(ctx, r.cfg.QueryTimeout, r.cfg.QueryTimeout, fn)
		if err != nil {
			log.Warn("recovery: "+what+" failed; the claim goes stale and is looked at again", "error", err)
		}
		return err
	}
	switch res.Outcome {
	case sideeffects.OutcomeOK:
		if write("mark processed", func(ctx context.Context) error {
			// The follow-ups the effect published, with its outcome: the
			// processors' sweep sends them.
			return r.store.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: taken.Owner, Answer: res.Answer,
				FollowUps: claim.NumberFollowUps(taken.Consumer, taken.MessageID, res.FollowUps)})
		}) != nil {
			return postponed, nil
		}
		log.Info("claim recovered: effect re-run with the same key, claim processed", "previous_holder", taken.PreviousHolder)
		if r.metrics != nil {
			r.metrics.Recovered.Inc()
		}
		return recovered, nil
	case sideeffects.OutcomeRetryable:
		_ = write("release", func(ctx context.Context) error {
			return r.store.Release(ctx, &claim.ReleaseParams{ID: c.ID, Owner: taken.Owner, Error: claim.ErrorText(res.Err),
				NextAttemptIn: backoff, Answer: res.Answer})
		})
		log.Info("recovery: not performed, retried later", "next_attempt_in", backoff, "error", res.Err)
		return postponed, nil
	case sideeffects.OutcomeUnknown:
		if sideeffects.ForOperator(res.Err) {
			// The answer says a person must decide (a failure stored
			// under the key): another recovery would get it again.
			return r.flagHeld(ctx, taken, held.OperatorReason(res.Err))
		}
		if taken.Recoveries < r.cfg.RecoveryMaxAttempts {
			log.Info("recovery: outcome unknown, retried later with the same key", "next_attempt_in", backoff, "error", res.Err)
			return postponed, nil
		}
		return r.flagHeld(ctx, taken, fmt.Sprintf(reasonStillUnknown, taken.Recoveries, claim.ErrorText(res.Err)))
	}
	// Rejected, permanent or conflict: the downstream's final word about
	// the key. The claim is failed (no message is at hand: the first
	// delivery of the key that arrives dead-letters it).
	reason := held.FailReason(res.Outcome)
	desc := held.FailDescription(res.Err, res.Answer)
	if write("fail", func(ctx context.Context) error {
		return r.store.Fail(ctx, &claim.FailParams{ID: c.ID, Owner: taken.Owner, Reason: reason, Error: desc, Answer: res.Answer})
	}) != nil {
		return postponed, nil
	}
	log.Warn("claim failed by recovery: the downstream gave a final answer", "effect_outcome", res.Outcome, "fail_reason", reason, "error", desc)
	if r.metrics != nil {
		r.metrics.Failed.Inc()
	}
	return failedFinal, nil
}

// HandOffGrace is how many stale windows a reconciler that does not run
// a handed-off claim's route leaves it to the one that does before it
// flags it.
const HandOffGrace = 10

// flagHandedOff flags a handed-off claim this reconciler cannot run, once
// it has been released for HandOffGrace stale windows (the guard is the
// Flag's own, by the database clock); until then it is skipped.
func (r *Reconciler) flagHandedOff(ctx context.Context, c *claim.Claim) (recoveryOutcome, *claim.Claim) {
	reason := fmt.Sprintf("handed off by an operator (%s) for the reconciler that runs route %q, but none re-ran it within %s: "+
		"run the reconciler passes in the binary that has the route's handler (operator.NewReconciler with its routers), then hand it off again",
		c.TakeOverReason, c.Route, HandOffGrace*r.cfg.StaleAfter)
	return r.flag(ctx, &claim.FlagParams{ID: c.ID, Owner: c.Owner, State: c.State, SilentFor: HandOffGrace * r.cfg.StaleAfter,
		Reason: reason, By: r.cfg.Host})
}

// flagStale flags a stale claim the pass will not recover, guarded on its
// owner, its state and its staleness (a holder that came back to life is
// left alone).
func (r *Reconciler) flagStale(ctx context.Context, c *claim.Claim, reason string) (recoveryOutcome, *claim.Claim) {
	return r.flag(ctx, &claim.FlagParams{ID: c.ID, Owner: c.Owner, State: c.State, SilentFor: r.cfg.StaleAfter, Reason: reason, By: r.cfg.Host})
}

// flagHeld flags a claim the reconciler holds after a recovery attempt.
func (r *Reconciler) flagHeld(ctx context.Context, c *claim.Claim, reason string) (recoveryOutcome, *claim.Claim) {
	return r.flag(ctx, &claim.FlagParams{ID: c.ID, Owner: c.Owner, State: claim.StateClaimed, Reason: reason, By: r.cfg.Host})
}

func (r *Reconciler) flag(ctx context.Context, p *claim.FlagParams) (recoveryOutcome, *claim.Claim) {
	var f *claim.Claim
	err := r.query(ctx, "flag a claim", func(ctx context.Context) error {
		var err error
		f, err = r.store.Flag(ctx, p)
		return err
	})
	if err != nil {
		if !errors.Is(err, claim.ErrStateChanged) {
			r.logger.Warn("flag failed; looked at again next tick", "claim_id", p.ID, "error", err)
		}
		return skipped, nil
	}
	r.logFlagged(f)
	if r.metrics != nil {
		r.metrics.Flagged.Inc()
	}
	return flaggedForOperators, f
}

// backoff is the wait before the recovery attempt after the n-th:
// RecoveryBackoff doubled per attempt, at most RecoveryBackoffMax.
func (r *Reconciler) backoff(n int) time.Duration {
	d := r.cfg.RecoveryBackoff
	for i := 1; i < n && d < r.cfg.RecoveryBackoffMax; i++ {
		d *= 2
	}
	return min(d, r.cfg.RecoveryBackoffMax)
}

// hasOutbox reports whether st keeps follow-ups: an effect the reconciler
// runs may then publish them, and the processors' sweep sends them.
func hasOutbox(st claim.Store) bool {
	_, ok := st.(claim.Outbox)
	return ok
}
