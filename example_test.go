package sbclaim_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// run starts a processor for consumer on queue with router, waits until
// the queue is idle and stops it.
func run(store *sbclaim.Store, router *sbclaim.Router, queue *sbclaimtest.Queue, msgs ...*azservicebus.Message) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := sbclaim.NewProcessor(sbclaim.ProcessorConfig{
		Consumer: "billing", Entity: "payments", Store: store, Router: router, NewReceiver: queue.NewReceiver,
	})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	if err := queue.Send(ctx, msgs...); err != nil {
		panic(err)
	}
	if err := queue.WaitIdle(ctx); err != nil {
		panic(err)
	}
	stop()
	<-done
}

func message(id, subject, body string) *azservicebus.Message {
	return &azservicebus.Message{MessageID: &id, Subject: &subject, Body: []byte(body)}
}

// A handler runs once per message, whatever the number of copies Service
// Bus delivers: the claim decides, and the duplicates are completed.
func Example() {
	ctx := context.Background()
	store, err := sbclaim.OpenStore(ctx, "sqlite::memory:")
	if err != nil {
		panic(err)
	}
	defer store.Close()

	var mu sync.Mutex
	charged := map[string]int{} // what the payment API saw, by idempotency key
	router, err := sbclaim.NewRouter(sbclaim.Route{
		Name:  "charge",
		Match: sbclaim.MatchSubject("payment.requested"),
		Handler: func(ctx context.Context, d *sbclaim.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			charged[d.IdempotencyKey()]++ // your API call, with the key
			return nil
		},
	})
	if err != nil {
		panic(err)
	}

	queue := sbclaimtest.NewQueue(nil)
	body := `{"order":42,"amount_cents":1999}`
	run(store, router, queue,
		message("order-42", "payment.requested", body),
		message("order-42", "payment.requested", body), // the producer's retry
	)

	fmt.Println("effects:", len(charged), "completed:", len(queue.Completed()))
	// Output:
	// effects: 1 completed: 2
}

// A decline is the downstream's final answer: the claim fails and the
// message is dead-lettered once, with the reason.
func ExampleRejected() {
	ctx := context.Background()
	store, _ := sbclaim.OpenStore(ctx, "sqlite::memory:")
	defer store.Close()
	router, _ := sbclaim.NewRouter(sbclaim.Route{
		Name: "charge",
		Handler: func(ctx context.Context, d *sbclaim.Delivery) error {
			return sbclaim.Rejected(errors.New("card_declined"))
		},
	})
	queue := sbclaimtest.NewQueue(nil)
	run(store, router, queue, message("order-7", "payment.requested", `{}`))

	for _, m := range queue.DeadLetters() {
		fmt.Println(m.MessageID, *m.DeadLetterReason)
	}
	claims, _ := store.Claims(ctx, sbclaim.ClaimFilter{Consumer: "billing"})
	fmt.Println(claims[0].State, claims[0].FailReason)
	// Output:
	// order-7 EffectRejected
	// failed EffectRejected
}

// A transactional handler writes to the claims database in the transaction
// that inserts the claim: the order row and the claim commit together, or
// neither does.
func ExampleTxHandlerFunc() {
	ctx := context.Background()
	store, _ := sbclaim.OpenStore(ctx, "sqlite::memory:")
	defer store.Close()
	router, _ := sbclaim.NewRouter(sbclaim.Route{
		Name: "record-order",
		TxHandler: func(ctx context.Context, tx *sql.Tx, d *sbclaim.Delivery) error {
			if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (claim_id INTEGER, key TEXT)`); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO orders (claim_id, key) VALUES (?, ?)`, d.ClaimID(), d.DedupKey())
			return err
		},
	})
	queue := sbclaimtest.NewQueue(nil)
	run(store, router, queue,
		message("order-1", "order.placed", `{}`),
		message("order-1", "order.placed", `{}`),
		message("order-2", "order.placed", `{}`),
	)

	claims, _ := store.Claims(ctx, sbclaim.ClaimFilter{})
	slices.SortFunc(claims, func(a, b *sbclaim.Claim) int { return strings.Compare(a.DedupKey, b.DedupKey) })
	for _, c := range claims {
		fmt.Println(c.DedupKey, c.State)
	}
	// Output:
	// order-1 processed
	// order-2 processed
}

// Routes are tried in order; the first whose Match selects the message
// runs it. A message no route selects is dead-lettered NoRoute.
func ExampleNewRouter() {
	ctx := context.Background()
	store, _ := sbclaim.OpenStore(ctx, "sqlite::memory:")
	defer store.Close()
	var mu sync.Mutex
	var ran []string
	handler := func(name string) sbclaim.HandlerFunc {
		return func(ctx context.Context, d *sbclaim.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			ran = append(ran, name+" "+d.DedupKey())
			return nil
		}
	}
	router, err := sbclaim.NewRouter(
		sbclaim.Route{Name: "refund", Match: sbclaim.MatchSubject("refund.requested"), Handler: handler("refund"), Recovery: sbclaim.RecoveryManual},
		sbclaim.Route{Name: "vip", Match: sbclaim.MatchProperty("tier", "vip"), Handler: handler("vip")},
	)
	if err != nil {
		panic(err)
	}
	vip := message("m-2", "order.placed", `{}`)
	vip.ApplicationProperties = map[string]any{"tier": "vip"}
	queue := sbclaimtest.NewQueue(nil)
	run(store, router, queue, message("m-1", "refund.requested", `{}`), vip, message("m-3", "order.placed", `{}`))

	mu.Lock()
	fmt.Println(len(ran), "ran")
	mu.Unlock()
	for _, m := range queue.DeadLetters() {
		fmt.Println(m.MessageID, *m.DeadLetterReason)
	}
	// Output:
	// 2 ran
	// m-3 NoRoute
}
