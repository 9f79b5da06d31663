-- Placeholder so the embed pattern compiles; the SQL Server engineer owns
-- this file and replaces its content with the real dbo.Claims migration.

-- +goose Up
SELECT 1;

-- +goose Down
SELECT 1;
