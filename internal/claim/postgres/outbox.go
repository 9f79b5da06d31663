package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/sqlstore"
)

var _ claim.Outbox = (*Store)(nil)

const followUpColumns = `claim_id, position, message_id, target, subject, content_type, correlation_id, session_id,
	properties::text, body, scheduled_utc, state, created_utc, lease_owner, lease_until_utc, next_attempt_utc, attempts,
	last_error, sent_utc`

func scanFollowUp(r sqlstore.Scanner) (*claim.StoredFollowUp, error) {
	var (
		f                                        claim.StoredFollowUp
		props, state                             string
		scheduled, leaseUntil, nextAttempt, sent sql.NullTime
		owner                                    sql.NullString
	)
	if err := r.Scan(&f.ClaimID, &f.Position, &f.MessageID, &f.To, &f.Subject, &f.ContentType, &f.CorrelationID, &f.SessionID,
		&props, &f.Body, &scheduled, &state, &f.CreatedAt, &owner, &leaseUntil, &nextAttempt, &f.Attempts, &f.LastError, &sent); err != nil {
		return nil, err
	}
	f.State = claim.FollowUpState(state)
	f.CreatedAt = f.CreatedAt.UTC()
	f.ScheduledAt, f.LeaseUntil, f.NextAttemptAt, f.SentAt = utc(scheduled), utc(leaseUntil), utc(nextAttempt), utc(sent)
	var err error
	if f.Properties, err = sqlstore.DecodeProperties(props); err != nil {
		return nil, err
	}
	if owner.Valid {
		if f.LeaseOwner, err = uuid.Parse(owner.String); err != nil {
			return nil, fmt.Errorf("lease owner: %w", err)
		}
	}
	return &f, nil
}

// insertFollowUps writes claim id's follow-ups in tx, in one statement; a
// position already written is kept (the insert is idempotent).
func insertFollowUps(ctx context.Context, tx *sql.Tx, id int64, fus []claim.FollowUp) error {
	if len(fus) == 0 {
		return nil
	}
	if err := claim.ValidateNumbered(id, fus); err != nil {
		return err
	}
	n := len(fus)
	var (
		positions = make([]int32, n)
		ids       = make([]string, n)
		targets   = make([]string, n)
		subjects  = make([]string, n)
		types     = make([]string, n)
		corrs     = make([]string, n)
		sessions  = make([]string, n)
		props     = make([]string, n)
		bodies    = make([][]byte, n)
		scheduled = make([]*string, n)
	)
	for i, f := range fus {
		p, err := sqlstore.EncodeProperties(f.Properties)
		if err != nil {
			return fmt.Errorf("follow-up %d of claim %d: %w", f.Position, id, err)
		}
		positions[i], ids[i], targets[i], subjects[i], types[i] = int32(f.Position), f.MessageID, f.To, f.Subject, f.ContentType
		corrs[i], sessions[i], props[i], bodies[i] = f.CorrelationID, f.SessionID, p, sqlstore.Body(f.Body)
		if f.ScheduledAt != nil {
			s := f.ScheduledAt.UTC().Format("2006-01-02T15:04:05.999999999Z07:00")
			scheduled[i] = &s
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO claim_followups (claim_id, position, message_id, target, subject,
		content_type, correlation_id, session_id, properties, body, scheduled_utc)
		SELECT $1, u.position, u.message_id, u.target, u.subject, u.content_type, u.correlation_id, u.session_id,
			u.properties::jsonb, u.body, u.scheduled::timestamptz
		FROM unnest($2::int4[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::bytea[], $11::text[])
			AS u(position, message_id, target, subject, content_type, correlation_id, session_id, properties, body, scheduled)
		ON CONFLICT (claim_id, position) DO NOTHING`,
		id, positions, ids, targets, subjects, types, corrs, sessions, props, bodies, scheduled); err != nil {
		return fmt.Errorf("follow-ups of claim %d: %w", id, translate(err))
	}
	return nil
}

// LeaseFollowUps leases due pending follow-ups (see claim.Outbox): the
// rows are locked with SKIP LOCKED, so concurrent relays take distinct
// rows without waiting on each other.
func (s *Store) LeaseFollowUps(ctx context.Context, params *claim.LeaseFollowUpsParams) ([]*claim.StoredFollowUp, error) {
	if err := params.Validate(); err != nil {
		return nil, err
	}
	const due = `state = 'pending' AND (lease_until_utc IS NULL OR lease_until_utc < now())
		AND (next_attempt_utc IS NULL OR next_attempt_utc <= now())`
	rows, err := s.db.QueryContext(ctx, `WITH c AS MATERIALIZED (SELECT claim_id, position FROM claim_followups
			WHERE `+due+` AND ($4::bigint <= 0 OR claim_id = $4::bigint)
			ORDER BY created_utc, claim_id, position LIMIT $3 FOR UPDATE SKIP LOCKED)
		UPDATE claim_followups f SET lease_owner = $1, lease_until_utc = now() + make_interval(secs => $2),
		attempts = f.attempts + 1
		FROM c WHERE f.claim_id = c.claim_id AND f.position = c.position
		RETURNING `+prefixed("f.", followUpColumns),
		params.Owner.String(), secs(params.For), sqlstore.Limit(params.Limit, sqlstore.DefaultLeaseLimit), params.ClaimID)
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

// prefixed qualifies every column of a column list.
func prefixed(prefix, list string) string {
	parts := strings.Split(list, ",")
	for i, p := range parts {
		parts[i] = prefix + strings.TrimSpace(p)
	}
	return strings.Join(parts, ", ")
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
		return sqlstore.RowExists(ctx, s.db, translate, `SELECT 1 FROM claim_followups WHERE claim_id = $1 AND position = $2`, p.ClaimID, p.Position)
	}
}

// MarkFollowUpSent marks a leased follow-up sent (see claim.Outbox).
func (s *Store) MarkFollowUpSent(ctx context.Context, params *claim.FollowUpLeaseParams) error {
	if err := sqlstore.ValidateFollowUpLease("mark sent", params); err != nil {
		return err
	}
	return sqlstore.ExecFollowUp(ctx, s.db, translate, "mark sent", params, s.followUpExists(params),
		`UPDATE claim_followups SET state = 'sent', sent_utc = now(), lease_until_utc = NULL, last_error = ''
		WHERE claim_id = $1 AND position = $2 AND state = 'pending' AND lease_owner = $3`,
		params.ClaimID, params.Position, params.Owner.String())
}

// RetryFollowUp gives back a leased follow-up whose send failed (see
// claim.Outbox).
func (s *Store) RetryFollowUp(ctx context.Context, params *claim.RetryFollowUpParams) error {
	if err := sqlstore.ValidateFollowUpLease("retry", &params.FollowUpLeaseParams); err != nil {
		return err
	}
	return sqlstore.ExecFollowUp(ctx, s.db, translate, "retry", &params.FollowUpLeaseParams, s.followUpExists(&params.FollowUpLeaseParams),
		`UPDATE claim_followups SET lease_until_utc = NULL, next_attempt_utc = now() + make_interval(secs => $4), last_error = left($5, 2000)
		WHERE claim_id = $1 AND position = $2 AND state = 'pending' AND lease_owner = $3`,
		params.ClaimID, params.Position, params.Owner.String(), secs(max(params.RetryIn, 0)), claim.Storable(params.Error))
}

// FollowUps lists a claim's follow-ups (see claim.Outbox).
func (s *Store) FollowUps(ctx context.Context, claimID int64) ([]*claim.StoredFollowUp, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+followUpColumns+` FROM claim_followups WHERE claim_id = $1 ORDER BY position`, claimID)
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
		oldest sql.NullTime
	)
	if err := s.db.QueryRowContext(ctx, `SELECT now(), count(*), min(created_utc) FROM claim_followups WHERE state = 'pending'`).
		Scan(&st.Now, &st.Pending, &oldest); err != nil {
		return nil, fmt.Errorf("outbox stats: %w", translate(err))
	}
	st.Now, st.OldestPending = st.Now.UTC(), utc(oldest)
	return &st, nil
}
