package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/sqlstore"
)

var _ claim.Outbox = (*Store)(nil)

const followUpColumns = `claim_id, position, message_id, target, subject, content_type, correlation_id, session_id,
	properties, body, scheduled_utc, state, created_utc, lease_owner, lease_until_utc, next_attempt_utc, attempts,
	last_error, sent_utc`

func scanFollowUp(r sqlstore.Scanner) (*claim.StoredFollowUp, error) {
	var (
		f                                        claim.StoredFollowUp
		props, state, created                    string
		scheduled, leaseUntil, nextAttempt, sent sql.NullString
		owner                                    sql.NullString
	)
	if err := r.Scan(&f.ClaimID, &f.Position, &f.MessageID, &f.To, &f.Subject, &f.ContentType, &f.CorrelationID, &f.SessionID,
		&props, &f.Body, &scheduled, &state, &created, &owner, &leaseUntil, &nextAttempt, &f.Attempts, &f.LastError, &sent); err != nil {
		return nil, err
	}
	f.State = claim.FollowUpState(state)
	var err error
	if f.Properties, err = sqlstore.DecodeProperties(props); err != nil {
		return nil, err
	}
	if f.CreatedAt, err = parseTime(created); err != nil {
		return nil, err
	}
	for _, t := range []struct {
		dst **time.Time
		src sql.NullString
	}{{&f.ScheduledAt, scheduled}, {&f.LeaseUntil, leaseUntil}, {&f.NextAttemptAt, nextAttempt}, {&f.SentAt, sent}} {
		if *t.dst, err = parseNullTime(t.src); err != nil {
			return nil, err
		}
	}
	if owner.Valid {
		if f.LeaseOwner, err = uuid.Parse(owner.String); err != nil {
			return nil, fmt.Errorf("lease owner: %w", err)
		}
	}
	return &f, nil
}

// insertFollowUps writes claim id's follow-ups in tx; a position already
// written is kept (the insert is idempotent).
func insertFollowUps(ctx context.Context, tx *stx, id int64, fus []claim.FollowUp) error {
	if err := claim.ValidateNumbered(id, fus); err != nil {
		return err
	}
	for _, f := range fus {
		props, err := sqlstore.EncodeProperties(f.Properties)
		if err != nil {
			return fmt.Errorf("follow-up %d of claim %d: %w", f.Position, id, err)
		}
		var scheduled any
		if f.ScheduledAt != nil {
			scheduled = f.ScheduledAt.UTC().Format(timeLayout)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO claim_followups (claim_id, position, message_id, target, subject,
			content_type, correlation_id, session_id, properties, body, scheduled_utc, created_utc)
			VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, `+nowSQL+`)
			ON CONFLICT (claim_id, position) DO NOTHING`,
			id, f.Position, f.MessageID, f.To, f.Subject, f.ContentType, f.CorrelationID, f.SessionID, props,
			sqlstore.Body(f.Body), scheduled); err != nil {
			return fmt.Errorf("follow-up %d of claim %d: %w", f.Position, id, translate(err))
		}
	}
	return nil
}

// LeaseFollowUps leases due pending follow-ups (see claim.Outbox).
func (s *Store) LeaseFollowUps(ctx context.Context, params *claim.LeaseFollowUpsParams) ([]*claim.StoredFollowUp, error) {
	if err := params.Validate(); err != nil {
		return nil, err
	}
	rows, err := s.db.QueryContext(ctx, `UPDATE claim_followups SET lease_owner = ?1, lease_until_utc = `+laterSQL(2)+`,
		attempts = attempts + 1
		WHERE rowid IN (SELECT rowid FROM claim_followups
			WHERE state = 'pending' AND (lease_until_utc IS NULL OR lease_until_utc < `+nowSQL+`)
			AND (next_attempt_utc IS NULL OR next_attempt_utc <= `+nowSQL+`) AND (?4 <= 0 OR claim_id = ?4)
			ORDER BY created_utc, claim_id, position LIMIT ?3)
		RETURNING `+followUpColumns,
		params.Owner.String(), later(params.For), sqlstore.Limit(params.Limit, sqlstore.DefaultLeaseLimit), params.ClaimID)
	if err != nil {
		return nil, fmt.Errorf("lease follow-ups: %w", translate(err))
	}
	out, err := collectFollowUps(rows)
	if err != nil {
		return nil, fmt.Errorf("lease follow-ups: %w", err)
	}
	sqlstore.SortFollowUps(out)
	return out, nil
}

func collectFollowUps(rows *sql.Rows) ([]*claim.StoredFollowUp, error) {
	defer rows.Close()
	var out []*claim.StoredFollowUp
	for rows.Next() {
		f, err := scanFollowUp(rows)
		if err != nil {
			return nil, translate(err)
		}
		out = append(out, f)
	}
	return out, translate(rows.Err())
}

func (s *Store) followUpExists(p *claim.FollowUpLeaseParams) func(ctx context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		return sqlstore.RowExists(ctx, s.db, translate, `SELECT 1 FROM claim_followups WHERE claim_id = ?1 AND position = ?2`, p.ClaimID, p.Position)
	}
}

// MarkFollowUpSent marks a leased follow-up sent (see claim.Outbox).
func (s *Store) MarkFollowUpSent(ctx context.Context, params *claim.FollowUpLeaseParams) error {
	if err := sqlstore.ValidateFollowUpLease("mark sent", params); err != nil {
		return err
	}
	return sqlstore.ExecFollowUp(ctx, s.db, translate, "mark sent", params, s.followUpExists(params),
		`UPDATE claim_followups SET state = 'sent', sent_utc = `+nowSQL+`, lease_until_utc = NULL, last_error = ''
		WHERE claim_id = ?1 AND position = ?2 AND state = 'pending' AND lease_owner = ?3`,
		params.ClaimID, params.Position, params.Owner.String())
}

// RetryFollowUp gives back a leased follow-up whose send failed (see
// claim.Outbox).
func (s *Store) RetryFollowUp(ctx context.Context, params *claim.RetryFollowUpParams) error {
	if err := sqlstore.ValidateFollowUpLease("retry", &params.FollowUpLeaseParams); err != nil {
		return err
	}
	return sqlstore.ExecFollowUp(ctx, s.db, translate, "retry", &params.FollowUpLeaseParams, s.followUpExists(&params.FollowUpLeaseParams),
		`UPDATE claim_followups SET lease_until_utc = NULL, next_attempt_utc = `+laterSQL(4)+`, last_error = substr(?5, 1, 2000)
		WHERE claim_id = ?1 AND position = ?2 AND state = 'pending' AND lease_owner = ?3`,
		params.ClaimID, params.Position, params.Owner.String(), later(max(params.RetryIn, 0)), claim.Storable(params.Error))
}

// FollowUps lists a claim's follow-ups (see claim.Outbox).
func (s *Store) FollowUps(ctx context.Context, claimID int64) ([]*claim.StoredFollowUp, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+followUpColumns+` FROM claim_followups WHERE claim_id = ?1 ORDER BY position`, claimID)
	if err != nil {
		return nil, fmt.Errorf("follow-ups of claim %d: %w", claimID, translate(err))
	}
	out, err := collectFollowUps(rows)
	if err != nil {
		return nil, fmt.Errorf("follow-ups of claim %d: %w", claimID, err)
	}
	return out, nil
}

// OutboxStats summarises the pending follow-ups (see claim.Outbox).
func (s *Store) OutboxStats(ctx context.Context) (*claim.OutboxStats, error) {
	var (
		st     claim.OutboxStats
		now    string
		oldest sql.NullString
		err    error
	)
	if err = s.db.QueryRowContext(ctx, `SELECT `+nowSQL+`, count(*), min(created_utc) FROM claim_followups WHERE state = 'pending'`).
		Scan(&now, &st.Pending, &oldest); err != nil {
		return nil, fmt.Errorf("outbox stats: %w", translate(err))
	}
	if st.Now, err = parseTime(now); err != nil {
		return nil, fmt.Errorf("outbox stats: %w", err)
	}
	if st.OldestPending, err = parseNullTime(oldest); err != nil {
		return nil, fmt.Errorf("outbox stats: %w", err)
	}
	return &st, nil
}
