package reconciler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/held"
	"github.com/sbclaim/sbclaim/internal/protocol"
)

// HandOffParams is the input of HandOff.
type HandOffParams struct {
	ID   int64
	By   string // the operator (required)
	Note string // why (required)
	// StoreTimeout bounds each store call; default DefaultQueryTimeout.
	StoreTimeout time.Duration
	// TracerProvider makes the hand-off's span; nil: the global one.
	TracerProvider trace.TracerProvider
}

// HandOff is the operator's redrive of a claim whose effect is code the
// operator's tool does not have: a Go handler in the user's own binary.
// The console and the CLI cannot run it, so they hand the claim to the
// binary that can: in two guarded, audited writes, the operator takes the
// flagged claim over (path operator: of two concurrent redrives or
// resolves, one wins) and releases it, recording who asked and why. A
// released claim is what the recovery pass re-runs: the reconciler passes
// running in the user's binary (operator.NewReconciler with its routers)
// take it over once it has been released for their stale window, check
// that its route and fingerprint are theirs, and run the handler with the
// claim's own idempotency key, so an effect that did happen is
// deduplicated downstream. On a manual route that run makes one attempt
// and stops at an unknown outcome, as every run of a manual route does.
//
// It refuses, changing nothing (a *RefusedError), a claim that is not
// flagged or has no stored payload (the recovery pass needs it).
func HandOff(ctx context.Context, store claim.Store, p *HandOffParams) (c *claim.Claim, err error) {
	ctx, endSpan := startAction(ctx, p.TracerProvider, "handoff", p.ID)
	defer func() { endSpan(c, err) }()
	timeout := cmp.Or(p.StoreTimeout, DefaultQueryTimeout)
	if p.By == "" || strings.TrimSpace(p.Note) == "" {
		return nil, fmt.Errorf("hand off claim %d: who (By) and why (Note) are required", p.ID)
	}
	c, err = get(ctx, store, timeout, p.ID)
	if err != nil {
		return nil, fmt.Errorf("hand off claim %d: %w", p.ID, err)
	}
	switch operate(protocol.ActHandOff, c, false).Refusal {
	case protocol.OpNotFlagged:
		return c, &RefusedError{ID: c.ID, Claim: c, Why: notFlagged(c), Err: ErrNotFlagged}
	case protocol.OpNoPayload:
		return c, &RefusedError{ID: c.ID, Claim: c, Err: ErrNoPayload,
			Why: "its payload was not stored, so no binary can re-run it; resolve it by hand"}
	}
	holder := "operator:" + p.By
	tctx, cancel := context.WithTimeout(ctx, timeout)
	taken, err := store.TakeOver(tctx, &claim.TakeOverParams{
		ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(), Path: claim.PathOperator,
		By: holder, Reason: "redrive handed off by " + p.By + ": " + p.Note,
		Route: c.Route, Fingerprint: c.Fingerprint,
	})
	cancel()
	if err != nil {
		if errors.Is(err, claim.ErrStateChanged) || errors.Is(err, claim.ErrRouteChanged) {
			now := cmp.Or(taken, c)
			return now, &RefusedError{ID: c.ID, Claim: now, Err: err, Why: "someone acted first: " + notFlagged(now)}
		}
		return c, fmt.Errorf("hand off claim %d: take it over: %w", c.ID, err)
	}
	why := fmt.Sprintf("redrive requested by %s (%s): handed to the reconciler that runs route %q, which re-runs it with key %q",
		p.By, p.Note, c.Route, taken.Key())
	err = held.Write(ctx, timeout, timeout, func(ctx context.Context) error {
		return store.Release(ctx, &claim.ReleaseParams{ID: c.ID, Owner: taken.Owner, Error: claim.ErrorText(errors.New(why))})
	})
	if err != nil {
		// The operator holds it with a silent heartbeat: the reconciler
		// flags it again once stale, and the operator can retry.
		return taken, fmt.Errorf("hand off claim %d: taken over, but releasing it failed (the reconciler flags it again once its hold is stale): %w", c.ID, err)
	}
	return get(ctx, store, timeout, p.ID)
}
