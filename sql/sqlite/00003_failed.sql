-- Final answers, recorded answers and deliberate new keys (sbclaim 0.3).
--
-- A claim can end failed: the downstream gave a final answer that is not a
-- success (rejected, permanent, conflict). It records when and why
-- (failed_utc, fail_reason: the message's dead-letter reason) and which
-- delivery dead-letters the message (dead_letter_seq, the broker's
-- sequence number), so a key is dead-lettered once however many copies
-- arrive. Every outcome records the downstream's last answer (answer: JSON
-- text, bounded; answer_utc). An operator's redrive under a new key
-- records the key and who chose it (key_revision, effect_key,
-- key_revised_by, key_revised_utc, key_revision_note); every later
-- attempt uses effect_key.
--
-- SQLite cannot change a CHECK constraint with ALTER TABLE, so the table
-- is rebuilt (the documented procedure: create the new table, copy, drop
-- the old one, rename, recreate the indexes), inside goose's transaction.
-- The AUTOINCREMENT counter is carried over (sqlite_sequence follows the
-- rename), so IDs of purged claims are never reused. No foreign key,
-- trigger or view refers to claims.
--
-- The purge index now covers failed claims (by failed_utc), and failed
-- claims get their own small index (Stats, List by state).

-- +goose Up
CREATE TABLE claims_new (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id        TEXT    NOT NULL CHECK (length(message_id) BETWEEN 1 AND 128),
    consumer          TEXT    NOT NULL CHECK (length(consumer) BETWEEN 1 AND 200),
    owner             TEXT    NOT NULL,
    state             TEXT    NOT NULL
                      CHECK (state IN ('claimed', 'processed', 'released', 'failed', 'flagged', 'resolved')),
    entity            TEXT    NOT NULL DEFAULT '',
    subject           TEXT    NOT NULL DEFAULT '',
    content_type      TEXT    NOT NULL DEFAULT '',
    properties        TEXT    NOT NULL DEFAULT '{}',
    payload_hash      BLOB    NOT NULL,
    payload           BLOB,
    delivery_count    INTEGER NOT NULL DEFAULT 0,
    claimed_by        TEXT    NOT NULL DEFAULT '',
    claimed_utc       TEXT    NOT NULL,
    heartbeat_utc     TEXT    NOT NULL,
    processed_utc     TEXT,
    released_utc      TEXT,
    attempts          INTEGER NOT NULL DEFAULT 0,
    last_error        TEXT    NOT NULL DEFAULT '',
    flagged_utc       TEXT,
    flag_reason       TEXT    NOT NULL DEFAULT '',
    resolved_utc      TEXT,
    resolved_by       TEXT    NOT NULL DEFAULT '',
    resolution        TEXT    NOT NULL DEFAULT ''
                      CHECK (resolution IN ('', 'redriven', 'done', 'discarded')),
    resolution_note   TEXT    NOT NULL DEFAULT '',
    route             TEXT    NOT NULL DEFAULT '' CHECK (length(route) <= 64),
    fingerprint       TEXT    NOT NULL DEFAULT '' CHECK (length(fingerprint) <= 64),
    take_overs        INTEGER NOT NULL DEFAULT 0,
    taken_over_utc    TEXT,
    take_over_path    TEXT    NOT NULL DEFAULT ''
                      CHECK (take_over_path IN ('', 'redelivery', 'reconciler', 'operator')),
    take_over_reason  TEXT    NOT NULL DEFAULT '',
    previous_owner    TEXT,
    previous_holder   TEXT    NOT NULL DEFAULT '',
    recoveries        INTEGER NOT NULL DEFAULT 0,
    next_attempt_utc  TEXT,
    late_success_utc  TEXT,
    late_success_by   TEXT    NOT NULL DEFAULT '',
    failed_utc        TEXT,
    fail_reason       TEXT    NOT NULL DEFAULT '' CHECK (length(fail_reason) <= 64),
    dead_letter_seq   INTEGER,
    answer            TEXT,   -- JSON object: status, step, headers, fields, truncated
    answer_utc        TEXT,
    key_revision      INTEGER NOT NULL DEFAULT 0,
    effect_key        TEXT    NOT NULL DEFAULT '', -- '' : the message id
    key_revised_by    TEXT    NOT NULL DEFAULT '',
    key_revised_utc   TEXT,
    key_revision_note TEXT    NOT NULL DEFAULT ''
) STRICT;

INSERT INTO claims_new (id, message_id, consumer, owner, state, entity, subject, content_type,
    properties, payload_hash, payload, delivery_count, claimed_by, claimed_utc,
    heartbeat_utc, processed_utc, released_utc, attempts, last_error, flagged_utc,
    flag_reason, resolved_utc, resolved_by, resolution, resolution_note,
    route, fingerprint, take_overs, taken_over_utc, take_over_path, take_over_reason,
    previous_owner, previous_holder, recoveries, next_attempt_utc, late_success_utc, late_success_by)
SELECT id, message_id, consumer, owner, state, entity, subject, content_type,
    properties, payload_hash, payload, delivery_count, claimed_by, claimed_utc,
    heartbeat_utc, processed_utc, released_utc, attempts, last_error, flagged_utc,
    flag_reason, resolved_utc, resolved_by, resolution, resolution_note,
    route, fingerprint, take_overs, taken_over_utc, take_over_path, take_over_reason,
    previous_owner, previous_holder, recoveries, next_attempt_utc, late_success_utc, late_success_by
FROM claims;

-- The ID counter, even when the claim with the highest ID was purged.
DELETE FROM sqlite_sequence WHERE name = 'claims_new';
INSERT INTO sqlite_sequence (name, seq) SELECT 'claims_new', seq FROM sqlite_sequence WHERE name = 'claims';

DROP TABLE claims;
ALTER TABLE claims_new RENAME TO claims;

CREATE UNIQUE INDEX ux_claims_message_consumer ON claims (message_id, consumer);
CREATE INDEX ix_claims_unfinished ON claims (heartbeat_utc)
    WHERE state IN ('claimed', 'released');
-- A finished claim has exactly one of the three times set last: resolved
-- claims were never failed, failed ones never processed.
CREATE INDEX ix_claims_finished ON claims (coalesce(resolved_utc, failed_utc, processed_utc))
    WHERE state IN ('processed', 'failed', 'resolved');
CREATE INDEX ix_claims_flagged ON claims (id) WHERE state = 'flagged';
CREATE INDEX ix_claims_failed ON claims (id) WHERE state = 'failed';

-- +goose Down
-- Schema 00002 has no failed state: a failed claim goes back to operators
-- as flagged, with its reason and final answer in flag_reason (its effect
-- is finished; resolve it as done).
UPDATE claims SET state = 'flagged', flagged_utc = coalesce(failed_utc, strftime('%Y-%m-%dT%H:%M:%f','now')),
    flag_reason = 'failed (' || fail_reason || ', a final answer) before the schema was downgraded: ' || last_error
WHERE state = 'failed';

CREATE TABLE claims_old (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id       TEXT    NOT NULL CHECK (length(message_id) BETWEEN 1 AND 128),
    consumer         TEXT    NOT NULL CHECK (length(consumer) BETWEEN 1 AND 200),
    owner            TEXT    NOT NULL,
    state            TEXT    NOT NULL
                     CHECK (state IN ('claimed', 'processed', 'released', 'flagged', 'resolved')),
    entity           TEXT    NOT NULL DEFAULT '',
    subject          TEXT    NOT NULL DEFAULT '',
    content_type     TEXT    NOT NULL DEFAULT '',
    properties       TEXT    NOT NULL DEFAULT '{}',
    payload_hash     BLOB    NOT NULL,
    payload          BLOB,
    delivery_count   INTEGER NOT NULL DEFAULT 0,
    claimed_by       TEXT    NOT NULL DEFAULT '',
    claimed_utc      TEXT    NOT NULL,
    heartbeat_utc    TEXT    NOT NULL,
    processed_utc    TEXT,
    released_utc     TEXT,
    attempts         INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT    NOT NULL DEFAULT '',
    flagged_utc      TEXT,
    flag_reason      TEXT    NOT NULL DEFAULT '',
    resolved_utc     TEXT,
    resolved_by      TEXT    NOT NULL DEFAULT '',
    resolution       TEXT    NOT NULL DEFAULT ''
                     CHECK (resolution IN ('', 'redriven', 'done', 'discarded')),
    resolution_note  TEXT    NOT NULL DEFAULT '',
    route            TEXT    NOT NULL DEFAULT '' CHECK (length(route) <= 64),
    fingerprint      TEXT    NOT NULL DEFAULT '' CHECK (length(fingerprint) <= 64),
    take_overs       INTEGER NOT NULL DEFAULT 0,
    taken_over_utc   TEXT,
    take_over_path   TEXT    NOT NULL DEFAULT ''
                     CHECK (take_over_path IN ('', 'redelivery', 'reconciler', 'operator')),
    take_over_reason TEXT    NOT NULL DEFAULT '',
    previous_owner   TEXT,
    previous_holder  TEXT    NOT NULL DEFAULT '',
    recoveries       INTEGER NOT NULL DEFAULT 0,
    next_attempt_utc TEXT,
    late_success_utc TEXT,
    late_success_by  TEXT    NOT NULL DEFAULT ''
) STRICT;

INSERT INTO claims_old (id, message_id, consumer, owner, state, entity, subject, content_type,
    properties, payload_hash, payload, delivery_count, claimed_by, claimed_utc,
    heartbeat_utc, processed_utc, released_utc, attempts, last_error, flagged_utc,
    flag_reason, resolved_utc, resolved_by, resolution, resolution_note,
    route, fingerprint, take_overs, taken_over_utc, take_over_path, take_over_reason,
    previous_owner, previous_holder, recoveries, next_attempt_utc, late_success_utc, late_success_by)
SELECT id, message_id, consumer, owner, state, entity, subject, content_type,
    properties, payload_hash, payload, delivery_count, claimed_by, claimed_utc,
    heartbeat_utc, processed_utc, released_utc, attempts, last_error, flagged_utc,
    flag_reason, resolved_utc, resolved_by, resolution, resolution_note,
    route, fingerprint, take_overs, taken_over_utc, take_over_path, take_over_reason,
    previous_owner, previous_holder, recoveries, next_attempt_utc, late_success_utc, late_success_by
FROM claims;

DELETE FROM sqlite_sequence WHERE name = 'claims_old';
INSERT INTO sqlite_sequence (name, seq) SELECT 'claims_old', seq FROM sqlite_sequence WHERE name = 'claims';

DROP TABLE claims;
ALTER TABLE claims_old RENAME TO claims;

CREATE UNIQUE INDEX ux_claims_message_consumer ON claims (message_id, consumer);
CREATE INDEX ix_claims_unfinished ON claims (heartbeat_utc)
    WHERE state IN ('claimed', 'released');
CREATE INDEX ix_claims_finished ON claims (coalesce(resolved_utc, processed_utc))
    WHERE state IN ('processed', 'resolved');
CREATE INDEX ix_claims_flagged ON claims (id) WHERE state = 'flagged';
