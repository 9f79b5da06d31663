-- Claims table for SQL Server and Azure SQL Database. Times are
-- datetime2(7) written by the database clock (SYSUTCDATETIME()), never by a
-- replica's clock.
--
-- The filtered indexes below require the connection's SET options that
-- go-mssqldb gets at login (fODBC: ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS,
-- CONCAT_NULL_YIELDS_NULL, QUOTED_IDENTIFIER ON); a session that turns one
-- of them off fails every INSERT/UPDATE/DELETE on dbo.Claims (error 1934).

-- +goose Up
-- +goose StatementBegin
CREATE TABLE dbo.Claims (
    -- Sequential clustered key: inserts append at the end of the clustered
    -- index; a random key (MessageId, a GUID) would split pages on every
    -- insert. Dedup is enforced by the unique nonclustered index below.
    Id             bigint IDENTITY(1,1) NOT NULL
                   CONSTRAINT PK_Claims PRIMARY KEY CLUSTERED,
    -- Binary collation: the dedup key compares exactly, as on PostgreSQL
    -- and SQLite ("Order-1" and "order-1" are two keys), whatever the
    -- database's default (Azure SQL: case-insensitive). SQL Server still
    -- ignores trailing spaces in comparisons, so the processor refuses keys
    -- with leading or trailing white space.
    MessageId      nvarchar(128)    COLLATE Latin1_General_100_BIN2 NOT NULL,
    Consumer       nvarchar(200)    COLLATE Latin1_General_100_BIN2 NOT NULL,
    Owner          uniqueidentifier NOT NULL,  -- token of the claiming attempt
    State          varchar(16)      NOT NULL
                   CONSTRAINT CK_Claims_State
                   CHECK (State IN ('claimed', 'processed', 'released', 'flagged', 'resolved')),
    Entity         nvarchar(400)    NOT NULL CONSTRAINT DF_Claims_Entity DEFAULT (N''),
    -- Subject and ContentType have no length limit in Service Bus; a limit
    -- here would make one odd message fail its whole claim batch.
    Subject        nvarchar(max)    NOT NULL CONSTRAINT DF_Claims_Subject DEFAULT (N''),
    ContentType    nvarchar(max)    NOT NULL CONSTRAINT DF_Claims_ContentType DEFAULT (N''),
    Properties     nvarchar(max)    NOT NULL CONSTRAINT DF_Claims_Properties DEFAULT (N'{}'), -- JSON object of strings
    PayloadHash    varbinary(32)    NOT NULL,  -- SHA-256 of the body
    Payload        varbinary(max)   NULL,      -- for redrive; NULL once processed or when storage is off
    DeliveryCount  int              NOT NULL CONSTRAINT DF_Claims_DeliveryCount DEFAULT (0),
    ClaimedBy      nvarchar(256)    NOT NULL CONSTRAINT DF_Claims_ClaimedBy DEFAULT (N''),
    ClaimedUtc     datetime2(7)     NOT NULL CONSTRAINT DF_Claims_ClaimedUtc DEFAULT (SYSUTCDATETIME()),
    HeartbeatUtc   datetime2(7)     NOT NULL CONSTRAINT DF_Claims_HeartbeatUtc DEFAULT (SYSUTCDATETIME()),
    ProcessedUtc   datetime2(7)     NULL,
    ReleasedUtc    datetime2(7)     NULL,
    Attempts       int              NOT NULL CONSTRAINT DF_Claims_Attempts DEFAULT (0),
    LastError      nvarchar(4000)   NOT NULL CONSTRAINT DF_Claims_LastError DEFAULT (N''),
    FlaggedUtc     datetime2(7)     NULL,
    FlagReason     nvarchar(400)    NOT NULL CONSTRAINT DF_Claims_FlagReason DEFAULT (N''),
    ResolvedUtc    datetime2(7)     NULL,
    ResolvedBy     nvarchar(256)    NOT NULL CONSTRAINT DF_Claims_ResolvedBy DEFAULT (N''),
    Resolution     varchar(16)      NOT NULL CONSTRAINT DF_Claims_Resolution DEFAULT ('')
                   CONSTRAINT CK_Claims_Resolution
                   CHECK (Resolution IN ('', 'redriven', 'done', 'discarded')),
    ResolutionNote nvarchar(4000)   NOT NULL CONSTRAINT DF_Claims_ResolutionNote DEFAULT (N''),
    CONSTRAINT CK_Claims_MessageId CHECK (MessageId <> N''),
    CONSTRAINT CK_Claims_Consumer CHECK (Consumer <> N'')
);
-- +goose StatementEnd

-- The arbiter: the only index whose violation (error 2601, which names the
-- index) means "duplicate". A UNIQUE INDEX, not a UNIQUE constraint, so the
-- error is 2601; the store also accepts 2627 naming this index.
-- No IGNORE_DUP_KEY: it would turn the violation into a warning and drop
-- the row silently, hiding the very signal that tells the loser it lost.
CREATE UNIQUE NONCLUSTERED INDEX UX_Claims_MessageId_Consumer
    ON dbo.Claims (MessageId, Consumer);

-- The reconciler's scan: unfinished claims by last sign of life. Release
-- sets HeartbeatUtc, so one predicate (HeartbeatUtc < cutoff) finds stale
-- claimed and stale released claims. The index holds only unfinished work,
-- so the scan costs the same at 10k or 100M rows. Queries repeat the filter
-- predicates literally so the optimizer can match this index.
-- The filter columns are INCLUDEd too: with an IS NULL filter the optimizer
-- otherwise looks every row up in the table to re-check it.
CREATE NONCLUSTERED INDEX IX_Claims_Unfinished
    ON dbo.Claims (HeartbeatUtc) INCLUDE (State, ClaimedUtc, ProcessedUtc, FlaggedUtc)
    WHERE ProcessedUtc IS NULL AND FlaggedUtc IS NULL;

-- The purge: processed claims by ProcessedUtc, resolved claims by
-- ResolvedUtc (two filtered indexes: a filtered index cannot be built on
-- the COALESCE of both).
CREATE NONCLUSTERED INDEX IX_Claims_Processed
    ON dbo.Claims (ProcessedUtc)
    WHERE State = 'processed';

CREATE NONCLUSTERED INDEX IX_Claims_Resolved
    ON dbo.Claims (ResolvedUtc)
    WHERE State = 'resolved';

-- Operators' queue: flagged claims (List by state, Stats).
CREATE NONCLUSTERED INDEX IX_Claims_Flagged
    ON dbo.Claims (Id)
    WHERE State = 'flagged';

-- +goose Down
DROP TABLE dbo.Claims;
