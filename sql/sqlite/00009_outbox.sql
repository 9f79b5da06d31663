-- The outbox: follow-up messages of a claim (sbclaim 0.6).
--
-- A claim's effect may publish follow-up messages (a payment consumer's
-- "payment.charged"). They are written in the transaction that records
-- the claim's outcome, so they exist if and only if the effect is
-- recorded as performed, and a relay sends each one, then marks it sent.
-- message_id is derived from the claim's key and the position (the
-- store computes it: sbclaim-fu:<sha256>:<n>), so a resend carries the
-- same MessageId. A relay leases a row before it sends it (lease_owner,
-- lease_until_utc by the database clock); a failed send makes it due
-- again at next_attempt_utc. The rows live as long as their claim: the
-- purge deletes them with it, and never purges a claim with a pending
-- follow-up. ix_claim_followups_pending holds only what the relay looks
-- for.
--
-- 00008 belongs to another change; goose applies the files in order and
-- accepts the gap until both are merged.

-- +goose Up
CREATE TABLE claim_followups (
    claim_id         INTEGER NOT NULL,
    position         INTEGER NOT NULL CHECK (position >= 1),
    message_id       TEXT    NOT NULL CHECK (length(message_id) BETWEEN 1 AND 128),
    target           TEXT    NOT NULL CHECK (length(target) BETWEEN 1 AND 260),
    subject          TEXT    NOT NULL DEFAULT '',
    content_type     TEXT    NOT NULL DEFAULT '',
    correlation_id   TEXT    NOT NULL DEFAULT '',
    session_id       TEXT    NOT NULL DEFAULT '',
    properties       TEXT    NOT NULL DEFAULT '{}', -- JSON object of strings
    body             BLOB    NOT NULL,
    scheduled_utc    TEXT,
    state            TEXT    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent')),
    created_utc      TEXT    NOT NULL,
    lease_owner      TEXT,
    lease_until_utc  TEXT,
    next_attempt_utc TEXT,
    attempts         INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT    NOT NULL DEFAULT '',
    sent_utc         TEXT,
    PRIMARY KEY (claim_id, position)
) STRICT;
CREATE INDEX ix_claim_followups_pending ON claim_followups (created_utc) WHERE state = 'pending';

-- +goose Down
DROP TABLE claim_followups;
