package processor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/claim/sqlite"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// Example wires a processor to a queue (the in-memory broker here; an
// *azservicebus.Receiver in production), a claim store and one effect, and
// sends the same message twice: the effect runs once, both copies are
// completed.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "sbclaim-example")
	defer os.RemoveAll(dir)
	store, err := sqlite.Open(ctx, "sqlite:"+filepath.Join(dir, "claims.db"))
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if err := sqlite.Migrate(ctx, store.DB()); err != nil {
		panic(err)
	}

	charges := 0
	router, err := sideeffects.NewRouter(sideeffects.Route{
		Name:  "payments",
		Match: sideeffects.Match{Subject: "payment"},
		Effect: sideeffects.EffectFunc(func(ctx context.Context, msg *azservicebus.ReceivedMessage, key string) error {
			charges++ // a real effect sends key as its Idempotency-Key
			return nil
		}),
	})
	if err != nil {
		panic(err)
	}

	queue := membus.NewQueue("payments", membus.QueueOptions{})
	p, err := processor.New(processor.Options{
		Consumer: "billing",
		Entity:   "payments",
		Store:    store,
		Router:   router,
		NewReceiver: func(context.Context) (processor.Receiver, error) {
			return queue.NewReceiver(), nil
		},
	})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- p.Run(runCtx) }()

	id, subject := "order-42", "payment"
	for range 2 { // a producer retry: the same message twice
		_ = queue.SendMessage(ctx, &azservicebus.Message{MessageID: &id, Subject: &subject, Body: []byte(`{"amount":10}`)}, nil)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_ = queue.WaitIdle(waitCtx)
	stop()
	<-done

	fmt.Println("charges:", charges)
	fmt.Println("completed:", len(queue.Completed()))
	// Output:
	// charges: 1
	// completed: 2
}
