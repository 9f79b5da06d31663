package sbclaim_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/claimdb"
	"github.com/sbclaim/sbclaim/internal/testkit/testdb"
	"github.com/sbclaim/sbclaim/operator"
	"github.com/sbclaim/sbclaim/prommetrics"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// calls records what a handler saw, by idempotency key.
type calls struct {
	mu       sync.Mutex
	keys     []string
	attempts []int
}

func (c *calls) add(d *sbclaim.Delivery) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.keys = append(c.keys, d.IdempotencyKey())
	c.attempts = append(c.attempts, d.Attempt())
	return len(c.keys)
}

func (c *calls) snapshot() ([]string, []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.keys...), append([]int(nil), c.attempts...)
}

func waitIdle(t *testing.T, q *sbclaimtest.Queue) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := q.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
}

func send(t *testing.T, q *sbclaimtest.Queue, msgs ...*azservicebus.Message) {
	t.Helper()
	if err := q.Send(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
}

func onlyClaim(t *testing.T, st *sbclaim.Store) *sbclaim.Claim {
	t.Helper()
	cs, err := st.Claims(context.Background(), sbclaim.ClaimFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 1 {
		t.Fatalf("%d claims, want 1: %+v", len(cs), cs)
	}
	return cs[0]
}

// A panic in a handler is recovered and its outcome is unknown: the
// processor goes on, retries with the same key, and the claim records it.
func TestPanicIsUnknown(t *testing.T) {
	st := sbclaimtest.NewStore(t)
	var c calls
	router, err := sbclaim.NewRouter(sbclaim.Route{Name: "charge", Handler: func(ctx context.Context, d *sbclaim.Delivery) error {
		if c.add(d) == 1 {
			panic("the SDK blew up")
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	q := sbclaimtest.NewQueue(nil)
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "billing", Store: st, Router: router}, q)
	send(t, q, message("order-1", "payment.requested", `{}`))
	waitIdle(t, q)

	keys, attempts := c.snapshot()
	if len(keys) != 2 || keys[0] != keys[1] {
		t.Fatalf("handler calls with keys %q, want two with the same key", keys)
	}
	if attempts[0] != 1 || attempts[1] != 2 {
		t.Errorf("attempts %v, want [1 2]", attempts)
	}
	cl := onlyClaim(t, st)
	if cl.State != sbclaim.StateProcessed || cl.Attempts != 1 || !strings.Contains(cl.LastError, "panicked") {
		t.Errorf("claim %+v: want processed after one recorded attempt whose error says it panicked", cl)
	}
	if cl.IdempotencyKey != keys[0] || cl.DedupKey != "order-1" {
		t.Errorf("claim keys %q/%q, handler saw %q", cl.DedupKey, cl.IdempotencyKey, keys[0])
	}
}

// A crash right after the effect, before its outcome is recorded: the
// redelivery takes the silent holder's claim over and runs the handler
// again with the same idempotency key; the message completes once.
func TestCrashAfterEffectIsRepeatedWithTheSameKey(t *testing.T) {
	st := sbclaimtest.NewStore(t)
	var c calls
	router, _ := sbclaim.NewRouter(sbclaim.Route{Name: "charge", Handler: func(ctx context.Context, d *sbclaim.Delivery) error {
		c.add(d)
		return nil
	}})
	q := sbclaimtest.NewQueue(&sbclaimtest.QueueOptions{LockDuration: 500 * time.Millisecond})
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "billing", Store: st, Router: router}, q, sbclaimtest.CrashAfterEffect(1))
	send(t, q, message("order-9", "payment.requested", `{}`))
	waitIdle(t, q)

	keys, _ := c.snapshot()
	if len(keys) != 2 || keys[0] != keys[1] {
		t.Fatalf("handler keys %q: want the effect twice (crash, take-over) with one key", keys)
	}
	cl := onlyClaim(t, st)
	if cl.State != sbclaim.StateProcessed || cl.TakeOvers != 1 {
		t.Errorf("claim %+v: want processed after one take-over", cl)
	}
	if got := q.Completed(); len(got) != 1 || q.Deliveries() != 2 {
		t.Errorf("completed %v after %d deliveries: want one completion of two deliveries", got, q.Deliveries())
	}
}

// A transactional handler's writes and its claim commit together and roll
// back together, on every store: a handler that fails (or panics) after
// its write leaves neither the row nor the claim, and the redelivery
// commits both once.
func TestTxHandlerCommitsWithItsClaim(t *testing.T) {
	for _, backend := range []string{"sqlite", "postgres", "sqlserver"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			url := testdb.URL(t, backend)
			ctx := context.Background()
			st, err := sbclaim.OpenStore(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			db, err := claimdb.OpenDB(ctx, url, 2)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			if _, err := db.ExecContext(ctx, `CREATE TABLE orders (claim_id BIGINT NOT NULL, order_key VARCHAR(128) NOT NULL)`); err != nil {
				t.Fatal(err)
			}

			var mu sync.Mutex
			fails := map[string]string{"order-fail": "error", "order-panic": "panic"}
			router, _ := sbclaim.NewRouter(sbclaim.Route{Name: "orders", TxHandler: func(ctx context.Context, tx *sql.Tx, d *sbclaim.Delivery) error {
				if d.ClaimID() == 0 {
					return sbclaim.Permanent(errors.New("no claim id"))
				}
				// Test-controlled values: no placeholders, so one
				// statement serves every dialect.
				if _, err := tx.ExecContext(ctx, fmt.Sprintf(`INSERT INTO orders (claim_id, order_key) VALUES (%d, '%s')`,
					d.ClaimID(), d.DedupKey())); err != nil {
					return err
				}
				mu.Lock()
				how := fails[d.DedupKey()]
				delete(fails, d.DedupKey()) // fail once
				mu.Unlock()
				switch how {
				case "error":
					return errors.New("the handler failed after its write")
				case "panic":
					panic("the handler panicked after its write")
				}
				return nil
			}})
			q := sbclaimtest.NewQueue(nil)
			sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "orders", Store: st, Router: router}, q)
			send(t, q, message("order-ok", "o", `{}`), message("order-fail", "o", `{}`), message("order-panic", "o", `{}`),
				message("order-ok", "o", `{}`))
			waitIdle(t, q)

			rows, err := db.QueryContext(ctx, `SELECT claim_id, order_key FROM orders ORDER BY order_key`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			got := map[string]int64{}
			for rows.Next() {
				var id int64
				var key string
				if err := rows.Scan(&id, &key); err != nil {
					t.Fatal(err)
				}
				if _, dup := got[key]; dup {
					t.Errorf("order %s written twice", key)
				}
				got[key] = id
			}
			claims, err := st.Claims(ctx, sbclaim.ClaimFilter{})
			if err != nil {
				t.Fatal(err)
			}
			if len(claims) != 3 || len(got) != 3 {
				t.Fatalf("%d claims and %d orders (%v), want 3 of each", len(claims), len(got), got)
			}
			for _, c := range claims {
				if c.State != sbclaim.StateProcessed || got[c.DedupKey] != c.ID {
					t.Errorf("claim %d %s %s: order row has claim %d", c.ID, c.DedupKey, c.State, got[c.DedupKey])
				}
			}
			if q.Deliveries() != 6 {
				t.Errorf("%d deliveries, want 6 (4 sent, the failed and the panicked one redelivered once)", q.Deliveries())
			}
		})
	}
}

// Router refuses what cannot work, naming the route.
func TestRouterRefusesBadRoutes(t *testing.T) {
	h := func(context.Context, *sbclaim.Delivery) error { return nil }
	tx := func(context.Context, *sql.Tx, *sbclaim.Delivery) error { return nil }
	for _, tc := range []struct {
		routes []sbclaim.Route
		want   string
	}{
		{[]sbclaim.Route{{Handler: h}}, "Name is required"},
		{[]sbclaim.Route{{Name: "a", Handler: h}, {Name: "a", Handler: h}}, `route "a": Name is used twice`},
		{[]sbclaim.Route{{Name: "a"}}, `route "a": exactly one of Handler and TxHandler`},
		{[]sbclaim.Route{{Name: "a", Handler: h, TxHandler: tx}}, `route "a": exactly one of Handler and TxHandler`},
		{[]sbclaim.Route{{Name: "a", Handler: h, Recovery: "sometimes"}}, `Recovery must be "auto" or "manual"`},
	} {
		if _, err := sbclaim.NewRouter(tc.routes...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewRouter(%+v): %v, want %q", tc.routes, err, tc.want)
		}
	}
}

// An operator's redrive of a claim whose handler is Go code the console
// and the CLI do not have: they hand the claim off, and the reconciler
// passes running in the user's binary (with the handler) re-run it once,
// with the claim's own idempotency key.
func TestHandOffRedrivesUserCodeWithTheSameKey(t *testing.T) {
	st := sbclaimtest.NewStore(t)
	var c calls
	router, _ := sbclaim.NewRouter(sbclaim.Route{Name: "refund", Recovery: sbclaim.RecoveryManual,
		Handler: func(ctx context.Context, d *sbclaim.Delivery) error {
			if c.add(d) == 1 {
				return errors.New("read timeout: the refund may have happened")
			}
			return nil
		}})
	q := sbclaimtest.NewQueue(&sbclaimtest.QueueOptions{LockDuration: 300 * time.Millisecond})
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "refunds", Store: st, Router: router}, q)
	send(t, q, message("refund-5", "refund.requested", `{"amount":5}`))
	waitIdle(t, q) // the unknown outcome on a manual route is left for the reconciler

	ctx := context.Background()
	rec, err := operator.NewReconciler(operator.ReconcilerConfig{Store: st, Routers: map[string]*sbclaim.Router{"refunds": router},
		HeartbeatInterval: 100 * time.Millisecond, StaleAfter: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	tick := func(want func(operator.TickResult) bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			res, err := rec.RunOnce(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if want(res) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("reconciler never did it; last tick %+v", res)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	tick(func(r operator.TickResult) bool { return r.Flagged == 1 })
	cl := onlyClaim(t, st)
	if cl.State != sbclaim.StateFlagged {
		t.Fatalf("claim %+v, want flagged (manual route, outcome unknown)", cl)
	}

	// The console has no handler: it hands the claim off. A second
	// operator acting at once is refused.
	// Two operators hand it off at once: one wins, the other is refused
	// (the take-over is guarded on the claim still being flagged).
	type res struct {
		c   *sbclaim.Claim
		err error
	}
	results := make(chan res, 2)
	for _, who := range []string{"alice", "bob"} {
		go func() {
			c, err := operator.HandOff(ctx, st, cl.ID, who, "checked the PSP: no refund")
			results <- res{c, err}
		}()
	}
	var handed *sbclaim.Claim
	refused := 0
	for range 2 {
		r := <-results
		switch {
		case r.err == nil && r.c.State == sbclaim.StateReleased:
			handed = r.c
		case errors.Is(r.err, operator.ErrNotFlagged) || errors.Is(r.err, operator.ErrStateChanged):
			refused++
		default:
			t.Fatalf("HandOff: %+v, %v", r.c, r.err)
		}
	}
	if handed == nil || refused != 1 {
		t.Fatalf("concurrent hand-offs: one released (%v), %d refused; want one each", handed != nil, refused)
	}
	h, err := operator.History(ctx, st, cl.ID)
	if err != nil {
		t.Fatal(err)
	}
	var audit []string
	for _, e := range h {
		if strings.HasPrefix(e.By, "operator:") {
			audit = append(audit, e.What+" by "+e.By+": "+e.Reason)
		}
	}
	if len(audit) != 2 || !strings.HasPrefix(audit[0], "redriven") || !strings.HasPrefix(audit[1], "released") ||
		!strings.Contains(audit[0], "checked the PSP") {
		t.Errorf("the hand-off's history %q: want the operator's take-over and release, with the note", audit)
	}
	if _, err := operator.Resolve(ctx, st, cl.ID, sbclaim.ResolutionDiscarded, "bob", "too late"); !errors.Is(err, operator.ErrStateChanged) {
		t.Errorf("Resolve after the hand-off: %v, want ErrStateChanged", err)
	}

	// A reconciler that does not run the route (a deployment's standalone
	// one) leaves the handed-off claim to the one that does.
	standalone, err := operator.NewReconciler(operator.ReconcilerConfig{Store: st, Routers: map[string]*sbclaim.Router{"billing": router},
		HeartbeatInterval: 100 * time.Millisecond, StaleAfter: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond) // released for longer than StaleAfter
	if res, err := standalone.RunOnce(ctx); err != nil || res.Flagged != 0 || res.Recovered != 0 {
		t.Fatalf("a reconciler without the route: %+v, %v; want the handed-off claim left alone", res, err)
	}
	if cl, _ := st.Claim(ctx, handed.ID); cl.State != sbclaim.StateReleased {
		t.Fatalf("after a reconciler without the route: %s, want still released", cl.State)
	}

	tick(func(r operator.TickResult) bool { return r.Recovered == 1 })
	keys, _ := c.snapshot()
	if len(keys) != 2 || keys[0] != keys[1] {
		t.Fatalf("handler keys %q: want the original attempt and one redrive, with one key", keys)
	}
	cl = onlyClaim(t, st)
	if cl.State != sbclaim.StateProcessed {
		t.Errorf("claim %+v, want processed by the redrive", cl)
	}
}

// A processor and a reconciler in one binary share its registry (both
// count take-overs), as do two processors of two consumers.
func TestOneRegistryServesEveryPart(t *testing.T) {
	st := sbclaimtest.NewStore(t)
	reg := prometheus.NewRegistry()
	router, _ := sbclaim.NewRouter(sbclaim.Route{Name: "r", Handler: func(context.Context, *sbclaim.Delivery) error { return nil }})
	q := sbclaimtest.NewQueue(nil)
	for _, consumer := range []string{"billing", "notifications"} {
		if _, err := sbclaim.NewProcessor(sbclaim.ProcessorConfig{Consumer: consumer, Store: st, Router: router,
			NewReceiver: q.NewReceiver, Metrics: prommetrics.New(reg)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := operator.NewReconciler(operator.ReconcilerConfig{Store: st, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, want := range []string{"sbclaim_claims_in_flight", "sbclaim_reconciler_tick_errors_total"} {
		if !names[want] {
			t.Errorf("%s not gathered (have %v)", want, names)
		}
	}
}
