package sbclaim

import (
	"context"
	"database/sql"
	"net/http"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// Delivery is one claimed message as a handler sees it. The processor
// builds it after the message's claim was won or taken over; a handler
// must treat it, and the message in it, as read-only.
type Delivery struct {
	msg      *azservicebus.ReceivedMessage
	key      string
	dedupKey string
	consumer string
	claimID  int64
	attempt  int
	form     claim.KeyForm       // how key was derived: its steps extend it alike
	outbox   *claim.FollowUpSink // the attempt's follow-ups (followup.go); nil: none
}

// Message returns the Service Bus SDK's own message value. When the
// reconciler's recovery or an operator's redrive runs the handler, there
// is no delivery: the message is rebuilt from what the claim stored —
// MessageID, Body, Subject, ContentType and the application properties
// as strings — and the broker's fields (lock token, sequence number,
// delivery count, CorrelationID) are zero.
func (d *Delivery) Message() *azservicebus.ReceivedMessage { return d.msg }

// DedupKey returns the message's dedup key: the key its claim is unique
// on, together with the consumer (the MessageId by default).
func (d *Delivery) DedupKey() string { return d.dedupKey }

// IdempotencyKey returns the key to send downstream (Stripe's
// Idempotency-Key, an email API's dedup id). It is the same on every
// attempt, redelivery, take-over, recovery and operator redrive of the
// claim, so the downstream deduplicates every repeat; it changes only when
// an operator redrives the claim under a new key. Send it unchanged.
func (d *Delivery) IdempotencyKey() string { return d.key }

// StepKey returns the idempotency key of one step of a handler that
// makes several calls (create a customer, then charge it): derived from
// IdempotencyKey and the step's name, the same on every attempt, distinct
// per step. A retry that repeats a step already performed sends its key
// again and the downstream replays its answer.
func (d *Delivery) StepKey(step string) string {
	if step == "" {
		return d.key
	}
	return claim.StepKey(d.form, d.key, step)
}

// Consumer returns the consumer name the claim was taken for.
func (d *Delivery) Consumer() string { return d.consumer }

// ClaimID returns the claim's id (the claims table's bigint key), for
// logs and for rows the handler links to its claim.
func (d *Delivery) ClaimID() int64 { return d.claimID }

// Attempt returns 1 + the failed attempts recorded on the claim so far:
// 1 for the first attempt, and a redelivery, take-over or recovery
// continues the count. An attempt whose holder died before recording it
// (a crash) is not counted, so Attempt() == 1 does not prove nothing was
// sent: only the idempotency key makes a repeat safe. A TxHandlerFunc
// always sees 1 (its attempts roll back).
func (d *Delivery) Attempt() int { return d.attempt }

// ReportAnswer records the downstream's answer on the claim with the
// attempt's outcome (operators see it in the console and in `reconciler
// show`): its HTTP status (0 when there is none), and the few header and
// field values worth keeping, such as a charge id. Pass only those
// headers, never a whole response's (it would keep Set-Cookie); it is
// bounded and must hold no payload and no secret. ctx must be the
// handler's; a TxHandlerFunc's answer is not recorded (its claim is
// written with its transaction).
func (d *Delivery) ReportAnswer(ctx context.Context, status int, headers http.Header, fields map[string]string) {
	a := sideeffects.Answer{Status: status, Fields: fields}
	if len(headers) > 0 {
		a.Headers = make(map[string]string, len(headers))
		for k := range headers {
			a.Headers[http.CanonicalHeaderKey(k)] = headers.Get(k)
		}
	}
	sideeffects.ReportAnswer(ctx, a)
}

func newDelivery(ctx context.Context, msg *azservicebus.ReceivedMessage, key string) *Delivery {
	d := &Delivery{msg: msg, key: key, dedupKey: msg.MessageID, attempt: 1, form: sideeffects.KeyFormOf(ctx), outbox: claim.FollowUpSinkOf(ctx)}
	if c, ok := sideeffects.CallOf(ctx); ok {
		d.dedupKey, d.consumer, d.claimID, d.attempt = c.DedupKey, c.Consumer, c.ClaimID, c.Attempt
	}
	return d
}

// HandlerFunc is a message's effect: the code that calls the outside world
// (an HTTP API through its SDK, a mailer) for a claimed message, with
// d.IdempotencyKey() as the downstream's idempotency key.
//
// What it returns says what happened, and decides the claim:
//
//   - nil: performed. The claim is marked processed and the message
//     completed.
//   - NotPerformed(err): definitely not performed (a connection refused,
//     a 503, a 429). The claim is released and the message retried later,
//     on the route's Backoff (deferred at Service Bus; with Backoff.Off,
//     handed back for a redelivery at once). NotPerformedAfter(err, d)
//     waits at least d (the downstream's Retry-After). HTTPOutcome maps
//     an HTTP response or transport error to these outcomes in one call.
//   - Misconfigured(err): an answer about this program's configuration
//     (a 401 after a key rotation): not performed and not final; the
//     route's breaker opens and its messages wait for the fix.
//   - Rejected(err): the downstream's final business answer (a card
//     decline). The claim fails, its message is dead-lettered once, and
//     the effect is never repeated.
//   - Permanent(err): refused for good, not performed (a 400). Like
//     Rejected.
//   - KeyConflict(err): the downstream says the key was used with another
//     payload. Like Rejected.
//   - NeedsOperator(err): a person must decide. The outcome is unknown,
//     and repeating the effect with the same key cannot settle it (the
//     downstream replays a failure it stored under the key). Retries stop
//     and the claim is flagged for an operator at once.
//   - any other error, and a panic (recovered, logged with its stack):
//     the outcome is unknown. The effect may have happened, so it is
//     repeated only with the same idempotency key, and only on a route
//     with RecoveryAuto; on a RecoveryManual route an operator decides.
//
// Within one delivery, retryable and unknown outcomes are retried with
// backoff (ProcessorConfig.Retry), each attempt with the same key.
type HandlerFunc func(ctx context.Context, d *Delivery) error

// TxHandlerFunc is an effect that writes only to the claims database: it
// runs inside the transaction that inserts the claim's marker, so the
// marker and its writes commit together or not at all, and a duplicate
// never reaches it. The transaction is its only way in: a write made on
// another connection would escape the guarantee. An error (or a panic)
// rolls everything back; Rejected, Permanent and KeyConflict dead-letter
// the message, any other error hands it back for a later delivery.
//
// On SQLite the store has one connection: use only tx.
type TxHandlerFunc func(ctx context.Context, tx *sql.Tx, d *Delivery) error

func (f HandlerFunc) effect() sideeffects.Effect {
	return sideeffects.EffectFunc(func(ctx context.Context, msg *azservicebus.ReceivedMessage, key string) error {
		return f(ctx, newDelivery(ctx, msg, key))
	})
}

func (f TxHandlerFunc) txEffect() sideeffects.TxEffect {
	return sideeffects.TxEffectFunc(func(ctx context.Context, tx *sql.Tx, msg *azservicebus.ReceivedMessage, key string) error {
		return f(ctx, tx, newDelivery(ctx, msg, key))
	})
}

// NotPerformed marks err as "definitely not performed; may succeed later":
// the claim is released and the message redelivered. Return it only when
// nothing can have reached the downstream, or the downstream said it did
// nothing (503, 429). A handler with several steps may return it for a
// later step after earlier ones were performed, when every step sends its
// own StepKey to a downstream that deduplicates on it: the repeat replays
// the performed steps under their keys.
func NotPerformed(err error) error { return sideeffects.Retryable(err) }

// Rejected marks err as the downstream's final business answer for the
// key, such as a card decline: the claim fails, the message is
// dead-lettered once (reason EffectRejected) and the effect is never
// repeated.
func Rejected(err error) error { return sideeffects.Rejected(err) }

// Permanent marks err as "refused for good, not performed" (a request the
// downstream will never accept): the claim fails and the message is
// dead-lettered once (reason EffectFailed).
func Permanent(err error) error { return sideeffects.Permanent(err) }

// KeyConflict marks err as the downstream's answer that the idempotency
// key was already used with another payload: the claim fails and the
// message is dead-lettered once (reason IdempotencyKeyConflict).
func KeyConflict(err error) error { return sideeffects.Conflict(err) }

// Unknown marks err as "may or may not have happened" explicitly; a plain
// error means the same.
func Unknown(err error) error { return sideeffects.Unknown(err) }

// NeedsOperator marks err as "a person must decide": the effect may have
// happened, and repeating it with the same idempotency key cannot settle
// it — the downstream replays a failure it stored under the key (Stripe
// answers a repeat with the stored 500 and Idempotent-Replayed: true).
// Retries stop at once and the claim is flagged for an operator, with the
// answer the handler reported (Delivery.ReportAnswer); the operator checks
// the downstream, then redrives the claim (under a new key on a route with
// AllowNewKey) or resolves it. The processor, the reconciler's recovery
// and a redrive treat it alike.
func NeedsOperator(err error) error { return sideeffects.NeedsOperator(err) }

// Misconfigured marks err as an answer about this program's configuration,
// not about the request: a 401 or 403 after a key rotation, a 407 from a
// proxy. The effect was not performed, and repeating it cannot succeed
// until someone fixes the configuration: retries stop, the route's breaker
// opens at once (see Route.Breaker) with a reason naming the route and the
// status (report it with Delivery.ReportAnswer), and the claim is
// released and its message postponed — never failed. A probe closes the
// breaker after the fix.
func Misconfigured(err error) error { return sideeffects.Misconfigured(err) }
