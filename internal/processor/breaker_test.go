package processor_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/metricreg"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// wideRefusalStore refuses every write with a store-wide class while refuse
// is set (a database that turned read-only after a failover, or lost its
// grant); reads still work. It counts the breaker's write probes.
type wideRefusalStore struct {
	claim.Store
	class  claim.Class
	refuse atomic.Bool
	probes atomic.Int64
}

func (s *wideRefusalStore) check() error {
	if s.refuse.Load() {
		return claim.NewError(s.class, errors.New("injected: writes refused"))
	}
	return nil
}

func (s *wideRefusalStore) ClaimBatch(ctx context.Context, p *claim.ClaimBatchParams) ([]claim.ClaimResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.Store.ClaimBatch(ctx, p)
}

func (s *wideRefusalStore) Heartbeat(ctx context.Context, p *claim.HeartbeatParams) error {
	if p.ID < 0 {
		s.probes.Add(1)
	}
	if err := s.check(); err != nil {
		return err
	}
	return s.Store.Heartbeat(ctx, p)
}

func (s *wideRefusalStore) MarkProcessed(ctx context.Context, p *claim.MarkProcessedParams) error {
	if err := s.check(); err != nil {
		return err
	}
	return s.Store.MarkProcessed(ctx, p)
}

// TestBreakerStopsReceivingWhileTheStoreRefuses: when claims fail with a
// store-wide class, the processor stops receiving (no message taken and
// abandoned, no delivery count burnt), reports not ready, counts the trip
// and probes with a write until the store accepts writes again; then it
// processes everything.
func TestBreakerStopsReceivingWhileTheStoreRefuses(t *testing.T) {
	for _, class := range []claim.Class{claim.ClassReadOnly, claim.ClassPermission, claim.ClassConnection} {
		t.Run(class.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, "sqlite", membus.QueueOptions{})
			st := &wideRefusalStore{Store: b.store, class: class}
			opts := b.options()
			opts.Store = st
			opts.MaxConcurrentCalls = 2
			opts.BrokerProbeInterval = 20 * time.Millisecond
			opts.Metrics = metricreg.ProcessorMetrics(nil)
			p, _ := b.start(opts)
			b.send("before", "pay", `{}`, nil)
			b.eventually("the first message processed", func() bool { return outcomes(opts.Metrics, processor.ResultProcessed) == 1 })
			b.eventually("ready", p.Ready)

			before := st.probes.Load() // the start-up probe
			st.refuse.Store(true)
			for i := range 6 {
				b.send(fmt.Sprintf("during-%d", i), "pay", `{}`, nil)
			}
			b.eventually("the breaker to open", func() bool { return metricValue(opts.Metrics.StoreBreakerOpen) == 1 })
			if p.Ready() {
				t.Error("ready while the store refuses writes")
			}
			// Receiving is paused: once the run loop probes (no receive is
			// in flight then), the deliveries stay where they are while the
			// breaker keeps probing (at least 3 more probes).
			b.eventually("the breaker's first probe", func() bool { return st.probes.Load() > before })
			delivered := b.q.Stats().Deliveries
			probes := st.probes.Load()
			b.eventually("the breaker to keep probing", func() bool { return st.probes.Load() >= probes+3 })
			if got := b.q.Stats().Deliveries; got != delivered {
				t.Errorf("deliveries went from %d to %d while the breaker was open: receiving was not paused", delivered, got)
			}
			if got := metricValue(opts.Metrics.StoreBreakerTrips.With(class.String())); got != 1 {
				t.Errorf("sbclaim_store_breaker_trips_total{class=%s} = %v, want 1 (one trip, however many calls failed)", class, got)
			}

			st.refuse.Store(false)
			b.waitIdle()
			b.eventually("ready again", p.Ready)
			for i := range 6 {
				k := fmt.Sprintf("during-%d", i)
				if c := b.claimOf(k); c.State != claim.StateProcessed || c.DeliveryCount > 2 {
					t.Errorf("%s: %s after delivery %d; want processed, at most one delivery burnt", k, c.State, c.DeliveryCount)
				}
			}
			if got := metricValue(opts.Metrics.StoreBreakerOpen); got != 0 {
				t.Errorf("breaker gauge %v after the store recovered", got)
			}
		})
	}
}

// TestReadinessFollowsServiceBus: with the broker unreachable (receives
// block, as the SDK's do while it reconnects), the periodic probe turns
// Ready false; once the broker is back, true again. An idle but reachable
// broker keeps the processor ready.
func TestReadinessFollowsServiceBus(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	opts := b.options()
	opts.BrokerProbeInterval = 20 * time.Millisecond
	opts.BrokerProbeTimeout = 50 * time.Millisecond
	opts.Metrics = metricreg.ProcessorMetrics(nil)
	p, _ := b.start(opts)
	b.eventually("ready (the first probe answered)", p.Ready)
	b.q.SetUnreachable(true)
	b.eventually("not ready while Service Bus is unreachable", func() bool { return !p.Ready() })
	if r := p.NotReadyReason(); r == "" {
		t.Error("no reason given for not being ready")
	}
	if got := metricValue(opts.Metrics.BrokerReachable); got != 0 {
		t.Errorf("sbclaim_servicebus_reachable = %v while unreachable", got)
	}
	b.q.SetUnreachable(false)
	b.eventually("ready again", p.Ready)
	b.send("m1", "pay", `{}`, nil)
	b.waitIdle()
	if got := b.claimOf("m1").State; got != claim.StateProcessed {
		t.Errorf("after the outage: %s", got)
	}
}
