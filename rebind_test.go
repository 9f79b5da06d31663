package sbclaim_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/testkit/testdb"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// TestRebindRunsOneStatementOnEveryDialect: a transactional handler
// writes with ? placeholders through Store.Rebind on each database.
func TestRebindRunsOneStatementOnEveryDialect(t *testing.T) {
	for _, backend := range []string{"sqlite", "postgres", "sqlserver"} {
		t.Run(backend, func(t *testing.T) {
			url := testdb.URL(t, backend)
			ctx := context.Background()
			st, err := sbclaim.OpenStore(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			if _, err := st.DB().ExecContext(ctx, `CREATE TABLE rebound (claim_id BIGINT NOT NULL, note VARCHAR(64) NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			router, err := sbclaim.NewRouter(sbclaim.Route{Name: "note", TxHandler: sbclaim.JSONTx(func(ctx context.Context, tx *sql.Tx, d *sbclaim.Delivery, v struct{ Note string }) error {
				_, err := tx.ExecContext(ctx, st.Rebind(`INSERT INTO rebound (claim_id, note) VALUES (?, ?) -- claim?`), d.ClaimID(), v.Note+"?")
				return err
			})})
			if err != nil {
				t.Fatal(err)
			}
			res := sbclaimtest.Work(t, sbclaim.ProcessorConfig{Store: st, Router: router}, sbclaimtest.Message(t, "n-1", "", map[string]string{"Note": "hello"}))
			if res.Outcome != sbclaim.OutcomeOK || res.Claim == nil {
				t.Fatalf("%+v", res)
			}
			var note string
			if err := st.DB().QueryRowContext(ctx, st.Rebind(`SELECT note FROM rebound WHERE claim_id = ?`), res.Claim.ID).Scan(&note); err != nil || note != "hello?" {
				t.Fatalf("note %q, %v", note, err)
			}
		})
	}
}
