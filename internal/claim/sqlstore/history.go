package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// FormOf is the key form a new claim records: its params' form, scoped
// when unset.
func FormOf(p *claim.ClaimParams) claim.KeyForm {
	if p.KeyForm == "" {
		return claim.KeyFormScoped
	}
	return p.KeyForm
}

// EffectKeyOf is the EffectKey a new claim records: the key its form
// derives, or "" for a raw claim (its key is its MessageID, as for every
// claim taken before key forms).
func EffectKeyOf(p *claim.ClaimParams) string {
	f := FormOf(p)
	if f == claim.KeyFormRaw {
		return ""
	}
	return claim.KeyFor(f, p.Consumer, p.MessageID, 0)
}

// NextKey returns, for a take-over with NewKey, the key the claim moves
// to and the revision the claim must still be at (the guarded write
// checks it); get reads the claim. A claim that is gone gets revision -1,
// which no row has: the write is refused and reports it.
func NextKey(ctx context.Context, get func(context.Context, int64) (*claim.Claim, error), p *claim.TakeOverParams) (key string, revision int, err error) {
	if !p.NewKey {
		return "", 0, nil
	}
	c, err := get(ctx, p.ID)
	if errors.Is(err, claim.ErrNotFound) {
		return "", -1, nil
	}
	if err != nil {
		return "", 0, fmt.Errorf("take over claim %d: read its key: %w", p.ID, err)
	}
	return c.NextKey(), c.KeyRevision, nil
}

// StaleBy is who FlagStale's changes are recorded as.
func StaleBy(p *claim.FlagStaleParams) string {
	if p.By == "" {
		return claim.ReconcilerBy
	}
	return Bound(p.By, 256)
}

// HistoryReason bounds a history reason.
func HistoryReason(s string) string { return Bound(s, claim.MaxHistoryReason) }

// TakeOverWhat is the change a take-over on path p records.
func TakeOverWhat(p claim.TakeOverPath) claim.Change {
	if p == claim.PathOperator {
		return claim.ChangeRedriven
	}
	return claim.ChangeTakenOver
}

// TakeOverChange is the change a take-over with params p records: its
// path's, or ChangeRetried for an operator's retry of a failed claim.
func TakeOverChange(p *claim.TakeOverParams) claim.Change {
	if p.Retry {
		return claim.ChangeRetried
	}
	return TakeOverWhat(p.Path)
}

// ScanHistory reads rows of (id, claim_id, at, what, from, to, by, path,
// reason, previous owner, owner, key) and closes rows. scanOwner converts
// the dialect's owner columns.
func ScanHistory(rows *sql.Rows, scan func(r *sql.Rows, e *claim.HistoryEntry) error) ([]claim.HistoryEntry, error) {
	defer rows.Close()
	var out []claim.HistoryEntry
	for rows.Next() {
		var e claim.HistoryEntry
		if err := scan(rows, &e); err != nil {
			return nil, err
		}
		e.At = e.At.UTC()
		out = append(out, e)
	}
	return out, rows.Err()
}

// NullOwner is a history row's previous owner as a column value: NULL for
// uuid.Nil.
func NullOwner(u uuid.UUID) uuid.NullUUID { return uuid.NullUUID{UUID: u, Valid: u != uuid.Nil} }
