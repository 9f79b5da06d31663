package mssql

import (
	"context"
	"database/sql/driver"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// overviewSets is the fake answer to the Overview batch: one result set
// per statement.
func overviewSets() fakeResult {
	ages := make([]driver.Value, len(claim.AgeBuckets))
	for i := range ages {
		ages[i] = int64(len(ages) - i)
	}
	return fakeResult{Sets: [][][]driver.Value{
		{{dbNow, int64(4), int64(1), int64(1), int64(3), dbNow.Add(-2 * time.Hour), dbNow.Add(-30 * time.Hour)}},
		{ages},
		{{"billing", int64(3), int64(1), int64(2)}, {"shipping", int64(1), int64(0), int64(1)}},
		{{int64(0), int64(2)}, {int64(-1), int64(1)}},
		{{dbNow.Truncate(time.Hour).Add(-3 * time.Hour), int64(1)}, {dbNow.Truncate(time.Hour), int64(2)}},
	}}
}

// The console's statements (Overview, List's Route and ReasonPrefix
// filters) declare their parameters from the statement alone, like every
// other (TestDeclaredParameterTypesAreStable), repeat the filters of the
// filtered indexes literally, compare reasons by code point with every
// LIKE special character escaped, and Overview scans its five result sets.
func TestConsoleStatements(t *testing.T) {
	run := func(long bool) (map[string]string, []fakeRequest, *claim.Overview) {
		db, rec := newFakeDB(t, func(req fakeRequest) fakeResult {
			if strings.Contains(req.Query, "COUNT_BIG") {
				return overviewSets()
			}
			return fakeResult{Sets: [][][]driver.Value{{claimRow(7, "flagged")}}}
		})
		st := New(db)
		ctx := context.Background()
		n := 1
		if long {
			n = 400
		}
		prefixes := []string{strings.Repeat("x", n), strings.Repeat("%", n)}
		if long {
			prefixes = slices.Repeat(prefixes, claim.MaxReasonGroups/2)
		}
		o, err := st.Overview(ctx, &claim.OverviewParams{ReasonPrefixes: prefixes})
		if err != nil {
			t.Fatalf("Overview (long %v): %v", long, err)
		}
		if _, err := st.List(ctx, &claim.ListParams{States: []claim.State{claim.StateFlagged},
			Route: strings.Repeat("r", min(n, 64)), ReasonPrefix: strings.Repeat("[", n)}); err != nil {
			t.Fatalf("List (long %v): %v", long, err)
		}
		out := map[string]string{}
		for _, r := range rec.requests() {
			d := strings.Join(r.Decls, ", ")
			key := r.Query
			if strings.Contains(key, "COUNT_BIG") {
				key = "overview"
				d = strings.ReplaceAll(d, ", @p", "|@p")
				var keep []string
				for _, decl := range strings.Split(d, "|") {
					if !strings.Contains(decl, declLikePattern) {
						keep = append(keep, decl[strings.IndexByte(decl, ' ')+1:])
					}
				}
				d = strings.Join(keep, ", ")
			}
			out[key] = d
		}
		return out, rec.requests(), o
	}
	short, reqs, o := run(false)
	long, _, _ := run(true)
	if short["overview"] != long["overview"] {
		t.Errorf("Overview's declarations depend on the values:\n short: %s\n  long: %s", short["overview"], long["overview"])
	}
	for q, d := range short {
		if q != "overview" && strings.HasPrefix(q, "SELECT TOP") && long[q] != d {
			t.Errorf("List's declarations depend on the values:\n short: %s\n  long: %s", d, long[q])
		}
	}

	var batch, list fakeRequest
	for _, r := range reqs {
		switch {
		case strings.Contains(r.Query, "COUNT_BIG"):
			batch = r
		case strings.Contains(r.Query, "FROM dbo.Claims WHERE Id >"):
			list = r
		}
	}
	for _, want := range []string{
		"FROM dbo.Claims WHERE State IN ('claimed', 'released') AND State = 'claimed'",
		"FROM dbo.Claims WHERE State = 'flagged'",
		"FlagReason COLLATE Latin1_General_100_BIN2 LIKE @",
	} {
		if !strings.Contains(batch.Query, want) {
			t.Errorf("the Overview batch lacks %q:\n%s", want, batch.Query)
		}
	}
	if strings.Contains(batch.Query, "DECLARE") {
		t.Error("the Overview batch declares a variable: a statement without a result set between the SELECTs")
	}
	if n := strings.Count(batch.Query, ";"); n != 5 {
		t.Errorf("the Overview batch has %d statements, want 5 (one per result set)", n)
	}
	// The escaped prefixes: % is escaped, and the pattern ends with %.
	var patterns []string
	for i, d := range batch.Decls {
		if d == declLikePattern {
			patterns = append(patterns, fmt.Sprint(batch.Args[i]))
		}
	}
	if want := []string{"x%", `\%%`}; !slices.Equal(patterns, want) {
		t.Errorf("Overview's LIKE patterns %q, want %q", patterns, want)
	}
	if !strings.Contains(list.Query, "Route = @") || !strings.Contains(list.Query, "FlagReason COLLATE Latin1_General_100_BIN2 LIKE @") ||
		!strings.Contains(list.Query, "State IN ('flagged')") {
		t.Errorf("List with Route and ReasonPrefix:\n%s", list.Query)
	}
	var listPattern string
	for i, d := range list.Decls {
		if d == declLikePattern {
			listPattern = fmt.Sprint(list.Args[i])
		}
	}
	if listPattern != `\[%` {
		t.Errorf("List's reason pattern %q, want %q", listPattern, `\[%`)
	}

	// The five result sets, scanned.
	if o.Claimed != 4 || o.Released != 1 || o.Redriving != 1 || o.Flagged != 3 ||
		o.OldestUnfinished == nil || o.OldestFlagged == nil || len(o.Consumers) != 2 || o.Consumers[0].Consumer != "billing" ||
		fmt.Sprint(o.Reasons) != "[2 0]" || o.OtherReasons != 1 || len(o.FlaggedPerHour) != 2 || o.FlaggedPerHour[1].Count != 2 ||
		o.UnfinishedOlderThan[0] != int64(len(claim.AgeBuckets)) {
		t.Errorf("overview scanned as %+v", o)
	}
}
