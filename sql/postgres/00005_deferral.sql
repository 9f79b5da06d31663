-- Delayed retries (sbclaim 0.4).
--
-- A claim whose effect was not performed can wait for its message, which
-- the processor deferred at the broker: deferred_seq is the message's
-- broker sequence number (kept while a processor holds the fetched
-- message), due_utc when a processor should fetch it (NULL once fetched).
-- postponements counts the deferrals; postponed_utc is the first one (the
-- start of the route's retry horizon). The processor's poller finds due
-- claims of its consumer and entity through a small partial index.
-- Adding nullable columns, or ones with a constant default, does not
-- rewrite the table.
--
-- 00004 belongs to another change; goose applies the files in order and
-- accepts the gap until both are merged.

-- +goose Up
ALTER TABLE claims
    ADD COLUMN deferred_seq  bigint,
    ADD COLUMN due_utc       timestamptz,
    ADD COLUMN postponements integer NOT NULL DEFAULT 0,
    ADD COLUMN postponed_utc timestamptz;
CREATE INDEX ix_claims_deferred ON claims (consumer, entity, due_utc)
    WHERE deferred_seq IS NOT NULL AND state IN ('claimed', 'released');

-- +goose Down
DROP INDEX ix_claims_deferred;
ALTER TABLE claims
    DROP COLUMN postponed_utc,
    DROP COLUMN postponements,
    DROP COLUMN due_utc,
    DROP COLUMN deferred_seq;
