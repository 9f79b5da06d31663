package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// DefaultLeaseLimit is LeaseFollowUps' limit when the params leave it at 0.
const DefaultLeaseLimit = 100

// SortFollowUps orders leased follow-ups oldest first, then by claim and
// position (RETURNING and OUTPUT keep no order).
func SortFollowUps(fus []*claim.StoredFollowUp) {
	slices.SortFunc(fus, func(a, b *claim.StoredFollowUp) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ClaimID, b.ClaimID), cmp.Compare(a.Position, b.Position))
	})
}

// Body is a follow-up's body as a NOT NULL column takes it.
func Body(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// FollowUpRefused explains a guarded follow-up write that matched no row:
// ErrNotFound when the row is gone, else ErrStateChanged. exists reads
// whether the row is there.
func FollowUpRefused(ctx context.Context, op string, p *claim.FollowUpLeaseParams, exists func(ctx context.Context) (bool, error)) error {
	ok, err := exists(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("%s follow-up %d of claim %d: %w", op, p.Position, p.ClaimID, err)
	case !ok:
		return fmt.Errorf("%s follow-up %d of claim %d: %w", op, p.Position, p.ClaimID, claim.ErrNotFound)
	}
	return fmt.Errorf("%s follow-up %d of claim %d: %w: it is sent, or leased to another relay", op, p.Position, p.ClaimID, claim.ErrStateChanged)
}

// ExecFollowUp runs a guarded follow-up UPDATE and, when it matched no
// row, explains why (FollowUpRefused).
func ExecFollowUp(ctx context.Context, db Execer, translate func(error) error, op string, p *claim.FollowUpLeaseParams,
	exists func(ctx context.Context) (bool, error), query string, args ...any) error {
	res, err := db.ExecContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("%s follow-up %d of claim %d: %w", op, p.Position, p.ClaimID, translate(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s follow-up %d of claim %d: %w", op, p.Position, p.ClaimID, translate(err))
	}
	if n == 0 {
		return FollowUpRefused(ctx, op, p, exists)
	}
	return nil
}

// RowExists runs a query that returns a row when something exists.
func RowExists(ctx context.Context, db *sql.DB, translate func(error) error, query string, args ...any) (bool, error) {
	var one int
	err := db.QueryRowContext(ctx, query, args...).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, translate(err)
	}
	return true, nil
}

// ValidateFollowUpLease checks the name of a leased follow-up.
func ValidateFollowUpLease(op string, p *claim.FollowUpLeaseParams) error {
	if p.ClaimID <= 0 || p.Position < 1 {
		return fmt.Errorf("%s follow-up: a claim id and a position are required (got %d, %d)", op, p.ClaimID, p.Position)
	}
	if p.Owner == [16]byte{} {
		return fmt.Errorf("%s follow-up %d of claim %d: Owner (the lease's owner) is required", op, p.Position, p.ClaimID)
	}
	return nil
}
