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
-- for. No foreign key, as for claim_history.
--
-- 00008 belongs to another change; goose applies the files in order and
-- accepts the gap until both are merged.

-- +goose Up
CREATE TABLE claim_followups (
    claim_id         bigint       NOT NULL,
    position         integer      NOT NULL CONSTRAINT ck_claim_followups_position CHECK (position >= 1),
    message_id       varchar(128) NOT NULL CONSTRAINT ck_claim_followups_message_id CHECK (message_id <> ''),
    target           varchar(260) NOT NULL CONSTRAINT ck_claim_followups_target CHECK (target <> ''),
    subject          text         NOT NULL DEFAULT '',
    content_type     text         NOT NULL DEFAULT '',
    correlation_id   text         NOT NULL DEFAULT '',
    session_id       text         NOT NULL DEFAULT '',
    properties       jsonb        NOT NULL DEFAULT '{}',
    body             bytea        NOT NULL,
    scheduled_utc    timestamptz,
    state            text         NOT NULL DEFAULT 'pending'
                     CONSTRAINT ck_claim_followups_state CHECK (state IN ('pending', 'sent')),
    created_utc      timestamptz  NOT NULL DEFAULT now(),
    lease_owner      uuid,
    lease_until_utc  timestamptz,
    next_attempt_utc timestamptz,
    attempts         integer      NOT NULL DEFAULT 0,
    last_error       text         NOT NULL DEFAULT '',
    sent_utc         timestamptz,
    CONSTRAINT pk_claim_followups PRIMARY KEY (claim_id, position)
);
CREATE INDEX ix_claim_followups_pending ON claim_followups (created_utc) WHERE state = 'pending';

-- +goose Down
DROP TABLE claim_followups;
