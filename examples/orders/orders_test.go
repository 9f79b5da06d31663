package orders_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	_ "modernc.org/sqlite" // the application's own connection to the claims database

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/examples/orders"
	"github.com/sbclaim/sbclaim/sbclaimtest"
	_ "github.com/sbclaim/sbclaim/store/sqlite" // the claims store's dialect
)

// setup migrates a SQLite claims database in the test's directory, creates
// the orders table in it as the application's migrations would, and returns
// the claims store and the application's own connection (to read orders).
func setup(t *testing.T) (*sbclaim.Store, *sql.DB) {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "claims.db")
	if err := sbclaim.Migrate(ctx, "sqlite:"+path); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(30000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.ExecContext(ctx, orders.Schema); err != nil {
		t.Fatal(err)
	}
	store, err := sbclaim.OpenStore(ctx, "sqlite:"+path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return store, db
}

func placed(id string, order int) *azservicebus.Message {
	subject := "order.placed"
	return &azservicebus.Message{MessageID: &id, Subject: &subject, Body: fmt.Appendf(nil, `{"order":%d,"amount_cents":1999}`, order)}
}

func sendAndWait(t *testing.T, q *sbclaimtest.Queue, msgs ...*azservicebus.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := q.Send(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	if err := q.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
}

// rows returns the orders table: claim id by order id.
func rows(t *testing.T, db *sql.DB) map[int64]int64 {
	t.Helper()
	rs, err := db.Query(`SELECT order_id, claim_id FROM orders`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	got := map[int64]int64{}
	for rs.Next() {
		var order, claim int64
		if err := rs.Scan(&order, &claim); err != nil {
			t.Fatal(err)
		}
		got[order] = claim
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// claims returns the claims by dedup key.
func claims(t *testing.T, store *sbclaim.Store) map[string]*sbclaim.Claim {
	t.Helper()
	cs, err := store.Claims(context.Background(), sbclaim.ClaimFilter{})
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]*sbclaim.Claim{}
	for _, c := range cs {
		byKey[c.DedupKey] = c
	}
	return byKey
}

// A duplicate of an order is completed without running the handler: one
// row per order, each with the id of the claim it committed with.
func TestDuplicateWritesOneRow(t *testing.T) {
	store, db := setup(t)
	queue := sbclaimtest.NewQueue(nil)
	router, err := sbclaim.NewRouter(orders.Route())
	if err != nil {
		t.Fatal(err)
	}
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "orders", Store: store, Router: router}, queue)
	sendAndWait(t, queue, placed("order-1", 1), placed("order-1", 1), placed("order-2", 2))

	got, cs := rows(t, db), claims(t, store)
	if len(got) != 2 || len(cs) != 2 {
		t.Fatalf("orders %v and %d claims, want 2 of each", got, len(cs))
	}
	for order, key := range map[int64]string{1: "order-1", 2: "order-2"} {
		if c := cs[key]; c == nil || c.State != sbclaim.StateProcessed || got[order] != c.ID {
			t.Errorf("order %d has claim %d; claim %s is %+v", order, got[order], key, c)
		}
	}
	if n := len(queue.Completed()); n != 3 {
		t.Errorf("%d completed, want 3 (the duplicate too)", n)
	}
}

// A failure after the row was written (a later step of the same
// transaction) rolls back the row and the claim together: the order that
// fails once is written once, by its redelivery; the order that always
// fails leaves neither a row nor a claim when the broker dead-letters it.
func TestFailureAfterWriteLeavesNeither(t *testing.T) {
	store, db := setup(t)
	queue := sbclaimtest.NewQueue(&sbclaimtest.QueueOptions{MaxDeliveryCount: 2})
	var mu sync.Mutex
	calls := map[string]int{}
	route := orders.Route()
	route.TxHandler = func(ctx context.Context, tx *sql.Tx, d *sbclaim.Delivery) error {
		if err := orders.Record(ctx, tx, d); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		calls[d.DedupKey()]++
		if d.DedupKey() == "order-4" || calls[d.DedupKey()] == 1 && d.DedupKey() == "order-3" {
			return errors.New("the step after the write failed")
		}
		return nil
	}
	router, err := sbclaim.NewRouter(route)
	if err != nil {
		t.Fatal(err)
	}
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "orders", Store: store, Router: router}, queue)
	sendAndWait(t, queue, placed("order-3", 3), placed("order-4", 4))

	got, cs := rows(t, db), claims(t, store)
	if c := cs["order-3"]; len(got) != 1 || c == nil || c.State != sbclaim.StateProcessed || got[3] != c.ID {
		t.Errorf("orders %v, claim order-3 %+v: want order 3 alone, with its processed claim's id", got, c)
	}
	if c := cs["order-4"]; c != nil {
		t.Errorf("order-4 left a claim: %+v", c)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls["order-3"] != 2 || calls["order-4"] < 2 {
		t.Errorf("handler calls %v: want order-3 twice, order-4 at each delivery", calls)
	}
	if dead := queue.DeadLetters(); len(dead) != 1 || dead[0].MessageID != "order-4" {
		t.Errorf("dead letters %v, want order-4", dead)
	} else if dead[0].DeadLetterReason != nil {
		t.Logf("order-4 dead-lettered after %d handler calls: %s", calls["order-4"], *dead[0].DeadLetterReason)
	}
}
