package sbclaim

import (
	"context"
	"errors"
	"log/slog"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/reconciler"
)

// The operator's actions on flagged claims. Each is a guarded, audited
// write (who, when, why): an action never races a processor, the
// reconciler or another operator silently; the loser changes nothing and
// gets an error that says what the claim is now.

// Why an operator action was refused; nothing was changed. The error
// wraps one of them.
var (
	ErrNotFlagged   = reconciler.ErrNotFlagged       // only a flagged claim can be redriven or resolved
	ErrNoPayload    = reconciler.ErrNoPayload        // the claim's payload was not stored: it cannot be re-run
	ErrStateChanged = claim.ErrStateChanged          // someone acted first
	ErrRouteChanged = claim.ErrRouteChanged          // the claim was taken for another route or fingerprint
	ErrNewKey       = reconciler.ErrNewKeyNotAllowed // the route does not allow a new idempotency key
	ErrKeyExpired   = reconciler.ErrKeyExpired       // the claim's key is older than its route's KeyLifetime: redrive it under a new key, or resolve it
)

// Resolution is how an operator closes a flagged claim by hand.
type Resolution string

const (
	// ResolutionDone: the operator checked that the effect happened.
	ResolutionDone Resolution = "done"
	// ResolutionDiscarded: the operator decided it must not happen.
	ResolutionDiscarded Resolution = "discarded"
)

// Resolve closes a flagged claim by hand, recording by (the operator) and
// note (why; both required).
func (s *Store) Resolve(ctx context.Context, id int64, as Resolution, by, note string) (*Claim, error) {
	c, err := reconciler.Resolve(ctx, s.s, &reconciler.ResolveParams{ID: id, Resolution: claim.Resolution(as), By: by, Note: note})
	return publicOrNil(c), err
}

// RedriveOptions tune Store.Redrive.
type RedriveOptions struct {
	// By is the operator, recorded as the holder and on the resolution
	// (required); Note says why.
	By, Note string
	// Routers are the routers by consumer the redrive finds the claim's
	// route in: it runs the route's handler here, now, with the claim's
	// idempotency key.
	Routers map[string]*Router
	// NewKey redrives under a new idempotency key, on a route that allows
	// it, after checking the downstream did nothing under the old one.
	NewKey bool
	Logger *slog.Logger
}

// Redrive re-runs the effect of a flagged claim, here and now, with the
// claim's idempotency key (the downstream deduplicates an effect the first
// attempt performed), holding the claim while it runs. A route with
// RecoveryManual makes one attempt and stops at an unknown outcome. When
// the effect is code this program does not have, use HandOff.
func (s *Store) Redrive(ctx context.Context, id int64, opts RedriveOptions) (*Claim, error) {
	if len(opts.Routers) == 0 {
		return nil, errors.New("sbclaim: redrive: Routers are required (use HandOff for a claim whose handler runs elsewhere)")
	}
	routes := make(reconciler.Routes, len(opts.Routers))
	for consumer, r := range opts.Routers {
		routes[consumer] = r.internal()
	}
	c, err := reconciler.Redrive(ctx, s.s, &reconciler.RedriveParams{ID: id, By: opts.By, Note: opts.Note, NewKey: opts.NewKey,
		Routes: routes, Logger: opts.Logger})
	return publicOrNil(c), err
}

// HandOff is the redrive of a flagged claim whose handler runs in another
// program (your binary's Go handler, from the console or the CLI): it
// takes the claim over and releases it, audited with by and note (both
// required), for the reconciler passes running with the handler
// (NewReconciler with Routers) to re-run with the claim's idempotency key
// once it has been released for their StaleAfter.
func (s *Store) HandOff(ctx context.Context, id int64, by, note string) (*Claim, error) {
	c, err := reconciler.HandOff(ctx, s.s, &reconciler.HandOffParams{ID: id, By: by, Note: note})
	return publicOrNil(c), err
}

func publicOrNil(c *claim.Claim) *Claim {
	if c == nil {
		return nil
	}
	return publicClaim(c)
}
