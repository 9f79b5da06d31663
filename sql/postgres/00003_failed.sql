-- Final answers, recorded answers and deliberate new keys (sbclaim 0.3).
--
-- A claim can end failed: the downstream gave a final answer that is not a
-- success (rejected, permanent, conflict). It records when and why
-- (failed_utc, fail_reason: the message's dead-letter reason) and which
-- delivery dead-letters the message (dead_letter_seq, the broker's
-- sequence number), so a key is dead-lettered once however many copies
-- arrive. Every outcome records the downstream's last answer (answer,
-- bounded; answer_utc). An operator's redrive under a new key records the
-- key and who chose it (key_revision, effect_key, key_revised_by,
-- key_revised_utc, key_revision_note); every later attempt uses
-- effect_key.
--
-- The state CHECK is dropped and added again with 'failed' (adding it
-- reads the table once, under the ALTER's lock; the new constraint only
-- allows more). The purge index now covers failed claims (by failed_utc),
-- and failed claims get their own small index (Stats, List by state).
-- Adding columns with constant defaults does not rewrite the table.

-- +goose Up
ALTER TABLE claims
    DROP CONSTRAINT ck_claims_state,
    ADD CONSTRAINT ck_claims_state
        CHECK (state IN ('claimed', 'processed', 'released', 'failed', 'flagged', 'resolved')),
    ADD COLUMN failed_utc        timestamptz,
    ADD COLUMN fail_reason       varchar(64) NOT NULL DEFAULT '',
    ADD COLUMN dead_letter_seq   bigint,
    ADD COLUMN answer            jsonb,
    ADD COLUMN answer_utc        timestamptz,
    ADD COLUMN key_revision      integer     NOT NULL DEFAULT 0,
    ADD COLUMN effect_key        text        NOT NULL DEFAULT '', -- '' : the message id
    ADD COLUMN key_revised_by    text        NOT NULL DEFAULT '',
    ADD COLUMN key_revised_utc   timestamptz,
    ADD COLUMN key_revision_note text        NOT NULL DEFAULT '';

DROP INDEX ix_claims_finished;
-- A finished claim has exactly one of the three times set last: resolved
-- claims were never failed, failed ones never processed.
CREATE INDEX ix_claims_finished ON claims ((coalesce(resolved_utc, failed_utc, processed_utc)))
    WHERE state IN ('processed', 'failed', 'resolved');
CREATE INDEX ix_claims_failed ON claims (id) WHERE state = 'failed';

-- +goose Down
-- Schema 00002 has no failed state: a failed claim goes back to operators
-- as flagged, with its reason and final answer in flag_reason (its effect
-- is finished; resolve it as done).
UPDATE claims SET state = 'flagged', flagged_utc = coalesce(failed_utc, now()),
    flag_reason = 'failed (' || fail_reason || ', a final answer) before the schema was downgraded: ' || last_error
WHERE state = 'failed';
DROP INDEX ix_claims_failed;
DROP INDEX ix_claims_finished;
CREATE INDEX ix_claims_finished ON claims ((coalesce(resolved_utc, processed_utc)))
    WHERE state IN ('processed', 'resolved');
ALTER TABLE claims
    DROP CONSTRAINT ck_claims_state,
    ADD CONSTRAINT ck_claims_state
        CHECK (state IN ('claimed', 'processed', 'released', 'flagged', 'resolved')),
    DROP COLUMN key_revision_note,
    DROP COLUMN key_revised_utc,
    DROP COLUMN key_revised_by,
    DROP COLUMN effect_key,
    DROP COLUMN key_revision,
    DROP COLUMN answer_utc,
    DROP COLUMN answer,
    DROP COLUMN dead_letter_seq,
    DROP COLUMN fail_reason,
    DROP COLUMN failed_utc;
