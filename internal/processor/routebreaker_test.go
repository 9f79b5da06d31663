package processor_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/metricreg"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

func trips(m *processor.Metrics, route, reason string) int {
	return int(metricValue(m.RouteBreakerTrips.With(route, reason)))
}

func breakerOpen(m *processor.Metrics, route string) float64 {
	return metricValue(m.RouteBreakerOpen.With(route))
}

// namedRouter lists the default route as the router's only route, so
// that its breaker open means every route is open.
type namedRouter struct{ *router }

func (namedRouter) Names() []string { return []string{"effect"} }

// TestRouteBreakerOpensAfterFailures: Failures deliveries in a row that
// find the downstream down (no answer) open the route's breaker; a later
// message's claim is won, then released and its message deferred without
// calling the effect. Nothing is failed or dead-lettered.
func TestRouteBreakerOpensAfterFailures(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.eff.behave = func(_, _ string, _ int) error {
			return sideeffects.Retryable(errors.New("connection refused"))
		}
		opts := b.deferOptions()
		b.router.breaker = sideeffects.Breaker{Failures: 3, ProbeAfter: time.Hour}
		b.start(opts)
		for _, id := range []string{"m1", "m2", "m3"} {
			b.send(id, "pay", `{}`, nil)
		}
		b.eventually("the breaker to open", func() bool { return trips(opts.Metrics, "effect", "failures") == 1 })
		if got := breakerOpen(opts.Metrics, "effect"); got != 1 {
			t.Fatalf("sbclaim_route_breaker_open{route=effect} = %v, want 1", got)
		}

		b.send("m4", "pay", `{}`, nil)
		b.eventually("m4 postponed", func() bool {
			for _, c := range b.claims() {
				if c.MessageID == "m4" {
					return c.State == claim.StateReleased && c.DeferredSeq != nil
				}
			}
			return false
		})
		if calls := b.eff.Calls("m4"); calls != 0 {
			t.Fatalf("m4: the effect was called %d time(s) while the route's breaker was open", calls)
		}
		c := b.claimOf("m4")
		if !strings.Contains(c.LastError, "breaker is open") || !strings.Contains(c.LastError, "route effect") {
			t.Errorf("m4's error %q does not say the route's breaker is open", c.LastError)
		}
		// Deliveries the breaker postponed do not count: still one trip.
		if n := trips(opts.Metrics, "effect", "failures"); n != 1 {
			t.Errorf("failures trips %d, want 1", n)
		}
		if st := b.q.Stats(); st.DeadLettered != 0 {
			t.Fatalf("broker: %+v; want no dead letter", st)
		}
		for _, c := range b.claims() {
			if c.State == claim.StateFailed || c.State == claim.StateFlagged {
				t.Fatalf("claim %s is %s; the breaker must not end claims", c.MessageID, c.State)
			}
		}
	})
}

// TestRouteBreakerProbe: a failed probe opens the breaker again; a probe
// the downstream answers closes it, and later messages run at once.
func TestRouteBreakerProbe(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.eff.behave = func(_, key string, call int) error {
			if key == "m1" && call <= 2 {
				return sideeffects.Unknown(errors.New("timeout"))
			}
			return nil
		}
		opts := b.deferOptions()
		b.router.breaker = sideeffects.Breaker{Failures: 1, ProbeAfter: 30 * time.Millisecond}
		b.start(opts)
		b.send("m1", "pay", `{}`, nil)
		b.waitCompleted(b.q, "m1", 1)

		if n := trips(opts.Metrics, "effect", "failures"); n != 1 {
			t.Errorf("failures trips %d, want 1", n)
		}
		if n := trips(opts.Metrics, "effect", "probe"); n != 1 {
			t.Errorf("probe trips %d, want 1 (the first probe failed)", n)
		}
		if got := breakerOpen(opts.Metrics, "effect"); got != 0 {
			t.Fatalf("sbclaim_route_breaker_open{route=effect} = %v after a successful probe, want 0", got)
		}
		if calls, done := b.eff.Calls("m1"), b.eff.Performed("m1"); calls != 3 || done != 1 {
			t.Fatalf("m1: calls %d, performed %d; want 3 (a failure, a failed probe, a good probe) and 1", calls, done)
		}
		b.send("m2", "pay", `{}`, nil)
		b.waitCompleted(b.q, "m2", 1)
		if calls := b.eff.Calls("m2"); calls != 1 {
			t.Fatalf("m2: calls %d, want 1 (the breaker is closed)", calls)
		}
		if !strings.Contains(b.logs.String(), "route breaker closed") {
			t.Error("no log line says the route's breaker closed")
		}
		if c := b.claimOf("m1"); c.State != claim.StateProcessed {
			t.Fatalf("m1 is %s, want processed", c.State)
		}
	})
}

// TestRouteBreakerMisconfiguredOpensAtOnce: a 401 (Misconfigured) opens
// the route's breaker at its first occurrence with a reason naming the
// route and the status; the claim is released and postponed, not failed,
// and the message is not dead-lettered. After the fix a probe performs it.
func TestRouteBreakerMisconfiguredOpensAtOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		var fixed atomic.Bool
		b.eff.behaveCtx = func(ctx context.Context, _ string, _ int) error {
			if fixed.Load() {
				return nil
			}
			sideeffects.ReportAnswer(ctx, sideeffects.Answer{Status: 401})
			return sideeffects.Misconfigured(sideeffects.Permanent(errors.New("HTTP 401: unauthorized")))
		}
		opts := b.deferOptions()
		b.router.breaker = sideeffects.Breaker{Failures: 5, ProbeAfter: 50 * time.Millisecond}
		b.start(opts)
		b.send("m1", "pay", `{}`, nil)
		b.eventually("the breaker to open", func() bool { return trips(opts.Metrics, "effect", "config") == 1 })
		b.eventually("m1 postponed", func() bool {
			c := b.claimOf("m1")
			return c != nil && c.Postponements >= 1
		})
		c := b.claimOf("m1")
		if c.State == claim.StateFailed {
			t.Fatalf("m1's claim failed on a configuration answer: %q", c.LastError)
		}
		const want = "route effect: the downstream answered 401: check the route's credentials"
		if !strings.Contains(c.LastError, want) {
			t.Errorf("m1's error %q does not contain %q", c.LastError, want)
		}
		if n := trips(opts.Metrics, "effect", "failures"); n != 0 {
			t.Errorf("failures trips %d, want 0 (a configuration answer is its own reason)", n)
		}

		fixed.Store(true)
		b.waitCompleted(b.q, "m1", 1)
		b.waitIdle()
		if c := b.claimOf("m1"); c.State != claim.StateProcessed {
			t.Fatalf("m1 is %s after the fix, want processed", c.State)
		}
		if done := b.eff.Performed("m1"); done != 1 {
			t.Fatalf("m1 performed %d time(s), want 1", done)
		}
		if st := b.q.Stats(); st.DeadLettered != 0 {
			t.Fatalf("broker: %+v; want no dead letter", st)
		}
		if got := breakerOpen(opts.Metrics, "effect"); got != 0 {
			t.Fatalf("sbclaim_route_breaker_open{route=effect} = %v after the fix, want 0", got)
		}
	})
}

// TestRouteBreakerMisconfiguredWithoutDeferral: with delayed retries off
// a configuration answer still fails no claim: it is released and its
// message abandoned.
func TestRouteBreakerMisconfiguredWithoutDeferral(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.eff.behave = func(_, _ string, call int) error {
			if call == 1 {
				return sideeffects.Misconfigured(errors.New("HTTP 403"))
			}
			return nil
		}
		opts := noDeferral(b.options())
		opts.Metrics = metricreg.ProcessorMetrics(nil)
		b.router.breaker = sideeffects.Breaker{ProbeAfter: time.Millisecond}
		b.start(opts)
		b.send("m1", "pay", `{}`, nil)
		b.waitCompleted(b.q, "m1", 1)
		if c := b.claimOf("m1"); c.State != claim.StateProcessed {
			t.Fatalf("m1 is %s, want processed", c.State)
		}
		if st := b.q.Stats(); st.Abandoned == 0 || st.DeadLettered != 0 {
			t.Fatalf("broker: %+v; want an abandon and no dead letter", st)
		}
		if n := trips(opts.Metrics, "effect", "config"); n != 1 {
			t.Errorf("config trips %d, want 1", n)
		}
	})
}

// TestRouteBreakerEveryRouteOpenPausesReceiving: when every route of the
// router is open, the processor stops receiving and /readyz names the
// routes.
func TestRouteBreakerEveryRouteOpenPausesReceiving(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.eff.behave = func(_, _ string, _ int) error {
			return sideeffects.Retryable(errors.New("connection refused"))
		}
		opts := b.deferOptions()
		opts.Router = namedRouter{b.router}
		b.router.breaker = sideeffects.Breaker{Failures: 1, ProbeAfter: time.Hour}
		p, _ := b.start(opts)
		b.send("m1", "pay", `{}`, nil)
		b.eventually("not ready: every route open", func() bool {
			return !p.Ready() && strings.Contains(p.NotReadyReason(), "every route's breaker is open")
		})
		if reason := p.NotReadyReason(); !strings.Contains(reason, "route effect") {
			t.Fatalf("NotReadyReason %q does not name the open route", reason)
		}
		// A receive already waiting returns the next message (postponed
		// without calling the effect); then the loop pauses.
		b.send("m2", "pay", `{}`, nil)
		b.eventually("receiving paused", func() bool {
			return strings.Contains(b.logs.String(), "every route's breaker is open: not receiving")
		})
		if calls := b.eff.Calls("m2"); calls != 0 {
			t.Fatalf("m2: calls %d while every route is open", calls)
		}
	})
}
