-- Sessions (sbclaim 0.6).
--
-- A message of a session-enabled queue or subscription carries a
-- SessionId (at most 128 characters); its claim records it (SessionId,
-- N'' for an entity without sessions), so operators can list a session's
-- claims (the console's session filter). Adding a NOT NULL column with a
-- constant default is a metadata change (no rewrite of the table). The
-- filtered index holds only claims of sessions, keyed for the list's
-- order (Id). 00009 belongs to another change.

-- +goose Up
-- +goose StatementBegin
ALTER TABLE dbo.Claims ADD
    SessionId     nvarchar(128) NOT NULL CONSTRAINT DF_Claims_SessionId DEFAULT (N'');
-- +goose StatementEnd

CREATE NONCLUSTERED INDEX IX_Claims_Session ON dbo.Claims (SessionId, Id)
    WHERE SessionId <> N'';

-- +goose Down
DROP INDEX IX_Claims_Session ON dbo.Claims;
-- +goose StatementBegin
ALTER TABLE dbo.Claims DROP CONSTRAINT DF_Claims_SessionId;
ALTER TABLE dbo.Claims DROP COLUMN SessionId;
-- +goose StatementEnd
