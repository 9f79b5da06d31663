package processor

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sbclaim/sbclaim/internal/held"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// A breaker per route.
//
// Each route (by name) counts the deliveries in a row whose effect failed
// for want of the downstream (failing): a retryable or unknown outcome
// with no answer (a connection failure, a timeout) or a 5xx or 429. After
// the route's Breaker.Failures of them, or at once on a configuration
// answer (sideeffects.Misconfigured: 401, 403, 407), the route opens:
// runHeld no longer calls the effect but postpones the claim it won
// (postpone: released, message deferred until the probe is due; with
// deferral off, released and abandoned). ProbeAfter after it opened, one
// delivery at a time is let through as a probe: a probe the downstream
// answers closes the route, a failed one opens it again for ProbeAfter. A
// probe that never reports (its worker crashed) is replaced after
// ProbeAfter.
//
// When every route of the router (the router lists them: Names) is open
// and no probe is due, the receive loop pauses like the store breaker,
// and Ready is false naming the routes; it resumes when a probe is due.

// Trip reasons (sbclaim_route_breaker_trips_total's reason label).
const (
	tripFailures = "failures" // Breaker.Failures failing deliveries in a row
	tripProbe    = "probe"    // a probe failed
	tripConfig   = "config"   // a configuration answer (Misconfigured)
)

// routeBreakers holds the breaker of every route the processor saw.
type routeBreakers struct {
	now   func() time.Time
	names []string // every route of the router; nil: unknown (never pause)

	mu     sync.Mutex
	routes map[string]*routeBreaker
}

type routeBreaker struct {
	failures int       // failing deliveries in a row
	open     bool      // open (or half open: a probe is due or out)
	until    time.Time // no probe before then
	probing  bool      // a probe is out (until is when it is given up)
	reason   string    // why it opened
}

func newRouteBreakers(router sideeffects.Router) *routeBreakers {
	b := &routeBreakers{now: time.Now, routes: map[string]*routeBreaker{}}
	if n, ok := router.(interface{ Names() []string }); ok {
		b.names = slices.Compact(slices.Sorted(slices.Values(n.Names())))
	}
	return b
}

func (b *routeBreakers) get(name string) *routeBreaker {
	r := b.routes[name]
	if r == nil {
		r = &routeBreaker{}
		b.routes[name] = r
	}
	return r
}

// allow reports whether a delivery of route h may call the effect: the
// route is closed, or it is open and this delivery is its probe (probe
// is true). When it may not, wait is how long until a probe is due and
// reason why the route is open.
func (b *routeBreakers) allow(h sideeffects.Handler) (ok, probe bool, wait time.Duration, reason string) {
	if h.Breaker.Off {
		return true, false, 0, ""
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.get(h.Name)
	if !r.open {
		return true, false, 0, ""
	}
	now := b.now()
	if now.Before(r.until) {
		return false, false, r.until.Sub(now), r.reason
	}
	r.probing = true
	r.until = now.Add(h.Breaker.WithDefaults().ProbeAfter)
	return true, true, 0, ""
}

// failing reports whether res counts against its route: the downstream
// could not be reached, did not answer in time, failed (5xx) or is
// rate limiting (429).
func failing(res held.Result) bool {
	if res.Outcome != sideeffects.OutcomeRetryable && res.Outcome != sideeffects.OutcomeUnknown {
		return false
	}
	if sideeffects.ForOperator(res.Err) {
		return false // the downstream answered: a stored failure
	}
	status := 0
	if a := sideeffects.AnswerOf(res.Err); a != nil {
		status = a.Status
	} else if res.Answer != nil {
		status = res.Answer.Status
	}
	return status == 0 || status >= 500 || status == 429
}

// record counts a delivery's result on route h (probe: it was let
// through as one). tripped is the trip reason when it opened the route
// ("" otherwise); closed says a probe closed it.
func (b *routeBreakers) record(h sideeffects.Handler, probe bool, res held.Result) (tripped, why string, closed bool) {
	if h.Breaker.Off {
		return "", "", false
	}
	cfg := h.Breaker.WithDefaults()
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.get(h.Name)
	now := b.now()
	switch {
	case res.Outcome == sideeffects.OutcomeRetryable && sideeffects.IsMisconfigured(res.Err):
		status := 0
		if a := sideeffects.AnswerOf(res.Err); a != nil {
			status = a.Status
		} else if res.Answer != nil {
			status = res.Answer.Status // a Go handler's ReportAnswer
		}
		why = misconfiguredReason(h.Name, status)
		tripped = tripConfig
	case failing(res):
		r.failures++
		switch {
		case probe && r.open:
			tripped, why = tripProbe, fmt.Sprintf("route %s: the probe failed: %s", h.Name, res.Err)
		case !r.open && r.failures >= cfg.Failures:
			tripped, why = tripFailures, fmt.Sprintf("route %s: %d deliveries in a row failed (connection failures, timeouts, 5xx, 429); last: %s", h.Name, r.failures, res.Err)
		}
	default:
		// The downstream answered (or the effect succeeded).
		r.failures = 0
		if r.open && probe {
			r.open, r.probing, r.reason = false, false, ""
			return "", "", true
		}
		return "", "", false
	}
	if tripped != "" {
		r.open, r.probing, r.reason = true, false, why
		r.until = now.Add(cfg.ProbeAfter)
	} else if probe {
		r.probing = false
	}
	return tripped, why, false
}

// misconfiguredReason names the route and the status of a configuration
// answer.
func misconfiguredReason(route string, status int) string {
	if status == 0 {
		return fmt.Sprintf("route %s: the effect reported a configuration error: check the route's configuration", route)
	}
	what := "check the route's credentials"
	if status == 407 {
		what = "check the proxy's credentials"
	}
	return fmt.Sprintf("route %s: the downstream answered %d: %s", route, status, what)
}

// allOpen reports whether every route of the router is open (a probe due
// or out included), and the open routes with their reasons.
func (b *routeBreakers) allOpen() (bool, string) {
	if len(b.names) == 0 {
		return false, ""
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	parts := make([]string, 0, len(b.names))
	for _, n := range b.names {
		r := b.routes[n]
		if r == nil || !r.open {
			return false, ""
		}
		parts = append(parts, r.reason)
	}
	return true, strings.Join(parts, "; ")
}

// pause reports how long the receive loop should wait: every route of
// the router is open and no probe is due for that long (0: receive).
func (b *routeBreakers) pause() time.Duration {
	if len(b.names) == 0 {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	var wait time.Duration
	for i, n := range b.names {
		r := b.routes[n]
		if r == nil || !r.open || !now.Before(r.until) {
			return 0
		}
		if w := r.until.Sub(now); i == 0 || w < wait {
			wait = w
		}
	}
	return wait
}
