package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/sqlstore"
)

// prefixSQL is "column starts with parameter ?n", exactly: SQLite's LIKE
// ignores ASCII case, so the prefix is compared with substr, which has no
// special characters to escape.
func prefixSQL(column string, n int) string {
	return fmt.Sprintf("substr(%s, 1, length(?%d)) = ?%d", column, n, n)
}

// listFilters adds List's Route and ReasonPrefix filters.
func listFilters(params *claim.ListParams, where []string, args []any) ([]string, []any, error) {
	if err := sqlstore.ValidateListFilters(params); err != nil {
		return nil, nil, err
	}
	if params.Route != "" {
		args = append(args, params.Route)
		where = append(where, fmt.Sprintf("route = ?%d", len(args)))
	}
	if params.SessionID != "" {
		args = append(args, params.SessionID)
		where = append(where, fmt.Sprintf("session_id = ?%d", len(args)))
	}
	if params.InSession {
		where = append(where, "session_id <> ''")
	}
	if params.ReasonPrefix != "" {
		args = append(args, params.ReasonPrefix)
		where = append(where, prefixSQL("flag_reason", len(args)))
	}
	return where, args, nil
}

// The overview's row sources. Each repeats the WHERE of a partial index
// literally, so SQLite reads that index (ix_claims_unfinished,
// ix_claims_flagged) and the rows it points to, never the whole table.
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
	qs = append(qs, overviewQuery{name: "counts", sql: `SELECT ` + nowSQL + `,
		(SELECT count(*) FROM ` + unfinishedRows + ` AND state = 'claimed'),
		(SELECT count(*) FROM ` + unfinishedRows + ` AND state = 'released'),
		(SELECT count(*) FROM ` + unfinishedRows + ` AND state = 'claimed' AND take_over_path = 'operator'),
		(SELECT count(*) FROM ` + flaggedRows + `),
		(SELECT min(claimed_utc) FROM ` + unfinishedRows + `),
		(SELECT min(flagged_utc) FROM ` + flaggedRows + `)`})

	// Ages of the unfinished claims, one pass over the unfinished rows.
	sums := make([]string, len(claim.AgeBuckets))
	args := make([]any, len(claim.AgeBuckets))
	for i, b := range claim.AgeBuckets {
		sums[i] = fmt.Sprintf("coalesce(sum(claimed_utc < strftime('%%Y-%%m-%%dT%%H:%%M:%%f',coalesce(sbclaim_now(),'now'),?%d)), 0)", i+1)
		args[i] = ago(b)
	}
	qs = append(qs, overviewQuery{name: "ages", sql: "SELECT " + strings.Join(sums, ", ") + " FROM " + unfinishedRows, args: args})

	// Consumers: one more than asked, to tell that some were left out.
	qs = append(qs, overviewQuery{name: "consumers", sql: `SELECT consumer, sum(state = 'claimed'), sum(state = 'released'), sum(state = 'flagged') FROM (
			SELECT consumer, state FROM ` + unfinishedRows + `
			UNION ALL
			SELECT consumer, state FROM ` + flaggedRows + `)
		GROUP BY consumer ORDER BY count(*) DESC, consumer LIMIT ?1`, args: []any{p.Consumers + 1}})

	// Reasons: the first group whose prefix the reason starts with.
	group, args := "-1", nil
	if len(p.Prefixes) > 0 {
		var b strings.Builder
		b.WriteString("CASE")
		for i, prefix := range p.Prefixes {
			args = append(args, prefix)
			fmt.Fprintf(&b, " WHEN %s THEN %d", prefixSQL("flag_reason", i+1), i)
		}
		b.WriteString(" ELSE -1 END")
		group = b.String()
	}
	qs = append(qs, overviewQuery{name: "reasons", sql: `SELECT g, count(*) FROM (SELECT ` + group + ` AS g FROM ` + flaggedRows + `) GROUP BY g`, args: args})

	// Flagged per hour: from the start of the hour Hours-1 hours ago.
	since := `strftime('%Y-%m-%dT%H:00:00.000',coalesce(sbclaim_now(),'now'),?1)`
	qs = append(qs, overviewQuery{name: "flagged per hour", sql: `SELECT substr(flagged_utc, 1, 13), count(*) FROM (
			SELECT flagged_utc FROM ` + flaggedRows + ` AND flagged_utc >= ` + since + `
			UNION ALL
			SELECT flagged_utc FROM ` + unfinishedRows + ` AND flagged_utc >= ` + since + `)
		GROUP BY 1 ORDER BY 1`, args: []any{fmt.Sprintf("-%d hours", p.Hours-1)}})
	return qs
}

// Overview summarises the open work (see claim.Store). Costs: the counts,
// the ages, the consumers and the per-hour series read the rows of
// ix_claims_unfinished and ix_claims_flagged; the reasons those of
// ix_claims_flagged (overview_test.go checks the plans).
func (s *Store) Overview(ctx context.Context, params *claim.OverviewParams) (*claim.Overview, error) {
	p, err := sqlstore.ValidateOverview(params)
	if err != nil {
		return nil, err
	}
	qs := overviewQueries(p)
	o := &claim.Overview{UnfinishedOlderThan: make([]int64, len(claim.AgeBuckets))}
	var (
		now                    string
		oldestOpen, oldestFlag sql.NullString
	)
	reasons := map[int]int64{}
	scans := []func(r *sql.Rows) error{
		func(r *sql.Rows) error {
			return r.Scan(&now, &o.Claimed, &o.Released, &o.Redriving, &o.Flagged, &oldestOpen, &oldestFlag)
		},
		sqlstore.ScanAges(o),
		sqlstore.ScanConsumer(o),
		sqlstore.ScanReasonGroup(reasons),
		func(r *sql.Rows) error {
			var (
				hour string
				n    int64
			)
			if err := r.Scan(&hour, &n); err != nil {
				return err
			}
			t, err := time.ParseInLocation("2006-01-02T15", hour, time.UTC)
			if err != nil {
				return fmt.Errorf("parse hour %q: %w", hour, err)
			}
			o.FlaggedPerHour = append(o.FlaggedPerHour, claim.HourCount{Hour: t, Count: n})
			return nil
		},
	}
	for i, q := range qs {
		if err := s.query(ctx, q.sql, q.args, scans[i]); err != nil {
			return nil, fmt.Errorf("overview: %s: %w", q.name, err)
		}
	}
	if o.Now, err = parseTime(now); err != nil {
		return nil, fmt.Errorf("overview: %w", err)
	}
	if o.OldestUnfinished, err = parseNullTime(oldestOpen); err != nil {
		return nil, fmt.Errorf("overview: %w", err)
	}
	if o.OldestFlagged, err = parseNullTime(oldestFlag); err != nil {
		return nil, fmt.Errorf("overview: %w", err)
	}
	if len(o.Consumers) > p.Consumers {
		o.Consumers, o.MoreConsumers = o.Consumers[:p.Consumers], true
	}
	sqlstore.GroupReasons(o, len(p.Prefixes), reasons)
	return o, nil
}

// query runs q and calls each for every row.
func (s *Store) query(ctx context.Context, q string, args []any, each func(*sql.Rows) error) error {
	rows, err := s.db.QueryContext(ctx, q, args...)
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
