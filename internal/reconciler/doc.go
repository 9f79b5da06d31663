// Package reconciler settles the claims their holders will not: it
// recovers stale claims by repeating their effect with the same key, flags
// for operators only what a person must decide, deletes old finished
// claims, and holds the operators' guarded actions (Redrive, Resolve,
// HandOff, and Retry of a failed claim after a fix).
//
// A claim is committed before its effect runs (docs/design.md, "Protocol"). If the
// processor dies, hangs, or loses the message's lock between the claim and
// MarkProcessed, the claim stays "claimed" with a heartbeat that stops
// moving; if an effect was released (definitely not performed) and no
// redelivery took it over, it stays "released". Nothing in the processor
// path can tell those apart from slow work, so the reconciler does, by the
// database clock:
//
//   - The flag pass calls Store.FlagStale in batches of FlagBatchSize until
//     a batch comes back short. The staleness test (no heartbeat for
//     StaleAfter) is inside the store's UPDATE, so a claim processed or
//     heartbeated between two passes is never flagged, and two reconcilers
//     racing flag each claim once. Every flagged claim is logged at Warn
//     with claim_id, message_id, consumer and reason.
//   - With routes configured, the recovery pass (recover.go) replaces the
//     flag pass: it takes stale claims over and re-runs them with the
//     claim's key; a final answer that is not a success (rejected,
//     permanent, conflict) fails the claim, like the processor does; only
//     what it cannot settle is flagged.
//   - The purge pass calls Store.PurgeProcessed in batches of
//     PurgeBatchSize (one bounded DELETE each, no long table locks) until a
//     batch is short or MaxPurgePerTick rows are gone. The store never
//     deletes an unfinished, flagged or unresolved claim; processed, failed
//     and resolved ones go after the retention.
//   - Stats feed the gauges (unfinished, oldest unfinished age, flagged,
//     failed).
//
// A tick (RunOnce) holds the database lock LockName; when another replica
// holds it the tick does nothing and reports Locked false. Each query has
// its own timeout (QueryTimeout), named in the error when it fires. Run
// schedules ticks with robfig/cron (no overlap, panics recovered) and, when
// its context ends, waits for a running tick up to ShutdownTimeout.
//
// Redrive re-runs a flagged claim's effect with the same idempotency key
// (the claim's Key(): its MessageID, or the key an operator chose) from its
// stored payload, then resolves the claim as redriven. The downstream
// deduplicates on the key, so redriving a claim whose effect did happen
// before the crash performs it once. With NewKey (a route with
// allowNewKey, and a note) it runs under the next key (claim.NextKey: the
// claim's key with :r<N>, in its form), recorded
// on the claim: for a downstream that stored a failure under the old key.
// A redrive that gets a final answer that is not a success fails the
// claim. The chaos harness calls RunOnce and Redrive directly.
package reconciler
