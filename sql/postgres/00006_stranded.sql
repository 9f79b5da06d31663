-- Stranded deferred messages (sbclaim 0.4).
--
-- A processor that fetched a claim's deferred message, finished the claim
-- (processed, failed, flagged) and died before it settled the message
-- leaves the message deferred, where no receive finds it. deferred_seq now
-- stays on the claim until the message is settled, and the processor's
-- poller also looks for finished claims that still name one. Its partial
-- index covers every state: deferred_seq is cleared once the message is
-- settled, so the index holds only claims whose message is still at the
-- broker.
--
-- Built CONCURRENTLY (outside a transaction), so a large claims table
-- keeps taking writes while it builds. A build that failed or was cut
-- short leaves an INVALID index behind, or a valid one whose version was
-- never recorded: the first statement drops whatever a try before left,
-- so migrating again just works.

-- +goose NO TRANSACTION
-- +goose Up
DROP INDEX CONCURRENTLY IF EXISTS ix_claims_deferred_any;
CREATE INDEX CONCURRENTLY ix_claims_deferred_any ON claims (consumer, entity, due_utc)
    WHERE deferred_seq IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS ix_claims_deferred;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS ix_claims_deferred;
CREATE INDEX CONCURRENTLY ix_claims_deferred ON claims (consumer, entity, due_utc)
    WHERE deferred_seq IS NOT NULL AND state IN ('claimed', 'released');
DROP INDEX CONCURRENTLY IF EXISTS ix_claims_deferred_any;
