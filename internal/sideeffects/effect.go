package sideeffects

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// Effect is an external side effect (an HTTP call, an email, a charge) run
// once per claimed message. key is the claim's idempotency key (the
// claim's Key(): for new claims scoped to the consumer, "<consumer>/<dedup
// key>"; see claim.KeyForm): the effect must pass it downstream as the
// idempotency key, unchanged on every attempt; an effect of several
// requests derives each one's key with StepKey.
//
// msg is the SDK's own message value; an effect must treat it as read-only.
// The returned error is classified by Classify: wrap it with Retryable,
// Permanent, Unknown, Rejected or Conflict to say what happened (and call
// ReportAnswer to have the downstream's answer recorded on the claim); an
// unwrapped error counts as
// OutcomeUnknown (the safe default: a claim is only released when the effect
// definitely did not happen).
type Effect interface {
	Perform(ctx context.Context, msg *azservicebus.ReceivedMessage, key string) error
}

// EffectFunc adapts a function to Effect.
type EffectFunc func(ctx context.Context, msg *azservicebus.ReceivedMessage, key string) error

// Perform calls f.
func (f EffectFunc) Perform(ctx context.Context, msg *azservicebus.ReceivedMessage, key string) error {
	return f(ctx, msg, key)
}

// TxEffect is a database-only effect. It runs inside the transaction that
// inserts the claim marker, so the marker and the effect's writes commit
// together or not at all (one phase, no reconciliation needed). The
// transaction is the only database handle it gets: a write made any other
// way would escape the guarantee.
type TxEffect interface {
	PerformTx(ctx context.Context, tx *sql.Tx, msg *azservicebus.ReceivedMessage, key string) error
}

// TxEffectFunc adapts a function to TxEffect.
type TxEffectFunc func(ctx context.Context, tx *sql.Tx, msg *azservicebus.ReceivedMessage, key string) error

// PerformTx calls f.
func (f TxEffectFunc) PerformTx(ctx context.Context, tx *sql.Tx, msg *azservicebus.ReceivedMessage, key string) error {
	return f(ctx, tx, msg, key)
}

// Handler is what a Router resolves a message to: exactly one of Effect or
// TxEffect is set.
type Handler struct {
	Name     string // route name, for logs, metrics and the claim
	Effect   Effect
	TxEffect TxEffect
	// Recovery says whether an attempt whose outcome is unknown may be
	// repeated without an operator ("" is RecoveryAuto).
	Recovery Recovery
	// Fingerprint identifies what the effect does (for an HTTP route: each
	// step's name, method and URL). A claim records its route's name and
	// fingerprint; a take-over, recovery or redrive under another name or
	// fingerprint is refused, so a key is never sent to another effect.
	Fingerprint string
	// KeyLifetime is how long the downstream keeps an idempotency key
	// (Stripe: 24h); zero: for ever. A claim whose key is older than that
	// (by the database clock, from ClaimedAt, or from KeyRevisedAt after a
	// redrive under a new key) is not repeated with the same key by a
	// redelivery's take-over, the reconciler's recovery or an operator's
	// redrive: the downstream would not deduplicate the repeat. It is
	// flagged instead (see KeyExpired). Routes file: keyLifetime: 24h. Not
	// part of the fingerprint.
	KeyLifetime time.Duration
	// AllowNewKey says an operator may redrive a claim of this route under
	// a new idempotency key (the reconciler's redrive --new-key, key
	// <key>:r<N>): for a downstream that stored a failure under the key
	// and replays it to every retry (Stripe stores a 500). A new key is a
	// new request to the downstream — it deduplicates nothing against the
	// old one — so it is safe only after an operator checked the
	// downstream did nothing under the old key; on a route with steps it
	// repeats every step, performed ones included. Routes file:
	// allowNewKey: true (default false).
	AllowNewKey bool
	// KeyForm is the form of the idempotency keys of the claims taken for
	// this route from now on ("" is claim.KeyFormScoped: the consumer and
	// the dedup key, escaped); claim.KeyFormRaw sends the raw dedup key
	// (the MessageId) for a downstream that needs it. Claims already taken
	// keep the form they recorded. Routes file: key: raw (default
	// scoped). Not part of the fingerprint: changing it changes no claim
	// in flight.
	KeyForm claim.KeyForm
	// HoldSessionOnFailure, on a session-enabled entity, holds a message's
	// session when its claim fails (a final answer) or is flagged: the
	// session's next message does not run until an operator resolves or
	// redrives the claim (for flows where it must not run after a
	// failure). Off: the message is dead-lettered once and its session
	// goes on. Routes file: holdSessionOnFailure: true. Not part of the
	// fingerprint; no effect without sessions.
	HoldSessionOnFailure bool
	// Backoff is the route's delayed-retry schedule (zero: DefaultBackoff).
	Backoff Backoff
	// Breaker is the route's breaker (zero: DefaultBreaker).
	Breaker Breaker
}

// Manual reports whether the handler's route is RecoveryManual.
func (h Handler) Manual() bool { return h.Recovery == RecoveryManual }

// Recovery is a route's answer to "may sbclaim repeat this effect with the
// same idempotency key on its own?".
type Recovery string

const (
	// RecoveryAuto: the downstream deduplicates on Idempotency-Key, so an
	// attempt whose outcome is unknown may be repeated with the same key —
	// by the processor's retries, by a redelivery that takes over a claim
	// whose holder went silent, and by the reconciler's recovery pass. The
	// default.
	RecoveryAuto Recovery = "auto"
	// RecoveryManual: the downstream does not honour the key. An attempt
	// whose outcome is unknown is never repeated without an operator: the
	// processor stops retrying at the first unknown outcome, redeliveries
	// do not take over a silent holder, and the reconciler flags the claim
	// instead of recovering it. (A claim whose effect was definitely not
	// performed — released — is still taken over.)
	RecoveryManual Recovery = "manual"
)

// Valid reports whether r is "", auto or manual.
func (r Recovery) Valid() bool { return r == "" || r == RecoveryAuto || r == RecoveryManual }

// Fingerprint returns the fingerprint of an effect made of parts (for an
// HTTP route: each step's name, method and URL): the first 16 bytes of the
// SHA-256 of the parts, NUL-separated, in hex. Secrets (headers) are not
// part of it, so rotating a key does not change it.
func Fingerprint(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// Router picks the handler for a message. It returns an *InputError when the
// message cannot be handled at all (no route, a body the route cannot take):
// the processor dead-letters such messages with the error's reason.
type Router interface {
	Route(msg *azservicebus.ReceivedMessage) (Handler, error)
}

// InputError is bad input: the message can never be processed, so it is
// dead-lettered with Reason as DeadLetterReason and Description as
// ErrorDescription.
type InputError struct {
	Reason      string // short, machine-readable: "NoRoute", "MalformedBody", ...
	Description string // human-readable
}

func (e *InputError) Error() string { return e.Reason + ": " + e.Description }

// Dead-letter reasons for bad input.
const (
	ReasonNoRoute       = "NoRoute"
	ReasonMalformedBody = "MalformedBody"
)

// Outcome is what an effect attempt did. Every effect error is sorted into
// one of these in one place (Classify). Outcomes marshal as their names
// (MarshalText), so logs and JSON say "rejected", never 4.
type Outcome int

const (
	// OutcomeOK: the effect happened.
	OutcomeOK Outcome = iota
	// OutcomeRetryable: the effect was definitely not performed and may
	// succeed later (release the claim, abandon the message).
	OutcomeRetryable
	// OutcomePermanent: the effect was definitely not performed and never
	// will be (the claim fails, the message is dead-lettered once).
	OutcomePermanent
	// OutcomeUnknown: the effect may or may not have happened (keep the
	// claim with its last error; the reconciler flags it).
	OutcomeUnknown
	// OutcomeRejected: the downstream gave its final business answer for
	// this key (a card decline): the effect is finished — the downstream
	// may have recorded it, as a failed charge — and must never be
	// repeated with this key. Only an answer rule of a route says so; the
	// default table never does.
	OutcomeRejected
	// OutcomeConflict: the downstream says the key was already used with
	// another payload (422 in the default table; Stripe's 400
	// idempotency_error through an answer rule). This payload was not
	// performed under the key and never will be.
	OutcomeConflict
)

var outcomeNames = [...]string{
	OutcomeOK:        "ok",
	OutcomeRetryable: "retryable",
	OutcomePermanent: "permanent",
	OutcomeUnknown:   "unknown",
	OutcomeRejected:  "rejected",
	OutcomeConflict:  "conflict",
}

func (o Outcome) String() string {
	if o >= 0 && int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Valid reports whether o is one of the Outcome constants.
func (o Outcome) Valid() bool { return o >= 0 && int(o) < len(outcomeNames) }

// Final reports whether o ends the retry loop and settles the key for
// good: ok, permanent, rejected and conflict. (Retryable and unknown are
// retried.)
func (o Outcome) Final() bool {
	return o == OutcomeOK || o == OutcomePermanent || o == OutcomeRejected || o == OutcomeConflict
}

// ParseOutcome reads an outcome name: ok, retryable, permanent, unknown,
// rejected or conflict.
func ParseOutcome(s string) (Outcome, error) {
	for o, n := range outcomeNames {
		if n == s {
			return Outcome(o), nil
		}
	}
	return OutcomeUnknown, fmt.Errorf("unknown outcome %q (want ok, retryable, permanent, unknown, rejected or conflict)", s)
}

// MarshalText implements encoding.TextMarshaler: the outcome's name (an
// invalid value marshals as "Outcome(n)", which UnmarshalText refuses, so
// that a log line never fails).
func (o Outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler (see ParseOutcome).
func (o *Outcome) UnmarshalText(b []byte) error {
	v, err := ParseOutcome(string(b))
	if err != nil {
		return err
	}
	*o = v
	return nil
}

// Error is a classified effect error.
type Error struct {
	Outcome Outcome
	// RetryAfter is the downstream's Retry-After, when it gave one.
	RetryAfter time.Duration
	// Answer is the downstream's answer to the failed attempt (nil when
	// there was none: a transport error, or an effect that reported none).
	// AnswerOf finds it anywhere in an error chain.
	Answer *Answer
	// Operator (only with OutcomeUnknown) says a person must decide: the
	// answer is final for this key although the effect's outcome is
	// unknown (a failure the downstream stored under the key and replays
	// to every repeat). The retry loop stops at it, and the claim is
	// flagged at once instead of being repeated. See NeedsOperator.
	Operator bool
	// Config (only with OutcomeRetryable) says the answer is about
	// sbclaim's configuration, not the request: see Misconfigured.
	Config bool
	Err    error
}

func (e *Error) Error() string {
	if e.Err == nil {
		return e.Outcome.String()
	}
	return e.Outcome.String() + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// Retryable marks err as "not performed, may succeed later".
func Retryable(err error) error { return &Error{Outcome: OutcomeRetryable, Err: err} }

// Permanent marks err as "not performed, never will be".
func Permanent(err error) error { return &Error{Outcome: OutcomePermanent, Err: err} }

// Unknown marks err as "may or may not have happened".
func Unknown(err error) error { return &Error{Outcome: OutcomeUnknown, Err: err} }

// Rejected marks err as the downstream's final business answer for the key
// (a decline): finished, never to be repeated.
func Rejected(err error) error { return &Error{Outcome: OutcomeRejected, Err: err} }

// Conflict marks err as "the key was already used with another payload".
func Conflict(err error) error { return &Error{Outcome: OutcomeConflict, Err: err} }

// NeedsOperator marks err as "a person must decide": the outcome is
// unknown (the effect may have happened) and repeating it with this key
// cannot settle it — the downstream replays a failure it stored under the
// key (Stripe's Idempotent-Replayed 5xx). Retries stop at it, and the
// claim is flagged for an operator at once, with the answer, by the
// processor, the reconciler's recovery and a redrive alike. An answer
// rule's outcome "flag" returns it.
func NeedsOperator(err error) error { return &Error{Outcome: OutcomeUnknown, Operator: true, Err: err} }

// ForOperator reports whether err was marked NeedsOperator: the first
// *Error in its chain has an unknown outcome and Operator set.
func ForOperator(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Outcome == OutcomeUnknown && e.Operator
}

// Classify sorts an effect's error into an Outcome: nil is OutcomeOK, an
// *Error (anywhere in the chain) is its Outcome, anything else — including a
// cancelled or timed-out context — is OutcomeUnknown.
func Classify(err error) Outcome {
	if err == nil {
		return OutcomeOK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Outcome
	}
	return OutcomeUnknown
}
