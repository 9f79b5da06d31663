-- Delayed retries (sbclaim 0.4).
--
-- A claim whose effect was not performed can wait for its message, which
-- the processor deferred at the broker: DeferredSeq is the message's
-- broker sequence number (kept while a processor holds the fetched
-- message), DueUtc when a processor should fetch it (NULL once fetched).
-- Postponements counts the deferrals; PostponedUtc is the first one (the
-- start of the route's retry horizon). The processor's poller finds due
-- claims of its consumer and entity through a small filtered index.
--
-- 00004 belongs to another change; goose applies the files in order and
-- accepts the gap until both are merged.

-- +goose Up
-- +goose StatementBegin
ALTER TABLE dbo.Claims ADD
    DeferredSeq   bigint       NULL,
    DueUtc        datetime2(7) NULL,
    Postponements int          NOT NULL CONSTRAINT DF_Claims_Postponements DEFAULT (0),
    PostponedUtc  datetime2(7) NULL;
-- +goose StatementEnd

CREATE NONCLUSTERED INDEX IX_Claims_Deferred ON dbo.Claims (Consumer, Entity, DueUtc)
    INCLUDE (HeartbeatUtc)
    WHERE DeferredSeq IS NOT NULL AND State IN ('claimed', 'released');

-- +goose Down
DROP INDEX IX_Claims_Deferred ON dbo.Claims;
-- +goose StatementBegin
ALTER TABLE dbo.Claims DROP CONSTRAINT DF_Claims_Postponements;
ALTER TABLE dbo.Claims DROP COLUMN PostponedUtc, Postponements, DueUtc, DeferredSeq;
-- +goose StatementEnd
