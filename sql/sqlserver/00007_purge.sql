-- The purge never deletes a claim that still names a deferred message
-- (sbclaim 0.5).
--
-- A finished claim that still names one (DeferredSeq: its holder died
-- before settling the message, and the processor's stranded sweep settles
-- it) is never purged: the message would stay deferred for good. The
-- purge's three filtered indexes (processed by ProcessedUtc, failed by
-- FailedUtc, resolved by ResolvedUtc: each by the time of the state the
-- claim is in, as before) now hold only what the purge may delete.

-- +goose Up
DROP INDEX IX_Claims_Processed ON dbo.Claims;
CREATE NONCLUSTERED INDEX IX_Claims_Processed ON dbo.Claims (ProcessedUtc)
    WHERE State = 'processed' AND DeferredSeq IS NULL;
DROP INDEX IX_Claims_Failed ON dbo.Claims;
CREATE NONCLUSTERED INDEX IX_Claims_Failed ON dbo.Claims (FailedUtc)
    WHERE State = 'failed' AND DeferredSeq IS NULL;
DROP INDEX IX_Claims_Resolved ON dbo.Claims;
CREATE NONCLUSTERED INDEX IX_Claims_Resolved ON dbo.Claims (ResolvedUtc)
    WHERE State = 'resolved' AND DeferredSeq IS NULL;

-- +goose Down
DROP INDEX IX_Claims_Processed ON dbo.Claims;
CREATE NONCLUSTERED INDEX IX_Claims_Processed ON dbo.Claims (ProcessedUtc)
    WHERE State = 'processed';
DROP INDEX IX_Claims_Failed ON dbo.Claims;
CREATE NONCLUSTERED INDEX IX_Claims_Failed ON dbo.Claims (FailedUtc)
    WHERE State = 'failed';
DROP INDEX IX_Claims_Resolved ON dbo.Claims;
CREATE NONCLUSTERED INDEX IX_Claims_Resolved ON dbo.Claims (ResolvedUtc)
    WHERE State = 'resolved';
