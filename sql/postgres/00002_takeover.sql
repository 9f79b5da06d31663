-- Take-over, recovery and route fingerprints (sbclaim 0.2).
--
-- Every change of a claim's owner is audited on its row: the last
-- take-over's time, path (redelivery | reconciler | operator), reason and
-- the previous owner and holder, and a count of take-overs. Claims record
-- the route they were taken for and the fingerprint of its effect, so a
-- take-over under another route is refused. The reconciler's recovery
-- keeps its attempt count and backoff on the row. An attempt that lost its
-- claim but saw its effect succeed notes it.
--
-- The reconciler's scan index now selects unfinished claims by state: a
-- flagged claim that an operator's redrive holds is claimed again (its
-- flagged_utc stays as history) and must be seen if that redrive dies.
-- (Adding columns with constant defaults does not rewrite the table.)

-- +goose Up
ALTER TABLE claims
    ADD COLUMN route            varchar(64) NOT NULL DEFAULT '',
    ADD COLUMN fingerprint      varchar(64) NOT NULL DEFAULT '',
    ADD COLUMN take_overs       integer     NOT NULL DEFAULT 0,
    ADD COLUMN taken_over_utc   timestamptz,
    ADD COLUMN take_over_path   text        NOT NULL DEFAULT ''
        CONSTRAINT ck_claims_take_over_path CHECK (take_over_path IN ('', 'redelivery', 'reconciler', 'operator')),
    ADD COLUMN take_over_reason text        NOT NULL DEFAULT '',
    ADD COLUMN previous_owner   uuid,
    ADD COLUMN previous_holder  text        NOT NULL DEFAULT '',
    ADD COLUMN recoveries       integer     NOT NULL DEFAULT 0,
    ADD COLUMN next_attempt_utc timestamptz,
    ADD COLUMN late_success_utc timestamptz,
    ADD COLUMN late_success_by  text        NOT NULL DEFAULT '';

DROP INDEX ix_claims_unfinished;
CREATE INDEX ix_claims_unfinished ON claims (heartbeat_utc)
    WHERE state IN ('claimed', 'released');

-- +goose Down
DROP INDEX ix_claims_unfinished;
CREATE INDEX ix_claims_unfinished ON claims (heartbeat_utc)
    WHERE processed_utc IS NULL AND flagged_utc IS NULL;
ALTER TABLE claims
    DROP COLUMN late_success_by,
    DROP COLUMN late_success_utc,
    DROP COLUMN next_attempt_utc,
    DROP COLUMN recoveries,
    DROP COLUMN previous_holder,
    DROP COLUMN previous_owner,
    DROP COLUMN take_over_reason,
    DROP COLUMN take_over_path,
    DROP COLUMN taken_over_utc,
    DROP COLUMN take_overs,
    DROP COLUMN fingerprint,
    DROP COLUMN route;
