package sbclaimtest_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// The in-memory queue stands in for Service Bus: a producer's retry
// delivers a message twice, the handler runs once, both copies complete.
// (In a test, sbclaimtest.Start runs the processor for the test's length.)
func ExampleNewQueue() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, _ := sbclaim.OpenStore(ctx, "sqlite::memory:")
	defer store.Close()

	var calls atomic.Int32
	router, _ := sbclaim.NewRouter(sbclaim.Route{Name: "welcome-email", Handler: func(ctx context.Context, d *sbclaim.Delivery) error {
		calls.Add(1) // send the email with d.IdempotencyKey()
		return nil
	}})
	queue := sbclaimtest.NewQueue(nil)
	p, _ := sbclaim.NewProcessor(sbclaim.ProcessorConfig{Consumer: "mailer", Store: store, Router: router, NewReceiver: queue.NewReceiver})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()

	id := "user-7-signed-up"
	msg := func() *azservicebus.Message { return &azservicebus.Message{MessageID: &id, Body: []byte(`{"user":7}`)} }
	_ = queue.Send(ctx, msg(), msg())
	_ = queue.WaitIdle(ctx)
	stop()
	<-done

	fmt.Println("emails sent:", calls.Load(), "messages completed:", len(queue.Completed()), "dead letters:", len(queue.DeadLetters()))
	// Output:
	// emails sent: 1 messages completed: 2 dead letters: 0
}
