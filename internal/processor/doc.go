// Package processor runs sbclaim's per-message protocol on a Service Bus
// receiver and a claim store: receive, validate, claim, run the effect with
// the claim's key as the idempotency key, record its outcome, settle
// (docs/design.md, "Protocol").
//
//	receive (peek-lock) ─► validate (key, size, ContentType, route) ─► claim
//	                       (one round trip per receive)
//	  won ───────────► effect (idempotency key = the claim's key), lock
//	                   renewal + heartbeat ─► mark processed ─► complete
//	  released ──────► take over ─► effect ...
//	  duplicate ─────► complete (a failed claim: the one delivery it names
//	                   dead-letters, every other copy completes)
//	  conflict ──────► dead-letter IdempotencyKeyConflict
//	  store down ────► abandon
//	effect retryable ► release ─► abandon
//	effect rejected, permanent or conflict (a final answer)
//	                 ► fail the claim ─► dead-letter EffectRejected,
//	                   EffectFailed or IdempotencyKeyConflict, once
//	effect unknown ──► keep the claim with its last error ─► abandon
//
// Every outcome write records the downstream's last answer on the claim.
//
// The processor decides nothing itself: package protocol does, from the
// facts of each step (decide.go reads them and performs what it decides:
// the claim write, then the one settlement in settle). The processor is
// its driver: I/O, lock renewal, heartbeats, metrics, spans and logs.
//
// It depends on Receiver, which *azservicebus.Receiver satisfies as it is,
// and works with *azservicebus.ReceivedMessage values end to end; tests use
// the in-memory broker in package membus. On a session-enabled entity it
// runs in session mode instead (session.go: Options.AcceptSession and
// SessionReceiver, which *azservicebus.SessionReceiver satisfies): one
// message at a time per session, a retry held in place rather than
// deferred, so that a session's effects keep their order.
package processor
