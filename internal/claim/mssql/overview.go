package mssql

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/sqlstore"
)

// declLikePattern declares a LIKE pattern made from a flag-reason prefix:
// at most sqlstore.MaxReasonLength characters of at most two UTF-16 code
// units each (an escaped special character is two), plus the trailing %.
const declLikePattern = "nvarchar(801)"

// likeSpecials are the characters SQL Server's LIKE treats as special
// outside a bracket expression ([ opens one).
const likeSpecials = "%_["

// reasonLike is "FlagReason starts with the prefix in parameter p",
// compared by code point whatever the database's collation (Azure SQL's
// default ignores case).
func reasonLike(p string) string {
	return "FlagReason COLLATE Latin1_General_100_BIN2 LIKE " + p + " ESCAPE N'\\'"
}

// listFilters adds List's Route and ReasonPrefix filters.
func listFilters(params *claim.ListParams, where []string, a *args) ([]string, error) {
	if err := sqlstore.ValidateListFilters(params); err != nil {
		return nil, err
	}
	if params.Route != "" {
		where = append(where, "Route = "+a.add(text(params.Route), declRoute))
	}
	if params.SessionID != "" {
		where = append(where, "SessionId = "+a.add(text(params.SessionID), declSessionID))
	}
	if params.InSession {
		where = append(where, "SessionId <> N''")
	}
	if params.ReasonPrefix != "" {
		where = append(where, reasonLike(a.add(text(sqlstore.LikePrefix(params.ReasonPrefix, likeSpecials)), declLikePattern)))
	}
	return where, nil
}

// The overview's row sources. Each repeats the filter of a filtered index
// literally (IX_Claims_Unfinished, IX_Claims_Flagged), so the optimizer
// can match it: the overview reads those indexes and looks up the rows
// they hold, never the history.
const (
	unfinishedRows = "dbo.Claims WHERE " + unfinished
	flaggedRows    = "dbo.Claims WHERE State = 'flagged'"
	// hourOf truncates a datetime2 to its hour: whole hours since a fixed
	// epoch, added back to it.
	hourEpoch = "CAST('2000-01-01' AS datetime2(7))"
)

func hourOf(col string) string {
	return "DATEADD(hour, DATEDIFF(hour, " + hourEpoch + ", " + col + "), " + hourEpoch + ")"
}

// Overview summarises the open work (see claim.Store) in one batch of five
// statements, each reading the filtered indexes of unfinished and flagged
// claims (the reasons: IX_Claims_Flagged alone). Each statement sees its
// own snapshot under READ_COMMITTED_SNAPSHOT.
func (s *Store) Overview(ctx context.Context, params *claim.OverviewParams) (*claim.Overview, error) {
	p, err := sqlstore.ValidateOverview(params)
	if err != nil {
		return nil, err
	}
	var a args
	var q strings.Builder
	q.WriteString(`SELECT SYSUTCDATETIME(),
    (SELECT COUNT_BIG(*) FROM ` + unfinishedRows + ` AND State = 'claimed'),
    (SELECT COUNT_BIG(*) FROM ` + unfinishedRows + ` AND State = 'released'),
    (SELECT COUNT_BIG(*) FROM ` + unfinishedRows + ` AND State = 'claimed' AND TakeOverPath = 'operator'),
    (SELECT COUNT_BIG(*) FROM ` + flaggedRows + `),
    (SELECT MIN(ClaimedUtc) FROM ` + unfinishedRows + `),
    (SELECT MIN(FlaggedUtc) FROM ` + flaggedRows + `);
SELECT `)
	for i, b := range claim.AgeBuckets {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("COUNT_BIG(CASE WHEN ClaimedUtc < " + agoSQL(&a, b) + " THEN 1 END)")
	}
	q.WriteString(" FROM " + unfinishedRows + `;
SELECT TOP (` + a.add(int64(p.Consumers+1), declID) + `) Consumer,
    COUNT_BIG(CASE WHEN State = 'claimed' THEN 1 END), COUNT_BIG(CASE WHEN State = 'released' THEN 1 END),
    COUNT_BIG(CASE WHEN State = 'flagged' THEN 1 END)
FROM (SELECT Consumer, State FROM ` + unfinishedRows + `
    UNION ALL SELECT Consumer, State FROM ` + flaggedRows + `) o
GROUP BY Consumer ORDER BY COUNT_BIG(*) DESC, Consumer;
SELECT g, COUNT_BIG(*) FROM (SELECT `)
	if len(p.Prefixes) == 0 {
		q.WriteString("-1")
	} else {
		q.WriteString("CASE")
		for i, prefix := range p.Prefixes {
			q.WriteString(" WHEN " + reasonLike(a.add(text(sqlstore.LikePrefix(prefix, likeSpecials)), declLikePattern)) + " THEN " + strconv.Itoa(i))
		}
		q.WriteString(" ELSE -1 END")
	}
	// No DECLARE for the window's start: every statement of the batch is
	// a SELECT with a result set, so the sets line up with the scanners.
	hours := a.add(int32(p.Hours-1), declInt)
	since := "DATEADD(hour, DATEDIFF(hour, " + hourEpoch + ", SYSUTCDATETIME()) - " + hours + ", " + hourEpoch + ")"
	q.WriteString(` AS g FROM ` + flaggedRows + `) r GROUP BY g;
SELECT h, COUNT_BIG(*) FROM (SELECT ` + hourOf("FlaggedUtc") + ` AS h FROM (
    SELECT FlaggedUtc FROM ` + flaggedRows + ` AND FlaggedUtc >= ` + since + `
    UNION ALL SELECT FlaggedUtc FROM ` + unfinishedRows + ` AND FlaggedUtc >= ` + since + `) f) x
GROUP BY h ORDER BY h;`)

	o := &claim.Overview{UnfinishedOlderThan: make([]int64, len(claim.AgeBuckets))}
	reasons := map[int]int64{}
	var oldestOpen, oldestFlag sql.NullTime
	err = querySets(ctx, s.db, q.String(), a,
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
		})
	if err != nil {
		return nil, fmt.Errorf("overview: %w", interpretError(err))
	}
	o.Now, o.OldestUnfinished, o.OldestFlagged = o.Now.UTC(), nullTime(oldestOpen), nullTime(oldestFlag)
	if len(o.Consumers) > p.Consumers {
		o.Consumers, o.MoreConsumers = o.Consumers[:p.Consumers], true
	}
	sqlstore.GroupReasons(o, len(p.Prefixes), reasons)
	return o, nil
}

// querySets runs a batch and scans the rows of its i-th result set with
// each[i]. Like query, it reads the response to its end. A set beyond
// each is an error (the batch and its scanners disagree).
func querySets(ctx context.Context, q querier, sqlText string, a args, each ...func(*sql.Rows) error) error {
	set := 0
	text, vals := call(sqlText, a)
	rows, err := q.QueryContext(ctx, text, vals...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for {
		for rows.Next() {
			if set >= len(each) {
				return fmt.Errorf("result set %d: the batch returned more sets than expected", set+1)
			}
			if err := each[set](rows); err != nil {
				return err
			}
		}
		if !rows.NextResultSet() {
			break
		}
		set++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return rows.Close()
}
