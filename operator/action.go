package operator

import (
	"errors"
	"fmt"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/bridge"
	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/reconciler"
)

// ActionKind says how an operator action (Redrive, Resolve, HandOff, Retry)
// ended when it did not succeed.
type ActionKind int

// The ways an action ends short of success.
const (
	// ActionRefused: the claim cannot take the action now (it is not
	// flagged, its payload was not stored, its route is not the one it was
	// taken for, someone acted first). Nothing was changed.
	ActionRefused ActionKind = iota + 1
	// ActionEffectFailed: the redrive ran the effect and it did not
	// succeed. With a final Outcome the claim is failed (Failed); otherwise
	// it is flagged again with the failure as its reason (Reflagged). When
	// neither could be written, the redrive's hold lapses and the
	// reconciler recovers or flags the claim within its stale window.
	ActionEffectFailed
	// ActionNotRecorded: the redrive's effect WAS performed, but recording
	// it failed. Do not redrive it again: the reconciler flags it again
	// once the redrive's hold lapses; resolve it as done.
	ActionNotRecorded
)

// String returns the kind's name: refused, effect failed or not recorded.
func (k ActionKind) String() string {
	switch k {
	case ActionRefused:
		return "refused"
	case ActionEffectFailed:
		return "effect failed"
	case ActionNotRecorded:
		return "not recorded"
	}
	return fmt.Sprintf("ActionKind(%d)", int(k))
}

// ActionError is an operator action that did not succeed; Kind says how.
// It wraps the reason (ErrNotFlagged, ErrStateChanged, ... for a refusal;
// the effect's error otherwise).
type ActionError struct {
	Kind    ActionKind
	ClaimID int64
	// Claim is the claim as the action left it (nil when it could not be
	// read).
	Claim *sbclaim.Claim
	// Why says, for a refusal, why the claim cannot take the action.
	Why string
	// Route and IdempotencyKey are the route whose effect a redrive ran
	// and the key it sent (ActionEffectFailed, ActionNotRecorded).
	Route          string
	IdempotencyKey string
	// Outcome, Attempts and Answer are the failed effect's
	// (ActionEffectFailed): how its last attempt ended, how many were
	// made, and the downstream's last answer (nil: none).
	Outcome  sbclaim.Outcome
	Attempts int
	Answer   *sbclaim.Answer
	// Failed: the outcome was final and the claim is failed. Reflagged:
	// it was not, and the claim is flagged again.
	Failed, Reflagged bool
	Err               error
}

// Error says what happened, in the words the CLI prints.
func (e *ActionError) Error() string {
	switch e.Kind {
	case ActionRefused:
		return fmt.Sprintf("claim %d: %s; nothing was changed", e.ClaimID, e.Why)
	case ActionEffectFailed:
		return fmt.Sprintf("redrive claim %d: effect %q failed after %d attempt(s) with idempotency key %q, outcome %s: %v",
			e.ClaimID, e.Route, e.Attempts, e.IdempotencyKey, e.Outcome, e.Err)
	case ActionNotRecorded:
		return fmt.Sprintf("redrive claim %d: the effect WAS performed (idempotency key %q), but recording it failed: %v",
			e.ClaimID, e.IdempotencyKey, e.Err)
	}
	return fmt.Sprintf("claim %d: %v", e.ClaimID, e.Err)
}

// Unwrap returns the reason.
func (e *ActionError) Unwrap() error { return e.Err }

// actionError turns the operator actions' internal errors into
// *ActionError; any other error is returned as it is.
func actionError(err error) error {
	var (
		refused *reconciler.RefusedError
		effErr  *reconciler.EffectError
		recErr  *reconciler.RecordError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &refused):
		return &ActionError{Kind: ActionRefused, ClaimID: refused.ID, Claim: publicOrNil(refused.Claim), Why: refused.Why, Err: refused.Err}
	case errors.As(err, &effErr):
		return &ActionError{Kind: ActionEffectFailed, ClaimID: effErr.ClaimID, Route: effErr.Route, IdempotencyKey: effErr.Key,
			Outcome: sbclaim.Outcome(effErr.Outcome.String()), Attempts: effErr.Attempts, Answer: publicAnswer(effErr.Answer),
			Failed: effErr.Failed, Reflagged: effErr.Reflagged, Err: effErr.Err}
	case errors.As(err, &recErr):
		return &ActionError{Kind: ActionNotRecorded, ClaimID: recErr.ClaimID, IdempotencyKey: recErr.Key, Err: recErr.Err}
	}
	return err
}

// RouteOf returns the name of the route r selects for a claim's stored
// message, as Redrive and the reconciler's recovery route it; ok is false
// when no route of r selects it. When the name is not the claim's Route,
// this program does not have the claim's effect: a redrive here is
// refused, and HandOff hands the claim to the program that has it.
func RouteOf(r *sbclaim.Router, c *sbclaim.Claim) (route string, ok bool) {
	h, err := bridge.RouterOf(r).Route(reconciler.MessageFromClaim(&claim.Claim{MessageID: c.DedupKey, Payload: c.Payload,
		Subject: c.Subject, ContentType: c.ContentType, Properties: c.Properties}))
	if err != nil {
		return "", false
	}
	return h.Name, true
}

// publicOrNil is the public view of c (nil for nil).
func publicOrNil(c *claim.Claim) *sbclaim.Claim {
	if c == nil {
		return nil
	}
	return bridge.NewClaim(c).(*sbclaim.Claim)
}

// publicAnswer is the public view of a (nil for nil).
func publicAnswer(a *claim.Answer) *sbclaim.Answer {
	if a == nil {
		return nil
	}
	return &sbclaim.Answer{Status: a.Status, Step: a.Step, Headers: a.Headers, Fields: a.Fields, Truncated: a.Truncated}
}
