package processor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/cenkalti/backoff/v5"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/protocol"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// Session mode (docs/design.md, "Sessions"). A session-enabled queue or
// subscription is received through session receivers: the processor
// accepts up to MaxConcurrentSessions sessions at once and works each one
// message at a time, in order, renewing the session lock while it holds
// it and releasing the session after SessionIdleTimeout without a
// message. The claim protocol per message is unchanged; what differs is
// what keeps the order:
//
//   - A retryable (or, on an auto route, unknown) outcome never defers or
//     abandons the message — either would let the session's next message
//     run first. The holder keeps the claim (heartbeats go on) and the
//     message (the session lock is renewed), waits the route's backoff
//     (Retry-After and the route's breaker included) and runs the effect
//     again: protocol.Hold, settled protocol.Retry.
//   - A final answer fails the claim and dead-letters the message once;
//     the session goes on, unless the route holds it
//     (HoldSessionOnFailure): then the session state names the claim, and
//     whoever holds the session waits until an operator acts on the claim
//     (retries, redrives, hands off or resolves it).
//   - A lost session lock ends the holder's waits (a retry's backoff, a
//     duplicate's watch of a live holder) as a lost message lock would;
//     an effect already running finishes and the claim decides, as
//     always. The session's next holder gets the same message again and
//     takes its claim over once the holder is silent (TakeoverAfter).

// SessionReceiver is the part of *azservicebus.SessionReceiver the
// processor uses in session mode; the in-memory broker's
// *membus.SessionReceiver has it too.
type SessionReceiver interface {
	SessionID() string
	LockedUntil() time.Time
	ReceiveMessages(ctx context.Context, maxMessages int, options *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	CompleteMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.CompleteMessageOptions) error
	AbandonMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.AbandonMessageOptions) error
	DeadLetterMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.DeadLetterOptions) error
	PeekMessages(ctx context.Context, maxMessageCount int, options *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	RenewSessionLock(ctx context.Context, options *azservicebus.RenewSessionLockOptions) error
	GetSessionState(ctx context.Context, options *azservicebus.GetSessionStateOptions) ([]byte, error)
	SetSessionState(ctx context.Context, state []byte, options *azservicebus.SetSessionStateOptions) error
	Close(ctx context.Context) error
}

var _ SessionReceiver = (*azservicebus.SessionReceiver)(nil)

// AcceptSessionFunc accepts the next session with messages
// (Client.AcceptNextSessionForQueue / …ForSubscription). When none is
// available it fails with an *azservicebus.Error whose Code is
// CodeTimeout, which the processor takes as the broker answering.
type AcceptSessionFunc func(ctx context.Context) (SessionReceiver, error)

// sessionWatch bounds a session delivery's watch of a live holder's
// claim (watchUntil): in effect, no bound.
const sessionWatch = 365 * 24 * time.Hour

// Session mode defaults.
const (
	DefaultMaxConcurrentSessions = 8
	DefaultSessionIdleTimeout    = time.Minute
)

// checkSessions validates and fills the session options (New).
func (o *Options) checkSessions() error {
	if o.AcceptSession == nil {
		if o.MaxConcurrentSessions != 0 || o.SessionIdleTimeout != 0 {
			return errors.New("processor: MaxConcurrentSessions and SessionIdleTimeout need AcceptSession (session mode)")
		}
		return nil
	}
	if o.MaxConcurrentSessions < 0 {
		return fmt.Errorf("processor: MaxConcurrentSessions cannot be negative (got %d)", o.MaxConcurrentSessions)
	}
	if o.SessionIdleTimeout < 0 {
		return fmt.Errorf("processor: SessionIdleTimeout cannot be negative (got %s)", o.SessionIdleTimeout)
	}
	if o.NewReceiver != nil {
		return errors.New("processor: set NewReceiver or AcceptSession, not both: an entity either requires sessions or does not")
	}
	if o.MaxLockRenewal < 0 {
		return fmt.Errorf("processor: session mode needs lock renewal (MaxLockRenewal %s): a session is held across its messages by renewing its lock", o.MaxLockRenewal)
	}
	if o.MaxConcurrentSessions == 0 {
		o.MaxConcurrentSessions = DefaultMaxConcurrentSessions
	}
	if o.SessionIdleTimeout == 0 {
		o.SessionIdleTimeout = DefaultSessionIdleTimeout
	}
	return nil
}

// sessionDelivery is what a delivery in a session carries besides the
// message (delivery.sess). Its methods are nil-safe: a delivery outside
// a session has none.
type sessionDelivery struct {
	id string
	// holds counts the retries this delivery waited for (each grows the
	// route's backoff like a postponement); firstHold is when it first
	// held (the route's horizon counts from it).
	holds     int
	firstHold time.Time
	// The last decision's claim, wait and whether it holds the session.
	claim       *claim.Claim
	wait        time.Duration
	write       protocol.Write
	holdSession bool
}

func (s *sessionDelivery) holdCount() int {
	if s == nil {
		return 0
	}
	return s.holds
}

// claimFacts is claimFacts(c) with this delivery's holds counted as
// postponements.
func (s *sessionDelivery) claimFacts(c *claim.Claim) protocol.Claim {
	f := claimFacts(c)
	if s == nil || s.holds == 0 {
		return f
	}
	f.Postponements += s.holds
	since := time.Since(s.firstHold)
	if f.Postponed {
		f.SincePostponed += since
	} else {
		f.Postponed, f.SincePostponed = true, since
	}
	return f
}

// decided records decision dec on claim c (perform, once its write
// committed).
func (s *sessionDelivery) decided(c *claim.Claim, dec protocol.Decision) {
	if s == nil {
		return
	}
	s.claim, s.wait, s.write, s.holdSession = c, dec.Wait, dec.Write, dec.HoldSession
}

// sessionLink adapts a SessionReceiver to Receiver, for the settlement
// path every delivery goes through. A session's message lock is its
// session's lock: the session renews it, not the message.
type sessionLink struct{ SessionReceiver }

var errNoDeferralInSessions = errors.New("processor: messages are not deferred in session mode (a deferred message would be overtaken by its session's next one)")

func (l sessionLink) RenewMessageLock(ctx context.Context, _ *azservicebus.ReceivedMessage, _ *azservicebus.RenewMessageLockOptions) error {
	return l.RenewSessionLock(ctx, nil)
}

func (l sessionLink) DeferMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.DeferMessageOptions) error {
	return errNoDeferralInSessions
}

func (l sessionLink) ReceiveDeferredMessages(context.Context, []int64, *azservicebus.ReceiveDeferredMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	return nil, errNoDeferralInSessions
}

// errSessionLockLost ends a session's context when its lock is lost.
var errSessionLockLost = errors.New("session lock lost")

// runSessions is Run in session mode: MaxConcurrentSessions workers, each
// accepting a session, working it, and accepting the next.
func (p *Processor) runSessions(ctx context.Context) error {
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(p.opts.ShutdownTimeout, cancelWork)
		context.AfterFunc(work, func() { t.Stop() })
	})
	defer stop()

	p.checkStore(ctx)
	p.receiverOpen.Store(true)
	defer p.receiverOpen.Store(false)
	var wg sync.WaitGroup
	for range p.opts.MaxConcurrentSessions {
		wg.Go(func() { p.sessionWorker(ctx, work) })
	}
	wg.Wait()
	p.inflight.Wait()
	p.waitForBatches()
	return nil
}

// sessionWorker accepts sessions one after the other until ctx ends.
func (p *Processor) sessionWorker(ctx, work context.Context) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 200 * time.Millisecond
	b.MaxInterval = 30 * time.Second
	for ctx.Err() == nil {
		if p.breaker.isOpen() {
			p.waitForStore(ctx)
			continue
		}
		if wait := p.routes.pause(); wait > 0 {
			p.waitForRoutes(ctx, wait)
			continue
		}
		// The SDK gives the service the deadline as its accept timeout: an
		// idle entity answers CodeTimeout within BrokerProbeInterval, which
		// keeps Ready honest without a probe of its own.
		actx, cancel := context.WithTimeout(ctx, p.opts.BrokerProbeInterval)
		sr, err := p.opts.AcceptSession(actx)
		cancel()
		switch {
		case ctx.Err() != nil:
			if err == nil {
				p.closeSession(sr)
			}
			return
		case sbCode(err) == azservicebus.CodeTimeout:
			p.brokerAnswered(time.Now()) // no session has messages: the broker answered
			b.Reset()
			continue
		case errors.Is(err, context.DeadlineExceeded):
			p.brokerFailed(errors.New("accepting a session: Service Bus did not answer within BrokerProbeInterval"))
			continue
		case err != nil:
			p.brokerFailed(err)
			sleep(ctx, b.NextBackOff())
			continue
		}
		b.Reset()
		p.brokerAnswered(time.Now())
		p.metrics.Receivers.Inc()
		if p.workSession(ctx, work, sr) {
			// The session gave a message back (the store or the broker
			// failed): wait before accepting again, or it comes straight
			// back.
			sleep(ctx, b.NextBackOff())
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// closeSession releases a session (on its own short context).
func (p *Processor) closeSession(sr SessionReceiver) {
	ctx, cancel := context.WithTimeout(context.Background(), p.opts.SettleTimeout)
	defer cancel()
	_ = sr.Close(ctx)
}

// sessionHold is a session's state while it is held for an operator: the
// claim whose failure holds it.
type sessionHold struct {
	HeldBy int64     `json:"heldByClaim"`
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
}

// workSession works one accepted session until it is idle for
// SessionIdleTimeout, its lock is lost, or ctx ends, then closes it. It
// reports whether it ended by giving a message back (abandoned).
func (p *Processor) workSession(ctx, work context.Context, sr SessionReceiver) (gaveBack bool) {
	sid := sr.SessionID()
	log := p.log.With("session_id", sid)
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopRenewal := p.renewSession(sctx, sr, log, cancel)
	lr := &liveReceiver{r: sessionLink{sr}}
	crashed := false
	defer func() {
		stopRenewal()
		lr.pending.Wait()
		if !crashed {
			p.closeSession(sr)
		}
	}()
	log.Debug("session accepted")

	if !p.waitHeldSession(sctx, work, sr, log) {
		return false
	}
	for sctx.Err() == nil {
		// While the store refuses work, or every route's breaker is open,
		// a message received would only be given back (a delivery spent):
		// release the session and wait in sessionWorker instead. Other
		// workers may have accepted it meanwhile; they look here first too.
		if p.breaker.isOpen() || p.routes.pause() > 0 {
			return false
		}
		rctx, rcancel := context.WithTimeout(sctx, p.opts.SessionIdleTimeout)
		msgs, err := sr.ReceiveMessages(rctx, 1, nil)
		rcancel()
		if len(msgs) == 0 {
			switch {
			case sctx.Err() != nil:
			case err == nil || errors.Is(err, context.DeadlineExceeded):
				log.Debug("session idle: released", "idle", p.opts.SessionIdleTimeout.String())
			case isLockLost(err):
				p.metrics.LockLosses.Inc()
				log.Warn("session lock lost while receiving", "error", err)
			default:
				log.Warn("session receive failed: releasing the session", "error", err)
				if needsNewReceiver(err) {
					p.brokerFailed(err)
				}
			}
			return false
		}
		p.brokerAnswered(time.Now())
		v, hold := p.sessionMessage(sctx, work, lr, msgs[0], sid)
		switch {
		case v.result == ResultCrashed:
			// A test hook "killed" the replica here: drop the session
			// as a dead process would, without closing it; its lock
			// runs out and the session goes to the next receiver.
			crashed = true
			return false
		case v.settle == settleAbandon:
			return true
		}
		if hold != nil && !p.holdSession(sctx, work, sr, *hold, log) {
			return false
		}
	}
	if cause := context.Cause(sctx); errors.Is(cause, errSessionLockLost) {
		log.Warn("session lock lost: the session goes to the next receiver")
	}
	return false
}

// sessionMessage takes one message of a session through the protocol and
// settles it. A retry (protocol.Retry) waits the route's backoff holding
// the claim and the session, and runs the effect again, until another
// decision ends the delivery. When the delivery ends on a claim that
// holds its session (holdFor), the hold is recorded in the session state
// before the message is settled, and returned: a replica that dies after
// the dead letter leaves the hold to the session's next holder.
func (p *Processor) sessionMessage(ctx, work context.Context, lr *liveReceiver, m *azservicebus.ReceivedMessage, sid string) (verdict, *sessionHold) {
	lr.pending.Add(1)
	p.inflight.Add(1)
	d := &delivery{msg: m, lr: lr, received: time.Now(), owner: uuid.New(), sess: &sessionDelivery{id: sid},
		log: p.log.With("message_id", m.MessageID, "delivery_count", m.DeliveryCount, "session_id", sid)}
	p.startProcess(d)
	d.tr.setSession(sid)
	d.stopRenewal = func() {} // the session's lock is renewed, not the message's
	var v verdict
	switch {
	case ctx.Err() != nil:
		v = abandoned(ResultAbandoned, "why", "shutting down")
	default:
		if reason, desc := p.validate(d); reason != "" {
			v = deadLettered(ResultDeadLettered, reason, desc)
		} else if d.handler.TxEffect != nil {
			v = p.runTx(ctx, d.traced(work), d)
		} else {
			v = p.claimOne(ctx, d.traced(work), d)
		}
	}
	for v.settle == protocol.Retry {
		v = p.retryHeld(ctx, work, d)
	}
	hold := p.holdFor(work, d, v)
	if hold != nil {
		p.recordHold(ctx, lr.r.(sessionLink), *hold, d.log)
	}
	p.settle(d, v)
	return v, hold
}

// holdFor is the hold a delivery that ended with verdict v puts on its
// session, nil for none: on a route that holds its session on failure,
// when the claim is failed or flagged — by this delivery's decision, or
// found so (a copy of a failed claim's message; a redelivery after a
// replica died between failing the claim and recording the hold).
func (p *Processor) holdFor(work context.Context, d *delivery, v verdict) *sessionHold {
	if v.result == ResultCrashed || !d.handler.HoldSessionOnFailure || d.claimID == 0 {
		return nil
	}
	if s := d.sess; s.holdSession && s.claim != nil {
		return &sessionHold{HeldBy: s.claim.ID, Reason: cmpOrString(v.reason, v.description), Since: time.Now().UTC()}
	}
	c, err := p.get(work, d.claimID)
	if err != nil {
		d.log.Warn("reading the claim to see whether it holds its session failed; the session goes on", "error", err)
		return nil
	}
	if c.State != claim.StateFailed && c.State != claim.StateFlagged {
		return nil
	}
	return &sessionHold{HeldBy: c.ID, Reason: cmpOrString(c.FailReason, c.FlagReason), Since: time.Now().UTC()}
}

func cmpOrString(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// retryHeld waits a held delivery's backoff, heartbeating its claim, then
// runs the effect again. A lost claim ends it as lost; a lost session
// lock or a shutdown ends the wait: a claim whose last attempt was
// definitely not performed is released for the session's next holder,
// an unknown one is left to go silent (it is taken over after
// TakeoverAfter), and the message is abandoned (it stays first in its
// session).
func (p *Processor) retryHeld(ctx, work context.Context, d *delivery) verdict {
	s, c := d.sess, d.sess.claim
	if s.holds == 0 {
		s.firstHold = time.Now()
	}
	s.holds++
	d.log.Info("holding the session: the effect runs again after the route's backoff", "next_attempt_in", s.wait.Round(time.Millisecond).String(), "holds", s.holds)
	err := p.heartbeatFor(ctx, work, c, s.wait)
	switch {
	case errors.Is(err, claim.ErrStateChanged):
		return p.lost(work, d, c, sideeffects.OutcomeRetryable)
	case err != nil:
		// ctx ended: a shutdown or a lost session lock.
		why := "shutting down while holding a retry"
		if errors.Is(context.Cause(ctx), errSessionLockLost) {
			why = "session lock lost while holding a retry"
		}
		if rerr := p.release(work, c, errors.New(why), nil); rerr != nil {
			d.log.Warn("releasing the held claim failed; it is taken over once silent", "error", rerr)
		}
		return abandoned(ResultReleased, "why", why)
	}
	// The message is held as long as its session: its renewal window
	// (MaxLockRenewal, which bounds an attempt) starts again.
	d.received = time.Now()
	return p.runHeld(d.traced(work), d, c)
}

// heartbeatFor waits for wait, writing claim c's heartbeat every
// HeartbeatInterval meanwhile (the holder is alive: no take-over, no
// recovery). It returns claim.ErrStateChanged (wrapped) when the claim is
// no longer this holder's, ctx's error when ctx ends first.
func (p *Processor) heartbeatFor(ctx, work context.Context, c *claim.Claim, wait time.Duration) error {
	done := time.NewTimer(wait)
	defer done.Stop()
	tick := time.NewTicker(p.opts.HeartbeatInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-done.C:
			return nil
		case <-tick.C:
			hctx, cancel := context.WithTimeout(work, p.opts.StoreTimeout)
			err := p.opts.Store.Heartbeat(hctx, &claim.HeartbeatParams{ID: c.ID, Owner: c.Owner})
			cancel()
			p.countHeartbeat(err)
			if errors.Is(err, claim.ErrStateChanged) {
				return err
			}
		}
	}
}

// renewSession renews sr's session lock at half of its remaining time
// until stop is called; when the lock is lost it cancels the session's
// context with errSessionLockLost.
func (p *Processor) renewSession(ctx context.Context, sr SessionReceiver, log *slog.Logger, lost context.CancelCauseFunc) (stop func()) {
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		next := func() time.Duration { return max(time.Until(sr.LockedUntil())/2, 10*time.Millisecond) }
		t := time.NewTimer(next())
		defer t.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-t.C:
			}
			cctx, ccancel := context.WithTimeout(rctx, p.opts.SettleTimeout)
			err := sr.RenewSessionLock(cctx, nil)
			ccancel()
			switch {
			case err == nil:
				p.metrics.LockRenewals.Inc()
			case isLockLost(err):
				p.metrics.LockLosses.Inc()
				log.Warn("session lock lost; waits end, the claim decides running effects", "error", err)
				lost(errSessionLockLost)
				return
			case rctx.Err() != nil:
				return
			default:
				p.metrics.LockRenewalFailures.Inc()
				log.Warn("session lock renewal failed; trying again", "error", err)
			}
			t.Reset(next())
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// recordHold writes hold to the session state, for whoever holds the
// session next.
func (p *Processor) recordHold(ctx context.Context, sr SessionReceiver, hold sessionHold, log *slog.Logger) {
	state, _ := json.Marshal(hold)
	sctx, cancel := context.WithTimeout(ctx, p.opts.SettleTimeout)
	err := sr.SetSessionState(sctx, state, nil)
	cancel()
	if err != nil {
		// Not recorded: this holder keeps the session and waits; a
		// restart loses the hold (the claim still shows its failure).
		log.Warn("recording the session's hold failed", "error", err)
	}
}

// holdSession waits, the hold recorded (recordHold), until an operator
// acts on the claim (waitHeld). It reports whether the session goes on.
func (p *Processor) holdSession(ctx, work context.Context, sr SessionReceiver, hold sessionHold, log *slog.Logger) bool {
	p.metrics.SessionsHeld.Inc()
	defer p.metrics.SessionsHeld.Dec()
	log.Warn("session held until an operator acts on the claim", "held_by_claim", hold.HeldBy, "reason", hold.Reason)
	return p.waitHeld(ctx, work, sr, hold, log)
}

// waitHeldSession reads the session state of a session just accepted: a
// session held for an operator (by this or another replica before it
// lost or released the session) waits here. It reports whether the
// session goes on.
func (p *Processor) waitHeldSession(ctx, work context.Context, sr SessionReceiver, log *slog.Logger) bool {
	gctx, cancel := context.WithTimeout(ctx, p.opts.SettleTimeout)
	state, err := sr.GetSessionState(gctx, nil)
	cancel()
	if err != nil {
		log.Warn("reading the session state failed: releasing the session", "error", err)
		return false
	}
	if len(state) == 0 {
		return true
	}
	var hold sessionHold
	if err := json.Unmarshal(state, &hold); err != nil || hold.HeldBy == 0 {
		// Another application's state: not ours to read or clear.
		log.Warn("the session has a state sbclaim did not write; ignored", "state_bytes", len(state))
		return true
	}
	p.metrics.SessionsHeld.Inc()
	defer p.metrics.SessionsHeld.Dec()
	log.Info("session held until an operator acts on the claim", "held_by_claim", hold.HeldBy, "since", hold.Since)
	return p.waitHeld(ctx, work, sr, hold, log)
}

// waitHeld polls the holding claim every HeartbeatInterval until it is no
// longer failed or flagged (an operator retried, redrove, handed off or
// resolved it), then clears the session state: the session goes on. It
// reports false when ctx ended first (a shutdown, a lost session lock):
// the state stays, for the session's next holder.
func (p *Processor) waitHeld(ctx, work context.Context, sr SessionReceiver, hold sessionHold, log *slog.Logger) bool {
	poll := time.NewTicker(p.opts.HeartbeatInterval)
	defer poll.Stop()
	for {
		c, err := p.get(work, hold.HeldBy)
		switch {
		case errors.Is(err, claim.ErrNotFound):
			log.Warn("the claim holding the session is gone (purged?): the session goes on", "held_by_claim", hold.HeldBy)
		case err != nil:
			log.Warn("reading the claim holding the session failed", "held_by_claim", hold.HeldBy, "error", err)
		case c.State != claim.StateFailed && c.State != claim.StateFlagged:
			log.Info("an operator acted on the claim holding the session: the session goes on", "held_by_claim", hold.HeldBy, "claim_state", string(c.State))
		}
		if errors.Is(err, claim.ErrNotFound) || (err == nil && c.State != claim.StateFailed && c.State != claim.StateFlagged) {
			sctx, cancel := context.WithTimeout(ctx, p.opts.SettleTimeout)
			err := sr.SetSessionState(sctx, nil, nil)
			cancel()
			if err != nil {
				log.Warn("clearing the session's hold failed: releasing the session", "error", err)
				return false
			}
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-poll.C:
		}
	}
}

// setSession puts the session id on the process span (nil-safe).
func (t *deliveryTrace) setSession(id string) {
	if t == nil {
		return
	}
	t.span.SetAttributes(attribute.String("sbclaim.session_id", id))
}

// flagSilentManual flags, for operators, a claim of a manual route whose
// holder went silent, found by a delivery in a session: its outcome is
// unknown and nobody may repeat it, and the session's next message must
// not run before someone decides (without sessions the reconciler flags
// it later, and the copy completes). The flag is guarded on the holder's
// silence; ok is false when it was refused (the holder showed life, or
// the claim changed): the delivery looks again.
func (p *Processor) flagSilentManual(work context.Context, d *delivery, c *claim.Claim) (v verdict, ok bool) {
	reason := fmt.Sprintf("route %q (recovery manual): holder %s silent for %s in session %s: its effect's outcome is unknown and may not be repeated",
		d.handler.Name, c.ClaimedBy, p.opts.TakeoverAfter, d.sess.id)
	sctx, cancel := context.WithTimeout(work, p.opts.StoreTimeout)
	defer cancel()
	_, err := p.opts.Store.Flag(sctx, &claim.FlagParams{ID: c.ID, Owner: c.Owner, State: c.State, SilentFor: p.opts.TakeoverAfter, Reason: reason, By: p.opts.Host})
	switch {
	case err == nil:
		d.log.Warn("claim flagged for operators: its holder went silent on a manual route, in a session", "holder", c.ClaimedBy)
		return p.verdictOf(d, protocol.FlagDecision(claimFacts(c), reason), nil), true
	case errors.Is(err, claim.ErrStateChanged):
		return verdict{}, false
	}
	p.storeErr(err)
	return abandoned(ResultAbandoned, "why", "flagging a silent holder's claim failed", "error", err), true
}
