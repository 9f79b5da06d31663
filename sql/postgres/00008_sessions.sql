-- Sessions (sbclaim 0.6).
--
-- A message of a session-enabled queue or subscription carries a
-- SessionId; its claim records it (session_id, '' for an entity without
-- sessions), so operators can list a session's claims (the console's
-- session filter) and see which claim holds a session. Adding a column
-- with a constant default does not rewrite the table.
--
-- The index holds only claims of sessions, keyed for the list's order
-- (id). Built CONCURRENTLY (outside a transaction) so a large claims table
-- keeps taking writes; the first statements make a try cut short safe to
-- run again. 00009 belongs to another change.

-- +goose NO TRANSACTION
-- +goose Up
ALTER TABLE claims ADD COLUMN IF NOT EXISTS session_id varchar(128) NOT NULL DEFAULT '';
DROP INDEX CONCURRENTLY IF EXISTS ix_claims_session;
CREATE INDEX CONCURRENTLY ix_claims_session ON claims (session_id, id) WHERE session_id <> '';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS ix_claims_session;
ALTER TABLE claims DROP COLUMN IF EXISTS session_id;
