-- The audit history and the key form (sbclaim 0.4).
--
-- dbo.ClaimHistory is append-only: one row per change of a claim's owner
-- or state (claimed, taken over, redriven, released, attempt, processed,
-- failed, flagged, resolved, dead letter taken), with who, when (the
-- database clock, SYSUTCDATETIME()), why, the owner before and after and
-- the idempotency key. The store writes it with OUTPUT ... INTO
-- dbo.ClaimHistory in the guarded statement itself, so it exists exactly
-- when the statement changed the claim. An OUTPUT INTO target may have no
-- trigger, foreign key or CHECK constraint: this table has none. It lives
-- as long as its claim: the purge deletes a claim's history with it, in
-- the same transaction. The bigint IDENTITY clustered key appends;
-- IX_ClaimHistory_Claim serves reading a claim's history and the purge.
--
-- dbo.Claims records the form of its key (KeyForm): 'raw' for the claims
-- already there (their key stays the MessageId, ":r<n>" for a new key),
-- 'scoped' for new claims (consumer and dedup key, escaped, and hashed
-- beyond 255 characters), so EffectKey widens to 255 (a metadata-only
-- change; its default stays). TakenOverFrom and FlaggedFrom keep the state
-- the last take-over and flag found (the other dialects' history reads
-- them back; here OUTPUT DELETED.State gives it as well). Adding NOT NULL
-- columns with a constant default is a metadata-only change.
--
-- Grants: the processor and the reconciler INSERT into dbo.ClaimHistory,
-- and SELECT it; the reconciler DELETEs from it (sql/grants).

-- +goose Up
-- +goose StatementBegin
ALTER TABLE dbo.Claims ADD
    KeyForm       varchar(8)  NOT NULL CONSTRAINT DF_Claims_KeyForm DEFAULT ('raw')
                  CONSTRAINT CK_Claims_KeyForm CHECK (KeyForm IN ('raw', 'scoped')),
    TakenOverFrom varchar(16) NOT NULL CONSTRAINT DF_Claims_TakenOverFrom DEFAULT (''),
    FlaggedFrom   varchar(16) NOT NULL CONSTRAINT DF_Claims_FlaggedFrom DEFAULT ('');
-- +goose StatementEnd

ALTER TABLE dbo.Claims ALTER COLUMN EffectKey nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL;

-- +goose StatementBegin
CREATE TABLE dbo.ClaimHistory (
    Id             bigint IDENTITY(1,1) NOT NULL
                   CONSTRAINT PK_ClaimHistory PRIMARY KEY CLUSTERED,
    ClaimId        bigint           NOT NULL,
    AtUtc          datetime2(7)     NOT NULL CONSTRAINT DF_ClaimHistory_AtUtc DEFAULT (SYSUTCDATETIME()),
    What           varchar(32)      NOT NULL,
    FromState      varchar(16)      NOT NULL CONSTRAINT DF_ClaimHistory_FromState DEFAULT (''),
    ToState        varchar(16)      NOT NULL,
    ByWhom         nvarchar(256)    NOT NULL CONSTRAINT DF_ClaimHistory_ByWhom DEFAULT (N''),
    Path           varchar(16)      NOT NULL CONSTRAINT DF_ClaimHistory_Path DEFAULT (''),
    Reason         nvarchar(2000)   NOT NULL CONSTRAINT DF_ClaimHistory_Reason DEFAULT (N''),
    PreviousOwner  uniqueidentifier NULL,
    Owner          uniqueidentifier NOT NULL,
    IdempotencyKey nvarchar(255)    COLLATE Latin1_General_100_BIN2 NOT NULL CONSTRAINT DF_ClaimHistory_IdempotencyKey DEFAULT (N'')
);
-- +goose StatementEnd

CREATE NONCLUSTERED INDEX IX_ClaimHistory_Claim ON dbo.ClaimHistory (ClaimId, Id);

-- +goose Down
-- Schema 00003 keeps keys of at most 160 characters: a longer scoped key
-- is cut (settle the claims that use one before downgrading).
DROP TABLE dbo.ClaimHistory;
-- +goose StatementBegin
UPDATE dbo.Claims SET EffectKey = LEFT(EffectKey, 160) WHERE LEN(EffectKey) > 160;
-- +goose StatementEnd
ALTER TABLE dbo.Claims ALTER COLUMN EffectKey nvarchar(160) COLLATE Latin1_General_100_BIN2 NOT NULL;
-- +goose StatementBegin
ALTER TABLE dbo.Claims DROP CONSTRAINT CK_Claims_KeyForm, DF_Claims_KeyForm, DF_Claims_TakenOverFrom, DF_Claims_FlaggedFrom;
-- +goose StatementEnd
ALTER TABLE dbo.Claims DROP COLUMN KeyForm, TakenOverFrom, FlaggedFrom;
