package sqlite_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/sqlite"
)

// Every statement of Overview reads the partial indexes of unfinished and
// flagged claims, never the whole table: SQLite's plan names an index for
// every access to claims.
func TestOverviewReadsOnlyThePartialIndexes(t *testing.T) {
	s, err := sqlite.Open(t.Context(), "sqlite:"+filepath.Join(t.TempDir(), "claims.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := sqlite.Migrate(t.Context(), s.DB()); err != nil {
		t.Fatal(err)
	}
	names, sqls, args, err := sqlite.OverviewQueries(&claim.OverviewParams{ReasonPrefixes: []string{"no heartbeat", "route changed"}})
	if err != nil {
		t.Fatal(err)
	}
	for i, q := range sqls {
		rows, err := s.DB().QueryContext(t.Context(), "EXPLAIN QUERY PLAN "+q, args[i]...)
		if err != nil {
			t.Fatalf("%s: %v", names[i], err)
		}
		var plan []string
		for rows.Next() {
			var (
				id, parent, unused int
				detail             string
			)
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		uses := 0
		for _, d := range plan {
			if !strings.Contains(d, " claims") {
				continue
			}
			uses++
			if !strings.Contains(d, "USING INDEX ix_claims_unfinished") && !strings.Contains(d, "USING COVERING INDEX ix_claims_unfinished") &&
				!strings.Contains(d, "USING INDEX ix_claims_flagged") && !strings.Contains(d, "USING COVERING INDEX ix_claims_flagged") {
				t.Errorf("%s reads claims without a partial index: %q\nplan: %q", names[i], d, plan)
			}
		}
		if uses == 0 {
			t.Errorf("%s: no access to claims in the plan %q", names[i], plan)
		}
		t.Logf("%s: %q", names[i], plan)
	}
}
