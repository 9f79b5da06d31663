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

// trace records the order middleware and handlers ran in.
type trace struct {
	mu    sync.Mutex
	steps []string
}

func (tr *trace) add(s string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.steps = append(tr.steps, s)
}

func (tr *trace) String() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return strings.Join(tr.steps, " ")
}

func (tr *trace) mw(name string) sbclaim.Middleware {
	return func(next sbclaim.HandlerFunc) sbclaim.HandlerFunc {
		return func(ctx context.Context, d *sbclaim.Delivery) error {
			tr.add(name + ">")
			defer tr.add("<" + name) // runs during a panic too
			return next(ctx, d)
		}
	}
}

// TestMiddlewareOrder: the router's middleware, in the order given (added
// before or after the route alike), outside the route's own, for plain and
// transactional handlers.
func TestMiddlewareOrder(t *testing.T) {
	st := sbclaimtest.NewStore(t)
	var plain, tx trace
	router, err := sbclaim.NewRouter(sbclaim.Route{Name: "charge", Match: sbclaim.MatchSubject("charge"),
		Middleware: []sbclaim.Middleware{plain.mw("c"), plain.mw("d")},
		Handler: func(context.Context, *sbclaim.Delivery) error {
			plain.add("h")
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := router.Add(sbclaim.Route{Name: "ship", Match: sbclaim.MatchSubject("ship"),
		Middleware: []sbclaim.Middleware{tx.mw("c")},
		TxHandler: func(ctx context.Context, q *sql.Tx, _ *sbclaim.Delivery) error {
			var one int
			if err := q.QueryRowContext(ctx, `SELECT 1`).Scan(&one); err != nil {
				return err
			}
			tx.add("tx")
			return nil
		}}); err != nil {
		t.Fatal(err)
	}
	router.Use(func(next sbclaim.HandlerFunc) sbclaim.HandlerFunc {
		return func(ctx context.Context, d *sbclaim.Delivery) error {
			if d.Message().Subject != nil && *d.Message().Subject == "ship" {
				return tx.mw("a")(next)(ctx, d)
			}
			return plain.mw("a")(next)(ctx, d)
		}
	}, func(next sbclaim.HandlerFunc) sbclaim.HandlerFunc {
		return func(ctx context.Context, d *sbclaim.Delivery) error {
			if d.Message().Subject != nil && *d.Message().Subject == "ship" {
				return tx.mw("b")(next)(ctx, d)
			}
			return plain.mw("b")(next)(ctx, d)
		}
	})
	q := sbclaimtest.NewQueue(nil)
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "orders", Store: st, Router: router}, q)
	send(t, q, message("m-1", "charge", `{}`), message("m-2", "ship", `{}`))
	waitIdle(t, q)
	if got, want := plain.String(), "a> b> c> d> h <d <c <b <a"; got != want {
		t.Errorf("plain route ran %q, want %q", got, want)
	}
	if got, want := tx.String(), "a> b> c> tx <c <b <a"; got != want {
		t.Errorf("transactional route ran %q, want %q", got, want)
	}
}

// TestPanicThroughMiddlewareIsUnknown: a panic passes through the
// middleware and is recorded as unknown; the repeat uses the same key.
func TestPanicThroughMiddlewareIsUnknown(t *testing.T) {
	st := sbclaimtest.NewStore(t)
	var c calls
	var tr trace
	router, err := sbclaim.NewRouter(sbclaim.Route{Name: "charge", Middleware: []sbclaim.Middleware{tr.mw("route")},
		Handler: func(_ context.Context, d *sbclaim.Delivery) error {
			if c.add(d) == 1 {
				panic("the SDK blew up")
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	router.Use(tr.mw("log"))
	q := sbclaimtest.NewQueue(nil)
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "billing", Store: st, Router: router}, q)
	send(t, q, message("order-1", "payment.requested", `{}`))
	waitIdle(t, q)

	keys, _ := c.snapshot()
	if len(keys) != 2 || keys[0] != keys[1] {
		t.Fatalf("handler calls with keys %q, want two with the same key", keys)
	}
	if got, want := tr.String(), "log> route> <route <log log> route> <route <log"; got != want {
		t.Errorf("middleware ran %q, want %q", got, want)
	}
	cl := onlyClaim(t, st)
	if cl.State != sbclaim.StateProcessed || cl.Attempts != 1 || !strings.Contains(cl.LastError, "panicked") {
		t.Errorf("claim %+v: want processed after one recorded unknown attempt whose error says it panicked", cl)
	}
}
