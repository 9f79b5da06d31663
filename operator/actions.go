package operator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/bridge"
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
	// ErrNotRedrivable: the claim's route is a TxHandlerFunc, which runs
	// in the claim's own transaction and cannot be re-run alone.
	ErrNotRedrivable = reconciler.ErrNotRedrivable
	// ErrKeyExpired: the claim's key is older than its route's
	// KeyLifetime; redrive it under a new key, or resolve it.
	ErrKeyExpired = reconciler.ErrKeyExpired
)

// Resolve closes a flagged claim by hand, recording by (the operator) and
// note (why; both required). A claim that is not flagged (any more) is
// refused with an *ActionError of Kind ActionRefused.
func Resolve(ctx context.Context, s *sbclaim.Store, id int64, as sbclaim.Resolution, by, note string) (*sbclaim.Claim, error) {
	c, err := reconciler.Resolve(ctx, bridge.StoreOf(s), &reconciler.ResolveParams{ID: id, Resolution: claim.Resolution(as), By: by, Note: note})
	return publicOrNil(c), actionError(err)
}

// RedriveOptions tune Redrive.
type RedriveOptions struct {
	// By is the operator, recorded as the holder and on the resolution
	// (required); Note says why.
	By, Note string
	// Routers are the routers by consumer the redrive finds the claim's
	// route in: it runs the route's handler here, now, with the claim's
	// idempotency key.
	Routers map[string]*sbclaim.Router
	// NewKey redrives under a new idempotency key, on a route that allows
	// it, after checking the downstream did nothing under the old one.
	NewKey bool
	// HeartbeatInterval is how often the redrive's hold on the claim is
	// renewed while the effect runs (default 30s, the processors').
	HeartbeatInterval time.Duration
	// QueryTimeout bounds each store call (default 30s).
	QueryTimeout time.Duration
	Logger       *slog.Logger
}

// Redrive re-runs the effect of a flagged claim, here and now, with the
// claim's idempotency key (the downstream deduplicates an effect the first
// attempt performed), holding the claim while it runs. A route with
// RecoveryManual makes one attempt and stops at an unknown outcome. When
// the effect is code this program does not have (RouteOf does not
// name the claim's route), use HandOff.
//
// When it does not succeed the error is an *ActionError: refused (nothing
// changed), the effect failed (the claim failed or flagged again), or the
// effect was performed but not recorded.
func Redrive(ctx context.Context, s *sbclaim.Store, id int64, opts RedriveOptions) (*sbclaim.Claim, error) {
	if len(opts.Routers) == 0 {
		return nil, errors.New("operator: redrive: Routers are required (use HandOff for a claim whose handler runs elsewhere)")
	}
	routes := make(reconciler.Routes, len(opts.Routers))
	for consumer, r := range opts.Routers {
		if r == nil {
			return nil, fmt.Errorf("operator: redrive: Routers[%q] is nil", consumer)
		}
		routes[consumer] = bridge.RouterOf(r)
	}
	c, err := reconciler.Redrive(ctx, bridge.StoreOf(s), &reconciler.RedriveParams{ID: id, By: opts.By, Note: opts.Note, NewKey: opts.NewKey,
		Routes: routes, Logger: opts.Logger, HeartbeatInterval: opts.HeartbeatInterval, StoreTimeout: opts.QueryTimeout})
	return publicOrNil(c), actionError(err)
}

// HandOff is the redrive of a flagged claim whose handler runs in another
// program (your binary's Go handler, from the console or the CLI): it
// takes the claim over and releases it, audited with by and note (both
// required), for the reconciler passes running with the handler
// (NewReconciler with Routers) to re-run with the claim's idempotency key
// once it has been released for their StaleAfter. A claim that is not
// flagged, or has no stored payload, is refused with an *ActionError of
// Kind ActionRefused.
func HandOff(ctx context.Context, s *sbclaim.Store, id int64, by, note string) (*sbclaim.Claim, error) {
	c, err := reconciler.HandOff(ctx, bridge.StoreOf(s), &reconciler.HandOffParams{ID: id, By: by, Note: note})
	return publicOrNil(c), actionError(err)
}

// ErrNotFailed: only a failed claim can be retried (Retry); a
// flagged one is redriven.
var ErrNotFailed = reconciler.ErrNotFailed

// ErrMessageUnsettled: a retry of a failed claim without a stored payload
// (Retry) waits while the claim still names a deferred message whose
// settlement is not recorded: the processors dead-letter it (or find it
// gone) once its last holder's lock has ended. Retry then.
var ErrMessageUnsettled = reconciler.ErrMessageUnsettled

// RetryOptions tune Retry.
type RetryOptions struct {
	// By is the operator and Note what was fixed (both required); both
	// are recorded in the claim's history ("retried").
	By, Note string
	// NewKey retries under a new idempotency key, on a route that allows
	// it (AllowNewKey): for a downstream that stored its failure under the
	// old key and would replay it. Without it the claim's key is used: the
	// operator asserts the downstream stored nothing under it (a 401 or a
	// 400 answered before its idempotency layer).
	NewKey bool
	// Routers are the routers by consumer the claim's route is found in:
	// the retry runs its handler here, now. Without Routers (the handler
	// runs in another program) the claim is handed off: released for the
	// reconciler passes running with the handler, as HandOff does.
	Routers map[string]*sbclaim.Router
	// HeartbeatInterval and QueryTimeout are as for RedriveOptions.
	HeartbeatInterval time.Duration
	QueryTimeout      time.Duration
	Logger            *slog.Logger
}

// Retry runs a failed claim again after the cause of its failure was
// fixed (a misconfiguration made the downstream refuse every request). A
// failed claim is the downstream's final answer: nothing retries it by
// itself, and a re-submitted dead letter of its message completes as a
// duplicate. Retry is the one way it runs again: a guarded, audited
// take-over of the claim, refused (an *ActionError of Kind ActionRefused,
// wrapping ErrNotFailed) when it is no longer failed, so of concurrent
// retries one runs. It then runs the route's handler like Redrive (or
// hands the claim off, without Routers, or when its payload was not
// stored: then the next delivery of its message runs it, so re-submit its
// dead letter). A copy of the message that comes after the claim finished
// completes as a duplicate: the effect runs once.
func Retry(ctx context.Context, s *sbclaim.Store, id int64, opts RetryOptions) (*sbclaim.Claim, error) {
	p := &reconciler.RetryParams{ID: id, By: opts.By, Note: opts.Note, NewKey: opts.NewKey, HandOff: len(opts.Routers) == 0,
		Logger: opts.Logger, HeartbeatInterval: opts.HeartbeatInterval, StoreTimeout: opts.QueryTimeout}
	if len(opts.Routers) > 0 {
		p.Routes = make(reconciler.Routes, len(opts.Routers))
		for consumer, r := range opts.Routers {
			if r == nil {
				return nil, fmt.Errorf("operator: retry: Routers[%q] is nil", consumer)
			}
			p.Routes[consumer] = bridge.RouterOf(r)
		}
	}
	c, err := reconciler.Retry(ctx, bridge.StoreOf(s), p)
	return publicOrNil(c), actionError(err)
}
