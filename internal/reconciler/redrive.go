package reconciler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

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
)

// EffectError is a redrive whose effect failed: the claim stays flagged.
type EffectError struct {
	ClaimID  int64
	Route    string
	Outcome  sideeffects.Outcome // classified by sideeffects.Classify
	Attempts int
	Err      error
}

func (e *EffectError) Error() string {
	return fmt.Sprintf("redrive claim %d: effect %q failed after %d attempt(s), outcome %s: %v",
		e.ClaimID, e.Route, e.Attempts, e.Outcome, e.Err)
}

func (e *EffectError) Unwrap() error { return e.Err }

// RedriveParams is the input of Redrive.
type RedriveParams struct {
	ID     int64              // the flagged claim
	By     string             // operator, recorded on the resolution
	Note   string             // defaults to "redriven"
	Router sideeffects.Router // the processor's routes
	Retry  sideeffects.RetryPolicy
	Logger *slog.Logger // may be nil
}

// Redrive re-runs the effect of a flagged claim with the same idempotency
// key (the claim's MessageID), so that an effect the original attempt had
// already performed is deduplicated downstream, and on success resolves the
// claim as redriven (which marks it processed).
//
// It refuses, without running anything, a claim that is not flagged
// (ErrNotFlagged), has no stored payload (ErrNoPayload) or routes to a
// TxEffect (ErrNotRedrivable). When the effect fails it returns an
// *EffectError and leaves the claim flagged. When the claim was resolved
// by someone else while the effect ran, it returns claim.ErrStateChanged
// (the effect, being idempotent, did no harm).
func Redrive(ctx context.Context, store claim.Store, p *RedriveParams) (*claim.Claim, error) {
	logger := p.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if p.Router == nil {
		return nil, errors.New("redrive: no router (routes file) configured")
	}
	c, err := store.Get(ctx, p.ID)
	if err != nil {
		return nil, fmt.Errorf("redrive claim %d: %w", p.ID, err)
	}
	if c.State != claim.StateFlagged {
		return c, fmt.Errorf("redrive claim %d: %w (state %s)", c.ID, ErrNotFlagged, c.State)
	}
	if c.Payload == nil {
		return c, fmt.Errorf("redrive claim %d: %w (payload storage was off when it was claimed); resolve it by hand", c.ID, ErrNoPayload)
	}

	msg := MessageFromClaim(c)
	h, err := p.Router.Route(msg)
	if err != nil {
		return c, fmt.Errorf("redrive claim %d: route message: %w", c.ID, err)
	}
	if h.Effect == nil {
		return c, fmt.Errorf("redrive claim %d: %w: route %q is a database-only (transactional) effect", c.ID, ErrNotRedrivable, h.Name)
	}

	log := logger.With("claim_id", c.ID, "message_id", c.MessageID, "consumer", c.Consumer, "route", h.Name)
	log.Info("redriving claim")
	attempts := 0
	err = p.Retry.Do(ctx, func(ctx context.Context) error {
		attempts++
		return h.Effect.Perform(ctx, msg, c.MessageID)
	}, func(attempt int, err error) {
		log.Warn("redrive attempt failed", "attempt", attempt, "outcome", sideeffects.Classify(err), "err", err)
	})
	if err != nil {
		return c, &EffectError{ClaimID: c.ID, Route: h.Name, Outcome: sideeffects.Classify(err), Attempts: attempts, Err: err}
	}

	// The effect happened; record it even if the caller's context ended
	// just now, or the claim would wrongly stay flagged.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultQueryTimeout)
	defer cancel()
	resolved, err := store.Resolve(rctx, &claim.ResolveParams{
		ID:         c.ID,
		Resolution: claim.ResolutionRedriven,
		By:         p.By,
		Note:       cmp.Or(p.Note, "redriven"),
	})
	if err != nil {
		return c, fmt.Errorf("redrive claim %d: effect succeeded but resolving the claim failed: %w", c.ID, err)
	}
	log.Info("claim redriven", "by", p.By, "attempts", attempts)
	return resolved, nil
}

// MessageFromClaim rebuilds the message a claim was taken for, as the SDK's
// own type, from what the claim stored: MessageID, Body (the stored
// payload), Subject, ContentType and ApplicationProperties (as strings).
// Broker-assigned fields (lock token, sequence number, delivery count) are
// left zero: a redrive has no delivery.
func MessageFromClaim(c *claim.Claim) *azservicebus.ReceivedMessage {
	msg := &azservicebus.ReceivedMessage{
		MessageID: c.MessageID,
		Body:      c.Payload,
	}
	if c.Subject != "" {
		subject := c.Subject
		msg.Subject = &subject
	}
	if c.ContentType != "" {
		contentType := c.ContentType
		msg.ContentType = &contentType
	}
	if len(c.Properties) > 0 {
		msg.ApplicationProperties = make(map[string]any, len(c.Properties))
		for k, v := range maps.All(c.Properties) {
			msg.ApplicationProperties[k] = v
		}
	}
	return msg
}
