package processor_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/metricreg"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/reconciler"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// quickBackoff is a delayed-retry schedule for tests: 20ms each time, no
// jitter, a horizon no test reaches unless it sets its own.
var quickBackoff = sideeffects.Backoff{First: 20 * time.Millisecond, Factor: 1, Max: 20 * time.Millisecond, Horizon: time.Hour}

// deferOptions are the bundle's options with delayed retries polled every
// 10ms.
func (b *bundle) deferOptions() processor.Options {
	b.router.backoff = quickBackoff
	opts := b.options()
	opts.DeferPollInterval = 10 * time.Millisecond
	opts.Metrics = metricreg.ProcessorMetrics(nil)
	return opts
}

func fetches(m *processor.Metrics, result string) int {
	return int(metricValue(m.DeferredFetches.With(result)))
}

// waitCompleted waits until id was completed n times.
func (b *bundle) waitCompleted(q *membus.Queue, id string, n int) {
	b.t.Helper()
	b.eventually(fmt.Sprintf("%s completed %d time(s)", id, n), func() bool { return countCompleted(q, id) >= n })
}

// TestRetryableIsDeferredAndFetchedWhenDue: a downstream that refuses
// three times gets the same key four times; each refusal postpones the
// claim and defers the message, the poller fetches it by its sequence
// number when due, and the fourth attempt performs the effect once. No
// redelivery by ReceiveMessages, no dead letter.
func TestRetryableIsDeferredAndFetchedWhenDue(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.eff.behave = func(_, _ string, call int) error {
			if call <= 3 {
				return sideeffects.Retryable(errors.New("downstream 503"))
			}
			return nil
		}
		opts := b.deferOptions()
		b.start(opts)
		b.send("m1", "pay", `{}`, nil)
		b.waitCompleted(b.q, "m1", 1)
		b.waitIdle()

		if calls, done := b.eff.Calls("m1"), b.eff.Performed("m1"); calls != 4 || done != 1 {
			t.Fatalf("calls %d, performed %d; want 4 and 1", calls, done)
		}
		// The claim forgets its message just after settling it.
		b.eventually("the claim forgets its settled message", func() bool { return b.claimOf("m1").DeferredSeq == nil })
		c := b.claimOf("m1")
		if c.State != claim.StateProcessed || c.Postponements != 3 || c.PostponedAt == nil || c.DeferredSeq != nil {
			t.Fatalf("claim: state %s, postponements %d, postponed at %v, deferred seq %v; want processed after 3 postponements, its settled message forgotten",
				c.State, c.Postponements, c.PostponedAt, c.DeferredSeq)
		}
		st := b.q.Stats()
		if st.Deferrals != 3 || st.DeferredReceives != 3 || st.Redeliveries != 3 || st.DeadLettered != 0 || st.Abandoned != 0 {
			t.Fatalf("broker: %+v; want 3 deferrals, 3 fetches by sequence number, no abandon, no dead letter", st)
		}
		if got := outcomes(opts.Metrics, processor.ResultPostponed); got != 3 {
			t.Errorf("postponed outcomes %d, want 3", got)
		}
		if got := int(metricValue(opts.Metrics.Postponed.With("effect"))); got != 3 {
			t.Errorf("sbclaim_postponed_total{route=effect} = %d, want 3", got)
		}
		if got := fetches(opts.Metrics, "fetched"); got != 3 {
			t.Errorf("fetched %d deferred messages, want 3", got)
		}
	})
}

// outageScenario: a downstream refuses more calls than the entity's
// MaxDeliveryCount allows deliveries (3), then recovers.
func outageScenario(t *testing.T, be string, deferral bool) (*bundle, processor.Options) {
	b := setup(t, be, membus.QueueOptions{MaxDeliveryCount: 3})
	b.eff.behave = func(_, _ string, call int) error {
		if call <= 3 {
			return sideeffects.Retryable(errors.New("downstream 503"))
		}
		return nil
	}
	opts := b.deferOptions()
	opts.MaxDeliveryCount = 3
	opts.NoDeferral = !deferral
	b.start(opts)
	b.send("m1", "pay", `{}`, nil)
	b.waitIdle()
	return b, opts
}

// TestOutageLongerThanTheDeliveryBudgetDeadLettersNothing: each fetch of a
// deferred message counts as a delivery, so the third one is the last the
// broker allows. The processor does not defer the message on the second
// (its fetch would be the last delivery, and a replica dying while holding
// it would leave the message to a lock that ends in a dead letter): it
// hands the claim to the reconciler — released, payload stored — and
// completes the message. The reconciler's recovery then retries it until
// the downstream is back and performs the effect once. The broker
// dead-letters nothing.
func TestOutageLongerThanTheDeliveryBudgetDeadLettersNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b, opts := outageScenario(t, be, true)
		if n := len(b.q.DeadLetters()); n != 0 {
			t.Fatalf("broker dead-lettered %d messages (%v), want 0", n, b.deadLetterReasons())
		}
		// The outcome is counted just after the message is completed.
		b.eventually("the hand-off counted", func() bool { return outcomes(opts.Metrics, processor.ResultHandedOff) == 1 })
		c := b.claimOf("m1")
		if c.State != claim.StateReleased || c.Payload == nil || c.Postponements != 1 || !strings.Contains(c.LastError, "deliveries are spent (delivery 2 of 3)") {
			t.Fatalf("claim: state %s, payload %v, postponements %d, last error %q; want released with its payload after 1 postponement, handed off on the second-to-last delivery",
				c.State, c.Payload != nil, c.Postponements, c.LastError)
		}
		if calls := b.eff.Calls("m1"); calls != 2 {
			t.Fatalf("calls %d before the reconciler, want 2", calls)
		}
		if st := b.q.Stats(); st.DeferredReceives != 1 {
			t.Fatalf("broker %+v: want one fetch (the last delivery is never fetched)", st)
		}
		rec, err := reconciler.New(b.store, reconciler.Config{StaleAfter: 30 * time.Millisecond, HeartbeatInterval: 10 * time.Millisecond,
			RecoveryBackoff: 10 * time.Millisecond, RecoveryBackoffMax: 10 * time.Millisecond,
			Routes: reconciler.Routes{"billing": b.router}}, slog.New(slog.DiscardHandler), nil)
		if err != nil {
			t.Fatal(err)
		}
		b.eventually("the reconciler's recovery performs the claim", func() bool {
			if _, err := rec.RunOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
			return b.claimOf("m1").State == claim.StateProcessed
		})
		if calls, done := b.eff.Calls("m1"), b.eff.Performed("m1"); calls != 4 || done != 1 {
			t.Fatalf("calls %d, performed %d; want 4 and 1", calls, done)
		}
	})
}

// TestOutageWithAbandonDeadLetters is the negative of the test above: with
// the old behaviour (release and abandon) the broker redelivers at once
// and dead-letters the message at MaxDeliveryCount.
func TestOutageWithAbandonDeadLetters(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b, _ := outageScenario(t, be, false)
		if got := b.deadLetterReasons()["m1"]; got != membus.ReasonMaxDeliveryCountExceeded {
			t.Fatalf("dead letter reason %q, want %s: abandon burns a delivery per attempt", got, membus.ReasonMaxDeliveryCountExceeded)
		}
		if c := b.claimOf("m1"); c.State != claim.StateReleased || c.Postponements != 0 {
			t.Fatalf("claim: state %s, postponements %d; want released, never postponed", c.State, c.Postponements)
		}
	})
}

// TestRetryAfterIsHonoured: a Retry-After of an hour (longer than the
// route's schedule) sets the claim's due time an hour ahead, by the
// database clock; the message stays deferred.
func TestRetryAfterIsHonoured(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.eff.behave = func(_, _ string, _ int) error {
			return &sideeffects.Error{Outcome: sideeffects.OutcomeRetryable, Err: errors.New("HTTP 429"), RetryAfter: time.Hour}
		}
		b.start(b.deferOptions())
		b.send("m1", "pay", `{}`, nil)
		b.eventually("the message deferred", func() bool { return b.q.Stats().Deferred == 1 })
		// SetDue follows DeferMessage.
		b.eventually("the due time recorded", func() bool { return b.claimOf("m1").DueAt != nil })
		c := b.claimOf("m1")
		if !c.Deferred() || c.ReleasedAt == nil {
			t.Fatalf("claim: state %s, due %v; want released and deferred", c.State, c.DueAt)
		}
		if got := c.DueAt.Sub(*c.ReleasedAt); got < 59*time.Minute || got > 61*time.Minute {
			t.Fatalf("due %s after the release, want the downstream's Retry-After of 1h", got)
		}
		if calls := b.eff.Calls("m1"); calls != 1 {
			t.Fatalf("calls %d, want 1", calls)
		}
	})
}

// TestHorizonFlags: a route whose horizon passed since the first
// postponement flags the claim with a reason naming the route and how
// long it retried, and completes the message (its payload is stored for a
// redrive). The broker dead-letters nothing.
func TestHorizonFlags(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.eff.behave = func(_, _ string, _ int) error { return sideeffects.Retryable(errors.New("downstream 503")) }
		opts := b.deferOptions()
		b.router.backoff.Horizon = time.Millisecond // reached by the second attempt (due 20ms after the first)
		b.start(opts)
		b.send("m1", "pay", `{}`, nil)
		b.waitIdle()
		c := b.claimOf("m1")
		if c.State != claim.StateFlagged || !strings.Contains(c.FlagReason, `route "effect"`) || !strings.Contains(c.FlagReason, "horizon 1ms") {
			t.Fatalf("claim: state %s, reason %q; want flagged naming the route and its horizon", c.State, c.FlagReason)
		}
		if calls := b.eff.Calls("m1"); calls != 2 {
			t.Fatalf("calls %d, want 2", calls)
		}
		if countCompleted(b.q, "m1") != 1 || len(b.q.DeadLetters()) != 0 {
			t.Fatalf("completed %d, dead letters %d; want the message completed once", countCompleted(b.q, "m1"), len(b.q.DeadLetters()))
		}
	})
}

// TestCrashBetweenRecordingTheDeferralAndDeferring: the replica records
// the deferral on the claim, then dies before DeferMessage. The message's
// lock runs out; its redelivery — the message the claim names — takes
// the claim back (or finds it released by a poller whose fetch found the
// message not deferred) and performs the effect once.
func TestCrashBetweenRecordingTheDeferralAndDeferring(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{LockDuration: 300 * time.Millisecond})
		b.eff.behave = func(_, _ string, call int) error {
			if call == 1 {
				return sideeffects.Retryable(errors.New("downstream 503"))
			}
			return nil
		}
		opts := b.deferOptions()
		opts.MaxLockRenewal = 0 // the crashed attempt's lock runs out
		var once sync.Once
		opts.Hooks.AfterDeferRecorded = func(context.Context, *azservicebus.ReceivedMessage) error {
			err := error(nil)
			once.Do(func() { err = processor.ErrCrash })
			return err
		}
		b.start(opts)
		b.send("m1", "pay", `{}`, nil)
		b.waitCompleted(b.q, "m1", 1)
		if calls, done := b.eff.Calls("m1"), b.eff.Performed("m1"); calls != 2 || done != 1 {
			t.Fatalf("calls %d, performed %d; want 2 and 1", calls, done)
		}
		if c := b.claimOf("m1"); c.State != claim.StateProcessed {
			t.Fatalf("claim state %s, want processed", c.State)
		}
		if st := b.q.Stats(); st.Deferrals != 0 || st.DeadLettered != 0 || st.LockExpiries < 1 {
			t.Fatalf("broker %+v: want no deferral (the replica died first), a lock expiry, no dead letter", st)
		}
	})
}

// barrierStore holds every TakeDeferred until two callers arrive, so two
// replicas' polls race for the same due claim for certain.
type barrierStore struct {
	claim.Store
	claim.Deferrer
	mu      sync.Mutex
	arrived int
	both    chan struct{}
}

func (s *barrierStore) TakeDeferred(ctx context.Context, p *claim.TakeDeferredParams) (*claim.Claim, error) {
	s.mu.Lock()
	s.arrived++
	if s.arrived == 2 {
		close(s.both)
	}
	s.mu.Unlock()
	select {
	case <-s.both:
	case <-time.After(20 * time.Second): // the other replica never came: the test says so
	case <-ctx.Done():
	}
	return s.Deferrer.TakeDeferred(ctx, p)
}

// TestTwoReplicasRaceForADueMessage: two replicas poll the same consumer;
// both find the due claim and both try to take it at once. The guarded
// take lets one through: it alone fetches the message and performs the
// effect; the other's take is refused by the guard (its metric says so).
func TestTwoReplicasRaceForADueMessage(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.eff.behave = func(_, _ string, call int) error {
			if call == 1 {
				return sideeffects.Retryable(errors.New("downstream 503"))
			}
			return nil
		}
		bs := &barrierStore{Store: b.store, Deferrer: b.store.(claim.Deferrer), both: make(chan struct{})}
		var ms []*processor.Metrics
		for _, host := range []string{"replica-a", "replica-b"} {
			opts := b.deferOptions()
			opts.Store, opts.Host = bs, host
			ms = append(ms, opts.Metrics)
			b.start(opts)
		}
		b.send("m1", "pay", `{}`, nil)
		b.waitCompleted(b.q, "m1", 1)
		if calls, done := b.eff.Calls("m1"), b.eff.Performed("m1"); calls != 2 || done != 1 {
			t.Fatalf("calls %d, performed %d; want 2 and 1", calls, done)
		}
		// The loser's refused take may still be returning (SQLite makes
		// it wait for the winner's write): wait for its answer.
		sum := func(result string) int { return fetches(ms[0], result) + fetches(ms[1], result) }
		b.eventually("the losing replica's take refused by the guard", func() bool { return sum("guard") >= 1 })
		if fetched, other := sum("fetched"), sum("gone")+sum("error"); fetched != 1 || other != 0 {
			t.Fatalf("fetched %d, gone or failed %d; want exactly 1 fetch", fetched, other)
		}
		if st := b.q.Stats(); st.DeferredReceives != 1 {
			t.Fatalf("%d fetches by sequence number reached the broker, want 1", st.DeferredReceives)
		}
	})
}

// TestDeferralInOneSubscriptionAddsNoCopyToAnother: a topic with two
// subscriptions, one consumer each. Billing's downstream refuses once, so
// billing defers its copy; shipping's copy is processed once and its
// subscription never sees another: deferral sends nothing.
func TestDeferralInOneSubscriptionAddsNoCopyToAnother(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		topic := membus.NewTopic("orders")
		billingSub := topic.Subscription("billing", membus.QueueOptions{LockDuration: 2 * time.Second})
		shippingSub := topic.Subscription("shipping", membus.QueueOptions{LockDuration: 2 * time.Second})
		b := setup(t, be, membus.QueueOptions{})
		b.eff.behave = func(_, _ string, call int) error {
			if call == 1 {
				return sideeffects.Retryable(errors.New("downstream 503"))
			}
			return nil
		}
		shipping := newEffects()
		billingOpts := b.deferOptions()
		billingOpts.Entity = "orders/Subscriptions/billing"
		billingOpts.NewReceiver = func(context.Context) (processor.Receiver, error) { return billingSub.NewReceiver(), nil }
		b.start(billingOpts)
		shippingOpts := b.deferOptions()
		shippingOpts.Consumer, shippingOpts.Entity = "shipping", "orders/Subscriptions/shipping"
		shippingOpts.Router = &router{eff: shipping, backoff: quickBackoff}
		shippingOpts.NewReceiver = func(context.Context) (processor.Receiver, error) { return shippingSub.NewReceiver(), nil }
		b.start(shippingOpts)

		id, subj := "m1", "pay"
		if err := topic.SendMessage(context.Background(), &azservicebus.Message{MessageID: &id, Subject: &subj, Body: []byte(`{}`)}, nil); err != nil {
			t.Fatal(err)
		}
		b.waitCompleted(billingSub, "m1", 1)
		b.waitCompleted(shippingSub, "m1", 1)
		for _, q := range []*membus.Queue{billingSub, shippingSub} {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if err := q.WaitIdle(ctx); err != nil {
				t.Fatalf("%s not drained: %v", q.Name(), err)
			}
			cancel()
		}
		if got := b.eff.Performed("m1"); got != 1 {
			t.Fatalf("billing performed %d times, want 1", got)
		}
		if calls := shipping.Calls("m1"); calls != 1 {
			t.Fatalf("shipping's effect called %d times, want 1", calls)
		}
		bs, ss := billingSub.Stats(), shippingSub.Stats()
		if ss.Sent != 1 || ss.Deliveries != 1 || ss.Completed != 1 || ss.Deferrals != 0 {
			t.Fatalf("shipping's subscription: %+v; want exactly one copy, delivered and completed once", ss)
		}
		if bs.Sent != 1 || bs.Deferrals != 1 || bs.DeadLettered+ss.DeadLettered != 0 {
			t.Fatalf("billing's subscription: %+v; want one copy, deferred once, no dead letter", bs)
		}
	})
}

// expiringReceiver runs out the time to live of every message it defers.
type expiringReceiver struct {
	*membus.Receiver
	q *membus.Queue
}

func (r expiringReceiver) DeferMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.DeferMessageOptions) error {
	if err := r.Receiver.DeferMessage(ctx, m, o); err != nil {
		return err
	}
	r.q.ExpireDeferred(*m.SequenceNumber)
	return nil
}

// TestDeferredMessageGoneIsRecoveredFromThePayload: the deferred message's
// time to live runs out before it is due. The fetch finds nothing (the
// broker dead-letters the expired message on access, as Service Bus does);
// the processor releases the claim with the reason, and the reconciler's
// recovery performs the effect once from the stored payload.
func TestDeferredMessageGoneIsRecoveredFromThePayload(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.eff.behave = func(_, _ string, call int) error {
			if call == 1 {
				return sideeffects.Retryable(errors.New("downstream 503"))
			}
			return nil
		}
		opts := b.deferOptions()
		opts.NewReceiver = func(context.Context) (processor.Receiver, error) {
			return expiringReceiver{Receiver: b.q.NewReceiver(), q: b.q}, nil
		}
		b.start(opts)
		b.send("m1", "pay", `{}`, nil)
		b.eventually("the fetch finding the message gone", func() bool { return fetches(opts.Metrics, "gone") == 1 })
		b.eventually("the claim released", func() bool { return b.claimOf("m1").State == claim.StateReleased })
		c := b.claimOf("m1")
		if !strings.Contains(c.LastError, "could not be fetched") || c.Payload == nil {
			t.Fatalf("claim: last error %q, payload %v; want the reason and the payload", c.LastError, c.Payload != nil)
		}
		if got := b.deadLetterReasons()["m1"]; got != "TTLExpiredException" {
			t.Fatalf("dead letter reason %q, want the broker's TTLExpiredException", got)
		}
		rec, err := reconciler.New(b.store, reconciler.Config{StaleAfter: 30 * time.Millisecond, HeartbeatInterval: 10 * time.Millisecond,
			Routes: reconciler.Routes{"billing": b.router}}, slog.New(slog.DiscardHandler), nil)
		if err != nil {
			t.Fatal(err)
		}
		b.eventually("the reconciler's recovery performs the claim", func() bool {
			if _, err := rec.RunOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
			return b.claimOf("m1").State == claim.StateProcessed
		})
		if calls, done := b.eff.Calls("m1"), b.eff.Performed("m1"); calls != 2 || done != 1 {
			t.Fatalf("calls %d, performed %d; want 2 and 1", calls, done)
		}
	})
}

// TestCopyOfAKeyWhoseDeferredMessageIsHeldCompletes: a producer's second
// copy of a key arrives while a replica holds the claim with the key's
// deferred message it fetched. The copy completes at once (the deferred
// message carries the work) instead of waiting out its lock for the
// holder; the effect is performed once.
func TestCopyOfAKeyWhoseDeferredMessageIsHeldCompletes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		holding, release := make(chan struct{}), make(chan struct{})
		b.eff.behaveCtx = func(ctx context.Context, _ string, call int) error {
			switch call {
			case 1:
				return sideeffects.Retryable(errors.New("downstream 503"))
			case 2:
				close(holding)
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		}
		opts := b.deferOptions()
		b.start(opts)
		b.send("m1", "pay", `{}`, nil)
		<-holding // the fetched deferred message's effect runs
		b.send("m1", "pay", `{}`, nil)
		b.eventually("the second copy completed while the holder works", func() bool { return countCompleted(b.q, "m1") == 1 })
		if got := outcomes(opts.Metrics, processor.ResultDuplicate); got != 1 {
			t.Fatalf("duplicate outcomes %d, want the copy's", got)
		}
		close(release)
		b.waitCompleted(b.q, "m1", 2)
		b.waitIdle()
		if calls, done := b.eff.Calls("m1"), b.eff.Performed("m1"); calls != 2 || done != 1 {
			t.Fatalf("calls %d, performed %d; want 2 and 1", calls, done)
		}
	})
}

// A fetched message whose lock ended before it was completed goes back to
// deferred at the broker, where no receive finds it and its finished
// claim sends no poller: the processor fetches it again by its sequence
// number and completes it, so nothing stays in the entity.
func TestFetchedMessageWhoseLockEndedIsSettledAgain(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.eff.behave = func(_, _ string, call int) error {
			if call == 1 {
				return sideeffects.Retryable(errors.New("downstream 503"))
			}
			// The fetched delivery: its lock ends while the effect runs
			// (a slow effect past a lost renewal), so its completion is
			// refused.
			b.q.ExpireLock("m1")
			return nil
		}
		opts := b.deferOptions()
		opts.MaxLockRenewal = -1 // no renewal to refresh the expired lock
		opts.LockDuration = time.Minute
		b.start(opts)
		b.send("m1", "pay", `{}`, nil)
		b.waitCompleted(b.q, "m1", 1)
		b.waitIdle()

		if calls, done := b.eff.Calls("m1"), b.eff.Performed("m1"); calls != 2 || done != 1 {
			t.Fatalf("calls %d, performed %d; want 2 and 1", calls, done)
		}
		st := b.q.Stats()
		if st.Deferred != 0 || st.Completed != 1 || st.LockLosses == 0 || st.DeferredReceives != 2 {
			t.Fatalf("broker: %+v; want the lost-lock completion refused, the message fetched again and completed, none left deferred", st)
		}
		if c := b.claimOf("m1"); c.State != claim.StateProcessed {
			t.Fatalf("claim %s, want processed", c.State)
		}
	})
}

// strandedScenario: the first attempt is refused (the message is
// deferred); the replica that fetches it finishes the claim and "dies"
// (hook) before it settles the message, whose lock then runs out: the
// message goes back to deferred, where no receive finds it, and its claim
// is finished. The poller must find the claim (it still names its
// message), fetch the message once the holder is silent, and settle it —
// without running the effect again.
func strandedScenario(t *testing.T, be string, final error, crash func(*processor.Hooks, func(context.Context, *azservicebus.ReceivedMessage) error)) (*bundle, processor.Options) {
	b := setup(t, be, membus.QueueOptions{LockDuration: 300 * time.Millisecond})
	b.eff.behave = func(_, _ string, call int) error {
		if call == 1 {
			return sideeffects.Retryable(errors.New("downstream 503"))
		}
		return final
	}
	opts := b.deferOptions()
	opts.HeartbeatInterval, opts.TakeoverAfter = 100*time.Millisecond, time.Second
	// The dead replica's lock runs out (its renewal ends with it). The
	// sweep waits as long as a holder may still lock the message: its
	// renewal + the lock duration + two settle timeouts (1.2 + 0.3 +
	// 0.4 = 1.9 s, longer than TakeoverAfter).
	opts.MaxLockRenewal, opts.LockDuration, opts.SettleTimeout = 1200*time.Millisecond, 300*time.Millisecond, 200*time.Millisecond
	crash(&opts.Hooks, func(_ context.Context, m *azservicebus.ReceivedMessage) error {
		if m.DeliveryCount == 2 { // the fetched delivery
			return processor.ErrCrash
		}
		return nil
	})
	b.start(opts)
	b.send("m1", "pay", `{}`, nil)
	b.waitIdle()
	return b, opts
}

func TestStrandedMessageOfAProcessedClaimIsCompleted(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b, opts := strandedScenario(t, be, nil, func(h *processor.Hooks, f func(context.Context, *azservicebus.ReceivedMessage) error) {
			h.AfterMarkProcessed = f
		})
		if calls, done := b.eff.Calls("m1"), b.eff.Performed("m1"); calls != 2 || done != 1 {
			t.Fatalf("calls %d, performed %d; want 2 and 1 (settling the stranded message runs nothing)", calls, done)
		}
		st := b.q.Stats()
		if st.Deferred != 0 || st.Completed != 1 || st.DeadLettered != 0 || st.LockExpiries < 1 || st.DeferredReceives != 2 {
			t.Fatalf("broker: %+v; want the lock of the dead holder expired, the message fetched again and completed, none left deferred", st)
		}
		// The claim forgets the message just after settling it.
		b.eventually("the claim forgets its settled message", func() bool { return b.claimOf("m1").DeferredSeq == nil })
		if c := b.claimOf("m1"); c.State != claim.StateProcessed {
			t.Fatalf("claim: state %s, want processed", c.State)
		}
		if got := int(metricValue(opts.Metrics.StrandedMessages.With("fetched"))); got != 1 {
			t.Errorf("sbclaim_stranded_messages_total{result=fetched} = %d, want 1", got)
		}
	})
}

func TestStrandedMessageOfAFailedClaimIsDeadLettered(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b, _ := strandedScenario(t, be, sideeffects.Rejected(errors.New("card declined")), func(h *processor.Hooks, f func(context.Context, *azservicebus.ReceivedMessage) error) {
			h.AfterFail = f
		})
		if calls := b.eff.Calls("m1"); calls != 2 {
			t.Fatalf("calls %d, want 2 (settling the stranded message runs nothing)", calls)
		}
		st := b.q.Stats()
		if st.Deferred != 0 || st.Completed != 0 || st.DeadLettered != 1 {
			t.Fatalf("broker: %+v; want the failed claim's message dead-lettered once, none left deferred", st)
		}
		dl := b.q.DeadLetters()
		if len(dl) != 1 || dl[0].DeadLetterReason == nil || *dl[0].DeadLetterReason != claim.FailRejected {
			t.Fatalf("dead letters %+v, want one with reason %s", dl, claim.FailRejected)
		}
		// The claim forgets the message just after settling it.
		b.eventually("the claim forgets its settled message", func() bool { return b.claimOf("m1").DeferredSeq == nil })
		if c := b.claimOf("m1"); c.State != claim.StateFailed {
			t.Fatalf("claim: state %s, want failed", c.State)
		}
	})
}

// muteStore drops the heartbeats of one owner (they "succeed" without a
// write): its holder goes silent in the store while it still runs and
// renews its message's lock, as when its writes fail but the broker
// answers.
type muteStore struct {
	claim.Store
	claim.Deferrer
	mu   sync.Mutex
	mute map[string]bool // owner tokens
}

func (s *muteStore) Heartbeat(ctx context.Context, p *claim.HeartbeatParams) error {
	s.mu.Lock()
	muted := s.mute[p.Owner.String()]
	s.mu.Unlock()
	if muted {
		return nil
	}
	return s.Store.Heartbeat(ctx, p)
}

// TestDeferredMessageLockedByASilentHolderIsLookedForAgain: the replica
// that fetched a deferred message goes silent in the store but keeps the
// message's lock. Once silent, a poll takes the claim and does not find
// the message (it is locked): that is not "gone" — the claim waits as
// deferred for the lock duration, the first holder's late success is
// noted and its message abandoned back to deferred, and the next fetch
// finds it and finishes the claim. Nothing is left deferred, nothing is
// dead-lettered, the reconciler is not needed.
func TestDeferredMessageLockedByASilentHolderIsLookedForAgain(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{LockDuration: 2 * time.Second})
		ms := &muteStore{Store: b.store, Deferrer: b.store.(claim.Deferrer), mute: map[string]bool{}}
		b.store = ms
		// The fetched delivery: its holder goes silent, and the effect
		// waits until a poll took the claim, missed the locked message,
		// and gave the claim back as deferred — then runs on for a
		// second, past the lock duration (0.5 s) but within the wait for
		// the holder (2.5 s): a poll that looked again after the lock
		// duration alone would miss the message again and forget it.
		b.eff.behave = silentFetchedHolder(b, ms, func(c *claim.Claim) bool { return c.Postponements >= 2 && c.Deferred() })
		opts := b.deferOptions()
		opts.HeartbeatInterval, opts.TakeoverAfter = 100*time.Millisecond, time.Second
		// How long the claim waits for the silent holder's lock to end:
		// its renewal (1.5 s) + the lock duration + a settle timeout.
		opts.MaxLockRenewal, opts.LockDuration, opts.SettleTimeout = 1500*time.Millisecond, 500*time.Millisecond, 500*time.Millisecond
		b.start(opts)
		b.send("m1", "pay", `{}`, nil)
		b.waitCompleted(b.q, "m1", 1)
		b.waitIdle()

		if calls := b.eff.Calls("m1"); calls != 3 {
			t.Fatalf("calls %d, want 3 (refused, the silent holder's late success, the fetch after the lock ended)", calls)
		}
		if got := fetches(opts.Metrics, "unsure"); got != 1 {
			t.Errorf("fetches not found while a holder may lock the message: %d, want 1", got)
		}
		if got := fetches(opts.Metrics, "gone"); got != 0 {
			t.Errorf("fetches taken for gone: %d, want 0", got)
		}
		st := b.q.Stats()
		if st.Deferred != 0 || st.Completed != 1 || st.DeadLettered != 0 {
			t.Fatalf("broker: %+v; want the message completed once, none left deferred, no dead letter", st)
		}
		b.eventually("the claim forgets its settled message", func() bool { return b.claimOf("m1").DeferredSeq == nil })
		if c := b.claimOf("m1"); c.State != claim.StateProcessed || c.TakeOverPath != claim.PathRedelivery || c.LateSuccessAt == nil {
			t.Fatalf("claim: state %s, path %s, late success %v; want processed by a fetch, the silent holder's success noted", c.State, c.TakeOverPath, c.LateSuccessAt)
		}
	})
}

// TestLastDeliveryOfAFetchedMessageIsHandedOffUnattempted: the replica
// holding the fetched second-to-last delivery dies during the effect
// (MaxDeliveryCount 3); its lock ends, the message goes back to deferred,
// and the poller fetches it once the holder is silent — on its last
// delivery. The effect is not attempted on it: the claim is released to
// the reconciler with its stored payload, the message completed, and the
// claim forgets it. The broker dead-letters nothing.
func TestLastDeliveryOfAFetchedMessageIsHandedOffUnattempted(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{MaxDeliveryCount: 3, LockDuration: 300 * time.Millisecond})
		b.eff.behave = func(_, _ string, call int) error {
			if call == 1 {
				return sideeffects.Retryable(errors.New("downstream 503"))
			}
			return nil
		}
		opts := b.deferOptions()
		opts.MaxDeliveryCount = 3
		opts.HeartbeatInterval, opts.TakeoverAfter = 100*time.Millisecond, time.Second
		opts.Hooks.AfterEffect = func(_ context.Context, m *azservicebus.ReceivedMessage) error {
			if m.DeliveryCount == 2 { // the fetched second-to-last delivery
				return processor.ErrCrash
			}
			return nil
		}
		b.start(opts)
		b.send("m1", "pay", `{}`, nil)
		b.waitCompleted(b.q, "m1", 1)
		b.waitIdle()

		if st := b.q.Stats(); st.DeadLettered != 0 || st.Completed != 1 || st.Deferred != 0 || st.DeferredReceives != 2 || st.LockExpiries < 1 {
			t.Fatalf("broker: %+v; want the dead holder's lock expired and the fetched last delivery completed, not dead-lettered", st)
		}
		if calls := b.eff.Calls("m1"); calls != 2 {
			t.Fatalf("calls %d, want 2 (the last delivery attempts nothing)", calls)
		}
		b.eventually("the claim forgets its message", func() bool { return b.claimOf("m1").DeferredSeq == nil })
		c := b.claimOf("m1")
		if c.State != claim.StateReleased || c.Payload == nil || !strings.Contains(c.LastError, "deliveries are spent") {
			t.Fatalf("claim: state %s, payload stored %v, last error %q; want released to the reconciler with its payload", c.State, c.Payload != nil, c.LastError)
		}
		// Its history says why (the chaos harness reads it to explain the
		// reconciler's recovery).
		hist, err := b.store.History(context.Background(), c.ID)
		if err != nil {
			t.Fatal(err)
		}
		if last := hist[len(hist)-1]; last.What != claim.ChangeReleased || !strings.Contains(last.Reason, "deliveries are spent") {
			t.Fatalf("last history row %+v: want the release, saying the deliveries are spent", last)
		}
		// The outcome is counted just after the message is completed.
		b.eventually("the hand-off counted", func() bool { return outcomes(opts.Metrics, processor.ResultHandedOff) == 1 })
	})
}

// payloadlessDeferral claims m1 on a replica that stores no payload,
// whose effect is refused (the claim is deferred), stops it, and returns
// the options of a second replica that stores payloads (a rolling deploy
// that turns them on): the claim it fetches holds no payload, whatever
// its own option says.
func payloadlessDeferral(t *testing.T, be string, backoff sideeffects.Backoff, behave func(_, _ string, call int) error) (*bundle, processor.Options) {
	b := setup(t, be, membus.QueueOptions{MaxDeliveryCount: 3})
	b.eff.behave = behave
	opts := b.deferOptions()
	b.router.backoff = backoff
	opts.MaxDeliveryCount = 3
	first := opts
	first.StorePayload = false
	first.DeferPollInterval = time.Hour // the second replica fetches it
	_, stop := b.start(first)
	b.send("m1", "pay", `{}`, nil)
	b.eventually("the payloadless claim deferred", func() bool {
		for _, c := range b.claims() {
			return c.Deferred()
		}
		return false
	})
	stop()
	if c := b.claimOf("m1"); c.Payload != nil {
		t.Fatalf("the first replica stored a payload")
	}
	return b, opts
}

// TestHandOffDecidesFromTheClaimsPayload: a claim taken by a replica
// that stores no payload is fetched, on its second-to-last delivery, by
// one that does. Nothing could carry a hand-off to the reconciler (no
// payload), so the message is deferred again, not completed; the last
// delivery performs the effect.
func TestHandOffDecidesFromTheClaimsPayload(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b, opts := payloadlessDeferral(t, be, quickBackoff, func(_, _ string, call int) error {
			if call <= 2 {
				return sideeffects.Retryable(errors.New("downstream 503"))
			}
			return nil
		})
		b.start(opts)
		b.waitCompleted(b.q, "m1", 1)
		b.waitIdle()
		if calls, done := b.eff.Calls("m1"), b.eff.Performed("m1"); calls != 3 || done != 1 {
			t.Fatalf("calls %d, performed %d; want 3 and 1 (deferred twice, performed on the last delivery)", calls, done)
		}
		if c := b.claimOf("m1"); c.State != claim.StateProcessed {
			t.Fatalf("claim: state %s (%s); want processed, not handed to a reconciler that has no payload", c.State, c.LastError)
		}
		if got := outcomes(opts.Metrics, processor.ResultHandedOff); got != 0 {
			t.Fatalf("%d hand-offs of a claim without a payload", got)
		}
		if st := b.q.Stats(); st.DeadLettered != 0 || st.Completed != 1 {
			t.Fatalf("broker: %+v; want completed once, no dead letter", st)
		}
	})
}

// TestHorizonOfAPayloadlessClaimDeadLetters: the same claim, past its
// route's horizon on the replica that stores payloads: it is flagged and
// its message dead-lettered (the dead-letter queue keeps the body), not
// completed with nothing left to redrive from.
func TestHorizonOfAPayloadlessClaimDeadLetters(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		short := quickBackoff
		short.Horizon = time.Millisecond
		b, opts := payloadlessDeferral(t, be, short, func(_, _ string, _ int) error { return sideeffects.Retryable(errors.New("downstream 503")) })
		b.start(opts)
		b.eventually("the message dead-lettered", func() bool { return b.q.Stats().DeadLettered == 1 })
		b.waitIdle()
		if got := b.deadLetterReasons()["m1"]; got != processor.ReasonRetryHorizon {
			t.Fatalf("dead-letter reason %q, want %s", got, processor.ReasonRetryHorizon)
		}
		if c := b.claimOf("m1"); c.State != claim.StateFlagged || c.Payload != nil {
			t.Fatalf("claim: state %s; want flagged", c.State)
		}
		if st := b.q.Stats(); st.Completed != 0 {
			t.Fatalf("broker: %+v; want nothing completed", st)
		}
	})
}

// TestSilentHolderOfAManualRoutesDeferredMessageIsFlagged: the replica
// that fetched a manual route's deferred message performs the effect and
// goes silent in the store before recording it, while it keeps the
// message's lock. Once silent, a poll takes the claim and misses the
// locked message. The effect's outcome is unknown and the route does not
// let its key be repeated: the claim is flagged there and then — not
// given back as released and due, whose next fetch ran the effect a
// second time. The holder's late success is noted, and the message is
// settled once its lock has ended (its claim stored the payload: it is
// completed). The effect ran once.
func TestSilentHolderOfAManualRoutesDeferredMessageIsFlagged(t *testing.T) {
	for _, stored := range []bool{true, false} {
		t.Run(fmt.Sprintf("payload=%v", stored), func(t *testing.T) { silentManualHolder(t, stored) })
	}
}

// silentManualHolder is TestSilentHolderOfAManualRoutesDeferredMessageIsFlagged
// with and without a stored payload: without one, the holder that lost
// its claim to the flag dead-letters its message (ClaimFlagged), as the
// stranded sweep would: the dead-letter queue keeps the body.
func silentManualHolder(t *testing.T, stored bool) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{LockDuration: 2 * time.Second})
		ms := &muteStore{Store: b.store, Deferrer: b.store.(claim.Deferrer), mute: map[string]bool{}}
		b.store = ms
		// The fetched delivery: its holder goes silent, and the effect
		// returns (performed) only once a poll took the claim and missed
		// the locked message.
		b.eff.behave = silentFetchedHolder(b, ms, func(c *claim.Claim) bool {
			return c.State == claim.StateFlagged || (c.Postponements >= 2 && c.Deferred())
		})
		opts := b.deferOptions()
		opts.HeartbeatInterval, opts.TakeoverAfter = 100*time.Millisecond, time.Second
		opts.MaxLockRenewal, opts.LockDuration, opts.SettleTimeout = 1500*time.Millisecond, 500*time.Millisecond, 500*time.Millisecond
		opts.StorePayload = stored
		b.start(opts)
		b.send("m1", "manual", `{}`, nil)
		b.eventually("the message settled", func() bool { st := b.q.Stats(); return st.Completed+st.DeadLettered >= 1 })
		b.waitIdle()

		if calls := b.eff.Calls("m1"); calls != 2 {
			t.Fatalf("calls %d, want 2 (refused, then performed by the holder that went silent): a manual route's effect ran again", calls)
		}
		c := b.claimOf("m1")
		if c.State != claim.StateFlagged || !strings.Contains(c.FlagReason, "unknown") || c.LateSuccessAt == nil {
			t.Fatalf("claim: state %s (%q), late success %v; want flagged, its outcome unknown, the silent holder's success noted", c.State, c.FlagReason, c.LateSuccessAt)
		}
		st := b.q.Stats()
		switch {
		case stored && (st.Completed != 1 || st.DeadLettered != 0):
			t.Fatalf("broker: %+v; want the message completed once (its payload is stored), no dead letter", st)
		case !stored && (st.Completed != 0 || st.DeadLettered != 1 || b.deadLetterReasons()["m1"] != processor.ReasonClaimFlagged):
			t.Fatalf("broker: %+v, reasons %v; want the message dead-lettered once as %s (no payload stored)", st, b.deadLetterReasons(), processor.ReasonClaimFlagged)
		}
		b.eventually("the claim forgets its settled message", func() bool { return b.claimOf("m1").DeferredSeq == nil })
	})
}

// TestResubmittedCopyOfADeadLetteredFetchedMessageRuns: without a stored
// payload nothing can carry a claim past the message's deliveries, so a
// fetched message whose effect is refused on its last delivery is
// released and abandoned, and the broker dead-letters it. The claim must
// forget it then: the operator's re-submitted copy takes the claim over
// and performs the effect, instead of being completed unprocessed as a
// copy of a message "being deferred" (the simulation's seed 16).
func TestResubmittedCopyOfADeadLetteredFetchedMessageRuns(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{MaxDeliveryCount: 3})
		var down atomic.Bool
		down.Store(true)
		b.eff.behave = func(_, _ string, _ int) error {
			if down.Load() {
				return sideeffects.Retryable(errors.New("downstream 503"))
			}
			return nil
		}
		opts := b.deferOptions()
		opts.MaxDeliveryCount = 3
		opts.StorePayload = false
		b.start(opts)
		b.send("m1", "pay", `{}`, nil)
		b.eventually("the broker dead-letters the message", func() bool { return b.q.Stats().DeadLettered == 1 })
		b.waitIdle()
		b.eventually("the claim forgets the dead-lettered message", func() bool {
			c := b.claimOf("m1")
			return c.State == claim.StateReleased && c.DeferredSeq == nil
		})

		down.Store(false)
		b.send("m1", "pay", `{}`, nil) // the operator re-submits the dead letter
		b.waitCompleted(b.q, "m1", 1)
		b.waitIdle()
		if got := b.eff.Performed("m1"); got != 1 {
			t.Fatalf("performed %d times, want 1: the re-submitted copy must run the work", got)
		}
		if c := b.claimOf("m1"); c.State != claim.StateProcessed {
			t.Fatalf("claim %s (%s), want processed", c.State, c.LastError)
		}
	})
}

// silentFetchedHolder is an effect behaviour for the silent-holder tests:
// the first call is refused (the message is deferred); on the second (the
// fetched delivery) the holder's heartbeats are muted, and the effect
// waits until the claim, as read, satisfies taken (a poller took it from
// the silent holder), runs on for a second, and succeeds.
func silentFetchedHolder(b *bundle, ms *muteStore, taken func(*claim.Claim) bool) func(_, key string, call int) error {
	return func(_, key string, call int) error {
		switch call {
		case 1:
			return sideeffects.Retryable(errors.New("downstream 503"))
		case 2:
			c := b.claimOf(key)
			ms.mu.Lock()
			ms.mute[c.Owner.String()] = true
			ms.mu.Unlock()
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) {
				if taken(b.claimOf(key)) {
					time.Sleep(time.Second)
					return nil
				}
				time.Sleep(20 * time.Millisecond)
			}
			return errors.New("the claim was never taken from its silent holder")
		}
		return nil
	}
}

// TestCopyOfAPayloadlessClaimRunsWhenItsDeferredMessageIsGone: a claim
// that stored no payload is released and names its deferred message,
// which left the broker meanwhile (here dead-lettered by hand; in the
// simulation's seed 218, by its delivery count once a dead holder's lock
// ended). A copy of the key (an operator re-submitting the dead letter)
// must not be completed on that message's behalf: the processor peeks
// from the claim's sequence number, finds nothing, forgets the message
// and runs the copy. While the message is still deferred, a copy is
// completed without a call (it carries the work).
func TestCopyOfAPayloadlessClaimRunsWhenItsDeferredMessageIsGone(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		var down atomic.Bool
		down.Store(true)
		b.eff.behave = func(_, _ string, _ int) error {
			if down.Load() {
				return sideeffects.Retryable(errors.New("downstream 503"))
			}
			return nil
		}
		opts := b.deferOptions()
		b.router.backoff = sideeffects.Backoff{First: time.Hour, Factor: 1, Max: time.Hour, Horizon: 24 * time.Hour}
		opts.StorePayload = false
		b.start(opts)
		b.send("m1", "pay", `{}`, nil)
		var seq int64
		b.eventually("the message is deferred for an hour", func() bool {
			for _, c := range b.claims() {
				if c.MessageID == "m1" && c.DeferredSeq != nil && c.DueAt != nil {
					seq = *c.DeferredSeq
					return true
				}
			}
			return false
		})
		down.Store(false)

		// A copy while the message is deferred: completed, no call.
		b.send("m1", "pay", `{}`, nil)
		b.waitCompleted(b.q, "m1", 1)
		if calls := b.eff.Calls("m1"); calls != 1 {
			t.Fatalf("calls %d after a copy of a deferred message, want 1 (the refused one)", calls)
		}

		// The deferred message leaves the broker; the claim still names it.
		ctx := context.Background()
		r := b.q.NewReceiver()
		ms, err := r.ReceiveDeferredMessages(ctx, []int64{seq}, nil)
		if err != nil || len(ms) != 1 {
			t.Fatalf("fetching the deferred message: %v (%d)", err, len(ms))
		}
		if err := r.DeadLetterMessage(ctx, ms[0], nil); err != nil {
			t.Fatal(err)
		}
		if c := b.claimOf("m1"); c.DeferredSeq == nil || *c.DeferredSeq != seq {
			t.Fatalf("the claim forgot its message before the copy came (%v)", c.DeferredSeq)
		}
		b.send("m1", "pay", `{}`, nil) // the operator re-submits it
		b.waitCompleted(b.q, "m1", 2)
		b.waitIdle()
		if got := b.eff.Performed("m1"); got != 1 {
			t.Fatalf("performed %d times, want 1: the copy must run the work its vanished message carried", got)
		}
		if c := b.claimOf("m1"); c.State != claim.StateProcessed || c.DeferredSeq != nil {
			t.Fatalf("claim %s naming %v (%s), want processed and naming no message", c.State, c.DeferredSeq, c.LastError)
		}
	})
}

// peekFailing is a receiver whose peeks fail while fail is set.
type peekFailing struct {
	*membus.Receiver
	fail  *atomic.Bool
	peeks *atomic.Int64
}

func (r peekFailing) PeekMessages(ctx context.Context, n int, o *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if o != nil && o.FromSequenceNumber != nil {
		r.peeks.Add(1)
		if r.fail.Load() {
			return nil, &azservicebus.Error{Code: azservicebus.CodeConnectionLost}
		}
	}
	return r.Receiver.PeekMessages(ctx, n, o)
}

// TestCopyOfAPayloadlessClaimIsKeptWhileItsMessageIsUnsure: a copy of a
// payloadless claim whose message is deferred elsewhere cannot tell
// whether that message is still at the broker (the peek fails): it waits,
// looking again, and at the end of its watch is given back, never
// completed — it may be the only body left. Once a peek finds the
// deferred message, the next delivery of the copy completes.
func TestCopyOfAPayloadlessClaimIsKeptWhileItsMessageIsUnsure(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	var down, fail atomic.Bool
	var peeks atomic.Int64
	down.Store(true)
	b.eff.behave = func(_, _ string, _ int) error {
		if down.Load() {
			return sideeffects.Retryable(errors.New("downstream 503"))
		}
		return nil
	}
	opts := b.deferOptions()
	b.router.backoff = sideeffects.Backoff{First: time.Hour, Factor: 1, Max: time.Hour, Horizon: 24 * time.Hour}
	opts.StorePayload = false
	opts.MaxLockRenewal = time.Second // the least the take-over window allows
	opts.Retry.Budget = 500 * time.Millisecond
	opts.NewReceiver = func(context.Context) (processor.Receiver, error) {
		return peekFailing{Receiver: b.q.NewReceiver(), fail: &fail, peeks: &peeks}, nil
	}
	b.start(opts)
	b.send("m1", "pay", `{}`, nil)
	b.eventually("the message is deferred for an hour", func() bool {
		for _, c := range b.claims() {
			if c.MessageID == "m1" && c.DeferredSeq != nil && c.DueAt != nil {
				return true
			}
		}
		return false
	})
	down.Store(false)

	fail.Store(true)
	b.send("m1", "pay", `{}`, nil) // a copy, its carrier unsure
	b.eventually("the copy given back at the end of its watch", func() bool { return b.q.Stats().Abandoned >= 1 })
	if got := countCompleted(b.q, "m1"); got != 0 {
		t.Fatalf("completed %d while the claim's message could not be found for sure, want 0", got)
	}
	if peeks.Load() < 2 {
		t.Fatalf("%d peeks: the copy did not look again while it waited", peeks.Load())
	}
	fail.Store(false)
	b.waitCompleted(b.q, "m1", 1) // the redelivery peeks, finds the deferred message and completes
	if calls := b.eff.Calls("m1"); calls != 1 {
		t.Fatalf("calls %d, want 1 (the refused one): the copy must not run beside its deferred message", calls)
	}
}
