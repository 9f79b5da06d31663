package processor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/held"
	"github.com/sbclaim/sbclaim/internal/protocol"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// The driver's half of the protocol: it reads the facts of a step, asks
// package protocol for the decision, and performs it (the claim write,
// then the settlement, through settle). No rule is re-derived here.

// claimFacts is what the protocol needs of claim c.
func claimFacts(c *claim.Claim) protocol.Claim {
	f := protocol.Claim{State: protocol.State(c.State), PayloadStored: c.Payload != nil, Postponements: c.Postponements, LastError: c.LastError}
	if c.PostponedAt != nil {
		// HeartbeatAt is when this attempt took the claim (database
		// clock), PostponedAt the first postponement.
		f.Postponed, f.SincePostponed = true, c.HeartbeatAt.Sub(*c.PostponedAt)
	}
	return f
}

// deliveryFacts is what the protocol needs of delivery d.
func (p *Processor) deliveryFacts(d *delivery) protocol.Delivery {
	return protocol.Delivery{
		Count: int(d.msg.DeliveryCount), Max: p.opts.MaxDeliveryCount,
		Fetched: d.fetched, FromSilent: d.fromSilent,
		CanDefer: p.deferrer != nil && !d.handler.Backoff.WithDefaults().Off && d.msg.SequenceNumber != nil && d.sess == nil,
		Session:  d.sess != nil,
	}
}

// routeFacts is what the protocol needs of route h.
func routeFacts(h sideeffects.Handler) protocol.Route {
	return protocol.Route{Name: h.Name, Manual: h.Manual(), Horizon: h.Backoff.WithDefaults().Horizon, HoldOnFailure: h.HoldSessionOnFailure}
}

// outcomeOf converts a classified effect outcome.
func outcomeOf(o sideeffects.Outcome) protocol.Outcome {
	switch o {
	case sideeffects.OutcomeOK:
		return protocol.OK
	case sideeffects.OutcomeRetryable:
		return protocol.Retryable
	case sideeffects.OutcomeRejected:
		return protocol.Rejected
	case sideeffects.OutcomePermanent:
		return protocol.Permanent
	case sideeffects.OutcomeConflict:
		return protocol.Conflict
	}
	return protocol.Unknown
}

// effectFacts is what the protocol needs of an attempt's result.
func effectFacts(d *delivery, c *claim.Claim, res held.Result) protocol.Effect {
	var retryAfter time.Duration
	var se *sideeffects.Error
	if errors.As(res.Err, &se) {
		retryAfter = se.RetryAfter
	}
	e := protocol.Effect{Outcome: outcomeOf(res.Outcome), Error: claim.ErrorText(res.Err),
		Delay: d.handler.Backoff.WithDefaults().Delay(c.Postponements+d.sess.holdCount(), retryAfter)}
	switch {
	case e.Outcome == protocol.Unknown && sideeffects.ForOperator(res.Err):
		e.ForOperator, e.OperatorReason = true, held.OperatorReason(res.Err)
	case protocol.FailReason(e.Outcome) != "":
		e.FailDescription = held.FailDescription(res.Err, res.Answer)
	}
	return e
}

// afterEffect asks the protocol what an attempt's result does, and does
// it.
func (p *Processor) afterEffect(work context.Context, d *delivery, c *claim.Claim, res held.Result) verdict {
	dec := protocol.AfterEffect(protocol.EffectStep{Claim: d.sess.claimFacts(c), Delivery: p.deliveryFacts(d), Route: routeFacts(d.handler), Effect: effectFacts(d, c, res)})
	return p.perform(work, d, c, dec, &res)
}

// perform makes decision dec's claim write for the claim c this delivery
// holds (res is the attempt's result, nil when none ran), and returns the
// verdict settle carries out: dec's settlement once the write committed;
// the lost delivery's when it was refused (the claim changed hands);
// dec.OnWriteError when it failed (the claim stays as it was, silent).
func (p *Processor) perform(work context.Context, d *delivery, c *claim.Claim, dec protocol.Decision, res *held.Result) verdict {
	eo := sideeffects.OutcomeRetryable // a hand-off without an attempt: nothing was performed
	var answer *claim.Answer
	if res != nil {
		eo, answer = res.Outcome, res.Answer
	}
	var err error
	switch dec.Write {
	case protocol.MarkProcessed:
		if crashed(p.opts.Hooks.AfterEffect, work, d) {
			return verdict{result: ResultCrashed}
		}
		err = p.markProcessed(work, c, answer, followUpsOf(c, res))
	case protocol.Release:
		err = p.release(work, c, errors.New(dec.Reason), answer)
	case protocol.HandOff:
		err = held.Write(work, p.opts.StoreTimeout, p.opts.RecordRetryWindow, func(ctx context.Context) error {
			return p.opts.Store.Release(ctx, &claim.ReleaseParams{ID: c.ID, Owner: c.Owner, Error: dec.Reason, NextAttemptIn: dec.Wait, Answer: answer})
		})
	case protocol.Defer:
		seq := *d.msg.SequenceNumber
		err = held.Write(work, p.opts.StoreTimeout, p.opts.RecordRetryWindow, func(ctx context.Context) error {
			return p.deferrer.Defer(ctx, &claim.DeferParams{ID: c.ID, Owner: c.Owner, Seq: seq,
				DueIn: dec.Wait, Grace: p.opts.DeferGrace, Error: dec.Reason, Answer: answer})
		})
		if errors.Is(err, claim.ErrStateChanged) && p.ownDeferral(work, c, seq) {
			err = nil // an earlier try committed but its answer was lost
		}
	case protocol.Fail:
		err = p.fail(work, c, &claim.FailParams{ID: c.ID, Owner: c.Owner, Reason: dec.Reason, Error: dec.Description,
			Answer: answer, DeadLetterSeq: d.msg.SequenceNumber})
	case protocol.Hold:
		// The attempts are recorded (held.Run); this guarded heartbeat
		// checks the claim is still this holder's before it waits.
		err = held.Write(work, p.opts.StoreTimeout, p.opts.RecordRetryWindow, func(ctx context.Context) error {
			return p.opts.Store.Heartbeat(ctx, &claim.HeartbeatParams{ID: c.ID, Owner: c.Owner})
		})
	case protocol.Flag:
		err = held.Write(work, p.opts.StoreTimeout, p.opts.RecordRetryWindow, func(ctx context.Context) error {
			_, err := p.opts.Store.Flag(ctx, &claim.FlagParams{ID: c.ID, Owner: c.Owner, State: claim.StateClaimed, Reason: dec.Reason, By: p.opts.Host})
			return err
		})
		if errors.Is(err, claim.ErrStateChanged) && p.ownState(work, c, claim.StateFlagged) {
			err = nil // an earlier try committed but its answer was lost
		}
	}
	switch {
	case errors.Is(err, claim.ErrStateChanged):
		return p.lost(work, d, c, eo)
	case err != nil:
		// The claim stays as it was and goes silent: whoever takes it
		// over decides again (the same answer, the same horizon).
		p.storeErr(err)
		d.log.Warn("the claim write failed", "write", dec.Write.String(), "why", dec.Why, "error", err)
		v := verdict{result: ResultUnknown, settle: dec.OnWriteError, attrs: []any{"why", dec.Write.String() + " failed", "error", err}}
		if dec.OnWriteError == settleComplete {
			v.result = dec.Result
		}
		return v
	}
	switch dec.Write {
	case protocol.MarkProcessed:
		if crashed(p.opts.Hooks.AfterMarkProcessed, work, d) {
			return verdict{result: ResultCrashed}
		}
		if res != nil && len(res.FollowUps) > 0 {
			p.followUpsRecorded(c.ID)
		}
	case protocol.Defer:
		if crashed(p.opts.Hooks.AfterDeferRecorded, work, d) {
			return verdict{result: ResultCrashed}
		}
		p.metrics.Postponed.With(d.handler.Name).Inc()
		d.deferral = &claim.SetDueParams{ID: c.ID, Owner: c.Owner, Seq: *d.msg.SequenceNumber, DueIn: dec.Wait}
	case protocol.HandOff:
		if res != nil {
			p.metrics.Postponed.With(d.handler.Name).Inc()
		}
	case protocol.Fail:
		if crashed(p.opts.Hooks.AfterFail, work, d) {
			return verdict{result: ResultCrashed}
		}
	case protocol.Flag:
		d.log.Warn("claim flagged for operators", "why", dec.Reason)
	case protocol.Hold:
		p.metrics.Postponed.With(d.handler.Name).Inc()
	}
	d.sess.decided(c, dec)
	return p.verdictOf(d, dec, res)
}

// verdictOf is the verdict that settles decision dec.
func (p *Processor) verdictOf(d *delivery, dec protocol.Decision, res *held.Result) verdict {
	v := verdict{result: dec.Result, settle: dec.Settle, reason: dec.DeadLetterReason, description: dec.Description}
	// Room for these attributes and those settle adds to the final log
	// line, so the slice is allocated once.
	v.attrs = make([]any, 0, 16)
	if dec.Settle == settleDeadLetter {
		v.attrs = append(v.attrs, "reason", dec.DeadLetterReason)
	}
	if dec.Why != "" {
		v.attrs = append(v.attrs, "why", dec.Why)
	}
	if dec.Write == protocol.Defer {
		v.attrs = append(v.attrs, "due_in", dec.Wait.Round(time.Millisecond).String())
	}
	if dec.Write == protocol.HandOff || dec.Write == protocol.Hold {
		v.attrs = append(v.attrs, "next_attempt_in", dec.Wait.Round(time.Millisecond).String())
	}
	if res != nil {
		v.attrs = append(v.attrs, "effect_outcome", res.Outcome)
		if res.Err != nil {
			v.attrs = append(v.attrs, "error", res.Err)
		}
		if res.Answer != nil {
			v.attrs = append(v.attrs, "status", res.Answer.Status)
		}
	}
	return v
}

// repeatable asks the protocol whether claim c's effect may be repeated
// under its key by the route it routes to now, from what the claim
// stored; unknown says an earlier attempt's outcome is unknown. It
// returns "" when it may, else why not.
func (p *Processor) repeatable(c *claim.Claim, unknown bool) string {
	h, err := p.opts.Router.Route(sideeffects.MessageFromClaim(c))
	f := protocol.RepeatStep{Unroutable: err != nil, Unknown: unknown}
	if err == nil {
		f.Transactional, f.RouteChanged, f.Manual = h.Effect == nil, c.RouteDiffers(h.Name, h.Fingerprint), h.Manual()
	}
	switch protocol.Repeat(f) {
	case protocol.Unroutable:
		return fmt.Sprintf("its route cannot be told from what the claim stored (%v)", err)
	case protocol.Transactional:
		return fmt.Sprintf("route %q has no effect that can be repeated alone", h.Name)
	case protocol.RouteChanged:
		return fmt.Sprintf("route changed: the claim was taken for route %q (fingerprint %s), it now routes to %q (fingerprint %s)",
			c.Route, c.Fingerprint, h.Name, h.Fingerprint)
	case protocol.ManualUnknown:
		return fmt.Sprintf("route %q (recovery manual)", h.Name)
	}
	return ""
}

// claimMessage is what claim c says of its deferred message.
func claimMessage(c *claim.Claim) protocol.ClaimMessage {
	return protocol.ClaimMessage{State: protocol.State(c.State), Seq: c.DeferredSeq, DueAt: c.DueAt, Path: string(c.TakeOverPath), ClaimedBy: c.ClaimedBy}
}
