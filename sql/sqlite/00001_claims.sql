-- Claims table for SQLite (the embedded store for local runs, demos and
-- tests). Times are TEXT written by the database clock as
-- strftime('%Y-%m-%dT%H:%M:%f','now') (UTC, millisecond precision): the
-- fixed width makes string order equal time order, so comparisons and
-- indexes work on the text.

-- +goose Up
CREATE TABLE claims (
    -- AUTOINCREMENT: IDs are never reused after a purge, so keyset paging
    -- and audit references stay unambiguous.
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id      TEXT    NOT NULL CHECK (length(message_id) BETWEEN 1 AND 128),
    consumer        TEXT    NOT NULL CHECK (length(consumer) BETWEEN 1 AND 200),
    owner           TEXT    NOT NULL, -- uuid, canonical text form
    state           TEXT    NOT NULL
                    CHECK (state IN ('claimed', 'processed', 'released', 'flagged', 'resolved')),
    entity          TEXT    NOT NULL DEFAULT '',
    subject         TEXT    NOT NULL DEFAULT '',
    content_type    TEXT    NOT NULL DEFAULT '',
    properties      TEXT    NOT NULL DEFAULT '{}', -- JSON object of strings
    payload_hash    BLOB    NOT NULL,
    payload         BLOB,                          -- NULL once processed
    delivery_count  INTEGER NOT NULL DEFAULT 0,
    claimed_by      TEXT    NOT NULL DEFAULT '',
    claimed_utc     TEXT    NOT NULL,
    heartbeat_utc   TEXT    NOT NULL,
    processed_utc   TEXT,
    released_utc    TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT    NOT NULL DEFAULT '',
    flagged_utc     TEXT,
    flag_reason     TEXT    NOT NULL DEFAULT '',
    resolved_utc    TEXT,
    resolved_by     TEXT    NOT NULL DEFAULT '',
    resolution      TEXT    NOT NULL DEFAULT ''
                    CHECK (resolution IN ('', 'redriven', 'done', 'discarded')),
    resolution_note TEXT    NOT NULL DEFAULT ''
) STRICT;

-- The arbiter: the only constraint whose violation means "duplicate".
CREATE UNIQUE INDEX ux_claims_message_consumer ON claims (message_id, consumer);

-- The reconciler's scan: unfinished claims by last sign of life. Release
-- sets heartbeat_utc, so one predicate finds stale claimed and stale
-- released claims.
CREATE INDEX ix_claims_unfinished ON claims (heartbeat_utc)
    WHERE processed_utc IS NULL AND flagged_utc IS NULL;

-- The purge: finished claims by the time they finished.
CREATE INDEX ix_claims_finished ON claims (coalesce(resolved_utc, processed_utc))
    WHERE state IN ('processed', 'resolved');

-- Operators' queue: flagged claims (List by state, Stats).
CREATE INDEX ix_claims_flagged ON claims (id) WHERE state = 'flagged';

-- +goose Down
DROP TABLE claims;
