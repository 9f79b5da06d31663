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

-- +goose Up
DROP INDEX ix_claims_deferred;
CREATE INDEX ix_claims_deferred ON claims (consumer, entity, due_utc)
    WHERE deferred_seq IS NOT NULL;

-- +goose Down
DROP INDEX ix_claims_deferred;
CREATE INDEX ix_claims_deferred ON claims (consumer, entity, due_utc)
    WHERE deferred_seq IS NOT NULL AND state IN ('claimed', 'released');
