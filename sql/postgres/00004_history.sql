-- The audit history and the key form (sbclaim 0.4).
--
-- claim_history is append-only: one row per change of a claim's owner or
-- state (claimed, taken over, redriven, released, attempt, processed,
-- failed, flagged, resolved, dead letter taken), with who, when (the
-- database clock), why, the owner before and after and the idempotency
-- key. The store writes it in the same statement or transaction as the
-- guarded write, and only when that write changed the claim. It lives as
-- long as its claim: the purge deletes a claim's history with it. No
-- foreign key (the same shape in every dialect: SQL Server writes it with
-- OUTPUT ... INTO, whose target may have none); ix_claim_history_claim
-- serves reading a claim's history and the purge.
--
-- The claims row records the form of its key (key_form): 'raw' for the
-- claims already there (their key stays the message id, ":r<n>" for a new
-- key), 'scoped' for new claims (consumer and dedup key, escaped, and
-- hashed beyond 255 characters). taken_over_from and flagged_from keep
-- the state the last take-over and flag found, which the history rows of
-- those changes read back (RETURNING sees only the new row).

-- +goose Up
ALTER TABLE claims
    ADD COLUMN key_form        text NOT NULL DEFAULT 'raw'
        CONSTRAINT ck_claims_key_form CHECK (key_form IN ('raw', 'scoped')),
    ADD COLUMN taken_over_from text NOT NULL DEFAULT '',
    ADD COLUMN flagged_from    text NOT NULL DEFAULT '';

CREATE TABLE claim_history (
    id              bigint GENERATED ALWAYS AS IDENTITY CONSTRAINT pk_claim_history PRIMARY KEY,
    claim_id        bigint      NOT NULL,
    at_utc          timestamptz NOT NULL DEFAULT now(),
    what            text        NOT NULL,
    from_state      text        NOT NULL DEFAULT '',
    to_state        text        NOT NULL,
    by_whom         text        NOT NULL DEFAULT '',
    path            text        NOT NULL DEFAULT '',
    reason          text        NOT NULL DEFAULT '',
    previous_owner  uuid,
    owner           uuid        NOT NULL,
    idempotency_key text        NOT NULL DEFAULT ''
);
CREATE INDEX ix_claim_history_claim ON claim_history (claim_id, id);

-- +goose Down
DROP TABLE claim_history;
ALTER TABLE claims
    DROP COLUMN flagged_from,
    DROP COLUMN taken_over_from,
    DROP COLUMN key_form;
