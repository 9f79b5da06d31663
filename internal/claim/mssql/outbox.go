package mssql

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	mssqldb "github.com/microsoft/go-mssqldb"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/sqlstore"
)

var _ claim.Outbox = (*Store)(nil)

// Declared types of the outbox's parameters.
const (
	declTarget    = "nvarchar(260)" // Target; claim.MaxFollowUpTargetLength
	declShortText = "nvarchar(128)" // Subject, ContentType, CorrelationId, SessionId, MessageId
	declTimeText  = "nvarchar(40)"  // a datetime2(7) as ISO 8601 text
)

var followUpColumnNames = []string{"ClaimId", "Position", "MessageId", "Target", "Subject", "ContentType", "CorrelationId",
	"SessionId", "Properties", "Body", "ScheduledUtc", "State", "CreatedUtc", "LeaseOwner", "LeaseUntilUtc", "NextAttemptUtc",
	"Attempts", "LastError", "SentUtc"}

func followUpCols(prefix string) string {
	parts := make([]string, len(followUpColumnNames))
	for i, c := range followUpColumnNames {
		parts[i] = prefix + c
	}
	return strings.Join(parts, ", ")
}

func scanFollowUp(r interface{ Scan(...any) error }) (*claim.StoredFollowUp, error) {
	var (
		f                                        claim.StoredFollowUp
		props, state                             string
		scheduled, leaseUntil, nextAttempt, sent sql.NullTime
		owner                                    mssqldb.NullUniqueIdentifier
	)
	if err := r.Scan(&f.ClaimID, &f.Position, &f.MessageID, &f.To, &f.Subject, &f.ContentType, &f.CorrelationID, &f.SessionID,
		&props, &f.Body, &scheduled, &state, &f.CreatedAt, &owner, &leaseUntil, &nextAttempt, &f.Attempts, &f.LastError, &sent); err != nil {
		return nil, err
	}
	f.State = claim.FollowUpState(state)
	f.CreatedAt = f.CreatedAt.UTC()
	f.ScheduledAt, f.LeaseUntil, f.NextAttemptAt, f.SentAt = nullTime(scheduled), nullTime(leaseUntil), nullTime(nextAttempt), nullTime(sent)
	if owner.Valid {
		f.LeaseOwner = uuid.UUID(owner.UUID)
	}
	var err error
	if f.Properties, err = sqlstore.DecodeProperties(props); err != nil {
		return nil, err
	}
	return &f, nil
}

// insertFollowUpsSQL is the INSERT of claim id's follow-ups, in one
// statement (at most claim.MaxFollowUps rows of 11 parameters); a
// position already written is kept.
func insertFollowUpsSQL(id int64, fus []claim.FollowUp) (string, args, error) {
	var a args
	claimID := a.add(id, declID)
	rows := make([]string, len(fus))
	for i, f := range fus {
		props, err := sqlstore.EncodeProperties(f.Properties)
		if err != nil {
			return "", nil, fmt.Errorf("follow-up %d of claim %d: %w", f.Position, id, err)
		}
		// The scheduled time as ISO 8601 text (style 126), converted by
		// the server: no driver conversion of a time.Time in between.
		scheduled := sql.NullString{}
		if f.ScheduledAt != nil {
			scheduled = sql.NullString{String: f.ScheduledAt.UTC().Format("2006-01-02T15:04:05.0000000"), Valid: true}
		}
		rows[i] = "(" + strings.Join([]string{
			a.add(int32(f.Position), declInt), a.add(text(f.MessageID), declShortText), a.add(text(f.To), declTarget),
			a.add(text(f.Subject), declShortText), a.add(text(f.ContentType), declShortText), a.add(text(f.CorrelationID), declShortText),
			a.add(text(f.SessionID), declShortText), a.add(text(props), declText), a.add(sqlstore.Body(f.Body), declPayload),
			"CONVERT(datetime2(7), " + a.add(scheduled, declTimeText) + ", 126)",
		}, ", ") + ")"
	}
	return `INSERT INTO dbo.ClaimFollowUps (ClaimId, Position, MessageId, Target, Subject, ContentType, CorrelationId, SessionId, Properties, Body, ScheduledUtc)
SELECT ` + claimID + `, v.Position, v.MessageId, v.Target, v.Subject, v.ContentType, v.CorrelationId, v.SessionId, v.Properties, v.Body, v.ScheduledUtc
FROM (VALUES ` + strings.Join(rows, ",\n\t") + `)
    AS v (Position, MessageId, Target, Subject, ContentType, CorrelationId, SessionId, Properties, Body, ScheduledUtc)
WHERE NOT EXISTS (SELECT 1 FROM dbo.ClaimFollowUps AS f WITH (UPDLOCK, HOLDLOCK)
    WHERE f.ClaimId = ` + claimID + ` AND f.Position = v.Position);`, a, nil
}

// insertFollowUps writes claim id's follow-ups in tx.
func insertFollowUps(ctx context.Context, tx *sql.Tx, id int64, fus []claim.FollowUp) error {
	if len(fus) == 0 {
		return nil
	}
	if err := claim.ValidateNumbered(id, fus); err != nil {
		return err
	}
	q, a, err := insertFollowUpsSQL(id, fus)
	if err != nil {
		return err
	}
	if err := query(ctx, tx, q, a, func(*sql.Rows) error { return nil }); err != nil {
		return fmt.Errorf("follow-ups of claim %d: %w", id, interpretError(err))
	}
	return nil
}

// inTx runs fn in a transaction and commits it when fn succeeds.
func (s *Store) inTx(ctx context.Context, op string, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("%s: begin: %w", op, interpretError(err))
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it only reports ErrTxDone
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("%s: commit: %w", op, interpretError(err))
	}
	return nil
}

// LeaseFollowUps leases due pending follow-ups (see claim.Outbox). The
// CTE reads the candidates with UPDLOCK and READPAST (READCOMMITTEDLOCK
// for READPAST's sake under READ_COMMITTED_SNAPSHOT, as FlagStale), so
// concurrent relays take distinct rows without waiting on each other.
func (s *Store) LeaseFollowUps(ctx context.Context, params *claim.LeaseFollowUpsParams) ([]*claim.StoredFollowUp, error) {
	if err := params.Validate(); err != nil {
		return nil, err
	}
	var a args
	owner := a.add(guid(params.Owner), declGUID)
	until := laterSQL(&a, params.For)
	top := a.add(int64(sqlstore.Limit(params.Limit, sqlstore.DefaultLeaseLimit)), declID)
	claimID := a.add(params.ClaimID, declID)
	q := `WITH c AS (
    SELECT TOP (` + top + `) * FROM dbo.ClaimFollowUps WITH (UPDLOCK, READPAST, ROWLOCK, READCOMMITTEDLOCK)
    WHERE State = 'pending' AND (LeaseUntilUtc IS NULL OR LeaseUntilUtc < SYSUTCDATETIME())
        AND (NextAttemptUtc IS NULL OR NextAttemptUtc <= SYSUTCDATETIME())
        AND (` + claimID + ` <= 0 OR ClaimId = ` + claimID + `)
    ORDER BY CreatedUtc, ClaimId, Position)
UPDATE c SET LeaseOwner = ` + owner + `, LeaseUntilUtc = ` + until + `, Attempts = Attempts + 1
OUTPUT ` + followUpCols("INSERTED.") + `;`
	out, err := s.queryFollowUps(ctx, q, a)
	if err != nil {
		return nil, fmt.Errorf("lease follow-ups: %w", err)
	}
	sqlstore.SortFollowUps(out)
	return out, nil
}

func (s *Store) queryFollowUps(ctx context.Context, q string, a args) ([]*claim.StoredFollowUp, error) {
	var out []*claim.StoredFollowUp
	err := query(ctx, s.db, q, a, func(r *sql.Rows) error {
		f, err := scanFollowUp(r)
		if err != nil {
			return err
		}
		out = append(out, f)
		return nil
	})
	if err != nil {
		return nil, interpretError(err)
	}
	return out, nil
}

func (s *Store) followUpExists(p *claim.FollowUpLeaseParams) func(ctx context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		var a args
		q := `SELECT 1 FROM dbo.ClaimFollowUps WHERE ClaimId = ` + a.add(p.ClaimID, declID) + ` AND Position = ` + a.add(int32(p.Position), declInt) + `;`
		n := 0
		if err := query(ctx, s.db, q, a, func(*sql.Rows) error { n++; return nil }); err != nil {
			return false, interpretError(err)
		}
		return n > 0, nil
	}
}

// execFollowUp runs a guarded follow-up UPDATE that outputs the rows it
// changed, and explains a refusal.
func (s *Store) execFollowUp(ctx context.Context, op string, p *claim.FollowUpLeaseParams, set string, a args) error {
	where := ` WHERE ClaimId = ` + a.add(p.ClaimID, declID) + ` AND Position = ` + a.add(int32(p.Position), declInt) +
		` AND State = 'pending' AND LeaseOwner = ` + a.add(guid(p.Owner), declGUID) + `;`
	n := 0
	err := query(ctx, s.db, `UPDATE dbo.ClaimFollowUps SET `+set+` OUTPUT INSERTED.ClaimId`+where, a, func(*sql.Rows) error { n++; return nil })
	if err != nil {
		return fmt.Errorf("%s follow-up %d of claim %d: %w", op, p.Position, p.ClaimID, interpretError(err))
	}
	if n == 0 {
		return sqlstore.FollowUpRefused(ctx, op, p, s.followUpExists(p))
	}
	return nil
}

// MarkFollowUpSent marks a leased follow-up sent (see claim.Outbox).
func (s *Store) MarkFollowUpSent(ctx context.Context, params *claim.FollowUpLeaseParams) error {
	if err := sqlstore.ValidateFollowUpLease("mark sent", params); err != nil {
		return err
	}
	return s.execFollowUp(ctx, "mark sent", params, `State = 'sent', SentUtc = SYSUTCDATETIME(), LeaseUntilUtc = NULL, LastError = N''`, nil)
}

// RetryFollowUp gives back a leased follow-up whose send failed (see
// claim.Outbox).
func (s *Store) RetryFollowUp(ctx context.Context, params *claim.RetryFollowUpParams) error {
	if err := sqlstore.ValidateFollowUpLease("retry", &params.FollowUpLeaseParams); err != nil {
		return err
	}
	var a args
	set := `LeaseUntilUtc = NULL, NextAttemptUtc = ` + laterSQL(&a, params.RetryIn) + `, LastError = ` +
		a.add(text(truncate(claim.Storable(params.Error), 2000)), declLongText)
	return s.execFollowUp(ctx, "retry", &params.FollowUpLeaseParams, set, a)
}

// FollowUps lists a claim's follow-ups (see claim.Outbox).
func (s *Store) FollowUps(ctx context.Context, claimID int64) ([]*claim.StoredFollowUp, error) {
	var a args
	out, err := s.queryFollowUps(ctx, `SELECT `+followUpCols("")+` FROM dbo.ClaimFollowUps WHERE ClaimId = `+a.add(claimID, declID)+` ORDER BY Position;`, a)
	if err != nil {
		return nil, fmt.Errorf("follow-ups of claim %d: %w", claimID, err)
	}
	return out, nil
}

// OutboxStats summarises the pending follow-ups (see claim.Outbox); the
// counts read the filtered index of pending follow-ups.
func (s *Store) OutboxStats(ctx context.Context) (*claim.OutboxStats, error) {
	var (
		st     claim.OutboxStats
		oldest sql.NullTime
	)
	err := query(ctx, s.db, `SELECT SYSUTCDATETIME(), COUNT_BIG(*), MIN(CreatedUtc) FROM dbo.ClaimFollowUps WHERE State = 'pending';`, nil,
		func(r *sql.Rows) error { return r.Scan(&st.Now, &st.Pending, &oldest) })
	if err != nil {
		return nil, fmt.Errorf("outbox stats: %w", interpretError(err))
	}
	st.Now, st.OldestPending = st.Now.UTC(), nullTime(oldest)
	return &st, nil
}
