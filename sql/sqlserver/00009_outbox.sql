-- The outbox: follow-up messages of a claim (sbclaim 0.6).
--
-- A claim's effect may publish follow-up messages (a payment consumer's
-- "payment.charged"). They are written in the transaction that records
-- the claim's outcome, so they exist if and only if the effect is
-- recorded as performed, and a relay sends each one, then marks it sent.
-- MessageId is derived from the claim's key and the position (the store
-- computes it: sbclaim-fu:<sha256>:<n>), so a resend carries the same
-- MessageId. A relay leases a row before it sends it (LeaseOwner,
-- LeaseUntilUtc by SYSUTCDATETIME()); a failed send makes it due again
-- at NextAttemptUtc. The rows live as long as their claim: the purge
-- deletes them with it, in the same transaction, and never purges a
-- claim with a pending follow-up. The clustered key (ClaimId, Position)
-- serves a claim's follow-ups and the purge; the filtered index
-- IX_ClaimFollowUps_Pending holds only what the relay looks for. No
-- foreign key, as for dbo.ClaimHistory.
--
-- Grants: the processor INSERTs, SELECTs and UPDATEs dbo.ClaimFollowUps;
-- the reconciler INSERTs (its recovery records outcomes), SELECTs and
-- DELETEs (sql/grants).
--
-- 00008 belongs to another change; goose applies the files in order and
-- accepts the gap until both are merged.

-- +goose Up
-- +goose StatementBegin
CREATE TABLE dbo.ClaimFollowUps (
    ClaimId        bigint           NOT NULL,
    Position       int              NOT NULL CONSTRAINT CK_ClaimFollowUps_Position CHECK (Position >= 1),
    MessageId      nvarchar(128)    COLLATE Latin1_General_100_BIN2 NOT NULL,
    Target         nvarchar(260)    NOT NULL,
    Subject        nvarchar(128)    NOT NULL CONSTRAINT DF_ClaimFollowUps_Subject DEFAULT (N''),
    ContentType    nvarchar(128)    NOT NULL CONSTRAINT DF_ClaimFollowUps_ContentType DEFAULT (N''),
    CorrelationId  nvarchar(128)    NOT NULL CONSTRAINT DF_ClaimFollowUps_CorrelationId DEFAULT (N''),
    SessionId      nvarchar(128)    NOT NULL CONSTRAINT DF_ClaimFollowUps_SessionId DEFAULT (N''),
    Properties     nvarchar(max)    NOT NULL CONSTRAINT DF_ClaimFollowUps_Properties DEFAULT (N'{}'),
    Body           varbinary(max)   NOT NULL,
    ScheduledUtc   datetime2(7)     NULL,
    State          varchar(16)      NOT NULL CONSTRAINT DF_ClaimFollowUps_State DEFAULT ('pending')
                   CONSTRAINT CK_ClaimFollowUps_State CHECK (State IN ('pending', 'sent')),
    CreatedUtc     datetime2(7)     NOT NULL CONSTRAINT DF_ClaimFollowUps_CreatedUtc DEFAULT (SYSUTCDATETIME()),
    LeaseOwner     uniqueidentifier NULL,
    LeaseUntilUtc  datetime2(7)     NULL,
    NextAttemptUtc datetime2(7)     NULL,
    Attempts       int              NOT NULL CONSTRAINT DF_ClaimFollowUps_Attempts DEFAULT (0),
    LastError      nvarchar(2000)   NOT NULL CONSTRAINT DF_ClaimFollowUps_LastError DEFAULT (N''),
    SentUtc        datetime2(7)     NULL,
    CONSTRAINT PK_ClaimFollowUps PRIMARY KEY CLUSTERED (ClaimId, Position)
);
-- +goose StatementEnd

CREATE NONCLUSTERED INDEX IX_ClaimFollowUps_Pending ON dbo.ClaimFollowUps (CreatedUtc) WHERE State = 'pending';

-- +goose Down
DROP TABLE dbo.ClaimFollowUps;
