package mssql

import (
	"context"
	"fmt"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
)

var _ claim.Deferrer = (*Store)(nil)

// Defer records that a claimed claim's message is deferred (see
// claim.Deferrer). ReleasedUtc and HeartbeatUtc are one reading of the
// clock (@now); DueUtc and NextAttemptUtc are computed from
// SYSUTCDATETIME() like every other "later" time of the store.
func (s *Store) Defer(ctx context.Context, params *claim.DeferParams) error {
	if err := claim.ValidateDefer(params); err != nil {
		return err
	}
	answer, err := answerParam(params.Answer)
	if err != nil {
		return fmt.Errorf("defer claim %d: %w", params.ID, err)
	}
	a := args{{params.ID, declID}, {guid(params.Owner), declGUID}, {text(truncate(params.Error, maxLastError)), declLongText},
		{answer, declAnswer}, {params.Seq, declID}}
	next := laterSQL(&a, params.DueIn+params.Grace)
	return s.execGuarded(ctx, "defer", params.ID, declareNow+`UPDATE dbo.Claims
SET State = 'released', ReleasedUtc = @now, HeartbeatUtc = @now, LastError = @p3, DeferredSeq = @p5,
    DueUtc = NULL, NextAttemptUtc = `+next+`,
    Postponements = Postponements + 1, PostponedUtc = COALESCE(PostponedUtc, @now), `+setAnswer("@p4")+`
`+simpleHistory(claim.ChangeReleased, "DELETED.State", "INSERTED.ClaimedBy",
		"N'deferred (sequence number ' + CAST(INSERTED.DeferredSeq AS nvarchar(20)) + N'): ' + INSERTED.LastError")+`OUTPUT INSERTED.Id
WHERE Id = @p1 AND Owner = @p2 AND State = 'claimed';`, a...)
}

// SetDue records when a deferred message is due (see claim.Deferrer).
func (s *Store) SetDue(ctx context.Context, params *claim.SetDueParams) error {
	if params.DueIn < 0 {
		return fmt.Errorf("set due: DueIn cannot be negative")
	}
	a := args{{params.ID, declID}, {guid(params.Owner), declGUID}, {params.Seq, declID}}
	due := laterSQL(&a, params.DueIn)
	return s.execGuarded(ctx, "set the due time of", params.ID, `UPDATE dbo.Claims SET DueUtc = `+due+`
OUTPUT INSERTED.Id
WHERE Id = @p1 AND Owner = @p2 AND State = 'released' AND DeferredSeq = @p3 AND DueUtc IS NULL;`, a...)
}

// duePredicate is FindDue's and TakeDeferred's test, adding the SilentFor
// parameters to a. The filter of IX_Claims_Deferred is repeated literally
// so the optimizer matches the filtered index.
func duePredicate(a *args, silentFor time.Duration) string {
	return "DeferredSeq IS NOT NULL AND State IN ('claimed', 'released')" +
		" AND ((State = 'released' AND DueUtc <= SYSUTCDATETIME())" +
		" OR ((State = 'claimed' AND TakeOverPath = 'redelivery'" +
		" OR State = 'released' AND DueUtc IS NULL)" +
		" AND HeartbeatUtc < " + agoSQL(a, silentFor) + "))"
}

// FindDue lists the claims whose deferred message is due, earliest first.
func (s *Store) FindDue(ctx context.Context, params *claim.FindDueParams) ([]*claim.Claim, error) {
	return s.findDeferred(ctx, "find due claims", params, duePredicate, "COALESCE(DueUtc, HeartbeatUtc)")
}

// findDeferred lists the claims of params' consumer and entity that match
// predicate (which adds its SilentFor parameters), in order.
func (s *Store) findDeferred(ctx context.Context, op string, params *claim.FindDueParams, predicate func(*args, time.Duration) string, order string) ([]*claim.Claim, error) {
	limit, err := claim.ValidateFindDue(params)
	if err != nil {
		return nil, err
	}
	var a args
	n := a.add(int64(limit), declID)
	consumer, entity := a.add(text(params.Consumer), declConsumer), a.add(text(params.Entity), declEntity)
	out, err := queryClaims(ctx, s.db, `SELECT TOP (`+n+`) `+columns+` FROM dbo.Claims
WHERE Consumer = `+consumer+` AND Entity = `+entity+` AND `+predicate(&a, params.SilentFor)+`
ORDER BY `+order+`;`, a)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}

// TakeDeferred gives a due claim to a new owner (see claim.Deferrer).
// SQL Server reads the row under an update lock before it changes it, so
// of concurrent takers one matches the guard.
func (s *Store) TakeDeferred(ctx context.Context, params *claim.TakeDeferredParams) (*claim.Claim, error) {
	if err := claim.ValidateTakeDeferred(params); err != nil {
		return nil, err
	}
	var a args
	owner, by := a.add(guid(params.Owner), declGUID), a.add(text(truncate(params.By, maxClaimedBy)), declHost)
	reason := a.add(text(truncate(params.Reason, maxFlagReason)), declFlagReason)
	id, previous, seq := a.add(params.ID, declID), a.add(guid(params.PreviousOwner), declGUID), a.add(params.Seq, declID)
	out, err := queryClaims(ctx, s.db, declareNow+`UPDATE dbo.Claims
SET State = 'claimed', Owner = `+owner+`, ClaimedBy = `+by+`,
    HeartbeatUtc = @now, TakenOverUtc = @now, TakeOvers = TakeOvers + 1,
    TakeOverPath = 'redelivery', TakeOverReason = `+reason+`, PreviousOwner = Owner, PreviousHolder = ClaimedBy,
    DueUtc = NULL, NextAttemptUtc = NULL
`+historyInto("'"+string(claim.ChangeTakenOver)+"'", "DELETED.State", "INSERTED.ClaimedBy", "INSERTED.TakeOverPath",
		"INSERTED.TakeOverReason", "DELETED.Owner")+`OUTPUT `+insertedColumns+`
WHERE Id = `+id+` AND Owner = `+previous+` AND DeferredSeq = `+seq+`
  AND `+duePredicate(&a, params.SilentFor)+`;`, a)
	if err != nil {
		return nil, fmt.Errorf("take deferred claim %d: %w", params.ID, err)
	}
	if len(out) == 0 {
		now, gerr := s.Get(ctx, params.ID)
		if gerr != nil {
			return nil, fmt.Errorf("take deferred claim %d: refused, then: %w", params.ID, gerr)
		}
		return now, fmt.Errorf("take deferred claim %d: %w", params.ID, claim.ErrStateChanged)
	}
	return out[0], nil
}

// strandedPredicate is FindStranded's and TakeStranded's test, adding the
// SilentFor parameters to a. It starts with IX_Claims_Deferred's filter.
// The silence counts from the last heartbeat and from the write that
// finished the claim (which need not be its holder's).
func strandedPredicate(a *args, silentFor time.Duration) string {
	ago := agoSQL(a, silentFor)
	return "DeferredSeq IS NOT NULL AND State IN ('processed', 'failed', 'flagged', 'resolved')" +
		" AND HeartbeatUtc < " + ago +
		" AND COALESCE(CASE State WHEN 'processed' THEN ProcessedUtc WHEN 'failed' THEN FailedUtc" +
		" WHEN 'flagged' THEN FlaggedUtc ELSE ResolvedUtc END, HeartbeatUtc) < " + ago
}

// FindStranded lists the finished claims whose deferred message was never
// settled, longest silent first (see claim.Deferrer).
func (s *Store) FindStranded(ctx context.Context, params *claim.FindDueParams) ([]*claim.Claim, error) {
	return s.findDeferred(ctx, "find stranded claims", params, strandedPredicate, "HeartbeatUtc")
}

// TakeStranded lets one caller settle a stranded claim's message (see
// claim.Deferrer). The state is validated (a finished one) and written
// literally, like Flag's.
func (s *Store) TakeStranded(ctx context.Context, params *claim.TakeStrandedParams) error {
	if err := claim.ValidateTakeStranded(params); err != nil {
		return err
	}
	a := args{{params.ID, declID}, {params.Seq, declID}}
	return s.execGuarded(ctx, "take the stranded message of", params.ID, `UPDATE dbo.Claims SET HeartbeatUtc = SYSUTCDATETIME()
OUTPUT INSERTED.Id
WHERE Id = @p1 AND DeferredSeq = @p2 AND State = '`+string(params.State)+`' AND `+strandedPredicate(&a, params.SilentFor)+`;`, a...)
}

// ClearDeferred forgets a settled deferred message (see claim.Deferrer).
func (s *Store) ClearDeferred(ctx context.Context, params *claim.ClearDeferredParams) error {
	return s.execGuarded(ctx, "clear the deferred message of", params.ID, `UPDATE dbo.Claims SET DeferredSeq = NULL, DueUtc = NULL,
    NextAttemptUtc = CASE WHEN DueUtc IS NOT NULL THEN NULL ELSE NextAttemptUtc END
OUTPUT INSERTED.Id
WHERE Id = @p1 AND DeferredSeq = @p2;`, param{params.ID, declID}, param{params.Seq, declID})
}
