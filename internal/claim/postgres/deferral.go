package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/sqlstore"
)

var _ claim.Deferrer = (*Store)(nil)

// Defer records that a claimed claim's message is deferred (see
// claim.Deferrer).
func (s *Store) Defer(ctx context.Context, params *claim.DeferParams) error {
	if err := claim.ValidateDefer(params); err != nil {
		return err
	}
	answer, err := sqlstore.EncodeAnswer(params.Answer)
	if err != nil {
		return fmt.Errorf("defer claim %d: %w", params.ID, err)
	}
	// A change of state: its history row in the same statement.
	return s.execGuarded(ctx, "defer", params.ID, guardedSQL(`UPDATE claims SET state = 'released', released_utc = now(),
		heartbeat_utc = now(), last_error = $1, deferred_seq = $5, due_utc = NULL,
		next_attempt_utc = now() + make_interval(secs => $6),
		postponements = postponements + 1, postponed_utc = coalesce(postponed_utc, now()), `+setAnswer(4)+`
		WHERE id = $2 AND owner = $3 AND state = 'claimed'`,
		string(claim.ChangeReleased), "'claimed'", "u.claimed_by", "'deferred (sequence number ' || u.deferred_seq || '): ' || u.last_error"),
		params.Error, params.ID, params.Owner, answer, params.Seq, secs(params.DueIn+params.Grace))
}

// SetDue records when a deferred message is due (see claim.Deferrer).
func (s *Store) SetDue(ctx context.Context, params *claim.SetDueParams) error {
	if params.DueIn < 0 {
		return errors.New("set due: DueIn cannot be negative")
	}
	return s.execGuarded(ctx, "set the due time of", params.ID, `UPDATE claims SET due_utc = now() + make_interval(secs => $4)
		WHERE id = $1 AND owner = $2 AND state = 'released' AND deferred_seq = $3 AND due_utc IS NULL`,
		params.ID, params.Owner, params.Seq, secs(params.DueIn))
}

// duePredicate is FindDue's and TakeDeferred's test; $1 is SilentFor in
// seconds.
const duePredicate = `deferred_seq IS NOT NULL AND ((state = 'released' AND due_utc <= now())
	OR ((state = 'claimed' AND take_over_path = 'redelivery'
		OR state = 'released' AND due_utc IS NULL)
		AND heartbeat_utc < now() - make_interval(secs => $1)))`

// FindDue lists the claims whose deferred message is due, earliest first.
func (s *Store) FindDue(ctx context.Context, params *claim.FindDueParams) ([]*claim.Claim, error) {
	return s.findDeferred(ctx, "find due claims", params, duePredicate, "coalesce(due_utc, heartbeat_utc)")
}

// findDeferred lists the claims of params' consumer and entity that match
// predicate ($1 is SilentFor in seconds), in order.
func (s *Store) findDeferred(ctx context.Context, op string, params *claim.FindDueParams, predicate, order string) ([]*claim.Claim, error) {
	limit, err := claim.ValidateFindDue(params)
	if err != nil {
		return nil, err
	}
	q := `SELECT ` + columns + ` FROM claims WHERE consumer = $2 AND entity = $3 AND ` + predicate + `
		ORDER BY ` + order + ` LIMIT $4`
	var out []*claim.Claim
	if err := queryClaims(ctx, s.db, q, []any{secs(params.SilentFor), params.Consumer, params.Entity, limit},
		func(c *claim.Claim) { out = append(out, c) }); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}

// TakeDeferred gives a due claim to a new owner (see claim.Deferrer). The
// predicate is in the UPDATE's own WHERE: READ COMMITTED re-checks it on
// the latest row version when a concurrent taker committed first.
func (s *Store) TakeDeferred(ctx context.Context, params *claim.TakeDeferredParams) (*claim.Claim, error) {
	if err := claim.ValidateTakeDeferred(params); err != nil {
		return nil, err
	}
	// A change of owner: its history row in the same statement.
	row := s.db.QueryRowContext(ctx, `WITH u AS (UPDATE claims SET state = 'claimed', owner = $2, claimed_by = $3,
		taken_over_from = state, heartbeat_utc = now(), taken_over_utc = now(), take_overs = take_overs + 1,
		take_over_path = 'redelivery', take_over_reason = $4, previous_owner = owner, previous_holder = claimed_by,
		due_utc = NULL, next_attempt_utc = NULL
		WHERE id = $5 AND owner = $6 AND deferred_seq = $7 AND `+duePredicate+`
		RETURNING *
	), h AS (
		`+historySQL("u", "'"+string(claim.ChangeTakenOver)+"'", "u.taken_over_from", "u.claimed_by", "u.take_over_path", "u.take_over_reason", "u.previous_owner")+`
	)
	SELECT `+cols("u.")+` FROM u`,
		secs(params.SilentFor), params.Owner, params.By, sqlstore.Bound(params.Reason, sqlstore.MaxReasonLength),
		params.ID, params.PreviousOwner, params.Seq)
	c, err := scanClaim(row)
	if errors.Is(err, sql.ErrNoRows) {
		now, gerr := s.Get(ctx, params.ID)
		if gerr != nil {
			return nil, fmt.Errorf("take deferred claim %d: refused, then: %w", params.ID, gerr)
		}
		return now, fmt.Errorf("take deferred claim %d: %w", params.ID, claim.ErrStateChanged)
	}
	if err != nil {
		return nil, fmt.Errorf("take deferred claim %d: %w", params.ID, translate(err))
	}
	return c, nil
}

// strandedPredicate is FindStranded's and TakeStranded's test; $1 is
// SilentFor in seconds. The silence counts from the last heartbeat and
// from the write that finished the claim (which need not be its holder's:
// the reconciler or an operator may finish it).
const strandedPredicate = `deferred_seq IS NOT NULL AND state IN ('processed', 'failed', 'flagged', 'resolved')
	AND heartbeat_utc < now() - make_interval(secs => $1)
	AND coalesce(CASE state WHEN 'processed' THEN processed_utc WHEN 'failed' THEN failed_utc
		WHEN 'flagged' THEN flagged_utc ELSE resolved_utc END, heartbeat_utc) < now() - make_interval(secs => $1)`

// FindStranded lists the finished claims whose deferred message was never
// settled, longest silent first (see claim.Deferrer).
func (s *Store) FindStranded(ctx context.Context, params *claim.FindDueParams) ([]*claim.Claim, error) {
	return s.findDeferred(ctx, "find stranded claims", params, strandedPredicate, "heartbeat_utc")
}

// TakeStranded lets one caller settle a stranded claim's message (see
// claim.Deferrer). READ COMMITTED re-checks the WHERE on the latest row
// version, so of concurrent callers one matches.
func (s *Store) TakeStranded(ctx context.Context, params *claim.TakeStrandedParams) error {
	if err := claim.ValidateTakeStranded(params); err != nil {
		return err
	}
	return s.execGuarded(ctx, "take the stranded message of", params.ID, `UPDATE claims SET heartbeat_utc = now()
		WHERE id = $2 AND deferred_seq = $3 AND state = $4 AND `+strandedPredicate,
		secs(params.SilentFor), params.ID, params.Seq, string(params.State))
}

// ClearDeferred forgets a settled deferred message (see claim.Deferrer).
func (s *Store) ClearDeferred(ctx context.Context, params *claim.ClearDeferredParams) error {
	return s.execGuarded(ctx, "clear the deferred message of", params.ID,
		`UPDATE claims SET deferred_seq = NULL, due_utc = NULL,
		next_attempt_utc = CASE WHEN due_utc IS NOT NULL THEN NULL ELSE next_attempt_utc END
		WHERE id = $1 AND deferred_seq = $2`, params.ID, params.Seq)
}
