// Package chaos is sbclaim's chaos harness: it runs several processor
// replicas in one process against the in-memory Service Bus (membus), a
// real claim store (SQLite, PostgreSQL or SQL Server) and a fake idempotent downstream
// served over loopback HTTP, kills replicas at every step of the protocol,
// and then checks that every message's effect happened exactly once.
//
// A run (Run) sends Config.Messages messages, a share of them two or three
// times (producer retries, some adjacent so the copies race, some late),
// plus a few messages with a conflicting payload and a few with no route,
// and injects the faults of Config.Faults, each counted:
//
//   - die-after-claim, die-after-effect, die-after-processed: a processor
//     hook (processor.Hooks) kills the replica at that point. Killing a
//     replica cuts its claim store, its receiver and its HTTP client at
//     once (every later call fails at once and does nothing), cancels its
//     Run, and starts a replacement 50 ms later, as a container platform
//     would. The dead replica's locks run out and the broker redelivers.
//   - response-lost: the downstream performs the effect and never answers
//     (fakedownstream.FaultHang); the route's timeout fires.
//   - lock-expiry: the message's lock is expired (membus.ExpireLock) while
//     its effect runs, and the effect waits until the redelivery was
//     received by some replica, so the two overlap.
//   - lost-then-503: the downstream performs the effect, the response is
//     lost, and the retries are answered 503 (not performed). The effect
//     may have happened, so the claim must stay kept, never released for
//     another delivery to take over.
//   - store-outage: the store refuses every replica's calls with
//     claim.ErrUnavailable for Config.OutageDuration, Config.OutageWindows
//     times as the run progresses.
//   - ack-lost: the store commits a MarkProcessed or Release and then
//     answers claim.ErrUnavailable (the answer to a COMMIT that reached
//     the server is lost); half of these messages are refused 503 by the
//     downstream first, so the write is a Release.
//
// Each replica is built as a user's program builds its processor, with
// the public API: sbclaim.NewProcessor over an *sbclaim.Store (the
// fault-injecting store chain, wrapped through internal/bridge) and an
// *sbclaim.Router, its crash hooks on Run's context
// (processor.WithHooks), its metrics through prommetrics (one registry for
// the run, a label per replica; the report sums them). Config.Handler
// (-handler) picks the effect: the routes file's HTTP route
// (routesfile.Parse with the replica's killable HTTP client) or a
// Go sbclaim.HandlerFunc that calls the same downstream through that
// client with the delivery's idempotency key and maps its answers to the
// outcome wrappers. The reconciler's recovery and the operators' redrives
// run the same kind of handler.
//
// The reconciler ticks during the run (every ReconcileEvery, StaleAfter
// 2 s, recovery on with the replicas' routes), as the scheduled job does in
// production. When the queue is idle the replicas stop, the reconciler
// ticks until no claim is claimed or released, and then every flagged claim
// is redriven (reconciler.Redrive) by a stand-in for operators, counted
// apart. Then the report checks:
//
//   - downstream effects per key: exactly 1 for every routed message, 0 for
//     the unroutable ones;
//   - the take-over protocol, against the ledger the harness keeps of who
//     held each claim when (every grant, heartbeat and release, and every
//     downstream request that may have performed an effect, each tagged
//     with its sender: a delivery's replica, the reconciler's recovery, an
//     operator's redrive): at most one ClaimBatch ever wins a key; a
//     claimed claim is taken over only after its holder showed no life for
//     the path's window (TakeoverAfter for a redelivery, StaleAfter for
//     the reconciler) — a live holder is never taken over; every request
//     that may have performed an effect was sent by a holder of the claim;
//   - with auto routes, that no delivery completed its copy while its
//     claim was still claimed by a holder that was dead or silent for
//     TakeoverAfter (it had to take the claim over and run the effect) —
//     unless the claim names another message, deferred and fetched by its
//     holder, as the one carrying it (delayed retries);
//   - the queue: nothing left, dead letters only by design (NoRoute for the
//     unroutable messages, IdempotencyKeyConflict for the losing payload of
//     a conflict);
//   - claims: one per routed message, none left claimed, released or
//     flagged, resolved only as redriven;
//   - every claim the reconciler flagged, and every claim its recovery
//     pass had to re-run, is explained: a fault happened to its key, an
//     outage refused a call on it, or its holder was killed while holding
//     a delivery of it. With auto routes (Config.Recovery, -recovery) no
//     claim may be flagged at all: recovery settles what a crash leaves;
//     with manual routes crash-left claims are flagged (and explained).
//     With no faults, nothing may be flagged;
//   - every fault that is on happened at least once.
//
// The report's "recovery:" line counts claims recovered by redelivery (a
// delivery took the claim over from a released or silent holder), by the
// reconciler, and flagged for operators, and gives the time from a key's
// first send (and first delivery) to its one effect: p50, p99 and max.
//
// With Config.Sessions (sessions.go) the queue is session-enabled, the
// replicas run in session mode, and the report adds two lines: the
// messages that ran out of order in their session (a message's first
// effect request before its predecessor's claim was final; each a
// violation) and the exactly-once counts (doubled, lost, dead-lettered by
// the broker).
//
// Report.Write prints the counts and ends with one verdict line
// ("VERDICT: PASS ..." or "VERDICT: FAIL: <reasons>").
//
// Reproducibility: Config.Seed fixes every choice the harness makes (which
// messages are duplicated, conflicting, unroutable or faulted). Goroutine
// scheduling, lock timing and the interleaving of replicas still vary, so
// two runs with one seed inject the same planned faults but need not take
// the same paths.
//
// RunPipeline (`chaos -pipeline`) runs two consumers joined by the outbox:
// A charges each payment and publishes a payment.charged follow-up, B
// issues a receipt for it; replicas of both are killed after the claim,
// after the effect and after the outcome, A's relay between a follow-up's
// send and its mark, sends fail and effects lose their answers. Its
// verdict lines check A's effects (each once), the follow-ups (each
// payment's sent at least once, every send with the one MessageId derived
// from A's claim, none left unsent) and B's effects (each once per
// payment); see pipeline.go.
//
// RunScenario reproduces one dedup strategy under a race (one message
// delivered to two instances at once): naive check-then-insert (2
// effects: the bug), insert-first on a unique index (1), and the product's
// two-phase claim with a slow HTTP effect: each instance holds one copy
// before either claims, and exactly one request may reach the downstream
// (one instance processed, the other a duplicate). The downstream
// deduplicates by key itself, so its effect count alone could not fail.
//
// RunBenchmarks (and the Benchmark functions in this package's tests)
// compare the product's two-phase claim with a raw store loop, naive
// check-then-insert, a transaction held across the HTTP call and no
// deduplication, and time the reconciler's stale scan at 10 000 and
// 1 000 000 claims.
package chaos
