-- Take-over, recovery and route fingerprints (sbclaim 0.2).
--
-- Every change of a claim's owner is audited on its row: the last
-- take-over's time, path (redelivery | reconciler | operator), reason and
-- the previous owner and holder, and a count of take-overs. Claims record
-- the route they were taken for and the fingerprint of its effect, so a
-- take-over under another route is refused. The reconciler's recovery
-- keeps its attempt count and backoff on the row. An attempt that lost its
-- claim but saw its effect succeed notes it.
--
-- The reconciler's scan index now selects unfinished claims by State: a
-- flagged claim that an operator's redrive holds is claimed again (its
-- FlaggedUtc stays as history) and must be seen if that redrive dies.
-- Adding NOT NULL columns with a constant default is a metadata-only
-- change (SQL Server 2012+, Azure SQL): no table rewrite.

-- +goose Up
-- +goose StatementBegin
ALTER TABLE dbo.Claims ADD
    -- Binary collation, like MessageId: route names and fingerprints
    -- compare exactly, whatever the database's default collation.
    Route          nvarchar(64)     COLLATE Latin1_General_100_BIN2 NOT NULL CONSTRAINT DF_Claims_Route DEFAULT (N''),
    Fingerprint    varchar(64)      COLLATE Latin1_General_100_BIN2 NOT NULL CONSTRAINT DF_Claims_Fingerprint DEFAULT (''),
    TakeOvers      int              NOT NULL CONSTRAINT DF_Claims_TakeOvers DEFAULT (0),
    TakenOverUtc   datetime2(7)     NULL,
    TakeOverPath   varchar(16)      NOT NULL CONSTRAINT DF_Claims_TakeOverPath DEFAULT ('')
                   CONSTRAINT CK_Claims_TakeOverPath CHECK (TakeOverPath IN ('', 'redelivery', 'reconciler', 'operator')),
    TakeOverReason nvarchar(400)    NOT NULL CONSTRAINT DF_Claims_TakeOverReason DEFAULT (N''),
    PreviousOwner  uniqueidentifier NULL,
    PreviousHolder nvarchar(256)    NOT NULL CONSTRAINT DF_Claims_PreviousHolder DEFAULT (N''),
    Recoveries     int              NOT NULL CONSTRAINT DF_Claims_Recoveries DEFAULT (0),
    NextAttemptUtc datetime2(7)     NULL,
    LateSuccessUtc datetime2(7)     NULL,
    LateSuccessBy  nvarchar(256)    NOT NULL CONSTRAINT DF_Claims_LateSuccessBy DEFAULT (N'');
-- +goose StatementEnd

DROP INDEX IX_Claims_Unfinished ON dbo.Claims;

-- The reconciler's scan (FlagStale, FindStale) and the take-over of a
-- silent holder: unfinished claims by last sign of life. Queries repeat
-- the filter literally (State IN ('claimed', 'released')) so the optimizer
-- matches it; the columns they also test are INCLUDEd.
CREATE NONCLUSTERED INDEX IX_Claims_Unfinished
    ON dbo.Claims (HeartbeatUtc) INCLUDE (State, ClaimedUtc, NextAttemptUtc)
    WHERE State IN ('claimed', 'released');

-- +goose Down
DROP INDEX IX_Claims_Unfinished ON dbo.Claims;
CREATE NONCLUSTERED INDEX IX_Claims_Unfinished
    ON dbo.Claims (HeartbeatUtc) INCLUDE (State, ClaimedUtc, ProcessedUtc, FlaggedUtc)
    WHERE ProcessedUtc IS NULL AND FlaggedUtc IS NULL;
-- +goose StatementBegin
ALTER TABLE dbo.Claims DROP CONSTRAINT CK_Claims_TakeOverPath, DF_Claims_Route, DF_Claims_Fingerprint,
    DF_Claims_TakeOvers, DF_Claims_TakeOverPath, DF_Claims_TakeOverReason, DF_Claims_PreviousHolder,
    DF_Claims_Recoveries, DF_Claims_LateSuccessBy;
-- +goose StatementEnd
-- +goose StatementBegin
ALTER TABLE dbo.Claims DROP COLUMN Route, Fingerprint, TakeOvers, TakenOverUtc, TakeOverPath, TakeOverReason,
    PreviousOwner, PreviousHolder, Recoveries, NextAttemptUtc, LateSuccessUtc, LateSuccessBy;
-- +goose StatementEnd
