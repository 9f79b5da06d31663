-- Stranded deferred messages (sbclaim 0.4).
--
-- A processor that fetched a claim's deferred message, finished the claim
-- (processed, failed, flagged) and died before it settled the message
-- leaves the message deferred, where no receive finds it. DeferredSeq now
-- stays on the claim until the message is settled, and the processor's
-- poller also looks for finished claims that still name one. Its filtered
-- index covers every state: DeferredSeq is cleared once the message is
-- settled, so the index holds only claims whose message is still at the
-- broker.

-- +goose Up
DROP INDEX IX_Claims_Deferred ON dbo.Claims;
CREATE NONCLUSTERED INDEX IX_Claims_Deferred ON dbo.Claims (Consumer, Entity, DueUtc)
    INCLUDE (HeartbeatUtc, State)
    WHERE DeferredSeq IS NOT NULL;

-- +goose Down
DROP INDEX IX_Claims_Deferred ON dbo.Claims;
CREATE NONCLUSTERED INDEX IX_Claims_Deferred ON dbo.Claims (Consumer, Entity, DueUtc)
    INCLUDE (HeartbeatUtc)
    WHERE DeferredSeq IS NOT NULL AND State IN ('claimed', 'released');
