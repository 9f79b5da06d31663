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

-- +goose Up
ALTER TABLE claims ADD COLUMN route            TEXT    NOT NULL DEFAULT '' CHECK (length(route) <= 64);
ALTER TABLE claims ADD COLUMN fingerprint      TEXT    NOT NULL DEFAULT '' CHECK (length(fingerprint) <= 64);
ALTER TABLE claims ADD COLUMN take_overs       INTEGER NOT NULL DEFAULT 0;
ALTER TABLE claims ADD COLUMN taken_over_utc   TEXT;
ALTER TABLE claims ADD COLUMN take_over_path   TEXT    NOT NULL DEFAULT ''
    CHECK (take_over_path IN ('', 'redelivery', 'reconciler', 'operator'));
ALTER TABLE claims ADD COLUMN take_over_reason TEXT    NOT NULL DEFAULT '';
ALTER TABLE claims ADD COLUMN previous_owner   TEXT;
ALTER TABLE claims ADD COLUMN previous_holder  TEXT    NOT NULL DEFAULT '';
ALTER TABLE claims ADD COLUMN recoveries       INTEGER NOT NULL DEFAULT 0;
ALTER TABLE claims ADD COLUMN next_attempt_utc TEXT;
ALTER TABLE claims ADD COLUMN late_success_utc TEXT;
ALTER TABLE claims ADD COLUMN late_success_by  TEXT    NOT NULL DEFAULT '';

DROP INDEX ix_claims_unfinished;
CREATE INDEX ix_claims_unfinished ON claims (heartbeat_utc)
    WHERE state IN ('claimed', 'released');

-- +goose Down
DROP INDEX ix_claims_unfinished;
CREATE INDEX ix_claims_unfinished ON claims (heartbeat_utc)
    WHERE processed_utc IS NULL AND flagged_utc IS NULL;
ALTER TABLE claims DROP COLUMN late_success_by;
ALTER TABLE claims DROP COLUMN late_success_utc;
ALTER TABLE claims DROP COLUMN next_attempt_utc;
ALTER TABLE claims DROP COLUMN recoveries;
ALTER TABLE claims DROP COLUMN previous_holder;
ALTER TABLE claims DROP COLUMN previous_owner;
ALTER TABLE claims DROP COLUMN take_over_reason;
ALTER TABLE claims DROP COLUMN take_over_path;
ALTER TABLE claims DROP COLUMN taken_over_utc;
ALTER TABLE claims DROP COLUMN take_overs;
ALTER TABLE claims DROP COLUMN fingerprint;
ALTER TABLE claims DROP COLUMN route;
