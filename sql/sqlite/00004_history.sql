-- The audit history and the key form (sbclaim 0.4).
--
-- claim_history is append-only: one row per change of a claim's owner or
-- state (claimed, taken over, redriven, released, attempt, processed,
-- failed, flagged, resolved, dead letter taken), with who, when (the
-- database clock), why, the owner before and after and the idempotency
-- key. The store writes it in the same transaction as the guarded write,
-- and only when that write changed the claim. It lives as long as its
-- claim: the purge deletes a claim's history with it. No foreign key (the
-- same shape in every dialect); ix_claim_history_claim serves reading a
-- claim's history and the purge. AUTOINCREMENT: ids are never reused.
--
-- The claims row records the form of its key (key_form): 'raw' for the
-- claims already there (their key stays the message id, ":r<n>" for a new
-- key), 'scoped' for new claims (consumer and dedup key, escaped, and
-- hashed beyond 255 characters). taken_over_from and flagged_from keep
-- the state the last take-over and flag found, which the history rows of
-- those changes read back. Adding columns with constant defaults is an
-- ALTER TABLE SQLite does in place.

-- +goose Up
ALTER TABLE claims ADD COLUMN key_form TEXT NOT NULL DEFAULT 'raw' CHECK (key_form IN ('raw', 'scoped'));
ALTER TABLE claims ADD COLUMN taken_over_from TEXT NOT NULL DEFAULT '';
ALTER TABLE claims ADD COLUMN flagged_from TEXT NOT NULL DEFAULT '';

CREATE TABLE claim_history (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    claim_id        INTEGER NOT NULL,
    at_utc          TEXT    NOT NULL,
    what            TEXT    NOT NULL,
    from_state      TEXT    NOT NULL DEFAULT '',
    to_state        TEXT    NOT NULL,
    by_whom         TEXT    NOT NULL DEFAULT '',
    path            TEXT    NOT NULL DEFAULT '',
    reason          TEXT    NOT NULL DEFAULT '',
    previous_owner  TEXT,
    owner           TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX ix_claim_history_claim ON claim_history (claim_id, id);

-- +goose Down
DROP TABLE claim_history;
ALTER TABLE claims DROP COLUMN flagged_from;
ALTER TABLE claims DROP COLUMN taken_over_from;
ALTER TABLE claims DROP COLUMN key_form;
