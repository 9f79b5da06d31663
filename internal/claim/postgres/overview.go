package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/sqlstore"
)

// likeSpecials are the characters PostgreSQL's LIKE treats as wildcards.
const likeSpecials = "%_"

// listFilters adds List's Route and ReasonPrefix filters.
func listFilters(params *claim.ListParams, where []string, args []any) ([]string, []any, error) {
	if err := sqlstore.ValidateListFilters(params); err != nil {
		return nil, nil, err
	}
	if params.Route != "" {
		args = append(args, params.Route)
		where = append(where, fmt.Sprintf("route = $%d", len(args)))
	}
	if params.SessionID != "" {
		args = append(args, params.SessionID)
		where = append(where, fmt.Sprintf("session_id = $%d", len(args)))
	}
	if params.InSession {
		where = append(where, "session_id <> ''")
	}
	if params.ReasonPrefix != "" {
		args = append(args, sqlstore.LikePrefix(params.ReasonPrefix, likeSpecials))
		where = append(where, fmt.Sprintf(`flag_reason LIKE $%d ESCAPE '\'`, len(args)))
	}
	return where, args, nil
}

// The overview's row sources. Each repeats the predicate of a partial
// index literally, so the planner can read that index (ix_claims_unfinished,
// ix_claims_flagged) instead of the table.
const (
	unfinishedRows = `claims WHERE state IN ('claimed', 'released')`
	flaggedRows    = `claims WHERE state = 'flagged'`
)

// overviewQuery is one statement of Overview.
type overviewQuery struct {
	name, sql string
	args      []any
}

// overviewQueries are Overview's statements, in the order Overview runs
// and scans them: counts, ages, consumers, reasons, flagged per hour.
func overviewQueries(p sqlstore.Overview) []overviewQuery {
	var qs []overviewQuery
	qs = append(qs, overviewQuery{name: "counts", sql: `SELECT now(),
		(SELECT count(*) FROM ` + unfinishedRows + ` AND state = 'claimed'),
		(SELECT count(*) FROM ` + unfinishedRows + ` AND state = 'released'),
		(SELECT count(*) FROM ` + unfinishedRows + ` AND state = 'claimed' AND take_over_path = 'operator'),
		(SELECT count(*) FROM ` + flaggedRows + `),
		(SELECT min(claimed_utc) FROM ` + unfinishedRows + `),
		(SELECT min(flagged_utc) FROM ` + flaggedRows + `)`})

	// Ages of the unfinished claims, one pass over the unfinished rows.
	counts := make([]string, len(claim.AgeBuckets))
	args := make([]any, len(claim.AgeBuckets))
	for i, b := range claim.AgeBuckets {
		counts[i] = fmt.Sprintf("count(*) FILTER (WHERE claimed_utc < now() - make_interval(secs => $%d))", i+1)
		args[i] = secs(b)
	}
	qs = append(qs, overviewQuery{name: "ages", sql: "SELECT " + strings.Join(counts, ", ") + " FROM " + unfinishedRows, args: args})

	// Consumers: one more than asked, to tell that some were left out.
	qs = append(qs, overviewQuery{name: "consumers", sql: `SELECT consumer, count(*) FILTER (WHERE state = 'claimed'),
			count(*) FILTER (WHERE state = 'released'), count(*) FILTER (WHERE state = 'flagged') FROM (
			SELECT consumer, state FROM ` + unfinishedRows + `
			UNION ALL
			SELECT consumer, state FROM ` + flaggedRows + `) o
		GROUP BY consumer ORDER BY count(*) DESC, consumer LIMIT $1`, args: []any{p.Consumers + 1}})

	// Reasons: the first group whose prefix the reason starts with.
	group, args := "-1", nil
	if len(p.Prefixes) > 0 {
		var b strings.Builder
		b.WriteString("CASE")
		for i, prefix := range p.Prefixes {
			args = append(args, sqlstore.LikePrefix(prefix, likeSpecials))
			fmt.Fprintf(&b, ` WHEN flag_reason LIKE $%d ESCAPE '\' THEN %d`, i+1, i)
		}
		b.WriteString(" ELSE -1 END")
		group = b.String()
	}
	qs = append(qs, overviewQuery{name: "reasons", sql: `SELECT g, count(*) FROM (SELECT ` + group + ` AS g FROM ` + flaggedRows + `) r GROUP BY g`, args: args})

	// Flagged per hour (UTC hours, whatever the session's time zone), from
	// the start of the hour Hours-1 hours ago.
	qs = append(qs, overviewQuery{name: "flagged per hour", sql: `WITH w AS (
			SELECT (date_trunc('hour', now() AT TIME ZONE 'UTC') - make_interval(hours => $1)) AT TIME ZONE 'UTC' AS since)
		SELECT date_trunc('hour', f.flagged_utc AT TIME ZONE 'UTC'), count(*) FROM (
			SELECT flagged_utc FROM ` + flaggedRows + ` AND flagged_utc >= (SELECT since FROM w)
			UNION ALL
			SELECT flagged_utc FROM ` + unfinishedRows + ` AND flagged_utc >= (SELECT since FROM w)) f
		GROUP BY 1 ORDER BY 1`, args: []any{p.Hours - 1}})
	return qs
}

// Overview summarises the open work (see claim.Store), in one read-only
// REPEATABLE READ transaction, so every part sees the same snapshot.
// Costs: the counts, the ages, the consumers and the per-hour series read
// the rows of ix_claims_unfinished and ix_claims_flagged; the reasons those
// of ix_claims_flagged (overview_test.go checks the plans).
func (s *Store) Overview(ctx context.Context, params *claim.OverviewParams) (*claim.Overview, error) {
	p, err := sqlstore.ValidateOverview(params)
	if err != nil {
		return nil, err
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("overview: begin: %w", translate(err))
	}
	defer tx.Rollback()

	o := &claim.Overview{UnfinishedOlderThan: make([]int64, len(claim.AgeBuckets))}
	var oldestOpen, oldestFlag sql.NullTime
	reasons := map[int]int64{}
	scans := []func(r *sql.Rows) error{
		func(r *sql.Rows) error {
			return r.Scan(&o.Now, &o.Claimed, &o.Released, &o.Redriving, &o.Flagged, &oldestOpen, &oldestFlag)
		},
		sqlstore.ScanAges(o),
		sqlstore.ScanConsumer(o),
		sqlstore.ScanReasonGroup(reasons),
		func(r *sql.Rows) error {
			var h claim.HourCount
			if err := r.Scan(&h.Hour, &h.Count); err != nil {
				return err
			}
			h.Hour = h.Hour.UTC()
			o.FlaggedPerHour = append(o.FlaggedPerHour, h)
			return nil
		},
	}
	for i, q := range overviewQueries(p) {
		if err := query(ctx, tx, q.sql, q.args, scans[i]); err != nil {
			return nil, fmt.Errorf("overview: %s: %w", q.name, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("overview: commit: %w", translate(err))
	}
	o.Now, o.OldestUnfinished, o.OldestFlagged = o.Now.UTC(), utc(oldestOpen), utc(oldestFlag)
	if len(o.Consumers) > p.Consumers {
		o.Consumers, o.MoreConsumers = o.Consumers[:p.Consumers], true
	}
	sqlstore.GroupReasons(o, len(p.Prefixes), reasons)
	return o, nil
}

// query runs q and calls each for every row.
func query(ctx context.Context, q sqlstore.Querier, sqlText string, args []any, each func(*sql.Rows) error) error {
	rows, err := q.QueryContext(ctx, sqlText, args...)
	if err != nil {
		return translate(err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return translate(rows.Err())
}
