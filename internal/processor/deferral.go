package processor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/held"
	"github.com/sbclaim/sbclaim/internal/protocol"
)

// Delayed retries.
//
// A held claim whose effect was not performed (retryable), or whose
// outcome is unknown on a RecoveryAuto route, is postponed instead of
// abandoned (which would burn one of the message's deliveries at once):
//
//  1. postpone records the deferral on the claim in one guarded write
//     (claim.Deferrer.Defer: released, DeferredSeq = the message's
//     sequence number, DueAt = now + the route's backoff, at least the
//     downstream's Retry-After; NextAttemptAt = DueAt + DeferGrace so the
//     reconciler leaves it to its message), THEN settle defers the message
//     at the broker (DeferMessage). A crash or a failed DeferMessage in
//     between leaves a claim that names its message: the message's lock
//     runs out, the broker redelivers it, and that delivery — the only one
//     whose sequence number the claim accepts — takes the claim back.
//  2. pollDeferred, on every replica of the consumer, finds due claims
//     (FindDue), takes each with one guarded write (TakeDeferred: of
//     replicas racing for it exactly one wins), then fetches the message
//     by its sequence number (ReceiveDeferredMessages) and runs the usual
//     protocol holding the claim (runFetched).
//  3. A fetch that finds nothing (the message expired or was settled)
//     releases the claim with its error: the reconciler's recovery
//     repeats it from the stored payload, or flags it when there is none.
//
// The horizon: a claim postponed for longer than its route's
// Backoff.Horizon is flagged (the reason names the route and how long),
// and its message completed (payload stored) or dead-lettered.
//
// Each fetch by sequence number counts as a delivery (see brokertest's
// DeferredReceiveCounts): a message whose DeliveryCount has reached
// MaxDeliveryCount cannot be deferred again — the broker would dead-letter
// it. Nor is it deferred on the delivery before: its fetch would be the
// last delivery, and a replica dying while holding a last delivery leaves
// the message to a lock that ends in a dead letter. So from the
// second-to-last delivery on, its claim is handed off: released with its
// next attempt due and its stored payload, the message completed, and the
// reconciler's recovery repeats it then. A fetch on the last delivery
// (after the holder of the one before died) hands off without an attempt
// (handOffLast).

// ReasonRetryHorizon is the dead-letter reason of a message whose claim
// was flagged at its route's retry horizon when no payload is stored (with
// a stored payload the message is completed and an operator redrives the
// claim from it).
const ReasonRetryHorizon = protocol.ReasonRetryHorizon

// ownDeferral reports whether claim c is released under c's owner with
// its message deferred under seq.
func (p *Processor) ownDeferral(work context.Context, c *claim.Claim, seq int64) bool {
	now, err := p.get(work, c.ID)
	return err == nil && now.State == claim.StateReleased && now.Owner == c.Owner && now.DeferredSeq != nil && *now.DeferredSeq == seq
}

// pollDeferred looks for due claims every DeferPollInterval until ctx
// ends, and fetches their messages (pollOnce). Fetched messages run on
// workers of their own, at most MaxConcurrentCalls at once: the receive
// loop holds its free slots while it waits for messages, so sharing them
// would starve the poller on an idle entity.
func (p *Processor) pollDeferred(ctx, work context.Context) {
	if p.deferrer == nil {
		return
	}
	slots := make(chan struct{}, p.opts.MaxConcurrentCalls)
	t := time.NewTicker(p.opts.DeferPollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if p.breaker.isOpen() {
			// The receive loop closes the breaker only between receives:
			// blocked on a quiet entity (every message deferred), it never
			// would, and the deferred messages would wait for the next
			// arrival. Probe the store here too.
			if p.probeStore(ctx) != nil || !p.breaker.isOpen() {
				continue
			}
			p.storeBack()
		}
		p.pollOnce(ctx, work, slots)
	}
}

// pollOnce takes and fetches the due claims of this consumer and entity,
// as many as there are free worker slots. It returns how many it fetched.
func (p *Processor) pollOnce(ctx, work context.Context, slots chan struct{}) int {
	lr := p.live.Load()
	if lr == nil {
		return 0
	}
	free := cap(slots) - len(slots)
	if free <= 0 {
		return 0
	}
	sctx, cancel := context.WithTimeout(ctx, p.opts.StoreTimeout)
	due, err := p.deferrer.FindDue(sctx, &claim.FindDueParams{Consumer: p.opts.Consumer, Entity: p.opts.Entity,
		SilentFor: p.opts.TakeoverAfter, Limit: free})
	cancel()
	if err != nil {
		if !p.storeErr(err) && ctx.Err() == nil {
			p.log.Warn("looking for due deferred claims failed", "error", err)
		}
		return 0
	}
	p.metrics.DeferredDue.Set(float64(len(due)))
	n := 0
	for _, c := range due {
		select {
		case slots <- struct{}{}:
		default:
			return n // every worker is busy: the next poll goes on
		}
		if p.fetch(ctx, work, lr, c, slots) {
			n++
		} else {
			<-slots
		}
	}
	return n + p.sweepStranded(ctx, work, lr, slots)
}

// sweepStranded settles the deferred messages of finished claims whose
// holder died between finishing the claim and settling its message (the
// message went back to deferred, where no receive finds it, and a
// finished claim sends no poller for it). Such a claim still names its
// message (DeferredSeq is cleared only once the message is settled);
// once its holder is silent for strandedAfter (its lock has ended, so a
// "not found" is final), one replica takes it
// (TakeStranded: a guarded write, so replicas do not race for it), fetches
// the message by its sequence number and settles it as a copy of a
// finished claim would be (runStranded). The effect never runs again.
// It returns how many messages it fetched.
func (p *Processor) sweepStranded(ctx, work context.Context, lr *liveReceiver, slots chan struct{}) int {
	free := cap(slots) - len(slots)
	if free <= 0 {
		return 0
	}
	sctx, cancel := context.WithTimeout(ctx, p.opts.StoreTimeout)
	stranded, err := p.deferrer.FindStranded(sctx, &claim.FindDueParams{Consumer: p.opts.Consumer, Entity: p.opts.Entity,
		SilentFor: p.strandedAfter(), Limit: free})
	cancel()
	if err != nil {
		if !p.storeErr(err) && ctx.Err() == nil {
			p.log.Warn("looking for stranded deferred messages failed", "error", err)
		}
		return 0
	}
	n := 0
	for _, c := range stranded {
		select {
		case slots <- struct{}{}:
		default:
			return n
		}
		if p.fetchStranded(ctx, work, lr, c, slots) {
			n++
		} else {
			<-slots
		}
	}
	return n
}

// fetchStranded takes the stranded claim c and fetches its message; the
// message is settled on a worker (holding the slot the caller took). It
// reports whether a worker was started.
func (p *Processor) fetchStranded(ctx, work context.Context, lr *liveReceiver, c *claim.Claim, slots chan struct{}) bool {
	seq := *c.DeferredSeq
	log := p.log.With("message_id", c.MessageID, "claim_id", c.ID, "sequence_number", seq, "claim_state", c.State)
	sctx, cancel := context.WithTimeout(ctx, p.opts.StoreTimeout)
	err := p.deferrer.TakeStranded(sctx, &claim.TakeStrandedParams{ID: c.ID, Seq: seq, State: c.State, SilentFor: p.strandedAfter()})
	cancel()
	switch {
	case errors.Is(err, claim.ErrStateChanged):
		p.metrics.StrandedMessages.With("guard").Inc()
		return false
	case err != nil:
		p.metrics.StrandedMessages.With("error").Inc()
		p.storeErr(err)
		log.Warn("taking a stranded deferred message failed", "error", err)
		return false
	}
	m, err := p.fetchBySeq(ctx, lr, seq)
	switch {
	case m != nil:
	case err == nil || isNotFound(err):
		// Settled after all (the holder's settlement landed before its
		// claim could forget the message), or expired: nothing to do
		// but forget it.
		p.metrics.StrandedMessages.With("gone").Inc()
		if err := p.forget(ctx, c.ID, seq); err != nil {
			log.Warn("forgetting a settled deferred message failed; looked at again later", "error", err)
		}
		return false
	default:
		p.metrics.StrandedMessages.With("error").Inc()
		log.Warn("fetching a stranded deferred message failed; looked at again once the claim is silent", "error", err)
		return false
	}
	if !lr.acquire() {
		log.Warn("the receiver was replaced while fetching a stranded deferred message; it is fetched again later")
		return false
	}
	p.metrics.StrandedMessages.With("fetched").Inc()
	p.inflight.Add(1)
	d := &delivery{msg: m, lr: lr, received: time.Now(), fetched: true,
		log: p.log.With("message_id", m.MessageID, "delivery_count", m.DeliveryCount, "sequence_number", seq)}
	d.stopRenewal = p.renewLock(work, d)
	go func() {
		p.settle(d, p.runStranded(work, d, c))
		<-slots
	}()
	return true
}

// runStranded decides how to settle the stranded message of finished
// claim c, as the duplicate path settles a copy: completed when the claim
// was processed or resolved; a failed claim's message carries its
// failure to the dead-letter queue when the claim names it (failedCopy);
// a flagged claim's message is completed when the claim stored its
// payload (an operator's redrive runs from it), dead-lettered with the
// flag reason otherwise (the dead-letter queue keeps the body). A message
// whose key is not the claim's is abandoned (back to deferred) and
// forgotten by the claim.
func (p *Processor) runStranded(work context.Context, d *delivery, c *claim.Claim) verdict {
	d.at(c)
	key, err := p.opts.Key(d.msg)
	dec, failed := protocol.Stranded(protocol.StrandedStep{State: protocol.State(c.State), KeyMatches: err == nil && key == c.MessageID,
		PayloadStored: c.Payload != nil, FlagReason: c.FlagReason})
	switch {
	case failed:
		return p.failedCopy(work, d, c, "why", "stranded deferred message")
	case dec.Settle == settleAbandon:
		// Not this claim's message (an entity recreated since: its
		// sequence numbers start again): leave it to its own claim, and
		// forget it here.
		d.log.Warn("the stranded claim's sequence number names another message; forgetting it", "claim_key", c.MessageID, "message_key", key)
		if err := p.forget(work, c.ID, *d.msg.SequenceNumber); err != nil {
			d.log.Warn("forgetting the other message failed; looked at again later", "error", err)
		}
		d.claimID = 0 // settling it forgets nothing of c
	default:
		d.log.Info("settling a deferred message its holder left behind after finishing its claim", "claim_state", c.State)
	}
	v := p.verdictOf(d, dec, nil)
	v.attrs = append(v.attrs, "claim_state", string(c.State))
	return v
}

// ReasonClaimFlagged is the dead-letter reason of the message of a claim
// flagged for operators that stored no payload (the dead-letter queue
// keeps the body): a stranded deferred message's, or the one at hand when
// a delivery flags the claim.
const ReasonClaimFlagged = protocol.ReasonClaimFlagged

// clearDeferred forgets the deferred message a fetched delivery settled
// (completed or dead-lettered): the claim no longer names it, and no
// poller looks for it. When this write fails the claim still names the
// message: a poller finds it gone later and forgets it then.
func (p *Processor) clearDeferred(d *delivery) {
	if d.claimID == 0 || d.msg.SequenceNumber == nil || p.deferrer == nil {
		return
	}
	if err := p.forget(context.Background(), d.claimID, *d.msg.SequenceNumber); err != nil {
		d.log.Warn("forgetting the settled deferred message failed; a poller forgets it later", "error", err)
	}
}

// forget clears claim id's deferred message seq (ClearDeferred), retrying
// a write whose answer was lost. A claim that names no message, or
// another one, has nothing to forget: not an error. A store error is
// counted (storeErr) and returned.
func (p *Processor) forget(ctx context.Context, id, seq int64) error {
	err := held.Write(ctx, p.opts.StoreTimeout, p.opts.RecordRetryWindow, func(ctx context.Context) error {
		return p.deferrer.ClearDeferred(ctx, &claim.ClearDeferredParams{ID: id, Seq: seq})
	})
	if err != nil && !errors.Is(err, claim.ErrStateChanged) {
		p.storeErr(err)
		return err
	}
	return nil
}

// fetch takes the due claim c and fetches its message by its sequence
// number; the message then runs on a worker (holding the slot the caller
// took). It reports whether a worker was started.
func (p *Processor) fetch(ctx, work context.Context, lr *liveReceiver, c *claim.Claim, slots chan struct{}) bool {
	seq := *c.DeferredSeq
	log := p.log.With("message_id", c.MessageID, "claim_id", c.ID, "sequence_number", seq)
	sctx, cancel := context.WithTimeout(ctx, p.opts.StoreTimeout)
	taken, err := p.deferrer.TakeDeferred(sctx, &claim.TakeDeferredParams{ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(),
		Seq: seq, SilentFor: p.opts.TakeoverAfter, By: p.opts.Host, Reason: "deferred message due"})
	cancel()
	switch {
	case errors.Is(err, claim.ErrStateChanged):
		p.metrics.DeferredFetches.With("guard").Inc()
		log.Debug("another replica took the due claim first (the guard refused this one)")
		return false
	case err != nil:
		p.metrics.DeferredFetches.With("error").Inc()
		p.storeErr(err)
		log.Warn("taking a due claim failed", "error", err)
		return false
	}
	p.metrics.TakeOvers.With(string(claim.PathRedelivery)).Inc()

	m, err := p.fetchBySeq(ctx, lr, seq)
	step := protocol.FetchStep{Result: protocol.Found, State: protocol.State(c.State), Deferred: c.Deferred(),
		HoldWait: p.holdWait(), PollInterval: p.opts.DeferPollInterval, Seq: seq, Holder: c.ClaimedBy}
	switch {
	case m != nil:
	case err == nil || isNotFound(err):
		step.Result = protocol.NotFound
	default:
		step.Result = protocol.BrokerError
	}
	if err != nil {
		step.Err = claim.ErrorText(err)
	}
	if step.Result != protocol.Found && c.State == claim.StateClaimed {
		// Taken from a silent holder whose message was not fetched: may
		// its route repeat the key (the outcome is unknown)?
		step.Unrepeatable = p.repeatable(c, true)
	}
	dec := protocol.AfterFetch(step)
	p.metrics.DeferredFetches.With(dec.Metric).Inc()
	switch dec.Action {
	case protocol.FetchFlag:
		p.flagTaken(work, taken, seq, dec.Reason)
		return false
	case protocol.FetchGiveBack:
		// Not found, but the claim was taken from a holder that went
		// silent (claimed), or that had not recorded the message as
		// deferred (released, no due time): that holder, or its broker
		// session, may still hold the message's lock, and a locked
		// message is not found. The claim waits as deferred, due once
		// that holder's lock has certainly ended (holdWait); a second
		// "not found" then is final. Or the broker did not answer.
		log.Info("the deferred message was not fetched; looking again later", "in", dec.Wait, "why", dec.Reason)
		p.giveBack(work, taken, seq, dec.Wait, dec.Reason)
		return false
	case protocol.FetchGone:
		// Gone: expired, or settled by a delivery that had it (the
		// deferral was recorded but DeferMessage never happened). Release
		// the claim with the reason: that delivery, if it still has the
		// message, takes it over; else the reconciler's recovery repeats
		// it from its stored payload (or flags it without one).
		log.Warn(dec.Reason)
		p.releaseFetched(work, taken, dec.Reason)
		return false
	}

	if !lr.acquire() {
		// The receiver was retired meanwhile: the message's lock runs
		// out, it goes back to deferred, and the claim's silent holder
		// is taken again by the next poll after TakeoverAfter.
		log.Warn("the receiver was replaced while fetching a deferred message; it is fetched again later")
		return false
	}
	p.inflight.Add(1)
	d := &delivery{msg: m, lr: lr, received: time.Now(), owner: taken.Owner, fetched: true, fromSilent: c.State == claim.StateClaimed,
		log: p.log.With("message_id", m.MessageID, "delivery_count", m.DeliveryCount, "sequence_number", seq)}
	d.stopRenewal = p.renewLock(work, d)
	go func() {
		p.settle(d, p.runFetched(work, d, taken))
		<-slots
	}()
	return true
}

// flagTaken flags a due claim this poller took (taken) whose message it
// did not fetch (AfterFetch: taken from a silent holder, its outcome
// unknown, and its route may not repeat the key). Its message stays
// deferred: its holder settles it (a lost claim's success is noted as a
// late success), or the stranded sweep does once its lock has ended.
// When the flag cannot be written the claim stays taken and silent, and
// the next poll decides again.
func (p *Processor) flagTaken(work context.Context, taken *claim.Claim, seq int64, reason string) {
	err := held.Write(work, p.opts.StoreTimeout, p.opts.RecordRetryWindow, func(ctx context.Context) error {
		_, err := p.opts.Store.Flag(ctx, &claim.FlagParams{ID: taken.ID, Owner: taken.Owner, State: claim.StateClaimed, Reason: reason, By: p.opts.Host})
		return err
	})
	if errors.Is(err, claim.ErrStateChanged) && p.ownState(work, taken, claim.StateFlagged) {
		err = nil // an earlier try committed but its answer was lost
	}
	log := p.log.With("message_id", taken.MessageID, "claim_id", taken.ID, "sequence_number", seq)
	switch {
	case errors.Is(err, claim.ErrStateChanged):
		log.Info("the claim changed while flagging its unknown outcome; left as it is", "why", reason)
	case err != nil:
		p.storeErr(err)
		log.Warn("flagging a claim whose outcome is unknown failed; the next poll decides again", "why", reason, "error", err)
	default:
		log.Warn("claim flagged for operators", "why", reason)
	}
}

// giveBack returns a taken claim whose message was not fetched to the
// deferred state, due in dueIn (Defer, then SetDue: the message stays
// deferred at the broker, as it was). When the writes fail, the claim is
// fetched again once this holder is silent.
func (p *Processor) giveBack(work context.Context, taken *claim.Claim, seq int64, dueIn time.Duration, why string) {
	werr := held.Write(work, p.opts.StoreTimeout, p.opts.RecordRetryWindow, func(ctx context.Context) error {
		err := p.deferrer.Defer(ctx, &claim.DeferParams{ID: taken.ID, Owner: taken.Owner, Seq: seq, DueIn: dueIn,
			Grace: p.opts.DeferGrace, Error: why})
		if err != nil && !(errors.Is(err, claim.ErrStateChanged) && p.ownDeferral(work, taken, seq)) {
			return err
		}
		return p.deferrer.SetDue(ctx, &claim.SetDueParams{ID: taken.ID, Owner: taken.Owner, Seq: seq, DueIn: dueIn})
	})
	if werr != nil {
		p.storeErr(werr)
		p.log.Warn("giving the due claim back failed; it is fetched again once its holder is silent", "claim_id", taken.ID, "error", werr)
	}
}

// lockDuration is the entity's lock duration, or Service Bus's longest
// (5 minutes) when it is not configured.
func (p *Processor) lockDuration() time.Duration {
	if p.opts.LockDuration > 0 {
		return p.opts.LockDuration
	}
	return 5 * time.Minute
}

// holdWait is how long after its last sign of life in the store a holder
// may still lock its message: a holder whose store writes fail goes on
// running its effect and renewing the lock for up to MaxLockRenewal, then
// the lock lasts its duration, then the holder may still settle.
func (p *Processor) holdWait() time.Duration {
	return max(p.opts.MaxLockRenewal, 0) + p.lockDuration() + p.opts.SettleTimeout
}

// strandedAfter is how long a finished claim must have been quiet (its
// last heartbeat, and the write that finished it) before the sweep
// fetches its message and takes a "not found" as final: as long as a
// holder may still lock the message (holdWait) — the claim may have been
// finished by someone else (the reconciler, an operator) while a silent
// holder still renewed its lock — plus the settlement it may then retry.
// Never less than TakeoverAfter.
func (p *Processor) strandedAfter() time.Duration {
	return max(p.opts.TakeoverAfter, p.holdWait()+p.opts.SettleTimeout)
}

// fetchBySeq fetches the deferred message with sequence number seq, or
// nil when the broker returned none (err says why, CodeNotFound when it
// is not deferred: gone, or locked by another receiver).
func (p *Processor) fetchBySeq(ctx context.Context, lr *liveReceiver, seq int64) (*azservicebus.ReceivedMessage, error) {
	rctx, cancel := context.WithTimeout(ctx, p.opts.SettleTimeout)
	defer cancel()
	msgs, err := lr.r.ReceiveDeferredMessages(rctx, []int64{seq}, nil)
	for _, m := range msgs {
		if m.SequenceNumber != nil && *m.SequenceNumber == seq {
			return m, err
		}
	}
	return nil, err
}

// releaseFetched releases a taken claim whose message could not be
// fetched. It forgets the message first (ClearDeferred): a Release keeps
// DeferredSeq, and a claim that names a message sends a poller for it.
func (p *Processor) releaseFetched(work context.Context, c *claim.Claim, why string) {
	if c.DeferredSeq != nil {
		if err := p.forget(work, c.ID, *c.DeferredSeq); err != nil {
			p.log.Warn("forgetting a deferred message that is gone failed; the claim is taken again once this holder is silent", "claim_id", c.ID, "error", err)
			return
		}
	}
	if err := p.release(work, c, errors.New(why), nil); err != nil {
		p.storeErr(err)
		p.log.Warn("releasing a claim whose deferred message is gone failed", "claim_id", c.ID, "error", err)
	}
}

// runFetched runs the protocol for a deferred message fetched by its
// sequence number, whose claim c this delivery took: BeforeFetchedRun
// decides whether it runs the effect.
func (p *Processor) runFetched(work context.Context, d *delivery, c *claim.Claim) verdict {
	d.at(c)
	s := protocol.FetchedStep{Claim: claimFacts(c), Delivery: p.deliveryFacts(d), Seq: *d.msg.SequenceNumber, PreviousHolder: c.PreviousHolder}
	if reason, desc := p.validate(d); reason != "" {
		s.Invalid = reason + ": " + desc
	} else {
		s.Route = routeFacts(d.handler)
		s.Transactional = d.handler.TxEffect != nil
		s.Delay = d.handler.Backoff.WithDefaults().Delay(c.Postponements, 0)
		if d.key != c.MessageID {
			s.OtherKey = d.key
		}
		if c.RouteDiffers(d.handler.Name, d.handler.Fingerprint) {
			s.RouteChange = fmt.Sprintf("the claim was taken for route %q (fingerprint %s), its deferred message routes to %q (fingerprint %s)",
				c.Route, c.Fingerprint, d.handler.Name, d.handler.Fingerprint)
		}
	}
	dec := protocol.BeforeFetchedRun(s)
	if dec.Run {
		return p.runHeld(work, d, c)
	}
	return p.perform(work, d, c, dec, nil)
}

// deferred records, once settle deferred the message, when it is due
// (SetDue). Until then no poller looks for it: the message may not be
// deferred yet. When this write fails, a poller finds the claim once its
// holder (this delivery) is silent for TakeoverAfter, and fetches it then.
func (p *Processor) deferred(d *delivery) {
	err := held.Write(context.Background(), p.opts.StoreTimeout, p.opts.RecordRetryWindow, func(ctx context.Context) error {
		return p.deferrer.SetDue(ctx, d.deferral)
	})
	if err != nil {
		p.storeErr(err)
		d.log.Warn("message deferred but recording its due time failed; it is fetched once this holder is silent", "error", err)
	}
}
