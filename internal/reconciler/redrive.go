package reconciler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/held"
	"github.com/sbclaim/sbclaim/internal/protocol"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// The operator actions: Redrive and Resolve. The CLI and the console call
// these, so an action means the same whatever front end an operator uses,
// and every one of them is a guarded, audited write: an action never races
// a processor, the reconciler or another operator silently.

// Reasons Redrive refuses a claim without running anything.
var (
	// ErrNotFlagged: only a flagged claim can be redriven.
	ErrNotFlagged = errors.New("claim is not flagged")
	// ErrNoPayload: the claim's payload was not stored (payload storage
	// off), so the message cannot be rebuilt.
	ErrNoPayload = errors.New("claim has no stored payload")
	// ErrNotRedrivable: the claim's route is a database-only TxEffect,
	// which runs in the claim's own transaction and cannot be re-run alone.
	ErrNotRedrivable = errors.New("route cannot be redriven")
	// ErrNewKeyNotAllowed: a redrive under a new key was asked for a claim
	// whose route does not allow it (allowNewKey in the routes file).
	ErrNewKeyNotAllowed = errors.New("route does not allow a new idempotency key")
	// ErrKeyExpired: a redrive with the claim's key was asked, but the key
	// is older than the route's KeyLifetime (keyLifetime in the routes
	// file): the downstream no longer deduplicates it. The claim stays
	// flagged; redrive it under a new key (allowNewKey routes) or resolve
	// it after checking the downstream.
	ErrKeyExpired = errors.New("idempotency key older than the downstream keeps keys")
)

// RefusedError is an action refused because the claim is not (or no longer)
// in a state that allows it. Nothing was changed. Claim is the claim as it
// is now (nil if it could not be read).
type RefusedError struct {
	ID    int64
	Claim *claim.Claim
	Why   string
	Err   error // ErrNotFlagged, ErrNoPayload, ErrNotRedrivable, ErrNewKeyNotAllowed, claim.ErrRouteChanged, claim.ErrStateChanged, ...
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("claim %d: %s; nothing was changed", e.ID, e.Why)
}

func (e *RefusedError) Unwrap() error { return e.Err }

// EffectError is a redrive whose effect failed.
//
// When the downstream gave a final answer that is not a success
// (rejected, permanent, conflict: Outcome.Final), the claim is failed
// (Failed), like any claim that gets one: it is finished, never
// redriven or flagged again, and the next delivery of its message, if
// any, is dead-lettered with its fail reason. Otherwise (retryable,
// unknown) it was handed back to operators (flagged again, with this
// failure as its reason) unless Reflagged is false; then the redrive's
// hold on it lapses and the reconciler flags it again within its stale
// window. If failing it could not be written, neither is set: the hold
// lapses the same way.
type EffectError struct {
	Action    string // "redrive" ("" too) or "retry"
	ClaimID   int64
	Route     string
	Key       string              // the idempotency key the effect was sent with
	Outcome   sideeffects.Outcome // classified by sideeffects.Classify
	Attempts  int
	Reflagged bool
	Failed    bool
	Answer    *claim.Answer // the downstream's last answer, if any
	Err       error
}

func (e *EffectError) Error() string {
	return fmt.Sprintf("%s claim %d: effect %q failed after %d attempt(s) with idempotency key %q, outcome %s: %v",
		cmp.Or(e.Action, "redrive"), e.ClaimID, e.Route, e.Attempts, e.Key, e.Outcome, e.Err)
}

func (e *EffectError) Unwrap() error { return e.Err }

// RecordError is a redrive whose effect WAS performed, but whose final write
// (resolving the claim as redriven) failed. The claim stays held by the
// redrive until its hold lapses; the reconciler then flags it again
// ("redrive interrupted"), and an operator resolves it as done.
type RecordError struct {
	ClaimID int64
	Key     string // the idempotency key the effect was performed with
	Err     error
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("redrive claim %d: the effect WAS performed (idempotency key %q), but recording it failed: %v", e.ClaimID, e.Key, e.Err)
}

func (e *RecordError) Unwrap() error { return e.Err }

// RedriveParams is the input of Redrive.
type RedriveParams struct {
	ID   int64  // the flagged claim
	By   string // operator, recorded as the holder and on the resolution
	Note string // recorded on the resolution; defaults to "redriven"
	// NewKey redrives under a new idempotency key, revision N of the
	// claim's key in its form (claim.NextKey: "<consumer>/<key>:r<N>"
	// scoped, "<key>:r<N>" raw; N: the claim's KeyRevision + 1; a route
	// with steps extends it with each step's name), recorded on the claim with the operator and the note (both
	// required) in the take-over itself; every later attempt of the claim
	// uses it. Only for a route with allowNewKey (else ErrNewKeyNotAllowed),
	// and only after checking the downstream did nothing under the old key.
	NewKey bool
	// Routes are the processors' routes; the claim's consumer's are used.
	Routes Routes
	// Retry is the policy the effect is re-run with. For a route with
	// recovery: manual (a downstream that does not honour the key) Redrive
	// sets StopOnUnknown whatever is passed: an attempt whose outcome is
	// unknown is never repeated.
	Retry sideeffects.RetryPolicy
	// HeartbeatInterval is how often the redrive's hold on the claim is
	// renewed while the effect runs; default 30s (the processors').
	HeartbeatInterval time.Duration
	// StoreTimeout bounds each store call; default DefaultQueryTimeout.
	StoreTimeout time.Duration
	Logger       *slog.Logger // may be nil
	Metrics      *Metrics     // may be nil
	// TracerProvider makes the redrive's spans; nil: the global one.
	TracerProvider trace.TracerProvider
}

// Redrive re-runs the effect of a flagged claim with the same idempotency
// key (the claim's Key(): its MessageID, or the key an earlier redrive
// with NewKey chose), so that an effect the original attempt had already
// performed is deduplicated downstream; with NewKey, under the next key.
//
// It refuses, changing nothing (a *RefusedError), a claim that is not
// flagged (ErrNotFlagged, also when another redrive holds it), has no
// stored payload (ErrNoPayload), routes to a TxEffect (ErrNotRedrivable), or
// whose route in params.Router is not the one it was taken for
// (claim.ErrRouteChanged: a wrong routes file would send the key to another
// effect), or, without NewKey, whose key is older than its route's
// KeyLifetime by the database clock (ErrKeyExpired: the downstream would
// not deduplicate the repeat; the claim stays flagged). Then it takes the claim over (path operator: guarded on the
// claim still being flagged, so of two concurrent redrives one runs and
// the other is refused, and Resolve refuses while it runs), runs the effect
// holding it, and resolves it as redriven, with the downstream's answer.
// When the effect gets a final answer that is not a success it fails the
// claim; when it fails otherwise it flags the claim again; either way an
// *EffectError. When the effect succeeded but the resolution could not be
// written, a *RecordError.
func Redrive(ctx context.Context, store claim.Store, p *RedriveParams) (c *claim.Claim, err error) {
	ctx, endSpan := startAction(ctx, p.TracerProvider, "redrive", p.ID)
	defer func() { endSpan(c, err) }()
	logger := cmp.Or(p.Logger, slog.New(slog.DiscardHandler))
	timeout := cmp.Or(p.StoreTimeout, DefaultQueryTimeout)
	if len(p.Routes) == 0 {
		return nil, errors.New("redrive: no routes (the processors' routes file) configured")
	}
	if p.By == "" {
		return nil, errors.New("redrive: By (the operator) is required")
	}
	if p.NewKey && strings.TrimSpace(p.Note) == "" {
		return nil, errors.New("redrive: a new key needs a Note: what was checked on the downstream, for whoever reads this claim next")
	}
	c, err = get(ctx, store, timeout, p.ID)
	if err != nil {
		return nil, fmt.Errorf("redrive claim %d: %w", p.ID, err)
	}
	switch operate(protocol.ActRedrive, c, false).Refusal {
	case protocol.OpNotFlagged:
		return c, &RefusedError{ID: c.ID, Claim: c, Why: notFlagged(c), Err: ErrNotFlagged}
	case protocol.OpNoPayload:
		return c, &RefusedError{ID: c.ID, Claim: c, Err: ErrNoPayload,
			Why: "its payload was not stored (payload storage was off when it was claimed), so it cannot be re-run; resolve it by hand"}
	}
	msg := MessageFromClaim(c)
	h, refused := routeFor(c, p.Routes, p.NewKey, "redrive", "")
	if refused != nil {
		return c, refused
	}

	if !p.NewKey && h.KeyLifetime > 0 {
		tctx, cancel := context.WithTimeout(ctx, timeout)
		now, err := store.Now(tctx)
		cancel()
		if err != nil {
			return c, fmt.Errorf("redrive claim %d: read the database clock: %w", c.ID, err)
		}
		if reason, expired := held.KeyExpired(c, h.KeyLifetime, now); expired {
			next := "check the downstream, then resolve it by hand"
			if h.AllowNewKey {
				next = "check the downstream, then redrive it under a new key or resolve it"
			}
			return c, &RefusedError{ID: c.ID, Claim: c, Err: ErrKeyExpired,
				Why: fmt.Sprintf("route %q: %s; it stays flagged: %s", h.Name, reason, next)}
		}
	}

	log := spanLogger(ctx, logger).With("claim_id", c.ID, "message_id", c.MessageID, "consumer", c.Consumer, "route", h.Name, "by", p.By)
	holder := "operator:" + p.By
	reason := "redrive by " + p.By + ": " + cmp.Or(p.Note, "redriven")
	if p.NewKey {
		reason = fmt.Sprintf("redrive by %s with a new key (%s): %s", p.By, c.NextKey(), p.Note)
	}
	tctx, cancel := context.WithTimeout(ctx, timeout)
	taken, err := store.TakeOver(tctx, &claim.TakeOverParams{
		ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(), Path: claim.PathOperator,
		By: holder, Reason: reason, Route: h.Name, Fingerprint: h.Fingerprint, NewKey: p.NewKey,
	})
	cancel()
	if err != nil {
		if errors.Is(err, claim.ErrStateChanged) || errors.Is(err, claim.ErrRouteChanged) {
			now := cmp.Or(taken, c)
			return now, &RefusedError{ID: c.ID, Claim: now, Err: err, Why: "someone acted first: " + notFlagged(now)}
		}
		return c, fmt.Errorf("redrive claim %d: take it over: %w", c.ID, err)
	}
	return runTaken(ctx, store, &runParams{c: c, taken: taken, h: h, msg: msg, by: p.By, note: cmp.Or(p.Note, "redriven"), newKey: p.NewKey,
		retry: p.Retry, heartbeat: p.HeartbeatInterval, timeout: timeout, log: log, metrics: p.Metrics, action: "redrive"})
}

// runParams is what runTaken needs: the claim before and after an
// operator took it over, its route and message, and who acts.
type runParams struct {
	c, taken  *claim.Claim
	h         sideeffects.Handler
	msg       *azservicebus.ReceivedMessage
	by, note  string
	newKey    bool
	retry     sideeffects.RetryPolicy
	heartbeat time.Duration
	timeout   time.Duration
	log       *slog.Logger
	metrics   *Metrics
	action    string // redrive | retry
}

// runTaken runs the effect of a claim an operator took over (a redrive or
// a retry), holding it, and records how it ended: resolved as redriven on
// success, failed on a final answer, flagged again otherwise.
func runTaken(ctx context.Context, store claim.Store, rp *runParams) (*claim.Claim, error) {
	c, taken, h, msg, log, timeout := rp.c, rp.taken, rp.h, rp.msg, rp.log, rp.timeout
	holder := "operator:" + rp.by
	if rp.metrics != nil {
		rp.metrics.TakeOvers.WithLabelValues(string(claim.PathOperator)).Inc()
	}
	key := taken.Key()
	log = log.With("idempotency_key", key)
	log.Info("running the effect of a claim an operator took over", "action", rp.action, "new_key", rp.newKey)
	// A manual route's downstream does not deduplicate: an attempt that may
	// have been performed is never sent again, as on every other path
	// (processor, recovery), whatever policy the caller passed.
	retry := rp.retry
	retry.StopOnUnknown = retry.StopOnUnknown || h.Manual()
	res := held.Run(ctx, held.Params{
		Store: store, Claim: taken, Effect: h.Effect, Message: msg, Key: key, Retry: retry,
		HeartbeatInterval: cmp.Or(rp.heartbeat, 30*time.Second), StoreTimeout: timeout, Logger: log,
		Outbox: hasOutbox(store),
	})
	if res.Lost != nil {
		return taken, fmt.Errorf("redrive claim %d: the claim was taken from this redrive while its effect ran (effect outcome %s): %w",
			c.ID, res.Outcome, res.Lost)
	}
	if res.Outcome != sideeffects.OutcomeOK {
		effErr := &EffectError{Action: rp.action, ClaimID: c.ID, Route: h.Name, Key: key, Outcome: res.Outcome, Attempts: res.Attempts, Answer: res.Answer, Err: res.Err}
		if failReason := held.FailReason(res.Outcome); failReason != "" {
			// The downstream's final word about the key: the claim is
			// finished, as it would be on any other path.
			desc := held.FailDescription(res.Err, res.Answer)
			ferr := held.Write(ctx, timeout, time.Minute, func(ctx context.Context) error {
				return store.Fail(ctx, &claim.FailParams{ID: c.ID, Owner: taken.Owner, Reason: failReason, Error: desc, Answer: res.Answer})
			})
			if ferr != nil {
				log.Warn("redrive got a final answer and failing the claim failed; its hold lapses and the reconciler recovers or flags it", "error", ferr)
			} else {
				log.Warn("redrive got a final answer: claim failed", "effect_outcome", res.Outcome, "fail_reason", failReason)
			}
			effErr.Failed = ferr == nil
			return taken, effErr
		}
		reason := fmt.Sprintf(rp.action+" by %s failed after %d attempt(s), outcome %s: %s", rp.by, res.Attempts, res.Outcome, claim.ErrorText(res.Err))
		if sideeffects.ForOperator(res.Err) {
			// The retries stopped at once: a person must decide.
			reason = fmt.Sprintf(rp.action+" by %s: %s", rp.by, held.OperatorReason(res.Err))
		}
		ferr := held.Write(ctx, timeout, time.Minute, func(ctx context.Context) error {
			_, err := store.Flag(ctx, &claim.FlagParams{ID: c.ID, Owner: taken.Owner, State: claim.StateClaimed, Reason: reason, By: holder})
			return err
		})
		if ferr != nil {
			log.Warn("redrive failed and flagging the claim again failed; its hold lapses and the reconciler flags it", "error", ferr)
		}
		effErr.Reflagged = ferr == nil
		return taken, effErr
	}

	// The effect happened; record it even if the caller's context ended
	// just now, or the claim would wrongly look unfinished.
	var resolved *claim.Claim
	err := held.Write(ctx, timeout, time.Minute, func(ctx context.Context) error {
		var err error
		resolved, err = store.Resolve(ctx, &claim.ResolveParams{
			ID: c.ID, Owner: taken.Owner, Resolution: claim.ResolutionRedriven, By: rp.by, Note: rp.note,
			Answer: res.Answer, FollowUps: claim.NumberFollowUps(taken.Consumer, taken.MessageID, res.FollowUps),
		})
		return err
	})
	if err != nil {
		return taken, &RecordError{ClaimID: c.ID, Key: key, Err: err}
	}
	log.Info("claim redriven", "attempts", res.Attempts)
	return resolved, nil
}

// ResolveParams is the input of Resolve.
type ResolveParams struct {
	ID           int64
	Resolution   claim.Resolution // ResolutionDone or ResolutionDiscarded
	By, Note     string           // both required
	StoreTimeout time.Duration    // default DefaultQueryTimeout
}

// Resolve closes a flagged claim by hand, audited (who, when, which note).
// It is guarded on the claim being flagged: a claim a redrive holds, or
// that someone resolved first, is refused with a *RefusedError that says
// what the claim is now.
func Resolve(ctx context.Context, store claim.Store, p *ResolveParams) (*claim.Claim, error) {
	if p.Resolution != claim.ResolutionDone && p.Resolution != claim.ResolutionDiscarded {
		return nil, fmt.Errorf("resolve claim %d: resolution must be %s or %s (a redrive resolves as %s), got %q",
			p.ID, claim.ResolutionDone, claim.ResolutionDiscarded, claim.ResolutionRedriven, p.Resolution)
	}
	if p.By == "" || p.Note == "" {
		return nil, fmt.Errorf("resolve claim %d: who (By) and why (Note) are required", p.ID)
	}
	timeout := cmp.Or(p.StoreTimeout, DefaultQueryTimeout)
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := store.Resolve(rctx, &claim.ResolveParams{ID: p.ID, Resolution: p.Resolution, By: p.By, Note: p.Note})
	if errors.Is(err, claim.ErrStateChanged) {
		now, gerr := get(ctx, store, timeout, p.ID)
		if gerr != nil {
			return nil, &RefusedError{ID: p.ID, Err: err, Why: "it is no longer flagged"}
		}
		return now, &RefusedError{ID: p.ID, Claim: now, Err: err, Why: notFlagged(now)}
	}
	if err != nil {
		return nil, fmt.Errorf("resolve claim %d: %w", p.ID, err)
	}
	return c, nil
}

// notFlagged says what a claim is instead of flagged.
func notFlagged(c *claim.Claim) string {
	switch {
	case c.State == claim.StateFlagged:
		return "it is flagged"
	case c.State == claim.StateClaimed && c.TakeOverPath == claim.PathOperator:
		return fmt.Sprintf("it is being redriven by %s (since %s)", c.ClaimedBy, stamp(c.TakenOverAt))
	case c.State == claim.StateResolved:
		return fmt.Sprintf("it is resolved (%s by %s at %s)", c.Resolution, c.ResolvedBy, stamp(c.ResolvedAt))
	case c.State == claim.StateFailed:
		return fmt.Sprintf("it is failed (%s at %s): the downstream gave a final answer, and a failed claim is never redriven or resolved", c.FailReason, stamp(c.FailedAt))
	case c.State == claim.StateClaimed:
		return fmt.Sprintf("it is claimed by %s, not flagged", c.ClaimedBy)
	}
	return fmt.Sprintf("it is %s, not flagged", c.State)
}

func stamp(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

func get(ctx context.Context, store claim.Store, timeout time.Duration, id int64) (*claim.Claim, error) {
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	return store.Get(gctx, id)
}

// MessageFromClaim rebuilds the message a claim was taken for
// (sideeffects.MessageFromClaim): a redrive and the recovery pass route
// it and run its effect on it.
func MessageFromClaim(c *claim.Claim) *azservicebus.ReceivedMessage {
	return sideeffects.MessageFromClaim(c)
}

// routeFor resolves the effect that re-runs claim c (an operator's redrive
// or retry, verb) under routes. It refuses, with a *RefusedError that
// changes nothing: a consumer without routes (noRoutes, when not empty,
// says what to do instead), a message no route takes, a database-only
// route (ErrNotRedrivable), a route other than the one the claim was
// taken for (claim.ErrRouteChanged: a wrong routes file would send the
// key to another effect), and newKey on a route without allowNewKey.
func routeFor(c *claim.Claim, routes Routes, newKey bool, verb, noRoutes string) (sideeffects.Handler, *RefusedError) {
	refuse := func(err error, why string) (sideeffects.Handler, *RefusedError) {
		return sideeffects.Handler{}, &RefusedError{ID: c.ID, Claim: c, Err: err, Why: why}
	}
	router := routes.For(c.Consumer)
	if router == nil {
		why := fmt.Sprintf("no routes are configured for its consumer %q", c.Consumer)
		if noRoutes != "" {
			why += " (" + noRoutes + ")"
		}
		return refuse(claim.ErrRouteChanged, why)
	}
	h, err := router.Route(MessageFromClaim(c))
	// The rule the processor's poller and the recovery follow
	// (protocol.Repeat); an operator may repeat a manual route's key (a
	// person decided), so the outcome counts as known here.
	step := protocol.RepeatStep{Unroutable: err != nil}
	if err == nil {
		step.Transactional, step.RouteChanged = h.Effect == nil, c.RouteDiffers(h.Name, h.Fingerprint)
	}
	switch protocol.Repeat(step) {
	case protocol.Unroutable:
		return refuse(err, fmt.Sprintf("the routes file routes no effect to it: %v", err))
	case protocol.Transactional:
		return refuse(ErrNotRedrivable, fmt.Sprintf("route %q is a database-only (transactional) effect, which cannot be re-run alone", h.Name))
	case protocol.RouteChanged:
		return refuse(claim.ErrRouteChanged, fmt.Sprintf("it was taken for route %q (fingerprint %s), but this routes file routes it to %q (fingerprint %s): give the routes file of consumer %q as it was",
			c.Route, c.Fingerprint, h.Name, h.Fingerprint, c.Consumer))
	}
	switch {
	case newKey && !h.AllowNewKey:
		return refuse(ErrNewKeyNotAllowed, fmt.Sprintf("route %q does not allow a new idempotency key (allowNewKey: true in the routes file): a new key is a new request the downstream deduplicates nothing against; %s it with its key %q",
			h.Name, verb, c.Key()))
	}
	return h, nil
}

// operate asks the protocol about an operator's action on claim c.
func operate(act protocol.OperatorAction, c *claim.Claim, handOffAsked bool) protocol.OperatorDecision {
	return protocol.Operate(protocol.OperatorStep{Action: act, State: protocol.State(c.State), PayloadStored: c.Payload != nil,
		HandOffAsked: handOffAsked, NamesMessage: c.DeferredSeq != nil})
}
