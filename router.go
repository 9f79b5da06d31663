package sbclaim

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// Recovery is a route's answer to "may sbclaim repeat this effect with the
// same idempotency key on its own, when its outcome is unknown?".
type Recovery string

const (
	// RecoveryAuto: the downstream deduplicates on the idempotency key,
	// so an attempt whose outcome is unknown is repeated with the same key
	// — by retries, by a redelivery that takes over a silent holder's
	// claim, and by the reconciler's recovery. The default.
	RecoveryAuto Recovery = "auto"
	// RecoveryManual: the downstream does not honour the key. An unknown
	// outcome is never repeated without an operator: retries stop at it,
	// and the reconciler flags the claim.
	RecoveryManual Recovery = "manual"
)

// Match selects the messages of a route.
type Match func(msg *azservicebus.ReceivedMessage) bool

// MatchSubject selects messages whose Subject is subject.
func MatchSubject(subject string) Match {
	m := sideeffects.Match{Subject: subject}
	return m.Matches
}

// MatchProperty selects messages carrying the application property name
// with value (compared as text: 42 and "42" match "42").
func MatchProperty(name, value string) Match {
	m := sideeffects.Match{Subject: sideeffects.AnySubject, Property: &sideeffects.PropertyMatch{Name: name, Value: value}}
	return m.Matches
}

// Route is one handler registered by name. Exactly one of Handler and
// TxHandler is set.
type Route struct {
	// Name is recorded on every claim taken for the route (required,
	// unique in a Router).
	Name string
	// Match selects the route's messages; nil selects every message.
	Match     Match
	Handler   HandlerFunc
	TxHandler TxHandlerFunc
	// Recovery is RecoveryAuto ("" too) or RecoveryManual.
	Recovery Recovery
	// Version goes into the route's fingerprint with its name. A claim
	// records both; a take-over, recovery or redrive under another name or
	// version is refused and the claim flagged, so a key is never sent to
	// an effect it was not taken for. Change it when the effect changes
	// meaning (another API, another amount field).
	Version string
	// AllowNewKey lets an operator redrive a flagged claim of this route
	// under a new idempotency key: for a downstream that stored a failure
	// under the key and replays it to every retry.
	AllowNewKey bool
	// HoldSessionOnFailure, on a session-enabled entity, holds a message's
	// session after a final answer (or a flag) until an operator resolves
	// or redrives the claim: the session's next message must not run
	// after a failure. Off (default): the message is dead-lettered once
	// and the session goes on. See docs/sessions.md.
	HoldSessionOnFailure bool
	// KeyLifetime is how long the downstream keeps an idempotency key
	// (Stripe: 24 hours); zero: for ever. A claim whose key is older than
	// that, by the database clock, is not repeated with the same key — by
	// a redelivery's take-over, the reconciler's recovery or a redrive —
	// because the downstream would not deduplicate the repeat: it is
	// flagged for an operator instead, with a reason naming the lifetime.
	// A redrive under a new key (AllowNewKey) is still allowed. It is not
	// part of the route's fingerprint.
	KeyLifetime time.Duration
	// JSONBody dead-letters a message whose body is not JSON
	// (MalformedBody) before it is claimed.
	JSONBody bool
	// Backoff is the route's delayed-retry schedule (zero:
	// DefaultBackoff).
	Backoff Backoff
	// Breaker is the route's breaker (zero: DefaultBreaker).
	Breaker Breaker
	// Middleware wraps this route's handler, inside the router's (see
	// Router.Use): the first is the outermost.
	Middleware []Middleware
}

// Router picks a message's route: the first registered route whose Match
// selects it, in registration order; a routes file (AddRoutesFile) is one
// entry among them. A message no route selects is dead-lettered NoRoute.
// Register every route before passing the router to NewProcessor or
// operator.NewReconciler: they take the routes it has then.
//
// A Match func also runs on messages the reconciler rebuilds from a claim
// (see Delivery.Message): match on Subject and application properties,
// not on the broker's fields.
type Router struct {
	entries []sideeffects.Router
	names   map[string]bool
	use     []Middleware
}

// NewRouter returns a router with routes, or an error naming every route
// that is invalid.
func NewRouter(routes ...Route) (*Router, error) {
	r := &Router{names: map[string]bool{}}
	var errs []error
	for _, rt := range routes {
		errs = append(errs, r.Add(rt))
	}
	return r, errors.Join(errs...)
}

// Add registers a route, or returns an error naming what is wrong with it.
func (r *Router) Add(rt Route) error {
	switch {
	case rt.Name == "":
		return errors.New("sbclaim: route: Name is required")
	case r.names[rt.Name]:
		return fmt.Errorf("sbclaim: route %q: Name is used twice", rt.Name)
	case (rt.Handler == nil) == (rt.TxHandler == nil):
		return fmt.Errorf("sbclaim: route %q: exactly one of Handler and TxHandler must be set", rt.Name)
	case rt.KeyLifetime < 0:
		return fmt.Errorf("sbclaim: route %q: KeyLifetime cannot be negative, got %s", rt.Name, rt.KeyLifetime)
	case rt.Recovery != "" && rt.Recovery != RecoveryAuto && rt.Recovery != RecoveryManual:
		return fmt.Errorf("sbclaim: route %q: Recovery must be %q or %q, got %q", rt.Name, RecoveryAuto, RecoveryManual, rt.Recovery)
	}
	if err := rt.Backoff.internal().Validate(); err != nil {
		return fmt.Errorf("sbclaim: route %q: Backoff: %w", rt.Name, err)
	}
	if err := rt.Breaker.internal().Validate(); err != nil {
		return fmt.Errorf("sbclaim: route %q: Breaker: %w", rt.Name, err)
	}
	r.init()
	r.names[rt.Name] = true
	r.entries = append(r.entries, r.newGoRoute(rt))
	return nil
}

// AddRoutesFile registers the HTTP routes of a routes file, as one entry
// at this point of the order.
func (r *Router) AddRoutesFile(f *RoutesFile) error {
	if f == nil {
		return errors.New("sbclaim: AddRoutesFile: no routes file")
	}
	r.init()
	for _, n := range f.r.Names() {
		if r.names[n] {
			return fmt.Errorf("sbclaim: routes file %s: route %q: Name is used twice", f.path, n)
		}
	}
	for _, n := range f.r.Names() {
		r.names[n] = true
	}
	r.entries = append(r.entries, f.r)
	return nil
}

func (r *Router) init() {
	if r.names == nil {
		r.names = map[string]bool{}
	}
}

// Names returns the registered routes' names.
func (r *Router) Names() []string {
	names := make([]string, 0, len(r.names))
	for n := range r.names {
		names = append(names, n)
	}
	return names
}

// internal returns the router the processor and the reconciler use.
func (r *Router) internal() sideeffects.Router { return sideeffects.Chain(r.entries...) }

// goRoute is a Route as the processor's router: an in-code sideeffects
// route that takes every message its Match selects (one implementation of
// JSON checks and fingerprints for both).
type goRoute struct {
	match Match
	route sideeffects.Routes
}

func (r *Router) newGoRoute(rt Route) goRoute {
	in := sideeffects.Route{Name: rt.Name, Match: sideeffects.Match{Subject: sideeffects.AnySubject},
		JSONBody: rt.JSONBody, Recovery: sideeffects.Recovery(cmp.Or(rt.Recovery, RecoveryAuto)), Version: rt.Version, AllowNewKey: rt.AllowNewKey,
		HoldSessionOnFailure: rt.HoldSessionOnFailure, KeyLifetime: rt.KeyLifetime, Backoff: rt.Backoff.internal(), Breaker: rt.Breaker.internal()}
	if h := rt.Handler; h != nil {
		in.Effect = HandlerFunc(func(ctx context.Context, d *Delivery) error {
			return r.wrap(rt.Middleware, h)(ctx, d)
		}).effect()
	} else {
		h := rt.TxHandler
		in.TxEffect = TxHandlerFunc(func(ctx context.Context, tx *sql.Tx, d *Delivery) error {
			return r.wrap(rt.Middleware, func(ctx context.Context, d *Delivery) error { return h(ctx, tx, d) })(ctx, d)
		}).txEffect()
	}
	return goRoute{match: rt.Match, route: sideeffects.Routes{in}}
}

func (g goRoute) Route(msg *azservicebus.ReceivedMessage) (sideeffects.Handler, error) {
	if g.match != nil && !g.match(msg) {
		return sideeffects.Handler{}, &sideeffects.InputError{Reason: sideeffects.ReasonNoRoute, Description: "no route matches"}
	}
	return g.route.Route(msg)
}

// RoutesFile is a routes file's HTTP routes: for users who do not write
// Go, each route calls an HTTP API with the message (or a request mapped
// from its JSON body) and the idempotency key. Package routesfile reads
// one (routesfile.Load, routesfile.Parse); Router.AddRoutesFile registers
// it. See docs/routes.md for the format.
type RoutesFile struct {
	path string
	r    *sideeffects.HTTPRouter
}

// Names returns the names of the file's routes, in file order.
func (f *RoutesFile) Names() []string { return f.r.Names() }
