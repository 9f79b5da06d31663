package postgres_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/postgres"
	"github.com/sbclaim/sbclaim/internal/testkit"
)

var planIndex = regexp.MustCompile(`(?:Index|Index Only|Bitmap Index) Scan(?: Backward)? (?:using|on) (\w+)`)

// Every statement of Overview can be served by the partial indexes of
// unfinished and flagged claims: with sequential scans priced out
// (enable_seqscan=off), PostgreSQL's plan reads claims only through
// ix_claims_unfinished and ix_claims_flagged, never by a Seq Scan or
// through another index (a full scan of pk_claims would read the history).
func TestOverviewReadsOnlyThePartialIndexes(t *testing.T) {
	testkit.PostgresURL(t)
	st := newStore(t)
	names, sqls, args, err := postgres.OverviewQueries(&claim.OverviewParams{ReasonPrefixes: []string{"no heartbeat", "route changed"}})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := st.DB().BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(t.Context(), "SET LOCAL enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	for i, q := range sqls {
		rows, err := tx.QueryContext(t.Context(), "EXPLAIN "+q, args[i]...)
		if err != nil {
			t.Fatalf("%s: %v", names[i], err)
		}
		var plan []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, line)
		}
		rows.Close()
		text := strings.Join(plan, "\n")
		if strings.Contains(text, "Seq Scan on claims") {
			t.Errorf("%s scans the claims table:\n%s", names[i], text)
		}
		used := planIndex.FindAllStringSubmatch(text, -1)
		if len(used) == 0 {
			t.Errorf("%s uses no index:\n%s", names[i], text)
		}
		for _, m := range used {
			if m[1] != "ix_claims_unfinished" && m[1] != "ix_claims_flagged" {
				t.Errorf("%s reads index %s, not a partial index of open claims:\n%s", names[i], m[1], text)
			}
		}
	}
}
