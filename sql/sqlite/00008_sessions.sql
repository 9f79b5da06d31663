-- Sessions (sbclaim 0.6).
--
-- A message of a session-enabled queue or subscription carries a
-- SessionId; its claim records it (session_id, '' for an entity without
-- sessions), so operators can list a session's claims (the console's
-- session filter). The partial index holds only claims of sessions, keyed
-- for the list's order (id). 00009 belongs to another change.

-- +goose Up
ALTER TABLE claims ADD COLUMN session_id TEXT NOT NULL DEFAULT '';
CREATE INDEX ix_claims_session ON claims (session_id, id) WHERE session_id <> '';

-- +goose Down
DROP INDEX ix_claims_session;
ALTER TABLE claims DROP COLUMN session_id;
