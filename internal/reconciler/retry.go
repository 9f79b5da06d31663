package reconciler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/held"
	"github.com/sbclaim/sbclaim/internal/protocol"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// ErrNotFailed: only a failed claim can be retried.
var ErrNotFailed = errors.New("claim is not failed")

// ErrMessageUnsettled: a retry that hands the claim to the next delivery
// of its message was asked while the claim still names a deferred message
// whose settlement is not recorded (its holder died, or its write failed,
// between failing the claim and recording the dead letter). Until the
// processors' stranded sweep settles it, a re-submitted copy would be
// taken for a second message moving for the claim and completed.
var ErrMessageUnsettled = errors.New("claim still names a deferred message that is not settled")

// RetryParams is the input of Retry.
type RetryParams struct {
	ID   int64  // the failed claim
	By   string // the operator (required), recorded as the holder
	Note string // why (required): what was fixed
	// NewKey retries under a new idempotency key (revision N of the
	// claim's key, as a redrive's NewKey): for a downstream that stored
	// the failure under the old key and replays it. Only on a route with
	// allowNewKey (else ErrNewKeyNotAllowed).
	NewKey bool
	// HandOff hands the retried claim to the binary that runs its route
	// (a Go handler the caller does not have) instead of running it here:
	// the claim is taken over and released, as HandOff does for a flagged
	// one. A claim without a stored payload is always handed off: its
	// message must come again (re-submit its dead letter).
	HandOff bool
	// Routes are the processors' routes; the claim's consumer's are used
	// (required unless HandOff without NewKey).
	Routes Routes
	// Retry, HeartbeatInterval, StoreTimeout, Logger, Metrics and
	// TracerProvider are as for Redrive.
	Retry             sideeffects.RetryPolicy
	HeartbeatInterval time.Duration
	StoreTimeout      time.Duration
	Logger            *slog.Logger
	Metrics           *Metrics
	TracerProvider    trace.TracerProvider
}

// Retry re-runs a failed claim after an operator fixed what made the
// downstream refuse it (a misconfiguration: an API key without "Bearer ",
// a wrong content type). A failed claim is the downstream's final word for
// its key, so nothing retries it by itself, and a copy of its message
// completes as a duplicate (or carries the failure to the dead-letter
// queue); Retry is the one way it runs again.
//
// With the same key (the operator asserts the downstream did not store its
// answer under it: a 401 or 400 before its idempotency layer) or, with
// NewKey on an allowNewKey route, the next key (the downstream stored the
// failure under the old one). It is guarded and audited like a redrive:
// one TakeOver on the operator path with Retry, guarded on the claim still
// being failed (of concurrent retries, one wins, and the others are
// refused, as a Resolve would be), recorded as a "retried" history row with
// who, why, the key and the failure it retries, in the same write.
//
// Then, with a stored payload and the route here, it runs the effect
// holding the claim, like Redrive: resolved as redriven on success, failed
// again on a final answer, flagged otherwise. With HandOff, or without a
// stored payload, it releases the claim: the reconciler that runs the
// route re-runs it from the payload once released for its stale window,
// or, without a payload, the next delivery of its message does (re-submit
// its dead letter; without one the reconciler flags it for operators).
// Either way a copy of the message that comes after the claim finished
// completes as a duplicate, so the effect runs once.
//
// It refuses, changing nothing (a *RefusedError), a claim that is not
// failed (ErrNotFailed), one without a stored payload that still names a
// deferred message whose settlement is not recorded (ErrMessageUnsettled:
// the next delivery it hands the claim to would be taken for a second
// message of the claim), one whose route here is not the one it was taken
// for (claim.ErrRouteChanged), a database-only route (ErrNotRedrivable),
// and NewKey on a route without allowNewKey (ErrNewKeyNotAllowed).
func Retry(ctx context.Context, store claim.Store, p *RetryParams) (c *claim.Claim, err error) {
	ctx, endSpan := startAction(ctx, p.TracerProvider, "retry", p.ID)
	defer func() { endSpan(c, err) }()
	logger := cmp.Or(p.Logger, slog.New(slog.DiscardHandler))
	timeout := cmp.Or(p.StoreTimeout, DefaultQueryTimeout)
	if p.By == "" || strings.TrimSpace(p.Note) == "" {
		return nil, fmt.Errorf("retry claim %d: who (By) and why (Note: what was fixed) are required", p.ID)
	}
	c, err = get(ctx, store, timeout, p.ID)
	if err != nil {
		return nil, fmt.Errorf("retry claim %d: %w", p.ID, err)
	}
	dec := operate(protocol.ActRetry, c, p.HandOff)
	switch dec.Refusal {
	case protocol.OpNotFailed:
		return c, &RefusedError{ID: c.ID, Claim: c, Why: notFailed(c), Err: ErrNotFailed}
	case protocol.OpMessageUnsettled:
		// Race-free: a failed claim's DeferredSeq is only ever cleared.
		return c, &RefusedError{ID: c.ID, Claim: c, Err: ErrMessageUnsettled, Why: fmt.Sprintf(
			"its message (sequence number %d) was deferred and its settlement is not recorded yet: the processors dead-letter it (or find it gone) once its last holder's lock has ended; retry then, and re-submit its dead letter",
			*c.DeferredSeq)}
	}
	handOff := dec.HandOff
	var h sideeffects.Handler
	routed := false
	if !handOff || p.NewKey {
		var refused *RefusedError
		if h, refused = routeFor(c, p.Routes, p.NewKey, "retry", "retry it with a hand-off, to the binary that runs it"); refused != nil {
			return c, refused
		}
		routed = true
	}
	route, fingerprint := c.Route, c.Fingerprint
	if routed {
		route, fingerprint = h.Name, h.Fingerprint
	}

	holder := "operator:" + p.By
	key := c.Key()
	if p.NewKey {
		key = c.NextKey()
	}
	// The history row keeps the failure visible: FailedAt and FailReason
	// stay on the row, and the reason names them.
	reason := fmt.Sprintf("retry by %s of a claim failed (%s at %s: %s) with key %s: %s",
		p.By, c.FailReason, stamp(c.FailedAt), claim.ErrorText(errors.New(c.LastError)), key, p.Note)
	tctx, cancel := context.WithTimeout(ctx, timeout)
	taken, err := store.TakeOver(tctx, &claim.TakeOverParams{
		ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(), Path: claim.PathOperator, Retry: true,
		By: holder, Reason: reason, Route: route, Fingerprint: fingerprint, NewKey: p.NewKey,
	})
	cancel()
	if err != nil {
		if errors.Is(err, claim.ErrStateChanged) || errors.Is(err, claim.ErrRouteChanged) {
			now := cmp.Or(taken, c)
			return now, &RefusedError{ID: c.ID, Claim: now, Err: err, Why: "someone acted first: " + notFailed(now)}
		}
		return c, fmt.Errorf("retry claim %d: take it over: %w", c.ID, err)
	}
	log := spanLogger(ctx, logger).With("claim_id", c.ID, "message_id", c.MessageID, "consumer", c.Consumer, "route", route, "by", p.By)
	if handOff {
		if p.Metrics != nil {
			p.Metrics.TakeOvers.WithLabelValues(string(claim.PathOperator)).Inc()
		}
		why := fmt.Sprintf("retry requested by %s (%s): handed to the reconciler that runs route %q, which re-runs it with key %q",
			p.By, p.Note, route, taken.Key())
		if c.Payload == nil {
			why = fmt.Sprintf("retry requested by %s (%s): no stored payload, so the next delivery of its message runs it with key %q: re-submit its dead letter",
				p.By, p.Note, taken.Key())
		}
		err = held.Write(ctx, timeout, timeout, func(ctx context.Context) error {
			return store.Release(ctx, &claim.ReleaseParams{ID: c.ID, Owner: taken.Owner, Error: claim.ErrorText(errors.New(why))})
		})
		if err != nil {
			return taken, fmt.Errorf("retry claim %d: taken over, but releasing it failed (the reconciler flags it once its hold is stale): %w", c.ID, err)
		}
		log.Info("failed claim retried: handed off", "idempotency_key", taken.Key(), "payload", c.Payload != nil)
		return get(ctx, store, timeout, p.ID)
	}
	return runTaken(ctx, store, &runParams{c: c, taken: taken, h: h, msg: MessageFromClaim(c), by: p.By, note: "retry: " + p.Note,
		newKey: p.NewKey, retry: p.Retry, heartbeat: p.HeartbeatInterval, timeout: timeout, log: log, metrics: p.Metrics, action: "retry"})
}

// notFailed says what a claim is instead of failed.
func notFailed(c *claim.Claim) string {
	switch {
	case c.State == claim.StateFailed:
		return "it is failed"
	case c.State == claim.StateClaimed && c.TakeOverPath == claim.PathOperator:
		return fmt.Sprintf("it is being retried or redriven by %s (since %s)", c.ClaimedBy, stamp(c.TakenOverAt))
	case c.State == claim.StateResolved:
		return fmt.Sprintf("it is resolved (%s by %s at %s), not failed", c.Resolution, c.ResolvedBy, stamp(c.ResolvedAt))
	}
	return fmt.Sprintf("it is %s, not failed: only a failed claim is retried (a flagged one is redriven)", c.State)
}
