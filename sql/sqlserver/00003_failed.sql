-- Final answers, recorded answers and deliberate new keys (sbclaim 0.3).
--
-- A claim can end failed: the downstream gave a final answer that is not a
-- success (rejected, permanent, conflict). It records when and why
-- (FailedUtc, FailReason: the message's dead-letter reason) and which
-- delivery dead-letters the message (DeadLetterSeq, the broker's sequence
-- number), so a key is dead-lettered once however many copies arrive.
-- Every outcome records the downstream's last answer (Answer: JSON text,
-- bounded to 4 KiB by the store; AnswerUtc). An operator's redrive under a
-- new key records the key and who chose it (KeyRevision, EffectKey,
-- KeyRevisedBy, KeyRevisedUtc, KeyRevisionNote); every later attempt uses
-- EffectKey.
--
-- A CHECK constraint cannot be altered: CK_Claims_State is dropped and
-- added again with 'failed' (WITH CHECK: the existing rows are checked,
-- and the constraint stays trusted). Adding NOT NULL columns with a
-- constant default is a metadata-only change. Failed claims get a filtered
-- index for the purge (by FailedUtc) and Stats, like processed and
-- resolved claims.

-- +goose Up
ALTER TABLE dbo.Claims DROP CONSTRAINT CK_Claims_State;

ALTER TABLE dbo.Claims WITH CHECK ADD CONSTRAINT CK_Claims_State
    CHECK (State IN ('claimed', 'processed', 'released', 'failed', 'flagged', 'resolved'));

-- +goose StatementBegin
ALTER TABLE dbo.Claims ADD
    FailedUtc       datetime2(7)     NULL,
    FailReason      nvarchar(64)     NOT NULL CONSTRAINT DF_Claims_FailReason DEFAULT (N''),
    DeadLetterSeq   bigint           NULL,
    Answer          nvarchar(max)    NULL,
    AnswerUtc       datetime2(7)     NULL,
    KeyRevision     int              NOT NULL CONSTRAINT DF_Claims_KeyRevision DEFAULT (0),
    -- Binary collation, like MessageId: the key the downstream sees.
    EffectKey       nvarchar(160)    COLLATE Latin1_General_100_BIN2 NOT NULL CONSTRAINT DF_Claims_EffectKey DEFAULT (N''),
    KeyRevisedBy    nvarchar(256)    NOT NULL CONSTRAINT DF_Claims_KeyRevisedBy DEFAULT (N''),
    KeyRevisedUtc   datetime2(7)     NULL,
    KeyRevisionNote nvarchar(400)    NOT NULL CONSTRAINT DF_Claims_KeyRevisionNote DEFAULT (N'');
-- +goose StatementEnd

CREATE NONCLUSTERED INDEX IX_Claims_Failed
    ON dbo.Claims (FailedUtc)
    WHERE State = 'failed';

-- +goose Down
-- Schema 00002 has no failed state: a failed claim goes back to operators
-- as flagged, with its reason and final answer in FlagReason (its effect
-- is finished; resolve it as done).
-- +goose StatementBegin
UPDATE dbo.Claims SET State = 'flagged', FlaggedUtc = COALESCE(FailedUtc, SYSUTCDATETIME()),
    FlagReason = LEFT(N'failed (' + FailReason + N', a final answer) before the schema was downgraded: ' + LastError, 400)
WHERE State = 'failed';
-- +goose StatementEnd
DROP INDEX IX_Claims_Failed ON dbo.Claims;
ALTER TABLE dbo.Claims DROP CONSTRAINT CK_Claims_State;
ALTER TABLE dbo.Claims WITH CHECK ADD CONSTRAINT CK_Claims_State
    CHECK (State IN ('claimed', 'processed', 'released', 'flagged', 'resolved'));
-- +goose StatementBegin
ALTER TABLE dbo.Claims DROP CONSTRAINT DF_Claims_FailReason, DF_Claims_KeyRevision, DF_Claims_EffectKey,
    DF_Claims_KeyRevisedBy, DF_Claims_KeyRevisionNote;
-- +goose StatementEnd
-- +goose StatementBegin
ALTER TABLE dbo.Claims DROP COLUMN FailedUtc, FailReason, DeadLetterSeq, Answer, AnswerUtc,
    KeyRevision, EffectKey, KeyRevisedBy, KeyRevisedUtc, KeyRevisionNote;
-- +goose StatementEnd
