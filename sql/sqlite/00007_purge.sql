-- The purge orders by the time of a claim's current state (sbclaim 0.5).
--
-- An operator's retry takes a failed claim back, and whoever runs it next
-- marks it processed: FailedUtc stays on the row. The purge ordered by
-- coalesce(resolved_utc, failed_utc, processed_utc), so a claim that failed
-- almost a retention ago and was processed a moment ago was purged at
-- once, and the next copy of its message claimed afresh and ran the
-- effect again. It now orders by the time of the state the claim is in.
--
-- A finished claim that still names a deferred message (deferred_seq: its
-- holder died before settling the message, and the processor's stranded
-- sweep settles it) is never purged: the message would stay deferred for
-- good. The partial index holds only what the purge may delete.

-- +goose Up
DROP INDEX ix_claims_finished;
CREATE INDEX ix_claims_finished ON claims (
    (CASE state WHEN 'processed' THEN processed_utc WHEN 'failed' THEN failed_utc ELSE resolved_utc END))
    WHERE state IN ('processed', 'failed', 'resolved') AND deferred_seq IS NULL;

-- +goose Down
DROP INDEX ix_claims_finished;
CREATE INDEX ix_claims_finished ON claims (coalesce(resolved_utc, failed_utc, processed_utc))
    WHERE state IN ('processed', 'failed', 'resolved');
