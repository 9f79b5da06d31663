-- Least-privilege grants for sbclaim on SQL Server / Azure SQL Database.
--
-- Run once per database, as its owner (or a member of db_owner), AFTER the
-- migrations created dbo.Claims, with sqlcmd or SSMS (GO separates
-- batches; the statements are idempotent). Not a goose migration: who runs the
-- binaries is a deployment decision, and the migration identity itself
-- needs DDL rights the processor and reconciler must not have.
--
-- Three identities:
--
--   migrator    runs `reconciler migrate` (goose): CREATE TABLE/INDEX and
--               the goose_db_version table. Simplest: run the migration as
--               the database owner (db_owner) from a pipeline.
--               db_ddladmin alone is not enough, and a GRANT on
--               dbo.goose_db_version cannot be given beforehand: on its
--               first run goose creates that table (in the migrator's
--               default schema, dbo) and inserts its version-0 row in the
--               same transaction; a table created in dbo is owned by dbo,
--               not by its creator, and db_ddladmin has no INSERT, so the
--               first run fails (error 229) and rolls back. Either have
--               the owner run the first migration, or grant the DML on
--               the schema (this also covers dbo.Claims):
--                 ALTER ROLE db_ddladmin ADD MEMBER [<migrator>];
--                 GRANT SELECT, INSERT, DELETE ON SCHEMA::dbo TO [<migrator>];
--   processor   claims messages: INSERT/SELECT/UPDATE on dbo.Claims.
--               (OUTPUT INSERTED.* needs SELECT; no DELETE: the processor
--               never deletes a claim, a released claim is kept.)
--   reconciler  flags, lists, resolves and purges: SELECT/UPDATE/DELETE on
--               dbo.Claims, and sp_getapplock / sp_releaseapplock for "one
--               reconciler per tick". Those two procedures need nothing
--               beyond membership in the public role (every user has it),
--               so no GRANT is needed (or possible) for them here.
--
-- A database-only effect (ClaimTx) writes its own business tables in the
-- claim's transaction: grant the processor role what those writes need on
-- those tables, and nothing else.

IF DATABASE_PRINCIPAL_ID(N'sbclaim_processor') IS NULL
    CREATE ROLE sbclaim_processor AUTHORIZATION dbo;
GO
IF DATABASE_PRINCIPAL_ID(N'sbclaim_reconciler') IS NULL
    CREATE ROLE sbclaim_reconciler AUTHORIZATION dbo;
GO

GRANT SELECT, INSERT, UPDATE ON OBJECT::dbo.Claims TO sbclaim_processor;
GO
GRANT SELECT, UPDATE, DELETE ON OBJECT::dbo.Claims TO sbclaim_reconciler;
GO
-- The audit history (migration 00004): every guarded write appends to it
-- (OUTPUT ... INTO needs INSERT), History reads it, the purge deletes a
-- claim's history with the claim. The reconciler also takes claims over
-- and flags them, so it INSERTs too.
IF OBJECT_ID(N'dbo.ClaimHistory', N'U') IS NOT NULL
    GRANT SELECT, INSERT ON OBJECT::dbo.ClaimHistory TO sbclaim_processor;
GO
IF OBJECT_ID(N'dbo.ClaimHistory', N'U') IS NOT NULL
    GRANT SELECT, INSERT, DELETE ON OBJECT::dbo.ClaimHistory TO sbclaim_reconciler;
GO

-- The outbox (migration 00009): the processor writes a claim's follow-ups
-- with its outcome, leases, sends and marks them; the reconciler writes
-- them when its recovery records an outcome, lists them (`show`) and
-- purges them with their claim.
IF OBJECT_ID(N'dbo.ClaimFollowUps', N'U') IS NOT NULL
    GRANT SELECT, INSERT, UPDATE ON OBJECT::dbo.ClaimFollowUps TO sbclaim_processor;
GO
IF OBJECT_ID(N'dbo.ClaimFollowUps', N'U') IS NOT NULL
    GRANT SELECT, INSERT, DELETE ON OBJECT::dbo.ClaimFollowUps TO sbclaim_reconciler;
GO

-- Optional: let the binaries read the migration version (a readiness check
-- that the schema is current) without being able to change it.
-- GRANT SELECT ON OBJECT::dbo.goose_db_version TO sbclaim_processor;
-- GRANT SELECT ON OBJECT::dbo.goose_db_version TO sbclaim_reconciler;

-- ---------------------------------------------------------------------------
-- Azure SQL Database with managed identities (no passwords)
-- ---------------------------------------------------------------------------
--
-- 1. The logical server needs a Microsoft Entra admin, and you run the
--    statements below connected to the *user database* (not master) as an
--    Entra principal (the Entra admin or a member of its group): only Entra
--    principals can create users FROM EXTERNAL PROVIDER.
--
-- 2. Create one contained database user per identity and add it to its
--    role. deploy/main.bicep prints exactly these statements, with the
--    identities' names and object ids filled in, as its sqlStatements
--    output (available after its first pass, before any app runs); every
--    statement checks first, so running them again changes nothing:
--
--      IF DATABASE_PRINCIPAL_ID(N'id-sbclaim-processor') IS NULL
--          CREATE USER [id-sbclaim-processor] FROM EXTERNAL PROVIDER
--              WITH OBJECT_ID = '<object (principal) id of the identity>';
--      IF NOT EXISTS (SELECT 1 FROM sys.database_role_members m
--              JOIN sys.database_principals r ON r.principal_id = m.role_principal_id
--              JOIN sys.database_principals u ON u.principal_id = m.member_principal_id
--              WHERE r.name = N'sbclaim_processor' AND u.name = N'id-sbclaim-processor')
--          ALTER ROLE sbclaim_processor ADD MEMBER [id-sbclaim-processor];
--      -- and the same for id-sbclaim-reconciler / sbclaim_reconciler
--
--    The name is the managed identity's *resource name* as shown in Azure
--    (for a system-assigned identity: the Container App / job name);
--    WITH OBJECT_ID binds the user to that principal even if another one
--    shares the display name, and works when the server cannot read
--    Microsoft Graph (Azure SQL Database / Managed Instance). If you delete
--    and recreate an identity under the same name, DROP USER the old one
--    first: the guard above would otherwise keep the stale user.
--
-- 3. Run the statements with go-sqlcmd (`sqlcmd --authentication-method
--    ActiveDirectoryDefault`; the ODBC sqlcmd has no such option), signed
--    in with `az login` as the Entra admin, from a machine the server's
--    firewall admits.
--
-- 4. Connection URLs (no password; the token comes from the identity):
--
--      system-assigned identity, or AZURE_CLIENT_ID set in the app:
--        sqlserver://<server>.database.windows.net?database=sbclaim&fedauth=ActiveDirectoryDefault
--      user-assigned identity, explicit client id:
--        sqlserver://<client-id>@<server>.database.windows.net?database=sbclaim&fedauth=ActiveDirectoryManagedIdentity
--
--    With fedauth=ActiveDirectoryManagedIdentity and no user in the URL,
--    sbclaim passes AZURE_CLIENT_ID as the client id when it is set
--    (Container Apps does not set it for you: set it to the user-assigned
--    identity's client id).
--
-- SQL Server on a VM or in a container (no Entra): use SQL logins instead,
-- created in master, then mapped in the user database:
--
--      -- in master
--      CREATE LOGIN sbclaim_processor_login WITH PASSWORD = '<strong password>';
--      -- in the sbclaim database
--      CREATE USER sbclaim_processor_user FOR LOGIN sbclaim_processor_login;
--      ALTER ROLE sbclaim_processor ADD MEMBER sbclaim_processor_user;
