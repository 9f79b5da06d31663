// Package emulator holds the local Service Bus setup used by
// docker-compose.yml and the tests that keep it consistent; it has no code
// of its own.
//
// Config.json declares the emulator's entities:
//
//   - queue "payments": LockDuration PT30S, MaxDeliveryCount 5. A short lock
//     makes lock renewal visible in a demo (the processor renews every
//     ~15 s) while leaving an HTTP effect with a 5 s timeout plenty of
//     room; five deliveries let a message survive a few abandons (a
//     downstream outage, a replica restart) before it is dead-lettered, and
//     keep the retention floor (lock × deliveries = 2.5 min) small.
//   - topic "orders" with subscriptions "billing" and "notifications": two
//     consumers of the same message, each with its own claims (claims are
//     unique per MessageId and consumer) and its own routes file. The
//     emulator's minimum LockDuration for a subscription is PT1M, so they
//     use that; MaxDeliveryCount 5 as for the queue. Rules is empty, which
//     gives each subscription the default match-all rule.
//   - queue "ledger": the same settings as "payments" and RequiresSession
//     true; processor-ledger consumes it in session mode (SBCLAIM_SESSIONS),
//     with routes.ledger.compose.yaml (holdSessionOnFailure), and demosender
//     sends ledger entries to it, an account per session.
//   - queue "integration": the same settings as "payments", consumed by no
//     compose service; internal/processor's gated TestServiceBus uses it
//     (docker compose up -d sqlserver servicebus, then the test
//     command of docs/proof.md with SBCLAIM_TEST_SERVICEBUS_CONNECTION_STRING set).
//   - queue "brokertest" (LockDuration PT5S, the emulator's minimum, and
//     MaxDeliveryCount 3) and topic "brokertest-topic" with subscriptions
//     "copy-a" and "copy-b": the entities of the broker contract suite
//     (internal/testkit/membus/brokertest) when it runs against the emulator. The
//     short lock lets its lock-expiry cases wait for a real expiry; no
//     compose service consumes them. Queue "brokertest-sessions" (the same
//     settings, RequiresSession true) is the suite's session-enabled queue.
//
// Logging is "Console", so `docker compose logs servicebus` shows the
// emulator's own log ("File" writes it inside the container only).
//
// Duplicate detection is off on purpose: the demo sends duplicates, and the
// point is that the consumers, not the broker, absorb them (the broker's
// detection window is minutes at most and does not cover redeliveries).
//
// The tests check Config.json against the emulator's documented limits
// (namespace name sbemulatorns, LockDuration PT5S-PT5M, MaxDeliveryCount
// 1-10, message TTL at most PT1H, at most 50 entities) and check that every
// queue, topic and subscription docker-compose.yml names exists, that every
// routes file a compose service mounts loads with the processor's own
// loader, that every route URL points at a compose service, and that the
// reconciler's windows are valid for these entities. They also check what
// makes the stack safe on a laptop: ports published on 127.0.0.1 only, the
// emulator pinned to a release, platform linux/amd64 for the SQL Server
// image (amd64 only), SQL_WAIT_INTERVAL set, and the processors' shutdown
// and stale settings consistent with stop_grace_period and the reconciler,
// and each processor's SBCLAIM_MAX_DELIVERY_COUNT equal to its entity's
// MaxDeliveryCount here (the processor cannot read it from the emulator,
// so the compose file must say it).
package emulator
