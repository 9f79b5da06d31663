-- Claims table for PostgreSQL. Times are timestamptz written by the
-- database clock (now()), never by a replica's clock.

-- +goose Up
CREATE TABLE claims (
    -- Sequential key: inserts append; the unique index below enforces dedup.
    id              bigint GENERATED ALWAYS AS IDENTITY CONSTRAINT pk_claims PRIMARY KEY,
    message_id      varchar(128) NOT NULL CONSTRAINT ck_claims_message_id CHECK (message_id <> ''),
    consumer        varchar(200) NOT NULL CONSTRAINT ck_claims_consumer CHECK (consumer <> ''),
    owner           uuid         NOT NULL,
    state           text         NOT NULL CONSTRAINT ck_claims_state
                    CHECK (state IN ('claimed', 'processed', 'released', 'flagged', 'resolved')),
    entity          text         NOT NULL DEFAULT '',
    subject         text         NOT NULL DEFAULT '',
    content_type    text         NOT NULL DEFAULT '',
    properties      jsonb        NOT NULL DEFAULT '{}',
    payload_hash    bytea        NOT NULL,
    payload         bytea,                      -- NULL once processed
    delivery_count  integer      NOT NULL DEFAULT 0,
    claimed_by      text         NOT NULL DEFAULT '',
    claimed_utc     timestamptz  NOT NULL DEFAULT now(),
    heartbeat_utc   timestamptz  NOT NULL DEFAULT now(),
    processed_utc   timestamptz,
    released_utc    timestamptz,
    attempts        integer      NOT NULL DEFAULT 0,
    last_error      text         NOT NULL DEFAULT '',
    flagged_utc     timestamptz,
    flag_reason     text         NOT NULL DEFAULT '',
    resolved_utc    timestamptz,
    resolved_by     text         NOT NULL DEFAULT '',
    resolution      text         NOT NULL DEFAULT '' CONSTRAINT ck_claims_resolution
                    CHECK (resolution IN ('', 'redriven', 'done', 'discarded')),
    resolution_note text         NOT NULL DEFAULT ''
);

-- The arbiter: the only constraint whose violation means "duplicate"
-- (SQLSTATE 23505 with this constraint name).
CREATE UNIQUE INDEX ux_claims_message_consumer ON claims (message_id, consumer);

-- The reconciler's scan: unfinished claims by last sign of life. Release
-- sets heartbeat_utc, so one predicate finds stale claimed and stale
-- released claims; the index stays as small as the unfinished work.
CREATE INDEX ix_claims_unfinished ON claims (heartbeat_utc)
    WHERE processed_utc IS NULL AND flagged_utc IS NULL;

-- The purge: finished claims by the time they finished.
CREATE INDEX ix_claims_finished ON claims ((coalesce(resolved_utc, processed_utc)))
    WHERE state IN ('processed', 'resolved');

-- Operators' queue: flagged claims (List by state, Stats).
CREATE INDEX ix_claims_flagged ON claims (id) WHERE state = 'flagged';

-- +goose Down
DROP TABLE claims;
