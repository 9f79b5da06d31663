package processor

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/cenkalti/backoff/v5"
	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// Dead-letter reasons set by the processor (besides the router's
// sideeffects.ReasonNoRoute and ReasonMalformedBody).
const (
	ReasonMissingDedupKey        = "MissingDedupKey"
	ReasonInvalidDedupKey        = "InvalidDedupKey"
	ReasonDedupKeyTooLong        = "DedupKeyTooLong"
	ReasonBodyTooLarge           = "BodyTooLarge"
	ReasonIdempotencyKeyConflict = "IdempotencyKeyConflict"
	ReasonEffectFailed           = "EffectFailed"
)

// delivery is one received message on its way through the protocol.
type delivery struct {
	msg      *azservicebus.ReceivedMessage
	lr       *liveReceiver
	received time.Time
	key      string
	hash     []byte
	handler  sideeffects.Handler
	claimID  int64
	owner    uuid.UUID // this delivery's owner token, made before it claims
	log      *slog.Logger
}

// handleBatch takes what one ReceiveMessages call returned: it validates
// each message, claims the valid ones in one round trip, and hands each to
// a worker. Every message holds one slot until it is settled.
func (p *Processor) handleBatch(ctx, work context.Context, lr *liveReceiver, msgs []*azservicebus.ReceivedMessage, slots chan struct{}) {
	now := time.Now()
	ds := make([]*delivery, len(msgs))
	for i, m := range msgs {
		lr.pending.Add(1)
		p.inflight.Add(1)
		ds[i] = &delivery{msg: m, lr: lr, received: now, owner: uuid.New(), log: p.log.With(
			"message_id", m.MessageID, "delivery_count", m.DeliveryCount)}
	}
	finish := func(d *delivery, o Outcome, args ...any) {
		p.finish(d, o, args...)
		<-slots
	}
	if ctx.Err() != nil {
		// Received while shutting down: nothing was claimed, hand it back.
		for _, d := range ds {
			go func() {
				p.abandon(d)
				finish(d, OutcomeAbandoned, "reason", "shutting down")
			}()
		}
		return
	}

	var batch []*delivery
	for _, d := range ds {
		if reason, desc := p.validate(d); reason != "" {
			go func() {
				p.deadLetter(d, reason, desc)
				finish(d, OutcomeDeadLettered, "reason", reason)
			}()
			continue
		}
		if d.handler.TxEffect != nil {
			go func() { finish(d, p.runTx(work, d)) }()
			continue
		}
		batch = append(batch, d)
	}
	if len(batch) == 0 {
		return
	}

	params := &claim.ClaimBatchParams{Host: p.opts.Host, Claims: make([]claim.ClaimParams, len(batch))}
	for i, d := range batch {
		params.Claims[i] = p.claimParams(d)
	}
	sctx, cancel := context.WithTimeout(work, p.opts.StoreTimeout)
	results, err := p.opts.Store.ClaimBatch(sctx, params)
	cancel()
	if err == nil && len(results) != len(batch) {
		err = fmt.Errorf("store returned %d results for %d claims", len(results), len(batch))
	}
	switch {
	case err == nil:
		for i, d := range batch {
			res := results[i]
			go func() { finish(d, p.afterClaim(work, d, res)) }()
		}
	case errors.Is(err, claim.ErrUnavailable) || len(batch) == 1:
		if errors.Is(err, claim.ErrUnavailable) {
			p.storeDown.Store(true)
		}
		// Nothing was claimed by this call that we know of; hand every
		// message back for redelivery.
		for _, d := range batch {
			go func() {
				p.abandon(d)
				finish(d, OutcomeAbandoned, "reason", "claim failed", "error", err)
			}()
		}
	default:
		// The store answered but refused the batch (one bad row fails a
		// whole statement): claim one by one, so only the message that
		// cannot be claimed goes back to the broker.
		p.log.Warn("batch claim failed; claiming one by one", "error", err, "messages", len(batch))
		for _, d := range batch {
			go func() { finish(d, p.claimOne(work, d)) }()
		}
	}
}

// claimOne claims a single message (the fallback of a refused batch).
func (p *Processor) claimOne(work context.Context, d *delivery) Outcome {
	sctx, cancel := context.WithTimeout(work, p.opts.StoreTimeout)
	results, err := p.opts.Store.ClaimBatch(sctx, &claim.ClaimBatchParams{Host: p.opts.Host, Claims: []claim.ClaimParams{p.claimParams(d)}})
	cancel()
	if err == nil && len(results) != 1 {
		err = fmt.Errorf("store returned %d results for 1 claim", len(results))
	}
	if err != nil {
		if errors.Is(err, claim.ErrUnavailable) {
			p.storeDown.Store(true)
		}
		d.log.Warn("claim failed", "error", err)
		p.abandon(d)
		return OutcomeAbandoned
	}
	return p.afterClaim(work, d, results[0])
}

// validate resolves the dedup key and the handler. A non-empty reason means
// the message can never be processed: dead-letter it.
func (p *Processor) validate(d *delivery) (reason, description string) {
	key, err := p.opts.Key(d.msg)
	if err != nil {
		return ReasonMissingDedupKey, err.Error()
	}
	if !utf8.ValidString(key) {
		return ReasonInvalidDedupKey, "the dedup key is not valid UTF-8"
	}
	if strings.IndexFunc(key, unicode.IsControl) >= 0 {
		// It is sent as the Idempotency-Key header, and PostgreSQL refuses
		// NUL in text.
		return ReasonInvalidDedupKey, "the dedup key contains control characters"
	}
	if strings.TrimSpace(key) != key {
		// SQL Server compares strings ignoring trailing spaces: "k" and
		// "k " would be one key there and two elsewhere.
		return ReasonInvalidDedupKey, "the dedup key has leading or trailing white space"
	}
	if n := len(utf16.Encode([]rune(key))); n > claim.MaxMessageIDLength {
		return ReasonDedupKeyTooLong, fmt.Sprintf("the dedup key is %d characters long; at most %d are allowed", n, claim.MaxMessageIDLength)
	}
	d.key = key
	if key != d.msg.MessageID {
		d.log = d.log.With("dedup_key", key)
	}
	if n := len(d.msg.Body); n > p.opts.MaxPayloadBytes {
		return ReasonBodyTooLarge, fmt.Sprintf("the body is %d bytes; at most %d are allowed (SBCLAIM_MAX_PAYLOAD_BYTES)", n, p.opts.MaxPayloadBytes)
	}
	h, err := p.opts.Router.Route(d.msg)
	if err != nil {
		var in *sideeffects.InputError
		if errors.As(err, &in) {
			return in.Reason, in.Description
		}
		return sideeffects.ReasonNoRoute, err.Error()
	}
	if h.Effect == nil && h.TxEffect == nil {
		return sideeffects.ReasonNoRoute, fmt.Sprintf("route %q has no effect", h.Name)
	}
	d.handler = h
	d.hash = claim.HashPayload(d.msg.Body)
	d.log = d.log.With("route", h.Name)
	return "", ""
}

func (p *Processor) claimParams(d *delivery) claim.ClaimParams {
	cp := claim.ClaimParams{
		MessageID:     d.key,
		Consumer:      p.opts.Consumer,
		Owner:         d.owner,
		Route:         d.handler.Name,
		Fingerprint:   d.handler.Fingerprint,
		Entity:        p.opts.Entity,
		PayloadHash:   d.hash,
		DeliveryCount: int(d.msg.DeliveryCount),
	}
	if d.msg.Subject != nil {
		cp.Subject = storable(*d.msg.Subject)
	}
	if d.msg.ContentType != nil {
		cp.ContentType = storable(*d.msg.ContentType)
	}
	if p.opts.StorePayload {
		cp.Payload = d.msg.Body
		if cp.Payload == nil {
			cp.Payload = []byte{}
		}
		if len(d.msg.ApplicationProperties) > 0 {
			cp.Properties = make(map[string]string, len(d.msg.ApplicationProperties))
			for k, v := range d.msg.ApplicationProperties {
				cp.Properties[storable(k)] = storable(fmt.Sprint(v))
			}
		}
	}
	return cp
}

// storable makes producer-controlled text storable in every database:
// PostgreSQL refuses NUL in text and JSON, so one such property would fail
// the whole batch. These copies only serve redrive routing and operators.
func storable(s string) string {
	if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	}
	return s
}

// afterClaim follows the claim's outcome (DESIGN.md §2).
func (p *Processor) afterClaim(work context.Context, d *delivery, res claim.ClaimResult) Outcome {
	c := res.Claim
	if c != nil {
		d.claimID = c.ID
		d.log = d.log.With("claim_id", c.ID)
	}
	switch res.Outcome {
	case claim.OutcomeWon:
		return p.runClaimed(work, d, c)
	case claim.OutcomeConflict:
		p.deadLetter(d, ReasonIdempotencyKeyConflict, conflictDescription(d, c, p.opts.Consumer))
		return OutcomeConflict
	case claim.OutcomeDuplicate:
		if c.State != claim.StateReleased {
			// Someone owns it or finished it: never run the effect again,
			// and complete so the duplicate does not bounce to the DLQ.
			p.complete(d)
			return OutcomeDuplicate
		}
		sctx, cancel := context.WithTimeout(work, p.opts.StoreTimeout)
		taken, err := p.opts.Store.TakeOver(sctx, &claim.TakeOverParams{
			ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(), Path: claim.PathRedelivery, SilentFor: 24 * time.Hour,
			By: p.opts.Host, Reason: "released", DeliveryCount: int(d.msg.DeliveryCount),
			Route: d.handler.Name, Fingerprint: d.handler.Fingerprint})
		cancel()
		switch {
		case err == nil:
			d.log.Info("took over released claim")
			return p.runClaimed(work, d, taken)
		case errors.Is(err, claim.ErrStateChanged):
			// Another delivery took it over first.
			p.complete(d)
			return OutcomeDuplicate
		default:
			if errors.Is(err, claim.ErrUnavailable) {
				p.storeDown.Store(true)
			}
			d.log.Warn("take over failed", "error", err)
			p.abandon(d)
			return OutcomeAbandoned
		}
	}
	d.log.Error("store returned an unknown claim outcome", "outcome", res.Outcome)
	p.abandon(d)
	return OutcomeAbandoned
}

// runClaimed runs the effect of a claim this attempt owns, records the
// outcome and settles the message.
func (p *Processor) runClaimed(work context.Context, d *delivery, c *claim.Claim) Outcome {
	p.metrics.ClaimsInFlight.Inc()
	defer p.metrics.ClaimsInFlight.Dec()
	stopKeepAlive := p.keepAlive(work, d, c)
	defer stopKeepAlive()

	if crashed(p.opts.Hooks.AfterClaim, work, d) {
		return OutcomeCrashed
	}

	// With lock renewal on, the message is ours for MaxLockRenewal at most:
	// an effect still running then is cut off (its outcome is unknown and
	// the claim goes to the reconciler) instead of heartbeating forever.
	effectCtx := work
	if p.opts.MaxLockRenewal > 0 {
		var cancel context.CancelFunc
		effectCtx, cancel = context.WithDeadline(work, d.received.Add(p.opts.MaxLockRenewal))
		defer cancel()
	}
	start := time.Now()
	err := p.opts.Retry.Do(effectCtx, func(ctx context.Context) error {
		return d.handler.Effect.Perform(ctx, d.msg, d.key)
	}, func(attempt int, err error) {
		d.log.Warn("effect attempt failed", "attempt", attempt, "error", err)
		p.storeCall(work, d, "record attempt", func(ctx context.Context) error {
			return p.opts.Store.RecordAttempt(ctx, &claim.RecordAttemptParams{ID: c.ID, Owner: c.Owner, Error: errorText(err)})
		})
	})
	eo := sideeffects.Classify(err)
	p.metrics.EffectSeconds.WithLabelValues(d.handler.Name, eo.String()).Observe(time.Since(start).Seconds())

	switch eo {
	case sideeffects.OutcomeOK:
		if crashed(p.opts.Hooks.AfterEffect, work, d) {
			return OutcomeCrashed
		}
		err := p.markProcessed(work, c)
		switch {
		case errors.Is(err, claim.ErrStateChanged):
			// The reconciler flagged the claim while the effect ran (no
			// heartbeat got through). The flagged row is the trace: an
			// operator resolves it, a redrive is deduplicated downstream.
			stopKeepAlive()
			p.reportLateEffect(work, d, c)
			p.complete(d)
			return OutcomeFlagged
		case err != nil:
			// The effect happened but could not be recorded. Keep the
			// claim (it goes stale and is flagged) and let the broker
			// redeliver: the redelivery takes the duplicate path.
			stopKeepAlive()
			d.log.Error("effect done but marking processed failed", "error", err)
			p.abandon(d)
			return OutcomeUnknown
		}
		if crashed(p.opts.Hooks.AfterMarkProcessed, work, d) {
			return OutcomeCrashed
		}
		stopKeepAlive()
		p.complete(d)
		return OutcomeProcessed

	case sideeffects.OutcomeRetryable, sideeffects.OutcomePermanent:
		relErr := p.release(work, c, err)
		stopKeepAlive()
		if relErr != nil {
			// The claim stays claimed and goes stale: the reconciler flags
			// it, and a redrive (same key) performs the effect.
			d.log.Warn("effect not performed but the release failed; claim kept for the reconciler", "error", relErr)
		}
		if eo == sideeffects.OutcomePermanent {
			p.deadLetter(d, ReasonEffectFailed, err.Error())
			return OutcomeDeadLettered
		}
		p.abandon(d)
		if relErr != nil {
			return OutcomeUnknown
		}
		return OutcomeReleased

	default: // unknown: keep the claim with its last error
		stopKeepAlive()
		d.log.Warn("effect outcome unknown after retries; claim kept for the reconciler", "error", err)
		p.abandon(d)
		return OutcomeUnknown
	}
}

// runTx is the one-phase path: the marker and the effect's writes commit in
// one transaction.
func (p *Processor) runTx(work context.Context, d *delivery) Outcome {
	if work.Err() != nil {
		p.abandon(d)
		return OutcomeAbandoned
	}
	ctx, cancel := context.WithTimeout(work, p.opts.StoreTimeout)
	defer cancel()
	start := time.Now()
	res, err := p.opts.Store.ClaimTx(ctx, &claim.ClaimTxParams{Host: p.opts.Host, Claim: p.claimParams(d)},
		func(ctx context.Context, tx *sql.Tx) error {
			return d.handler.TxEffect.PerformTx(ctx, tx, d.msg, d.key)
		})
	if err != nil {
		eo := sideeffects.Classify(err)
		if errors.Is(err, claim.ErrUnavailable) {
			eo = sideeffects.OutcomeRetryable
			p.storeDown.Store(true)
		}
		p.metrics.EffectSeconds.WithLabelValues(d.handler.Name, eo.String()).Observe(time.Since(start).Seconds())
		d.log.Warn("transactional effect rolled back", "error", err, "effect_outcome", eo.String())
		if eo == sideeffects.OutcomePermanent {
			p.deadLetter(d, ReasonEffectFailed, err.Error())
			return OutcomeDeadLettered
		}
		// Nothing was committed: safe to redeliver whatever the error.
		p.abandon(d)
		return OutcomeAbandoned
	}
	if res.Outcome == claim.OutcomeWon {
		p.metrics.EffectSeconds.WithLabelValues(d.handler.Name, sideeffects.OutcomeOK.String()).Observe(time.Since(start).Seconds())
		if res.Claim != nil {
			d.claimID = res.Claim.ID
			d.log = d.log.With("claim_id", res.Claim.ID)
		}
		p.complete(d)
		return OutcomeProcessed
	}
	if res.Claim != nil {
		d.claimID = res.Claim.ID
		d.log = d.log.With("claim_id", res.Claim.ID)
	}
	if res.Outcome == claim.OutcomeConflict {
		p.deadLetter(d, ReasonIdempotencyKeyConflict, conflictDescription(d, res.Claim, p.opts.Consumer))
		return OutcomeConflict
	}
	// A duplicate: the one-phase effect committed with its marker. (A
	// released claim can only come from a two-phase route that has since
	// become transactional; it cannot be taken over here, and the
	// reconciler flags it for an operator.)
	if res.Claim != nil && res.Claim.State == claim.StateReleased {
		d.log.Warn("duplicate of a released two-phase claim on a transactional route; left to the reconciler")
	}
	p.complete(d)
	return OutcomeDuplicate
}

func conflictDescription(d *delivery, existing *claim.Claim, consumer string) string {
	return fmt.Sprintf("dedup key %q was already claimed (claim %d, consumer %q) with another payload: existing sha256 %x, this message's sha256 %x",
		d.key, existing.ID, consumer, existing.PayloadHash, d.hash)
}

func crashed(hook func(context.Context, *azservicebus.ReceivedMessage) error, ctx context.Context, d *delivery) bool {
	if hook == nil {
		return false
	}
	if err := hook(ctx, d.msg); errors.Is(err, ErrCrash) {
		d.log.Debug("simulated crash")
		return true
	}
	return false
}

// markProcessed records the effect's success. A store outage is retried
// for a while (recordOutcome): the effect already happened, and recording
// it now saves a flag and an operator's time.
func (p *Processor) markProcessed(work context.Context, c *claim.Claim) error {
	err := p.recordOutcome(work, func(ctx context.Context) error {
		return p.opts.Store.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner})
	})
	if errors.Is(err, claim.ErrStateChanged) && p.ownProcessed(work, c) {
		// An earlier try committed but its answer was lost.
		return nil
	}
	return err
}

// ownProcessed reports whether claim c is processed under c's owner.
func (p *Processor) ownProcessed(work context.Context, c *claim.Claim) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(work), p.opts.StoreTimeout)
	defer cancel()
	now, err := p.opts.Store.Get(ctx, c.ID)
	return err == nil && now.State == claim.StateProcessed && now.Owner == c.Owner
}

// release marks the claim released: the effect was definitely not
// performed, and the next delivery may take the claim over.
func (p *Processor) release(work context.Context, c *claim.Claim, cause error) error {
	return p.recordOutcome(work, func(ctx context.Context) error {
		return p.opts.Store.Release(ctx, &claim.ReleaseParams{ID: c.ID, Owner: c.Owner, Error: errorText(cause)})
	})
}

// recordOutcome runs a store write that records an outcome already known.
// Each try runs on its own short context, so a shutdown does not cut it
// off; a store outage is retried for up to RecordRetryWindow (the
// message's lock is still being renewed meanwhile), but no new try starts once the
// shutdown timeout has passed (the platform's SIGKILL is near).
func (p *Processor) recordOutcome(work context.Context, write func(ctx context.Context) error) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = 2 * time.Second
	detached := context.WithoutCancel(work)
	var last error
	_, err := backoff.Retry(work, func() (struct{}, error) {
		ctx, cancel := context.WithTimeout(detached, p.opts.StoreTimeout)
		defer cancel()
		last = write(ctx)
		if last != nil && !errors.Is(last, claim.ErrUnavailable) {
			return struct{}{}, backoff.Permanent(last)
		}
		return struct{}{}, last
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(p.opts.RecordRetryWindow))
	if err != nil && last != nil {
		return last // not the shutdown's context error: what the store said
	}
	return err
}

// errorText is an error as stored on a claim: storable in every database
// and bounded.
func errorText(err error) string {
	s := storable(err.Error())
	const max = 2000
	if len(s) > max {
		s = strings.ToValidUTF8(s[:max], "") + "…"
	}
	return s
}

// reportLateEffect tells operators about an effect that completed after
// its claim was flagged — loudly if one of them has already resolved it
// as if it had not happened.
func (p *Processor) reportLateEffect(work context.Context, d *delivery, c *claim.Claim) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(work), p.opts.StoreTimeout)
	defer cancel()
	now, err := p.opts.Store.Get(ctx, c.ID)
	switch {
	case err != nil:
		d.log.Warn("effect done but the claim was flagged meanwhile; leaving it to operators", "error", err)
	case now.State == claim.StateResolved && now.Resolution == claim.ResolutionDiscarded:
		d.log.Error("effect done AFTER an operator discarded its claim: the effect DID happen",
			"resolved_by", now.ResolvedBy, "resolution_note", now.ResolutionNote)
	case now.State == claim.StateResolved:
		d.log.Info("effect done after its claim was resolved", "resolution", string(now.Resolution))
	default:
		d.log.Warn("effect done but the claim was flagged meanwhile; leaving it to operators (resolve it as done)",
			"state", string(now.State))
	}
}

// storeCall runs a best-effort store write and logs its failure. Like
// settlement, it runs on its own short context: recording an outcome that
// is already known must not fail because the shutdown timeout ran out.
func (p *Processor) storeCall(work context.Context, d *delivery, what string, fn func(ctx context.Context) error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(work), p.opts.StoreTimeout)
	defer cancel()
	if err := fn(ctx); err != nil {
		d.log.Warn(what+" failed", "error", err)
	}
}

// keepAlive renews the message lock and writes the claim heartbeat on one
// ticker until the returned stop is called (idempotent; it waits for the
// ticker goroutine, so nothing is renewed after settlement).
func (p *Processor) keepAlive(work context.Context, d *delivery, c *claim.Claim) (stop func()) {
	interval := p.opts.HeartbeatInterval
	renew := p.opts.MaxLockRenewal > 0 && d.msg.LockedUntil != nil
	if renew {
		if half := d.msg.LockedUntil.Sub(d.received) / 2; half < interval {
			interval = max(half, 10*time.Millisecond)
		}
	}
	renewUntil := d.received.Add(p.opts.MaxLockRenewal)
	ctx, cancel := context.WithCancel(work)
	if p.opts.MaxLockRenewal > 0 {
		// Heartbeats end with the effect's deadline too: an effect that
		// ignores its context must not keep its claim fresh forever.
		cancel()
		ctx, cancel = context.WithDeadline(work, renewUntil.Add(p.opts.HeartbeatInterval))
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		heartbeat := true
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if renew && time.Now().Before(renewUntil) {
				rctx, rcancel := context.WithTimeout(ctx, p.opts.SettleTimeout)
				err := d.lr.r.RenewMessageLock(rctx, d.msg, nil)
				rcancel()
				switch {
				case err == nil:
					p.metrics.LockRenewals.Inc()
				case isLockLost(err):
					p.metrics.LockLosses.Inc()
					d.log.Warn("message lock lost; the claim still decides the outcome")
					renew = false
				case ctx.Err() == nil:
					d.log.Warn("lock renewal failed", "error", err)
				}
			}
			if heartbeat {
				hctx, hcancel := context.WithTimeout(ctx, p.opts.StoreTimeout)
				err := p.opts.Store.Heartbeat(hctx, &claim.HeartbeatParams{ID: c.ID, Owner: c.Owner})
				hcancel()
				switch {
				case err == nil:
					p.metrics.Heartbeats.Inc()
				case errors.Is(err, claim.ErrStateChanged):
					d.log.Warn("claim no longer ours (flagged?); heartbeats stop")
					heartbeat = false
				case ctx.Err() == nil:
					d.log.Warn("heartbeat failed", "error", err)
				}
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// Settlement runs on its own short context: a shutdown must not strand
// work whose outcome is already committed.
func (p *Processor) settleCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), p.opts.SettleTimeout)
}

func (p *Processor) settled(d *delivery, what string, err error) {
	switch {
	case err == nil:
	case isLockLost(err):
		p.metrics.LockLosses.Inc()
		d.log.Warn(what+": lock lost; the broker redelivers and the claim decides", "error", err)
	default:
		d.log.Warn(what+" failed; the lock will expire and the broker redeliver", "error", err)
	}
}

func (p *Processor) complete(d *delivery) {
	ctx, cancel := p.settleCtx()
	defer cancel()
	p.settled(d, "complete", d.lr.r.CompleteMessage(ctx, d.msg, nil))
}

func (p *Processor) abandon(d *delivery) {
	ctx, cancel := p.settleCtx()
	defer cancel()
	p.settled(d, "abandon", d.lr.r.AbandonMessage(ctx, d.msg, nil))
}

func (p *Processor) deadLetter(d *delivery, reason, description string) {
	ctx, cancel := p.settleCtx()
	defer cancel()
	p.metrics.DeadLetters.WithLabelValues(reason).Inc()
	if len(description) > 1024 {
		description = description[:1024]
	}
	p.settled(d, "dead-letter", d.lr.r.DeadLetterMessage(ctx, d.msg, &azservicebus.DeadLetterOptions{
		Reason: &reason, ErrorDescription: &description}))
}

// finish writes the message's final log line and metrics and frees its
// slot in the receiver.
func (p *Processor) finish(d *delivery, o Outcome, args ...any) {
	p.metrics.Messages.WithLabelValues(string(o)).Inc()
	level := slog.LevelInfo
	switch o {
	case OutcomeUnknown, OutcomeConflict, OutcomeDeadLettered, OutcomeFlagged, OutcomeAbandoned:
		level = slog.LevelWarn
	}
	args = append(args, "outcome", string(o), "duration_ms", time.Since(d.received).Milliseconds())
	if d.claimID == 0 {
		args = append(args, "claim_id", nil)
	}
	d.log.Log(context.Background(), level, "message finished", args...)
	d.lr.pending.Done()
	p.inflight.Done()
}
