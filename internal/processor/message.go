package processor

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/held"
	"github.com/sbclaim/sbclaim/internal/protocol"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// Dead-letter reasons set by the processor (besides the router's
// sideeffects.ReasonNoRoute, ReasonMalformedBody and
// ReasonInvalidContentType). The last three are also the fail reasons of
// a failed claim (claim.FailRejected, FailPermanent, FailConflict):
// IdempotencyKeyConflict is both a claim conflict (same key, another
// payload hash) and the downstream's conflict answer.
const (
	ReasonMissingDedupKey        = "MissingDedupKey"
	ReasonInvalidDedupKey        = "InvalidDedupKey"
	ReasonDedupKeyTooLong        = "DedupKeyTooLong"
	ReasonBodyTooLarge           = "BodyTooLarge"
	ReasonIdempotencyKeyConflict = claim.FailConflict
	ReasonEffectFailed           = claim.FailPermanent
	ReasonEffectRejected         = claim.FailRejected
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
	// stopRenewal stops the message's lock renewal (set when renewal is
	// on); settle calls it before settling.
	stopRenewal func()
	tr          *deliveryTrace // the process span (tracing.go)
	// fetched: the message was fetched by its sequence number (a deferred
	// message whose claim this delivery took with TakeDeferred);
	// fromSilent: taken from a holder that had fetched it and went silent.
	fetched, fromSilent bool
	// deferral is the due time to record once the message is deferred
	// (set by postpone).
	deferral *claim.SetDueParams
	// sess: the message came through a session receiver (session.go);
	// nil otherwise.
	sess *sessionDelivery
}

// settlement is what happens to a delivery's message at the end (the
// protocol decides it).
type settlement = protocol.Settle

const (
	settleNone       = protocol.SettleNone   // a test hook "crashed" the replica: nothing
	settleComplete   = protocol.Complete     // done, or a duplicate of finished work
	settleAbandon    = protocol.Abandon      // redeliver
	settleDeadLetter = protocol.DeadLetter   // never processable
	settleDefer      = protocol.DeferMessage // set aside until its claim is due (deferral.go)
)

// verdict is how a protocol step ends a delivery: how to settle the message
// and what to report. Every step returns one; settle carries it out, once.
type verdict struct {
	result      Result
	settle      settlement
	reason      string // dead-letter reason
	description string // dead-letter description
	attrs       []any  // extra attributes of the final log line
}

func completed(r Result, attrs ...any) verdict {
	return verdict{result: r, settle: settleComplete, attrs: attrs}
}

func abandoned(r Result, attrs ...any) verdict {
	return verdict{result: r, settle: settleAbandon, attrs: attrs}
}

func deadLettered(r Result, reason, description string) verdict {
	return verdict{result: r, settle: settleDeadLetter, reason: reason, description: description, attrs: []any{"reason", reason}}
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
		d := &delivery{msg: m, lr: lr, received: now, owner: uuid.New(), log: p.log.With(
			"message_id", m.MessageID, "delivery_count", m.DeliveryCount)}
		p.startProcess(d)
		d.stopRenewal = p.renewLock(work, d)
		ds[i] = d
	}
	run := func(d *delivery, step func() verdict) {
		go func() {
			p.settle(d, step())
			<-slots
		}()
	}
	if ctx.Err() != nil {
		// Received while shutting down: nothing was claimed, hand it back.
		for _, d := range ds {
			run(d, func() verdict { return abandoned(ResultAbandoned, "why", "shutting down") })
		}
		return
	}

	var batch []*delivery
	for _, d := range ds {
		if reason, desc := p.validate(d); reason != "" {
			run(d, func() verdict { return deadLettered(ResultDeadLettered, reason, desc) })
			continue
		}
		if d.handler.TxEffect != nil {
			run(d, func() verdict { return p.runTx(ctx, d.traced(work), d) })
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
	endClaims := p.startClaims(batch)
	results, err := p.opts.Store.ClaimBatch(sctx, params)
	cancel()
	if err == nil && len(results) != len(batch) {
		err = fmt.Errorf("store returned %d results for %d claims", len(results), len(batch))
	}
	endClaims(results, err)
	switch {
	case err == nil:
		for i, d := range batch {
			res := results[i]
			run(d, func() verdict { return p.afterClaim(ctx, d.traced(work), d, res) })
		}
	case claim.StoreWide(err) || len(batch) == 1:
		p.storeErr(err)
		// Whatever this call may have committed carries this delivery's
		// owner tokens, so the redelivery's claim finds it (an orphan row
		// whose holder shows no life is taken over after TakeoverAfter).
		for _, d := range batch {
			run(d, func() verdict {
				return p.whenStoreBack(ctx, d, err, "claim failed", func() verdict { return p.claimOne(ctx, d.traced(work), d) })
			})
		}
	default:
		// The store answered but refused the batch (one bad row fails a
		// whole statement; SQL Server may have committed some chunks):
		// claim one by one with the same tokens, so a row this batch did
		// commit is recognised as won and only the message that cannot be
		// claimed goes back to the broker.
		p.log.Warn("batch claim failed; claiming one by one", "error", err, "messages", len(batch))
		for _, d := range batch {
			run(d, func() verdict { return p.claimOne(ctx, d.traced(work), d) })
		}
	}
}

// whenStoreBack handles a delivery whose claim (alone, in a batch, or in
// a transactional effect's transaction) failed with err before anything
// was recorded. A store-wide refusal (an outage, a failover) pauses
// receiving; the delivery keeps its message locked (its lock is renewed)
// and runs again — the same owner token, so a row a lost COMMIT answer
// hid is recognised as its own — once the store accepts writes, for as
// long as its lock may be renewed: an abandon now would spend one of the
// message's deliveries on an outage, and a few outages would dead-letter
// it. Any other error, or an outage that outlasts the lock's renewal,
// gives the message back (why says what failed).
func (p *Processor) whenStoreBack(ctx context.Context, d *delivery, err error, why string, again func() verdict) verdict {
	if !claim.StoreWide(err) {
		return abandoned(ResultAbandoned, "why", why, "error", err)
	}
	wait := time.NewTimer(time.Until(p.watchUntil(d)))
	defer wait.Stop()
	// The receive loop probes the store only between receives, and a
	// receive on a quiet entity blocks: probe here too, with backoff.
	probe := 100 * time.Millisecond
	for {
		select {
		case <-p.breaker.closed():
		case <-time.After(probe):
			if p.probeStore(ctx) != nil {
				probe = min(2*probe, 5*time.Second)
				continue
			}
			if p.breaker.isOpen() {
				p.storeBack()
			}
		case <-wait.C:
			return abandoned(ResultAbandoned, "why", why+", and the claim store still refuses work at the end of the lock's renewal", "error", err)
		case <-ctx.Done():
			return abandoned(ResultAbandoned, "why", "shutting down while the claim store refuses work", "error", err)
		}
		d.log.Info("claim store accepts writes again: claiming the message it refused", "error", err)
		return again()
	}
}

// claimOne claims a single message (the fallback of a refused batch).
func (p *Processor) claimOne(ctx, work context.Context, d *delivery) verdict {
	sctx, cancel := context.WithTimeout(work, p.opts.StoreTimeout)
	endClaim := p.startClaims([]*delivery{d})
	results, err := p.opts.Store.ClaimBatch(sctx, &claim.ClaimBatchParams{Host: p.opts.Host, Claims: []claim.ClaimParams{p.claimParams(d)}})
	cancel()
	endClaim(results, err)
	if err == nil && len(results) != 1 {
		err = fmt.Errorf("store returned %d results for 1 claim", len(results))
	}
	if err != nil {
		p.storeErr(err)
		return p.whenStoreBack(ctx, d, err, "claim failed", func() verdict { return p.claimOne(ctx, work, d) })
	}
	return p.afterClaim(ctx, work, d, results[0])
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
	if d.msg.ContentType != nil {
		// Whatever the route: an effect may send it as a header (the HTTP
		// router checks it too), and a value net/http refuses would look
		// retryable and loop until the broker dead-letters the message.
		if err := sideeffects.CheckContentType(*d.msg.ContentType); err != nil {
			var in *sideeffects.InputError
			if errors.As(err, &in) {
				return in.Reason, in.Description
			}
			return sideeffects.ReasonInvalidContentType, err.Error()
		}
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
		KeyForm:       d.handler.KeyForm,
		Entity:        p.opts.Entity,
		PayloadHash:   d.hash,
		DeliveryCount: int(d.msg.DeliveryCount),
	}
	if d.sess != nil {
		cp.SessionID = d.sess.id
	}
	if d.msg.Subject != nil {
		cp.Subject = claim.Storable(*d.msg.Subject)
	}
	if d.msg.ContentType != nil {
		cp.ContentType = claim.Storable(*d.msg.ContentType)
	}
	if p.opts.StorePayload {
		cp.Payload = d.msg.Body
		if cp.Payload == nil {
			cp.Payload = []byte{}
		}
		if len(d.msg.ApplicationProperties) > 0 {
			cp.Properties = make(map[string]string, len(d.msg.ApplicationProperties))
			for k, v := range d.msg.ApplicationProperties {
				cp.Properties[claim.Storable(k)] = claim.Storable(fmt.Sprint(v))
			}
		}
	}
	return cp
}

func (d *delivery) at(c *claim.Claim) {
	if c != nil && d.claimID != c.ID {
		d.claimID = c.ID
		d.log = d.log.With("claim_id", c.ID)
	}
}

// afterClaim follows the claim's outcome.
func (p *Processor) afterClaim(ctx, work context.Context, d *delivery, res claim.ClaimResult) verdict {
	d.at(res.Claim)
	switch res.Outcome {
	case claim.OutcomeWon:
		return p.runHeld(work, d, res.Claim)
	case claim.OutcomeConflict:
		return deadLettered(ResultConflict, ReasonIdempotencyKeyConflict, conflictDescription(d, res.Claim, p.opts.Consumer))
	case claim.OutcomeDuplicate:
		return p.duplicate(ctx, work, d, res.Claim)
	}
	d.log.Error("store returned an unknown claim outcome", "claim_outcome", res.Outcome.String())
	return abandoned(ResultAbandoned, "why", "unknown claim outcome")
}

// duplicate handles a delivery whose claim another attempt holds or
// finished. Finished (processed, resolved) or in operators' hands
// (flagged): complete, the effect never runs again. Failed (a final
// answer): complete too, unless this delivery is the one that carries
// the failure to the dead-letter queue (failedCopy). Released: take it
// over (the effect was definitely not performed). Claimed: the holder's
// fate is open, so the delivery keeps its message (the lock is renewed)
// and watches the claim until the holder finishes (complete), releases it
// (take over) or goes silent for TakeoverAfter by the database clock (take
// over, and run the effect with the same key) — bounded by the message's
// lock-renewal window, after which it completes, or, when the holder has
// no message (messageless), abandons so a copy remains for a final answer.
func (p *Processor) duplicate(ctx, work context.Context, d *delivery, c *claim.Claim) verdict {
	until := p.watchUntil(d)
	poll := 25 * time.Millisecond
	waited := false
	for {
		released := c.State == claim.StateReleased
		routeChanged := c.RouteDiffers(d.handler.Name, d.handler.Fingerprint)
		step := protocol.DuplicateStep{State: protocol.State(c.State), Elsewhere: protocol.Elsewhere(claimMessage(c), d.msg.SequenceNumber),
			PayloadStored: c.Payload != nil, RouteChanged: routeChanged, Manual: d.handler.Manual(), Quiet: released, Session: d.sess != nil}
		// Whether the holder is silent: a released claim has none; for a
		// take-over the guarded UPDATE itself judges it; otherwise ask the
		// database clock. A route whose downstream forgets keys asks it
		// too: a key older than that must not be repeated.
		expiredReason := ""
		if c.State.Unfinished() && step.Elsewhere == "" && protocol.NeedsClock(step.State, step.Manual, routeChanged, d.handler.KeyLifetime > 0) {
			var now time.Time
			err := p.readWhileWatching(ctx, until, &poll, func() (err error) {
				now, err = p.dbNow(work)
				return err
			})
			if err != nil {
				return abandoned(ResultAbandoned, "why", "reading the database clock failed", "error", err)
			}
			step.Quiet = released || now.Sub(c.HeartbeatAt) > p.opts.TakeoverAfter
			expiredReason, step.KeyExpired = held.KeyExpired(c, d.handler.KeyLifetime, now)
		}
		again := false // the claim changed under us: decide again at once
		action := protocol.Duplicate(step)
		if action == protocol.DupPeek {
			// The claim stored no payload and names another message: this
			// copy is completed on that message's behalf only if it is
			// surely at the broker.
			step.Carrier = p.peekCarrier(work, d, *c.DeferredSeq)
			action = protocol.Duplicate(step)
		}
		switch action {
		case protocol.DupForget:
			// The claim's message left the broker (settled, or
			// dead-lettered by its delivery count) while the claim still
			// names it: forget it (guarded on its sequence number), and
			// this copy carries the work.
			d.log.Info("the claim's deferred message is gone from the broker and the claim stored no payload: this copy carries the work",
				"claim_id", c.ID, "claim_sequence_number", *c.DeferredSeq)
			if err := p.forget(work, c.ID, *c.DeferredSeq); err != nil {
				return abandoned(ResultAbandoned, "why", "forgetting the claim's vanished message failed", "error", err)
			}
			again = true
		case protocol.DupComplete:
			why := "finished"
			switch {
			case c.State == claim.StateFlagged:
				why = "flagged for operators"
			case step.Elsewhere != "":
				// The claim's own message waits at the broker (or a
				// replica holds it): it carries the work, and this copy
				// would be a second message moving for one claim.
				why = step.Elsewhere
			}
			return completed(ResultDuplicate, "claim_state", string(c.State), "why", why, "waited", waited)
		case protocol.DupFailedCopy:
			return p.failedCopy(work, d, c, "waited", waited)
		case protocol.DupFlagRouteChanged:
			v, ok := p.flagRouteChanged(work, d, c)
			if ok {
				return v
			}
			again = true
		case protocol.DupLeave:
			// A manual route's holder went silent: its outcome is unknown
			// and the downstream does not honour the key, so nobody may
			// repeat it. The reconciler flags the claim for an operator.
			return completed(ResultDuplicate, "why", "holder silent on a manual route: left for the reconciler to flag")
		case protocol.DupFlagSilentManual:
			// As DupLeave, in a session: flag it now (session.go).
			if v, ok := p.flagSilentManual(work, d, c); ok {
				return v
			}
		case protocol.DupFlagKeyExpired:
			// Its key is older than the downstream keeps keys: a repeat
			// would not be deduplicated. A person decides. A refused flag
			// (the holder showed life, or the claim changed) is looked
			// at again after the wait below.
			if v, ok := p.flagKeyExpired(work, d, c, expiredReason); ok {
				return v
			}
		case protocol.DupTakeOver:
			// Released, or (auto route) a holder that may have gone
			// silent: the guarded take-over refuses a live holder by the
			// database clock.
			taken, err := p.takeOver(work, d, c)
			switch {
			case err == nil:
				return p.runHeld(work, d, taken)
			case errors.Is(err, claim.ErrStateChanged) && taken != nil:
				// The claim as it is now: decide again at once when it
				// changed hands or state, else wait for its holder.
				changed := taken.State != claim.StateClaimed || taken.Owner != c.Owner
				c = taken
				if changed {
					continue
				}
			case errors.Is(err, claim.ErrRouteChanged) && taken != nil:
				// Recorded since we read it (a claim from before routes
				// were recorded, taken over meanwhile): decide again.
				c = taken
				continue
			default:
				p.storeErr(err)
				return abandoned(ResultAbandoned, "why", "take-over failed", "error", err)
			}
		}
		if !again {
			// The holder is alive: wait for its outcome.
			if !waited {
				waited = true
				p.metrics.DuplicateWaits.Inc()
				d.log.Debug("claim held by a live attempt; waiting for its outcome", "holder", c.ClaimedBy)
			}
			if time.Now().Add(poll).After(until) {
				dec := protocol.WatchEnded(messageless(c), step.Elsewhere != "" && !step.PayloadStored)
				return verdict{result: dec.Result, settle: dec.Settle, attrs: []any{"why", dec.Why, "holder", c.ClaimedBy, "path", string(c.TakeOverPath)}}
			}
			select {
			case <-ctx.Done():
				return abandoned(ResultAbandoned, "why", "shutting down while waiting for the claim's holder")
			case <-time.After(poll):
			}
			poll = min(2*poll, p.opts.HeartbeatInterval)
		}
		err := p.readWhileWatching(ctx, until, &poll, func() error {
			now, err := p.get(work, c.ID)
			if err == nil {
				c = now
			}
			return err
		})
		if err != nil {
			return abandoned(ResultAbandoned, "why", "reading the claim failed", "error", err)
		}
	}
}

// readWhileWatching runs read, a duplicate's look at the claim or the
// database clock, until it succeeds, waiting poll (growing) between
// tries, for as long as the watch may last (until): one failed read (a
// deadlock victim, a dropped connection, a short outage) must not abandon
// the message, which spends one of its deliveries. It returns the last
// error when the watch ends or ctx is done first.
func (p *Processor) readWhileWatching(ctx context.Context, until time.Time, poll *time.Duration, read func() error) error {
	for {
		err := read()
		if err == nil || ctx.Err() != nil || time.Now().Add(*poll).After(until) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(*poll):
		}
		*poll = min(2**poll, p.opts.HeartbeatInterval)
	}
}

// peekCarrier peeks at the broker from sequence number seq (the claim's
// message, deferred or held elsewhere) without locking it: is it still
// there, and on which delivery? Peeking sees locked and deferred
// messages, never dead-lettered or settled ones.
func (p *Processor) peekCarrier(ctx context.Context, d *delivery, seq int64) protocol.Carrier {
	pctx, cancel := context.WithTimeout(ctx, p.opts.SettleTimeout)
	defer cancel()
	ms, err := d.lr.r.PeekMessages(pctx, 1, &azservicebus.PeekMessagesOptions{FromSequenceNumber: &seq})
	switch {
	case err != nil:
		d.log.Warn("peeking at the claim's deferred message failed", "claim_sequence_number", seq, "error", err)
		return protocol.CarrierUnknown
	case len(ms) == 0 || ms[0].SequenceNumber == nil || *ms[0].SequenceNumber != seq:
		return protocol.CarrierGone
	case int(ms[0].DeliveryCount) >= p.opts.MaxDeliveryCount:
		return protocol.CarrierAtRisk
	}
	return protocol.CarrierThere
}

// messageless reports whether c is held by a holder that has no message
// of its own to settle: the reconciler's recovery or an operator's redrive.
// A final answer such a holder reaches is dead-lettered by a copy of the
// message (failedCopy), so copies are not completed while it holds c.
func messageless(c *claim.Claim) bool {
	return c.State == claim.StateClaimed && (c.TakeOverPath == claim.PathReconciler || c.TakeOverPath == claim.PathOperator)
}

// watchUntil is how long a duplicate delivery may hold its message while
// it waits for a live holder: its lock-renewal window, or (renewal off)
// until shortly before its lock expires.
func (p *Processor) watchUntil(d *delivery) time.Time {
	if d.sess != nil {
		// In a session the message is held as long as the session, whose
		// lock is renewed: the watch ends with the holder's outcome, its
		// silence or the session's context, never by completing the
		// message while the holder's effect may still run (the session's
		// next message would overtake it).
		return time.Now().Add(sessionWatch)
	}
	if p.opts.MaxLockRenewal > 0 {
		return d.received.Add(p.opts.MaxLockRenewal)
	}
	if d.msg.LockedUntil != nil {
		return d.msg.LockedUntil.Add(-p.opts.SettleTimeout)
	}
	return d.received
}

// takeOver asks for the claim: released, or held by an attempt silent for
// TakeoverAfter.
func (p *Processor) takeOver(work context.Context, d *delivery, c *claim.Claim) (*claim.Claim, error) {
	reason := "released: the effect was not performed"
	if c.State == claim.StateClaimed {
		reason = fmt.Sprintf("holder %s silent for %s", c.ClaimedBy, p.opts.TakeoverAfter)
	}
	work, endSpan := p.startTakeOver(work, d, c)
	sctx, cancel := context.WithTimeout(work, p.opts.StoreTimeout)
	defer cancel()
	taken, err := p.opts.Store.TakeOver(sctx, &claim.TakeOverParams{
		ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(),
		Path: claim.PathRedelivery, SilentFor: p.opts.TakeoverAfter,
		By: p.opts.Host, Reason: reason, DeliveryCount: int(d.msg.DeliveryCount),
		Route: d.handler.Name, Fingerprint: d.handler.Fingerprint, Seq: d.msg.SequenceNumber,
	})
	endSpan(taken, err)
	if err == nil {
		p.metrics.TakeOvers.With(string(claim.PathRedelivery)).Inc()
		d.log.Info("took the claim over", "from", c.ClaimedBy, "claim_state", string(c.State), "why", reason)
	}
	return taken, err
}

// dbNow reads the database clock, which judges a holder's silence
// (HeartbeatAt older than TakeoverAfter) and a key's age.
func (p *Processor) dbNow(work context.Context) (time.Time, error) {
	sctx, cancel := context.WithTimeout(work, p.opts.StoreTimeout)
	defer cancel()
	return p.opts.Store.Now(sctx)
}

// flagRouteChanged hands a claim whose holder is gone (released, or
// silent) to operators because this delivery's route is not the one the
// claim was taken for: repeating its key under another effect could
// perform the wrong effect, or skip the right one. ok is false when the
// guarded flag was refused (the claim changed, or its holder showed life).
func (p *Processor) flagRouteChanged(work context.Context, d *delivery, c *claim.Claim) (v verdict, ok bool) {
	reason := fmt.Sprintf("route changed: the claim was taken for route %q (fingerprint %s), this delivery routes to %q (fingerprint %s)",
		c.Route, c.Fingerprint, d.handler.Name, d.handler.Fingerprint)
	silent := time.Duration(0)
	if c.State == claim.StateClaimed {
		silent = p.opts.TakeoverAfter // never flag a live holder
	}
	sctx, cancel := context.WithTimeout(work, p.opts.StoreTimeout)
	defer cancel()
	_, err := p.opts.Store.Flag(sctx, &claim.FlagParams{ID: c.ID, Owner: c.Owner, State: c.State, SilentFor: silent, Reason: reason, By: p.opts.Host})
	switch {
	case err == nil:
		d.log.Warn("claim flagged for operators: route changed", "claim_route", c.Route, "claim_fingerprint", c.Fingerprint,
			"route_fingerprint", d.handler.Fingerprint)
		return p.verdictOf(d, protocol.FlagDecision(claimFacts(c), reason), nil), true
	case errors.Is(err, claim.ErrStateChanged):
		return verdict{}, false
	}
	p.storeErr(err)
	return abandoned(ResultAbandoned, "why", "flagging a route change failed", "error", err), true
}

// runHeld runs the effect of a claim this delivery holds, and records the
// outcome.
func (p *Processor) runHeld(work context.Context, d *delivery, c *claim.Claim) verdict {
	d.at(c)
	p.metrics.ClaimsInFlight.Inc()
	defer p.metrics.ClaimsInFlight.Dec()
	if crashed(p.opts.Hooks.AfterClaim, work, d) {
		return verdict{result: ResultCrashed}
	}
	allowed, probe, wait, why := p.routes.allow(d.handler)
	if !allowed {
		return p.routeOpen(work, d, c, wait, why)
	}
	retry := p.opts.Retry
	retry.StopOnUnknown = retry.StopOnUnknown || d.handler.Manual()
	// The claim's key: the dedup key, or the one an operator's redrive
	// chose (a take-over keeps it).
	hp := held.Params{
		Store: p.opts.Store, Claim: c, Effect: d.handler.Effect, Message: d.msg, Key: c.Key(), Retry: retry,
		HeartbeatInterval: p.opts.HeartbeatInterval, StoreTimeout: p.opts.StoreTimeout, Logger: d.log,
		OnHeartbeat: p.countHeartbeat, Outbox: p.publishes(),
	}
	if p.opts.MaxLockRenewal > 0 {
		// The message is ours for MaxLockRenewal at most: an effect still
		// running then is cut off (its outcome is unknown) instead of
		// keeping its claim fresh forever.
		hp.Deadline = d.received.Add(p.opts.MaxLockRenewal)
	}
	res := held.Run(work, hp)
	p.metrics.EffectSeconds.With(d.handler.Name, res.Outcome.String()).Observe(res.Duration.Seconds())
	res = p.recordRoute(d, probe, res)
	if res.Lost != nil {
		return p.lost(work, d, c, res.Outcome)
	}
	return p.afterEffect(work, d, c, res)
}

// routeOpen postpones a held claim without calling its effect: its
// route's breaker is open (why) and no probe is due for wait. The claim
// waits at least that long (see routebreaker.go).
func (p *Processor) routeOpen(work context.Context, d *delivery, c *claim.Claim, wait time.Duration, why string) verdict {
	err := &sideeffects.Error{Outcome: sideeffects.OutcomeRetryable, RetryAfter: wait,
		Err: fmt.Errorf("not attempted: the route's breaker is open: %s", why)}
	return p.afterEffect(work, d, c, held.Result{Outcome: sideeffects.OutcomeRetryable, Err: err})
}

// recordRoute counts a held effect's result on its route's breaker,
// reports a trip or a close, and returns res with a configuration
// answer's error naming the route and the status (so the claim's error
// says what to fix) and asking to wait until the probe is due.
func (p *Processor) recordRoute(d *delivery, probe bool, res held.Result) held.Result {
	tripped, why, closed := p.routes.record(d.handler, probe, res)
	name := d.handler.Name
	switch {
	case closed:
		p.metrics.RouteBreakerOpen.With(name).Set(0)
		d.log.Info("route breaker closed: the probe succeeded", "route", name)
	case tripped != "":
		p.metrics.RouteBreakerOpen.With(name).Set(1)
		p.metrics.RouteBreakerTrips.With(name, tripped).Inc()
		d.log.Warn("route breaker open: its messages are postponed until a probe succeeds", "route", name, "reason", tripped, "why", why,
			"probe_after", d.handler.Breaker.WithDefaults().ProbeAfter.String())
	}
	if tripped == tripConfig {
		res.Err = &sideeffects.Error{Outcome: sideeffects.OutcomeRetryable, Config: true, Answer: sideeffects.AnswerOf(res.Err),
			RetryAfter: d.handler.Breaker.WithDefaults().ProbeAfter, Err: fmt.Errorf("%s: %w", why, res.Err)}
	}
	return res
}

// flagKeyExpired hands a claim whose holder is gone (released, or silent
// for TakeoverAfter: the guarded flag checks it by the database clock) to
// operators instead of taking it over: its key is older than the route's
// KeyLifetime, so the downstream would not deduplicate a repeat. ok is
// false when the guarded flag was refused (the claim changed, or its
// holder showed life).
func (p *Processor) flagKeyExpired(work context.Context, d *delivery, c *claim.Claim, reason string) (v verdict, ok bool) {
	silent := time.Duration(0)
	if c.State == claim.StateClaimed {
		silent = p.opts.TakeoverAfter // never flag a live holder
	}
	sctx, cancel := context.WithTimeout(work, p.opts.StoreTimeout)
	defer cancel()
	_, err := p.opts.Store.Flag(sctx, &claim.FlagParams{ID: c.ID, Owner: c.Owner, State: c.State, SilentFor: silent, Reason: reason, By: p.opts.Host})
	switch {
	case err == nil:
		d.log.Warn("claim flagged for operators instead of taken over: its key is older than the downstream keeps keys",
			"claim_state", string(c.State), "key_lifetime", d.handler.KeyLifetime)
		return p.verdictOf(d, protocol.FlagDecision(claimFacts(c), reason), nil), true
	case errors.Is(err, claim.ErrStateChanged):
		return verdict{}, false
	}
	p.storeErr(err)
	return abandoned(ResultAbandoned, "why", "flagging a claim whose key expired failed", "error", err), true
}

// failedCopy ends a delivery of a failed claim's key. The key is
// dead-lettered once: by the delivery the claim names (DeadLetterSeq,
// the broker's sequence number) — the one that failed it, which is only
// delivered again when its dead letter did not land (a lost lock, a crash
// after the claim failed) — or, when the claim names none (the
// reconciler or a redrive failed it, with no message at hand), by the
// first delivery that records itself (TakeDeadLetter). Every other copy
// completes without calling the downstream.
func (p *Processor) failedCopy(work context.Context, d *delivery, c *claim.Claim, attrs ...any) verdict {
	attrs = append(attrs, "claim_state", claim.StateFailed, "fail_reason", c.FailReason)
	seq := d.msg.SequenceNumber
	dec := protocol.FailedCopy(protocol.FailedCopyStep{HasSeq: seq != nil,
		NamedHere: seq != nil && c.DeadLetterSeq != nil && *c.DeadLetterSeq == *seq, NamedNone: c.DeadLetterSeq == nil,
		FailReason: c.FailReason, LastError: c.LastError})
	if dec.Write == protocol.TakeDeadLetter {
		sctx, cancel := context.WithTimeout(work, p.opts.StoreTimeout)
		err := p.opts.Store.TakeDeadLetter(sctx, &claim.TakeDeadLetterParams{ID: c.ID, Seq: *seq, By: p.opts.Host})
		cancel()
		switch {
		case errors.Is(err, claim.ErrStateChanged):
			return verdict{result: ResultDuplicate, settle: dec.OnRefused, attrs: append(attrs, "why", "another delivery dead-letters the failed claim")}
		case err != nil:
			p.storeErr(err)
			return verdict{result: ResultAbandoned, settle: dec.OnWriteError, attrs: []any{"why", "taking the dead letter of a failed claim failed", "error", err}}
		}
	}
	if dec.Settle == settleDeadLetter {
		d.log.Info(dec.Why)
	}
	v := p.verdictOf(d, dec, nil)
	v.attrs = append(v.attrs, attrs...)
	return v
}

// lost ends a delivery whose claim was taken over, flagged or resolved by
// someone else while its effect ran. Nothing more is written to the claim
// but the note of a late success (operators see it: an effect they may
// think did not happen did).
func (p *Processor) lost(work context.Context, d *delivery, c *claim.Claim, eo sideeffects.Outcome) verdict {
	if eo == sideeffects.OutcomeOK {
		p.metrics.LateEffects.Inc()
		err := held.Write(work, p.opts.StoreTimeout, p.opts.RecordRetryWindow, func(ctx context.Context) error {
			return p.opts.Store.RecordLateSuccess(ctx, &claim.LateSuccessParams{ID: c.ID, Owner: c.Owner, By: p.opts.Host})
		})
		if err != nil {
			d.log.Warn("recording the late success failed", "error", err)
		}
	}
	now, err := p.get(work, c.ID)
	if err != nil {
		d.log.Warn("claim lost while its effect ran; reading it failed", "effect_outcome", eo.String(), "error", err)
		return abandoned(ResultLost, "error", err)
	}
	attrs := []any{"effect_outcome", eo.String(), "claim_state", string(now.State), "holder", now.ClaimedBy}
	switch {
	case eo == sideeffects.OutcomeOK && now.State == claim.StateResolved && now.Resolution == claim.ResolutionDiscarded:
		d.log.Error("effect done AFTER an operator discarded its claim: the effect DID happen",
			"resolved_by", now.ResolvedBy, "resolution_note", now.ResolutionNote)
	case eo == sideeffects.OutcomeOK:
		d.log.Warn("effect done after the claim was lost; recorded on the claim as a late success", attrs...)
	default:
		d.log.Info("claim lost while its effect ran; the effect was cancelled", attrs...)
	}
	seq := d.msg.SequenceNumber
	dec, failed := protocol.Lost(protocol.LostStep{Now: protocol.State(now.State), Fetched: d.fetched,
		LastDelivery: int(d.msg.DeliveryCount) >= p.opts.MaxDeliveryCount, NowPayload: now.Payload != nil,
		NamesThisMessage: now.DeferredSeq != nil && seq != nil && *now.DeferredSeq == *seq, Messageless: messageless(now)})
	if failed {
		// Another attempt got the final answer; this delivery may be the
		// one to dead-letter it.
		return p.failedCopy(work, d, now, attrs...)
	}
	v := verdict{result: dec.Result, settle: dec.Settle, reason: dec.DeadLetterReason, description: now.FlagReason, attrs: append(attrs, "why", dec.Why)}
	return v
}

// runTx is the one-phase path: the marker and the effect's writes commit in
// one transaction.
func (p *Processor) runTx(ctx, work context.Context, d *delivery) verdict {
	if work.Err() != nil {
		return abandoned(ResultAbandoned, "why", "shutting down")
	}
	sctx, cancel := context.WithTimeout(work, p.opts.StoreTimeout)
	defer cancel()
	start := time.Now()
	published := false
	res, err := p.opts.Store.ClaimTx(sctx, &claim.ClaimTxParams{Host: p.opts.Host, Claim: p.claimParams(d)},
		func(ctx context.Context, tx *sql.Tx) (err error) {
			defer func() {
				if r := recover(); r != nil {
					d.log.Error("transactional effect panicked; rolled back", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
					err = fmt.Errorf("transactional effect panicked: %v", r) // rolled back
				}
			}()
			key := d.key
			if c := claim.TxClaimOf(ctx); c != nil {
				key = c.Key()
				ctx = sideeffects.WithCall(ctx, sideeffects.Call{ClaimID: c.ID, Consumer: c.Consumer, DedupKey: c.MessageID, Attempt: 1})
			}
			if !p.publishes() {
				ctx = claim.WithoutFollowUps(ctx)
			}
			if err := d.handler.TxEffect.PerformTx(ctx, tx, d.msg, key); err != nil {
				return err
			}
			published = len(claim.FollowUpSinkOf(ctx).List()) > 0
			return nil
		})
	if err != nil {
		eo := sideeffects.Classify(err)
		if claim.StoreWide(err) {
			eo = sideeffects.OutcomeRetryable
			p.storeErr(err)
			p.metrics.EffectSeconds.With(d.handler.Name, eo.String()).Observe(time.Since(start).Seconds())
			d.log.Warn("transactional effect rolled back: the claim store refuses work", "error", err)
			// Nothing was committed (or a lost COMMIT answer hid a row
			// the rerun finds as its own): run it again once the store
			// is back, keeping the message.
			return p.whenStoreBack(ctx, d, err, "transactional effect rolled back", func() verdict { return p.runTx(ctx, work, d) })
		}
		p.metrics.EffectSeconds.With(d.handler.Name, eo.String()).Observe(time.Since(start).Seconds())
		d.log.Warn("transactional effect rolled back", "error", err, "effect_outcome", eo)
		if reason := held.FailReason(eo); reason != "" {
			// A final answer; nothing was committed, so there is no claim
			// to fail: the dead letter is the record.
			return deadLettered(ResultDeadLettered, reason, claim.ErrorText(err))
		}
		// Nothing was committed: safe to redeliver whatever the error.
		return abandoned(ResultAbandoned, "why", "transactional effect rolled back")
	}
	d.at(res.Claim)
	switch res.Outcome {
	case claim.OutcomeWon:
		p.metrics.EffectSeconds.With(d.handler.Name, sideeffects.OutcomeOK.String()).Observe(time.Since(start).Seconds())
		if published {
			p.followUpsRecorded(res.Claim.ID)
		}
		return completed(ResultProcessed)
	case claim.OutcomeConflict:
		return deadLettered(ResultConflict, ReasonIdempotencyKeyConflict, conflictDescription(d, res.Claim, p.opts.Consumer))
	}
	// A duplicate: the one-phase effect committed with its marker. (A
	// released claim can only come from a two-phase route that has since
	// become transactional; it cannot be taken over here, and the
	// reconciler flags it for an operator.)
	if res.Claim != nil && res.Claim.State == claim.StateReleased {
		d.log.Warn("duplicate of a released two-phase claim on a transactional route; left to the reconciler")
	}
	return completed(ResultDuplicate)
}

func conflictDescription(d *delivery, existing *claim.Claim, consumer string) string {
	return fmt.Sprintf("dedup key %q was already claimed (claim %d, consumer %q) with another payload: existing sha256 %x, this message's sha256 %x",
		d.key, existing.ID, consumer, existing.PayloadHash, d.hash)
}

// maxDescription bounds a dead-letter description, in bytes.
const maxDescription = 1024

// deadLetterText makes a dead-letter description safe to send and read:
// valid UTF-8 (invalid bytes and NUL become U+FFFD: claim.Storable), at
// most maxDescription bytes, cut on a rune boundary with "…" marking the
// cut.
func deadLetterText(s string) string {
	s = claim.Storable(s)
	if len(s) <= maxDescription {
		return s
	}
	n := maxDescription - len("…")
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
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
// for a while (held.Write): the effect already happened, and recording it
// now saves a take-over and a repeat.
func (p *Processor) markProcessed(work context.Context, c *claim.Claim, answer *claim.Answer, followUps []claim.FollowUp) error {
	work, endSpan := p.startOutcome(work, c, "processed")
	err := held.Write(work, p.opts.StoreTimeout, p.opts.RecordRetryWindow, func(ctx context.Context) error {
		return p.opts.Store.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner, Answer: answer, FollowUps: followUps})
	})
	if errors.Is(err, claim.ErrStateChanged) && p.ownState(work, c, claim.StateProcessed) {
		err = nil // an earlier try committed but its answer was lost
	}
	endSpan(err)
	return err
}

// release marks the claim released: the effect was definitely not
// performed, and the next delivery may take the claim over.
func (p *Processor) release(work context.Context, c *claim.Claim, cause error, answer *claim.Answer) error {
	work, endSpan := p.startOutcome(work, c, "released")
	err := held.Write(work, p.opts.StoreTimeout, p.opts.RecordRetryWindow, func(ctx context.Context) error {
		return p.opts.Store.Release(ctx, &claim.ReleaseParams{ID: c.ID, Owner: c.Owner, Error: claim.ErrorText(cause), Answer: answer})
	})
	if errors.Is(err, claim.ErrStateChanged) && p.ownState(work, c, claim.StateReleased) {
		err = nil // an earlier try committed but its answer was lost
	}
	endSpan(err)
	return err
}

// fail moves the claim to failed (a final answer), retrying a store
// outage for a while like markProcessed: the answer is final, and
// recording it now saves a take-over and a repeat.
func (p *Processor) fail(work context.Context, c *claim.Claim, params *claim.FailParams) error {
	work, endSpan := p.startOutcome(work, c, "failed")
	err := held.Write(work, p.opts.StoreTimeout, p.opts.RecordRetryWindow, func(ctx context.Context) error {
		return p.opts.Store.Fail(ctx, params)
	})
	if errors.Is(err, claim.ErrStateChanged) && p.ownState(work, c, claim.StateFailed) {
		err = nil // an earlier try committed but its answer was lost
	}
	endSpan(err)
	return err
}

// ownState reports whether claim c is in state under c's own owner.
func (p *Processor) ownState(work context.Context, c *claim.Claim, state claim.State) bool {
	now, err := p.get(work, c.ID)
	return err == nil && now.State == state && now.Owner == c.Owner
}

// get reads a claim on its own short context.
func (p *Processor) get(work context.Context, id int64) (*claim.Claim, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(work), p.opts.StoreTimeout)
	defer cancel()
	c, err := p.opts.Store.Get(ctx, id)
	p.storeErr(err)
	return c, err
}

func (p *Processor) countHeartbeat(err error) {
	if err == nil {
		p.metrics.Heartbeats.Inc()
		return
	}
	p.metrics.HeartbeatFailures.Inc()
	p.storeErr(err)
}

// renewLock renews the message's lock, on a timer's goroutine (held.Periodic), from receipt
// until the returned stop is called (by settle), for at most
// MaxLockRenewal: every half of the lock's remaining time, so a renewal
// that fails can be tried again before the lock expires. It runs
// independently of the claim's heartbeat, so a slow store never starves
// the renewal of a short lock. nil when renewal is off.
func (p *Processor) renewLock(work context.Context, d *delivery) (stop func()) {
	if p.opts.MaxLockRenewal <= 0 || d.msg.LockedUntil == nil {
		return func() {}
	}
	lockedUntil := *d.msg.LockedUntil
	log := d.log // the worker adds attributes to d.log meanwhile
	// Renewals never overlap (held.Periodic): lockedUntil is theirs.
	return held.Periodic(work, d.received.Add(p.opts.MaxLockRenewal), max(time.Until(lockedUntil)/2, 10*time.Millisecond),
		func(ctx context.Context) (time.Duration, bool) {
			rctx, rcancel := context.WithTimeout(ctx, p.opts.SettleTimeout)
			err := d.lr.r.RenewMessageLock(rctx, d.msg, nil)
			rcancel()
			switch {
			case err == nil:
				p.metrics.LockRenewals.Inc()
				if d.msg.LockedUntil != nil {
					lockedUntil = *d.msg.LockedUntil
				}
			case isLockLost(err):
				p.metrics.LockLosses.Inc()
				log.Warn("message lock lost; the claim still decides the outcome")
				return 0, false
			case ctx.Err() != nil:
				return 0, false
			default:
				p.metrics.LockRenewalFailures.Inc()
				log.Warn("lock renewal failed; trying again", "error", err)
			}
			return max(time.Until(lockedUntil)/2, 10*time.Millisecond), true
		})
}

// settle carries out a delivery's verdict: it stops the lock renewal,
// settles the message (on its own short context: a shutdown must not
// strand work whose outcome is already committed), and writes the final
// log line and metrics. It is the only place a message is settled.
func (p *Processor) settle(d *delivery, v verdict) {
	d.stopRenewal()
	ctx, cancel := context.WithTimeout(context.Background(), p.opts.SettleTimeout)
	defer cancel()
	var err error
	what := ""
	endSettle := p.startSettle(d, v)
	switch v.settle {
	case settleComplete:
		what, err = "complete", d.lr.r.CompleteMessage(ctx, d.msg, nil)
	case settleAbandon:
		what, err = "abandon", d.lr.r.AbandonMessage(ctx, d.msg, d.abandonOptions())
	case settleDefer:
		what, err = "defer", d.lr.r.DeferMessage(ctx, d.msg, nil)
		if err == nil && d.deferral != nil {
			p.deferred(d)
		}
	case settleDeadLetter:
		p.metrics.DeadLetters.With(v.reason).Inc()
		desc := deadLetterText(v.description)
		what, err = "dead-letter", d.lr.r.DeadLetterMessage(ctx, d.msg, &azservicebus.DeadLetterOptions{
			Reason: &v.reason, ErrorDescription: &desc})
	}
	endSettle(err)
	gone := v.settle == settleComplete || v.settle == settleDeadLetter
	switch {
	case err == nil:
		if d.fetched && protocol.MessageLeaves(v.settle, int(d.msg.DeliveryCount) >= p.opts.MaxDeliveryCount) {
			p.clearDeferred(d)
		}
	case d.fetched && gone:
		// A message fetched by its sequence number goes back to deferred
		// when its lock ends, where no receive finds it and its claim, now
		// finished, sends no poller for it: fetch it again and settle it,
		// or it stays in the entity until its time to live.
		if isLockLost(err) {
			p.metrics.LockLosses.Inc()
		}
		if p.settleFetchedAgain(d, v, what, err) {
			p.clearDeferred(d)
		}
	case isLockLost(err):
		p.metrics.LockLosses.Inc()
		d.log.Warn(what+": lock lost; the broker redelivers and the claim decides", "error", err)
	default:
		d.log.Warn(what+" failed; the lock will expire and the broker redeliver", "error", err)
	}

	p.metrics.Messages.With(string(v.result)).Inc()
	level := slog.LevelInfo
	switch v.result {
	case ResultUnknown, ResultConflict, ResultDeadLettered, ResultFailed, ResultFlagged, ResultAbandoned, ResultLost, ResultHandedOff:
		level = slog.LevelWarn
	}
	args := append(v.attrs, "outcome", string(v.result), "duration_ms", time.Since(d.received).Milliseconds())
	if d.claimID == 0 {
		args = append(args, "claim_id", nil)
	}
	d.log.Log(d.traced(context.Background()), level, "message finished", args...)
	p.endProcess(d, v)
	d.lr.pending.Done()
	p.inflight.Done()
}

// settleFetchedAgain settles a fetched (deferred) message whose settlement
// failed: it fetches the message again by its sequence number, with a new
// lock, and completes or dead-letters it as the verdict says. The claim
// already holds the outcome; this only keeps the message from staying
// deferred with nobody to fetch it. It reports whether the message was
// settled. When it was not, the claim still names it (DeferredSeq): the
// poller settles it once this replica is silent (FindStranded).
func (p *Processor) settleFetchedAgain(d *delivery, v verdict, what string, first error) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*p.opts.SettleTimeout)
	defer cancel()
	if d.msg.SequenceNumber == nil {
		d.log.Warn(what+" of a fetched message failed, and it has no sequence number to fetch it again", "error", first)
		return false
	}
	msgs, err := d.lr.r.ReceiveDeferredMessages(ctx, []int64{*d.msg.SequenceNumber}, nil)
	if err == nil && len(msgs) != 1 {
		err = fmt.Errorf("fetched %d messages for one sequence number", len(msgs))
	}
	if err == nil {
		if v.settle == settleComplete {
			err = d.lr.r.CompleteMessage(ctx, msgs[0], nil)
		} else {
			desc := deadLetterText(v.description)
			err = d.lr.r.DeadLetterMessage(ctx, msgs[0], &azservicebus.DeadLetterOptions{Reason: &v.reason, ErrorDescription: &desc})
		}
	}
	if err != nil {
		d.log.Warn(what+" of a fetched message failed, and settling it again failed: the poller settles it once this replica is silent (its claim holds the outcome)",
			"error", first, "again", err)
		return false
	}
	d.log.Info(what+" of a fetched message failed; fetched it again and settled it", "error", first)
	return true
}
