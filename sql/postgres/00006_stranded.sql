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
-- keeps taking writes while it builds. A build that fails (a lock
-- timeout) leaves an INVALID index behind: drop ix_claims_deferred_any
-- and migrate again.

-- +goose NO TRANSACTION
-- +goose Up
CREATE INDEX CONCURRENTLY ix_claims_deferred_any ON claims (consumer, entity, due_utc)
    WHERE deferred_seq IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS ix_claims_deferred;

-- +goose Down
CREATE INDEX CONCURRENTLY ix_claims_deferred ON claims (consumer, entity, due_utc)
    WHERE deferred_seq IS NOT NULL AND state IN ('claimed', 'released');
DROP INDEX CONCURRENTLY IF EXISTS ix_claims_deferred_any;
