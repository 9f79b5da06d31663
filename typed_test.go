package sbclaim_test

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

type order struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// TestJSONDecodesThePayload: a typed handler gets the decoded body; a body
// that does not decode fails the claim for good, with a reason naming the
// type, and the handler never runs for it.
func TestJSONDecodesThePayload(t *testing.T) {
	st := sbclaimtest.NewStore(t)
	var mu sync.Mutex
	got := map[string]order{}
	router, err := sbclaim.NewRouter(
		sbclaim.Route{Name: "charge", Match: sbclaim.MatchSubject("charge"),
			Handler: sbclaim.JSON(func(_ context.Context, d *sbclaim.Delivery, o order) error {
				mu.Lock()
				defer mu.Unlock()
				got[d.DedupKey()] = o
				return nil
			})},
		sbclaim.Route{Name: "ship", Match: sbclaim.MatchSubject("ship"),
			TxHandler: sbclaim.JSONTx(func(ctx context.Context, tx *sql.Tx, d *sbclaim.Delivery, o order) error {
				if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS shipped (id TEXT NOT NULL)`); err != nil {
					return err
				}
				_, err := tx.ExecContext(ctx, `INSERT INTO shipped (id) VALUES (?)`, o.ID)
				return err
			})})
	if err != nil {
		t.Fatal(err)
	}
	q := sbclaimtest.NewQueue(nil)
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "orders", Store: st, Router: router}, q)
	send(t, q, message("c-ok", "charge", `{"id":"o-1","amount":250}`), message("c-bad", "charge", `{"id":`),
		message("s-ok", "ship", `{"id":"o-2"}`), message("s-bad", "ship", `{"amount":"ten"}`))
	waitIdle(t, q)

	if len(got) != 1 || got["c-ok"] != (order{ID: "o-1", Amount: 250}) {
		t.Fatalf("the handler saw %+v, want only c-ok's order", got)
	}
	claims, err := st.Claims(context.Background(), sbclaim.ClaimFilter{})
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]*sbclaim.Claim{}
	for _, c := range claims {
		states[c.DedupKey] = c
	}
	for key, want := range map[string]sbclaim.ClaimState{"c-ok": sbclaim.StateProcessed, "s-ok": sbclaim.StateProcessed} {
		if c := states[key]; c == nil || c.State != want {
			t.Errorf("claim %s: %+v, want %s", key, c, want)
		}
	}
	if c := states["c-bad"]; c == nil || c.State != sbclaim.StateFailed || !strings.Contains(c.LastError, "sbclaim_test.order") {
		t.Errorf("claim c-bad: %+v, want failed naming the type", c)
	}
	if dl := q.DeadLetters(); len(dl) != 2 {
		t.Fatalf("%d dead letters, want 2 (c-bad, s-bad)", len(dl))
	} else {
		for _, m := range dl {
			if m.MessageID != "c-bad" && m.MessageID != "s-bad" {
				t.Errorf("dead letter %s", m.MessageID)
			}
			if m.DeadLetterErrorDescription == nil || !strings.Contains(*m.DeadLetterErrorDescription, "does not decode as JSON into sbclaim_test.order") {
				t.Errorf("dead letter %s: description %v", m.MessageID, m.DeadLetterErrorDescription)
			}
		}
	}
}
