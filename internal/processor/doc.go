// Package processor runs the per-message protocol of DESIGN.md §2 on top
// of a Service Bus receiver and a claim store:
//
//	receive (peek-lock) ─► validate ─► claim (one round trip per receive)
//	  won ───────────► effect (idempotency key = dedup key), lock renewal +
//	                   heartbeat ─► mark processed ─► complete
//	  released ──────► take over ─► effect ...
//	  duplicate ─────► complete
//	  conflict ──────► dead-letter IdempotencyKeyConflict
//	  store down ────► abandon
//	effect retryable ► release ─► abandon
//	effect permanent ► release ─► dead-letter EffectFailed
//	effect unknown ──► keep the claim with its last error ─► abandon
//
// It depends on Receiver, which *azservicebus.Receiver satisfies as it is,
// and works with *azservicebus.ReceivedMessage values end to end; tests use
// the in-memory broker in package membus.
package processor
