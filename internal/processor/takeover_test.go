package processor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/metricreg"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// commitThenFail commits a ClaimBatch and then reports an error, as a
// batch whose COMMIT answer was lost (unavailable) or a SQL Server batch
// whose first chunk committed before a later one failed (refused) does.
type commitThenFail struct {
	claim.Store
	unavailable bool
	once        atomic.Bool
}

func (s *commitThenFail) ClaimBatch(ctx context.Context, p *claim.ClaimBatchParams) ([]claim.ClaimResult, error) {
	res, err := s.Store.ClaimBatch(ctx, p)
	if err != nil || !s.once.CompareAndSwap(false, true) {
		return res, err
	}
	if s.unavailable {
		return nil, fmt.Errorf("connection reset after COMMIT: %w", claim.ErrUnavailable)
	}
	return nil, errors.New("chunk 2: string or binary data would be truncated")
}

// TestPartlyCommittedBatchIsRecognisedAsOwn: the claims a failed ClaimBatch
// did commit carry this delivery's owner tokens. The one-by-one fallback
// of the same delivery recognises them as won and runs each effect once;
// after a lost COMMIT answer (a store-wide error) the delivery keeps its
// message and claims it again once the store answers, with the same
// tokens, so it recognises its own row too. Never a duplicate path that
// skips the effect, never a redelivery.
func TestPartlyCommittedBatchIsRecognisedAsOwn(t *testing.T) {
	for _, unavailable := range []bool{false, true} {
		t.Run(fmt.Sprintf("unavailable=%v", unavailable), func(t *testing.T) {
			b := setup(t, "sqlite", membus.QueueOptions{})
			st := &commitThenFail{Store: b.store, unavailable: unavailable}
			opts := b.options()
			opts.Store = st
			opts.Metrics = metricreg.ProcessorMetrics(nil)
			for i := range 3 {
				b.send(fmt.Sprintf("m%d", i), "pay", `{}`, nil)
			}
			b.start(opts)
			b.waitIdle()
			if !st.once.Load() {
				t.Fatal("no batch failed after committing: the test proves nothing")
			}
			for i := range 3 {
				k := fmt.Sprintf("m%d", i)
				c := b.claimOf(k)
				if b.eff.Performed(k) != 1 || c.State != claim.StateProcessed {
					t.Errorf("%s: performed %d, claim %s; want the effect once and processed", k, b.eff.Performed(k), c.State)
				}
				if c.TakeOvers != 0 {
					t.Errorf("%s: take-overs %d, want 0 (the delivery recognised its own row)", k, c.TakeOvers)
				}
			}
			if s := b.q.Stats(); s.Abandoned != 0 || s.Redeliveries != 0 {
				t.Errorf("abandoned %d, redelivered %d: the delivery must keep its message", s.Abandoned, s.Redeliveries)
			}
			if got := outcomes(opts.Metrics, processor.ResultDuplicate); got != 0 {
				t.Errorf("%d duplicate outcomes: a delivery completed without running its effect", got)
			}
		})
	}
}

// TestLiveHolderIsNeverTakenOver: the holder's message lock is lost while
// its effect runs; the redelivery finds the claim held by an attempt
// whose heartbeat is fresh, waits (its own lock renewed) until the holder
// marks it processed, then completes its copy. The effect runs once.
func TestLiveHolderIsNeverTakenOver(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{LockDuration: 500 * time.Millisecond})
		b.eff.gate = make(chan struct{})
		b.eff.started = make(chan string, 2)
		opts := b.options()
		opts.NoDeferral = true // the abandon path: released, redelivered at once
		opts.HeartbeatInterval = 50 * time.Millisecond
		opts.Metrics = metricreg.ProcessorMetrics(nil)
		b.start(opts)
		b.start(opts) // a second replica to receive the redelivery
		b.send("slow", "pay", `{}`, nil)
		<-b.eff.started
		if b.q.ExpireLock("slow") != 1 {
			t.Fatal("no lock to expire")
		}
		b.eventually("the redelivery to wait for the live holder", func() bool {
			return metricValue(opts.Metrics.DuplicateWaits) == 1
		})
		// Longer than TakeoverAfter (150ms): a waiter that ignored the
		// heartbeat would have taken the claim over by now.
		time.Sleep(4 * 3 * opts.HeartbeatInterval)
		close(b.eff.gate)
		b.waitIdle()
		c := b.claimOf("slow")
		if c.State != claim.StateProcessed || c.TakeOvers != 0 {
			t.Errorf("claim %s, take-overs %d; want processed by its first holder", c.State, c.TakeOvers)
		}
		if got := b.eff.Calls("slow"); got != 1 {
			t.Errorf("effect called %d times, want 1", got)
		}
		b.eventually("one processed (the holder, whose complete finds its lock lost) and one duplicate (the waiter)", func() bool {
			return outcomes(opts.Metrics, processor.ResultProcessed) == 1 && outcomes(opts.Metrics, processor.ResultDuplicate) == 1
		})
		if got := countCompleted(b.q, "slow"); got != 1 {
			t.Errorf("completed %d, want 1 (the waiter's delivery)", got)
		}
	})
}

// gatedStore refuses every call once dead is set: a replica that died.
type gatedStore struct {
	claim.Store
	dead *atomic.Bool
}

func (g gatedStore) check() error {
	if g.dead.Load() {
		return errDead
	}
	return nil
}

func (g gatedStore) ClaimBatch(ctx context.Context, p *claim.ClaimBatchParams) ([]claim.ClaimResult, error) {
	if err := g.check(); err != nil {
		return nil, err
	}
	return g.Store.ClaimBatch(ctx, p)
}

func (g gatedStore) TakeOver(ctx context.Context, p *claim.TakeOverParams) (*claim.Claim, error) {
	if err := g.check(); err != nil {
		return nil, err
	}
	return g.Store.TakeOver(ctx, p)
}

func (g gatedStore) Get(ctx context.Context, id int64) (*claim.Claim, error) {
	if err := g.check(); err != nil {
		return nil, err
	}
	return g.Store.Get(ctx, id)
}

func (g gatedStore) RecordAttempt(ctx context.Context, p *claim.RecordAttemptParams) error {
	if err := g.check(); err != nil {
		return err
	}
	return g.Store.RecordAttempt(ctx, p)
}

func (g gatedStore) Release(ctx context.Context, p *claim.ReleaseParams) error {
	if err := g.check(); err != nil {
		return err
	}
	return g.Store.Release(ctx, p)
}

func (g gatedStore) Heartbeat(ctx context.Context, p *claim.HeartbeatParams) error {
	if err := g.check(); err != nil {
		return err
	}
	return g.Store.Heartbeat(ctx, p)
}

func (g gatedStore) MarkProcessed(ctx context.Context, p *claim.MarkProcessedParams) error {
	if err := g.check(); err != nil {
		return err
	}
	return g.Store.MarkProcessed(ctx, p)
}

// deadReceiver stops receiving, renewing and settling once dead is set.
type deadReceiver struct {
	processor.Receiver
	dead *atomic.Bool
}

var errDead = errors.New("replica is dead")

func (d deadReceiver) ReceiveMessages(ctx context.Context, n int, o *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if d.dead.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return d.Receiver.ReceiveMessages(ctx, n, o)
}

func (d deadReceiver) CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.CompleteMessageOptions) error {
	if d.dead.Load() {
		return errDead
	}
	return d.Receiver.CompleteMessage(ctx, m, o)
}

func (d deadReceiver) AbandonMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.AbandonMessageOptions) error {
	if d.dead.Load() {
		return errDead
	}
	return d.Receiver.AbandonMessage(ctx, m, o)
}

func (d deadReceiver) RenewMessageLock(ctx context.Context, msg *azservicebus.ReceivedMessage, o *azservicebus.RenewMessageLockOptions) error {
	if d.dead.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	return d.Receiver.RenewMessageLock(ctx, msg, o)
}

// TestReplicaKilledMidEffectIsRecoveredByRedelivery: replica A dies while
// its effect runs (no more heartbeats, lock renewals or settlements).
// Its lock expires, replica B receives the redelivery, finds the claim
// held by a silent holder, takes it over once the holder has been silent
// for TakeoverAfter, and performs the effect with the same key — no
// reconciler involved.
func TestReplicaKilledMidEffectIsRecoveredByRedelivery(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{LockDuration: 400 * time.Millisecond})
		var dead atomic.Bool
		b.eff.hang = func(call int) bool { return call == 1 } // A's attempt never ends by itself
		b.eff.started = make(chan string, 2)
		optsA := b.options()
		optsA.HeartbeatInterval = 50 * time.Millisecond
		optsA.Host = "replica-a"
		optsA.ShutdownTimeout = 100 * time.Millisecond // its hung effect ends with the test
		optsA.Store = gatedStore{Store: b.store, dead: &dead}
		optsA.NewReceiver = func(context.Context) (processor.Receiver, error) {
			return deadReceiver{Receiver: b.q.NewReceiver(), dead: &dead}, nil
		}
		_, stopA := b.start(optsA)
		b.send("m1", "pay", `{}`, nil)
		<-b.eff.started
		dead.Store(true) // A dies mid-effect

		optsB := b.options()
		optsB.HeartbeatInterval = 50 * time.Millisecond
		optsB.Host = "replica-b"
		optsB.Metrics = metricreg.ProcessorMetrics(nil)
		b.start(optsB)
		b.eventually("B to process the message", func() bool { return outcomes(optsB.Metrics, processor.ResultProcessed) == 1 })
		c := b.claimOf("m1")
		if c.State != claim.StateProcessed || c.TakeOvers != 1 || c.TakeOverPath != claim.PathRedelivery ||
			c.ClaimedBy != "replica-b" || c.PreviousHolder != "replica-a" || !strings.Contains(c.TakeOverReason, "silent") {
			t.Errorf("claim %s, take-overs %d path %q by %q (previous %q, reason %q); want processed by replica-b after taking it from silent replica-a",
				c.State, c.TakeOvers, c.TakeOverPath, c.ClaimedBy, c.PreviousHolder, c.TakeOverReason)
		}
		if got := b.eff.Calls("m1"); got != 2 {
			t.Errorf("effect called %d times, want 2 (A's, then B's with the same key)", got)
		}
		if got := countCompleted(b.q, "m1"); got != 1 {
			t.Errorf("completed %d, want 1", got)
		}
		stopA()
	})
}

// TestRedeliveryUnderAChangedRouteFlags: a claim left by an attempt whose
// route had another fingerprint is not taken over by a delivery routed
// to the new effect: it is flagged with a reason naming both, and the
// message completed; the effect does not run.
func TestRedeliveryUnderAChangedRouteFlags(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	b.eff.behave = func(_, _ string, call int) error { return errPerformedThenLost }
	opts := b.options()
	opts.NoDeferral = true // the abandon path: released, redelivered at once
	opts.Metrics = metricreg.ProcessorMetrics(nil)
	_, stop := b.start(opts)
	b.send("m1", "pay", `{}`, nil)
	b.eventually("an unknown outcome", func() bool { return outcomes(opts.Metrics, processor.ResultUnknown) == 1 })
	stop()

	b.router.fp.Store("fp-effect-v2") // a new routes file: the effect's URL changed
	b.eff.behave = nil
	opts.Metrics = metricreg.ProcessorMetrics(nil)
	b.start(opts)
	b.waitIdle()
	c := b.claimOf("m1")
	if c.State != claim.StateFlagged || !strings.Contains(c.FlagReason, "fp-effect") || !strings.Contains(c.FlagReason, "fp-effect-v2") {
		t.Errorf("claim %s reason %q; want flagged naming both fingerprints", c.State, c.FlagReason)
	}
	if got := b.eff.Calls("m1"); got != 1 {
		t.Errorf("effect called %d times, want 1 (never under the changed route)", got)
	}
	// The outcome is counted just after the message is settled.
	b.eventually("the flagged outcome counted", func() bool { return outcomes(opts.Metrics, processor.ResultFlagged) == 1 })
	if got := countCompleted(b.q, "m1"); got != 1 {
		t.Errorf("completed %d, want 1", got)
	}
}

// TestPanickingEffectIsAnUnknownOutcome: a panic in a Go effect does not
// kill the replica; the attempt's outcome is unknown (the effect may have
// done something), the claim is kept, and the redelivery repeats it once
// the claim is silent.
func TestPanickingEffectIsAnUnknownOutcome(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	b.eff.behave = func(_, _ string, call int) error {
		if call == 1 {
			panic("nil map in the effect")
		}
		return nil
	}
	opts := b.options()
	opts.NoDeferral = true // the abandon path: released, redelivered at once
	opts.Metrics = metricreg.ProcessorMetrics(nil)
	b.start(opts)
	b.send("m1", "pay", `{}`, nil)
	b.send("m2", "pay", `{}`, nil)
	b.waitIdle()
	c := b.claimOf("m1")
	if c.State != claim.StateProcessed || c.TakeOvers != 1 || !strings.Contains(c.LastError, "panicked") {
		t.Errorf("claim %s take-overs %d last error %q; want processed after a take-over, the panic recorded", c.State, c.TakeOvers, c.LastError)
	}
	if got := b.claimOf("m2").State; got != claim.StateProcessed {
		t.Errorf("the other message: %s, want processed (the replica survived)", got)
	}
	if !strings.Contains(b.logs.String(), "effect panicked") {
		t.Error("the panic was not logged")
	}
}

// slowHeartbeatStore blocks every heartbeat of a claim until its context
// ends: a store whose heartbeats hang. (The processor's store probe, a
// heartbeat of no claim, goes through.)
type slowHeartbeatStore struct{ claim.Store }

func (s slowHeartbeatStore) Heartbeat(ctx context.Context, p *claim.HeartbeatParams) error {
	if p.ID < 0 {
		return s.Store.Heartbeat(ctx, p)
	}
	<-ctx.Done()
	return fmt.Errorf("heartbeat: %w: %w", claim.ErrUnavailable, ctx.Err())
}

// TestRenewalDoesNotWaitForHeartbeats: heartbeats hang for the store
// timeout (500ms) while the message's lock lasts 300ms; the lock renewal runs
// on its own and keeps the message: no redelivery, no lock loss. A failed
// renewal is counted and tried again before the lock runs out.
func TestRenewalDoesNotWaitForHeartbeats(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{LockDuration: 300 * time.Millisecond})
	b.eff.delay = 1500 * time.Millisecond
	opts := b.options()
	opts.Store = slowHeartbeatStore{b.store}
	opts.HeartbeatInterval = 50 * time.Millisecond
	opts.StoreTimeout = 500 * time.Millisecond
	opts.Metrics = metricreg.ProcessorMetrics(nil)
	b.q.FailRenewals(1)
	b.start(opts)
	b.send("m1", "pay", `{}`, nil)
	b.waitIdle()
	s := b.q.Stats()
	if s.Redeliveries != 0 || s.LockLosses != 0 || s.Renewals < 3 {
		t.Errorf("redeliveries %d, lock losses %d, renewals %d; want 0, 0 and at least 3", s.Redeliveries, s.LockLosses, s.Renewals)
	}
	if got := metricValue(opts.Metrics.LockRenewalFailures); got != 1 {
		t.Errorf("sbclaim_lock_renewal_failures_total = %v, want 1", got)
	}
	if got := metricValue(opts.Metrics.HeartbeatFailures); got < 1 {
		t.Errorf("sbclaim_claim_heartbeat_failures_total = %v, want at least 1 (the hung heartbeats)", got)
	}
	if c := b.claimOf("m1"); c.State != claim.StateProcessed {
		t.Errorf("claim %s, want processed", c.State)
	}
}
