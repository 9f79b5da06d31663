package processor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/held"
)

// The outbox relay (docs/design.md, Outbox). A handler's follow-up
// messages are written with its claim's outcome (MarkProcessed, or
// ClaimTx's transaction); the relay sends them and marks each sent:
//
//   - the fast path: right after a claim's outcome is committed, the
//     processor hands its id to the relay, which leases that claim's
//     follow-ups and sends them (on its own goroutines: the message's
//     settlement does not wait for them);
//   - the sweep: every SweepInterval it leases what is left, oldest
//     first — the follow-ups of a replica that died between its outcome
//     and its sends (or between a send and its mark: the lease runs out),
//     of a failed send (due again after its backoff), of a full fast-path
//     queue, of the reconciler's recoveries — and sends them.
//
// Each row is leased (by the database clock) before it is sent, so two
// relays do not send it at once, and marked sent under its lease. A relay
// that dies between its send and its mark leaves the row pending: it is
// sent again, with the same MessageId (claim.FollowUpMessageID), which
// Service Bus duplicate detection drops and the next sbclaim consumer's
// claim deduplicates. Follow-ups are at least once, never lost, and
// carry no order among themselves.

// Sender is the part of *azservicebus.Sender the relay uses. The SDK's
// sender satisfies it; so does the in-memory broker's (package membus).
type Sender interface {
	SendMessage(ctx context.Context, message *azservicebus.Message, options *azservicebus.SendMessageOptions) error
	Close(ctx context.Context) error
}

var _ Sender = (*azservicebus.Sender)(nil)

// NewSenderFunc opens a sender to a queue or topic (azservicebus
// Client.NewSender). The relay keeps one per target, and opens it again
// after the SDK reports it closed or its connection lost.
type NewSenderFunc func(target string) (Sender, error)

// OutboxOptions configure the relay. The outbox is on when NewSender is
// set and the store is a claim.Outbox; otherwise a handler's Publish
// fails with claim.ErrNoOutbox.
type OutboxOptions struct {
	NewSender NewSenderFunc
	// Lease is how long a relay holds a follow-up it is sending (default
	// 1m); it must exceed SendTimeout. A relay that dies holding one
	// leaves it to the sweep once the lease ends.
	Lease time.Duration
	// SendTimeout bounds each send (default 10s).
	SendTimeout time.Duration
	// SweepInterval is how often the sweep looks for pending follow-ups
	// (default 5s).
	SweepInterval time.Duration
	// Batch is how many follow-ups one lease of the sweep takes (default
	// 64).
	Batch int
	// MinBackoff and MaxBackoff bound the wait after a failed send
	// (doubling per attempt, with jitter; defaults 1s and 5m).
	MinBackoff, MaxBackoff time.Duration
	// Workers is how many fast-path sends run at once (default 4).
	Workers int
	// AfterSend is a fault-injection seam (the chaos harness): called
	// after a follow-up was sent, before it is marked; ErrCrash ends the
	// relay's work on it there, as if the replica died.
	AfterSend func(ctx context.Context, f *claim.StoredFollowUp) error
}

func (o *OutboxOptions) defaults() error {
	o.Lease = cmpOr(o.Lease, time.Minute)
	o.SendTimeout = cmpOr(o.SendTimeout, 10*time.Second)
	o.SweepInterval = cmpOr(o.SweepInterval, 5*time.Second)
	o.MaxBackoff = cmpOr(o.MaxBackoff, 5*time.Minute)
	o.MinBackoff = cmpOr(o.MinBackoff, min(time.Second, o.MaxBackoff))
	if o.Batch == 0 {
		o.Batch = 64
	}
	if o.Workers == 0 {
		o.Workers = 4
	}
	switch {
	case o.Lease < 0 || o.SendTimeout < 0 || o.SweepInterval < 0 || o.MinBackoff < 0 || o.MaxBackoff < 0 || o.Batch < 0 || o.Workers < 0:
		return fmt.Errorf("processor: the outbox's settings cannot be negative (Lease %s, SendTimeout %s, SweepInterval %s, MinBackoff %s, MaxBackoff %s, Batch %d, Workers %d)",
			o.Lease, o.SendTimeout, o.SweepInterval, o.MinBackoff, o.MaxBackoff, o.Batch, o.Workers)
	case o.Lease <= o.SendTimeout:
		return fmt.Errorf("processor: the outbox's Lease (%s) must exceed its SendTimeout (%s): a send still running would lose its lease", o.Lease, o.SendTimeout)
	case o.MaxBackoff < o.MinBackoff:
		return fmt.Errorf("processor: the outbox's MaxBackoff (%s) is below its MinBackoff (%s)", o.MaxBackoff, o.MinBackoff)
	}
	return nil
}

// outbox returns the store's outbox when the relay is on (NewSender set),
// and fills the relay's defaults. Call it before the store is wrapped
// (the group commit passes on only claim.Store).
func (o *Options) outbox() (claim.Outbox, error) {
	if o.Outbox.NewSender == nil {
		return nil, nil
	}
	ob, ok := o.Store.(claim.Outbox)
	if !ok {
		return nil, fmt.Errorf("processor: Outbox.NewSender is set, but the store (%T) has no outbox", o.Store)
	}
	if err := o.Outbox.defaults(); err != nil {
		return nil, err
	}
	return ob, nil
}

func cmpOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// relay sends a processor's follow-ups.
type relay struct {
	p     *Processor
	store claim.Outbox
	opts  OutboxOptions
	owner uuid.UUID // this relay's lease token
	fast  chan int64

	mu      sync.Mutex
	senders map[string]Sender
}

// fastQueue bounds the claims waiting for the fast path; beyond it the
// sweep sends their follow-ups.
const fastQueue = 1024

func newRelay(p *Processor, store claim.Outbox, opts OutboxOptions) *relay {
	return &relay{p: p, store: store, opts: opts, owner: uuid.New(), fast: make(chan int64, fastQueue), senders: map[string]Sender{}}
}

// publishes reports whether handlers may publish follow-ups.
func (p *Processor) publishes() bool { return p.relay != nil }

// followUpsRecorded hands claim id, whose outcome was just committed with
// follow-ups, to the fast path (a full queue leaves them to the sweep).
func (p *Processor) followUpsRecorded(id int64) {
	if p.relay == nil {
		return
	}
	select {
	case p.relay.fast <- id:
	default:
	}
}

// startRelay runs the relay's fast path and sweep until stop is called
// (Run calls it once its messages are finished). Sends and store writes
// run on work, each with its own timeout.
func (p *Processor) startRelay(work context.Context) (stop func()) {
	if p.relay == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(work)
	var wg sync.WaitGroup
	for range p.relay.opts.Workers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case id := <-p.relay.fast:
					p.relay.sendClaim(ctx, id)
				}
			}
		})
	}
	wg.Go(func() { p.relay.sweep(ctx) })
	return func() {
		cancel()
		wg.Wait()
		p.relay.closeSenders()
	}
}

// sendClaim is the fast path: lease claim id's follow-ups and send them.
func (r *relay) sendClaim(ctx context.Context, id int64) {
	lctx, cancel := context.WithTimeout(ctx, r.p.opts.StoreTimeout)
	fus, err := r.store.LeaseFollowUps(lctx, &claim.LeaseFollowUpsParams{Owner: r.owner, For: r.opts.Lease, ClaimID: id, Limit: claim.MaxFollowUps})
	cancel()
	if err != nil {
		r.p.storeErr(err)
		r.p.log.Warn("outbox: could not lease a claim's follow-ups; the sweep sends them", "claim_id", id, "error", err)
		return
	}
	r.sendAll(ctx, fus)
}

// sweep sends what the fast path left, every SweepInterval.
func (r *relay) sweep(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.sweepOnce(ctx)
		t.Reset(jitter(r.opts.SweepInterval))
	}
}

// sweepOnce leases and sends pending follow-ups in batches until none is
// left, a send fails (Service Bus is failing: the next pass tries again)
// or the store does (its breaker pauses the sweep as it pauses receives).
// While Service Bus does not answer the processor's receiver (Ready says
// so) the sweep waits too, rather than spend its leases and backoffs.
func (r *relay) sweepOnce(ctx context.Context) {
	if r.p.breaker.isOpen() || !r.p.brokerOK.Load() {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, r.p.opts.StoreTimeout)
	st, err := r.store.OutboxStats(sctx)
	cancel()
	if err != nil {
		r.p.storeErr(err)
		r.p.log.Warn("outbox: could not read the pending follow-ups", "error", err)
		return
	}
	r.p.metrics.FollowUpsPending.Set(float64(st.Pending))
	age := 0.0
	if st.OldestPending != nil {
		age = max(st.Now.Sub(*st.OldestPending).Seconds(), 0)
	}
	r.p.metrics.FollowUpOldestSeconds.Set(age)
	for ctx.Err() == nil && st.Pending > 0 {
		lctx, cancel := context.WithTimeout(ctx, r.p.opts.StoreTimeout)
		fus, err := r.store.LeaseFollowUps(lctx, &claim.LeaseFollowUpsParams{Owner: r.owner, For: r.opts.Lease, Limit: r.opts.Batch})
		cancel()
		if err != nil {
			r.p.storeErr(err)
			r.p.log.Warn("outbox: could not lease pending follow-ups", "error", err)
			return
		}
		if failed := r.sendAll(ctx, fus); failed > 0 || len(fus) < r.opts.Batch {
			return
		}
	}
}

// sendAll sends leased follow-ups one by one and returns how many sends
// failed.
func (r *relay) sendAll(ctx context.Context, fus []*claim.StoredFollowUp) (failed int) {
	for _, f := range fus {
		if ctx.Err() != nil {
			return failed // the lease runs out; the next relay sends it
		}
		switch err := r.send(ctx, f); {
		case errors.Is(err, ErrCrash):
			return failed
		case err != nil:
			failed++
		}
	}
	return failed
}

// send sends one leased follow-up and marks it sent; a failed send is
// given back with a backoff.
func (r *relay) send(ctx context.Context, f *claim.StoredFollowUp) error {
	log := r.p.log.With("claim_id", f.ClaimID, "followup", f.Position, "to", f.To, "message_id", f.MessageID)
	lease := claim.FollowUpLeaseParams{ClaimID: f.ClaimID, Position: f.Position, Owner: r.owner}
	err := r.sendMessage(ctx, f)
	if err != nil {
		r.p.metrics.FollowUpSends.With("failed").Inc()
		wait := r.backoff(f.Attempts)
		log.Warn("outbox: sending a follow-up failed; retrying later", "attempt", f.Attempts, "retry_in", wait.Round(time.Millisecond).String(), "error", err)
		wctx, cancel := context.WithTimeout(ctx, r.p.opts.StoreTimeout)
		defer cancel()
		if werr := r.store.RetryFollowUp(wctx, &claim.RetryFollowUpParams{FollowUpLeaseParams: lease, Error: claim.ErrorText(err), RetryIn: wait}); werr != nil {
			r.p.storeErr(werr)
			log.Warn("outbox: could not record the failed send; the lease runs out", "error", werr)
		}
		return err
	}
	if f.Attempts > 1 {
		r.p.metrics.FollowUpResends.Inc()
	}
	if h := r.opts.AfterSend; h != nil {
		if err := h(ctx, f); errors.Is(err, ErrCrash) {
			return ErrCrash
		}
	}
	wctx, cancel := context.WithTimeout(ctx, r.p.opts.StoreTimeout)
	defer cancel()
	if err := r.store.MarkFollowUpSent(wctx, &lease); err != nil {
		// Sent, not marked: it is sent again, with the same MessageId,
		// once the lease runs out (or by the relay that holds it now).
		r.p.metrics.FollowUpSends.With("unmarked").Inc()
		r.p.storeErr(err)
		log.Warn("outbox: a follow-up was sent but could not be marked; it will be sent again with the same MessageId", "error", err)
		return nil
	}
	r.p.metrics.FollowUpSends.With("sent").Inc()
	log.Debug("outbox: follow-up sent")
	return nil
}

// sendMessage sends f to its target.
func (r *relay) sendMessage(ctx context.Context, f *claim.StoredFollowUp) error {
	s, err := r.sender(f.To)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, r.opts.SendTimeout)
	defer cancel()
	err = s.SendMessage(sctx, MessageOf(f), nil)
	if needsNewReceiver(err) { // the sender's link or connection is gone
		r.dropSender(f.To, s)
	}
	return err
}

// MessageOf is the Service Bus message of a follow-up.
func MessageOf(f *claim.StoredFollowUp) *azservicebus.Message {
	m := &azservicebus.Message{MessageID: &f.MessageID, Body: f.Body}
	str := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	m.Subject, m.ContentType, m.CorrelationID, m.SessionID = str(f.Subject), str(f.ContentType), str(f.CorrelationID), str(f.SessionID)
	if f.ScheduledAt != nil {
		t := *f.ScheduledAt
		m.ScheduledEnqueueTime = &t
	}
	if len(f.Properties) > 0 {
		m.ApplicationProperties = make(map[string]any, len(f.Properties))
		for k, v := range f.Properties {
			m.ApplicationProperties[k] = v
		}
	}
	return m
}

func (r *relay) sender(target string) (Sender, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.senders[target]; s != nil {
		return s, nil
	}
	s, err := r.opts.NewSender(target)
	if err != nil {
		return nil, fmt.Errorf("open a sender to %q: %w", target, err)
	}
	r.senders[target] = s
	return s, nil
}

func (r *relay) dropSender(target string, s Sender) {
	r.mu.Lock()
	if r.senders[target] == s {
		delete(r.senders, target)
	}
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), r.opts.SendTimeout)
	defer cancel()
	_ = s.Close(ctx)
}

func (r *relay) closeSenders() {
	r.mu.Lock()
	senders := r.senders
	r.senders = map[string]Sender{}
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), r.opts.SendTimeout)
	defer cancel()
	for _, s := range senders {
		_ = s.Close(ctx)
	}
}

// backoff is the wait after the attempt-th failed send: MinBackoff
// doubled per attempt, at most MaxBackoff, with ±20% jitter.
func (r *relay) backoff(attempt int) time.Duration {
	d := r.opts.MinBackoff
	for i := 1; i < attempt && d < r.opts.MaxBackoff; i++ {
		d *= 2
	}
	return jitter(min(d, r.opts.MaxBackoff))
}

// jitter spreads d by ±20%.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d*8/10 + time.Duration(rand.Int64N(int64(d)*4/10+1))
}

// followUpsOf numbers the follow-ups an attempt published, for claim c's
// outcome write (nil when none).
func followUpsOf(c *claim.Claim, res *held.Result) []claim.FollowUp {
	if res == nil || len(res.FollowUps) == 0 {
		return nil
	}
	return claim.NumberFollowUps(c.Consumer, c.MessageID, res.FollowUps)
}
