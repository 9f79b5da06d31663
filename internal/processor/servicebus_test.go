package processor_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/sideeffects/routesfile"
	"github.com/sbclaim/sbclaim/internal/testkit"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
	"github.com/sbclaim/sbclaim/internal/testkit/testdb"
)

// Variables of the gated Service Bus suite. With the compose stack up
// (docker compose up -d sqlserver servicebus), see the README.
const (
	serviceBusEnv      = testkit.ServiceBusEnv
	serviceBusQueueEnv = "SBCLAIM_TEST_SERVICEBUS_QUEUE" // default "integration"
)

// TestServiceBus runs two processors against a real Service Bus namespace
// or the emulator: duplicates are absorbed (each effect once, on the fake
// idempotent downstream over HTTP) and a poison message is dead-lettered
// with its reason. The claims store is SQL Server when
// SBCLAIM_TEST_SQLSERVER_URL is set, SQLite otherwise.
func TestServiceBus(t *testing.T) {
	cs := testkit.RequireOrSkip(t, "servicebus", serviceBusEnv)
	queue := os.Getenv(serviceBusQueueEnv)
	if queue == "" {
		queue = "integration"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// A broker that is not there fails here, at once, naming the variable
	// and the cause.
	if err := testkit.CheckServiceBus(ctx, cs, queue); err != nil {
		t.Fatal(err)
	}

	newClient := func() *azservicebus.Client {
		c, err := azservicebus.NewClientFromConnectionString(cs, nil)
		if err != nil {
			t.Fatalf("%s: the client rejected it", serviceBusEnv)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	admin := newClient()
	drain(ctx, t, admin, queue, nil)
	drain(ctx, t, admin, queue, &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})

	var st claim.Store
	if os.Getenv(testdb.SQLServerURLEnv) != "" {
		st = testdb.SQLServer(t)
	} else {
		st = testdb.SQLite(t)
	}
	down := fakedownstream.New(fakedownstream.Options{Latency: 20 * time.Millisecond})
	srv := httptest.NewServer(down)
	t.Cleanup(srv.Close)
	router, err := routesfile.Parse([]byte(fmt.Sprintf(`
routes:
  - name: payments
    key: raw
    match: {subject: payment}
    body: json
    url: %s/payments
    timeout: 5s
`, srv.URL)), os.Getenv, nil, slog.Default())
	if err != nil {
		t.Fatal(err)
	}

	logs := &syncBuffer{}
	for i := range 2 {
		c := newClient() // one connection per replica, like two containers
		p, err := processor.New(processor.Options{
			Consumer: "integration",
			Entity:   queue,
			Store:    st,
			Router:   router,
			NewReceiver: func(context.Context) (processor.Receiver, error) {
				return c.NewReceiverForQueue(queue, nil)
			},
			MaxConcurrentCalls: 4,
			MaxLockRenewal:     time.Minute,
			HeartbeatInterval:  time.Second,
			Retry:              sideeffects.RetryPolicy{MaxAttempts: 3, Budget: 20 * time.Second},
			StorePayload:       true,
			Host:               fmt.Sprintf("replica-%d", i),
			Logger:             slog.New(slog.NewJSONHandler(logs, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(rctx) }()
		t.Cleanup(func() { stop(); <-done })
	}

	sender, err := admin.NewSender(queue, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Close(context.Background())
	run := time.Now().UnixNano()
	const unique = 30
	var keys []string
	send := func(id, subject, body string) {
		t.Helper()
		if err := sender.SendMessage(ctx, &azservicebus.Message{MessageID: &id, Subject: &subject, Body: []byte(body)}, nil); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	for i := range unique {
		id := fmt.Sprintf("it-%d-%02d", run, i)
		keys = append(keys, id)
		copies := 1 + i%3 // 1, 2 or 3 copies
		for range copies {
			send(id, "payment", fmt.Sprintf(`{"n":%d}`, i))
		}
	}
	poison := fmt.Sprintf("it-%d-poison", run)
	send(poison, "payment", `{not json`)

	// Wait for every effect and for the poison message in the DLQ.
	dlq, err := admin.NewReceiverForQueue(queue, &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	if err != nil {
		t.Fatal(err)
	}
	defer dlq.Close(context.Background())
	var dead *azservicebus.ReceivedMessage
	for dead == nil {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		msgs, err := dlq.ReceiveMessages(rctx, 10, nil)
		rcancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("receive DLQ: %v", err)
		}
		for _, m := range msgs {
			if m.MessageID == poison {
				dead = m
			}
			_ = dlq.CompleteMessage(ctx, m, nil)
		}
		if ctx.Err() != nil {
			t.Fatalf("poison message never reached the DLQ; logs:\n%s", logs.tail(30))
		}
	}
	if dead.DeadLetterReason == nil || *dead.DeadLetterReason != sideeffects.ReasonMalformedBody {
		t.Errorf("poison dead-letter reason %v, want %s", dead.DeadLetterReason, sideeffects.ReasonMalformedBody)
	}

	for {
		n := 0
		for _, k := range keys {
			if down.Effects(k) > 0 {
				n++
			}
		}
		if n == unique {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%d of %d effects after 5 minutes; logs:\n%s", n, unique, logs.tail(30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // let late duplicates arrive
	for _, k := range keys {
		if got := down.Effects(k); got != 1 {
			t.Errorf("%s: %d effects downstream, want 1", k, got)
		}
	}
	cs2, err := st.List(ctx, &claim.ListParams{Consumer: "integration", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	processed := 0
	for _, c := range cs2 {
		if c.State == claim.StateProcessed {
			processed++
		}
	}
	if processed != unique {
		t.Errorf("%d processed claims, want %d", processed, unique)
	}
}

// drain completes whatever an earlier run left in the queue (or its DLQ).
func drain(ctx context.Context, t *testing.T, c *azservicebus.Client, queue string, opts *azservicebus.ReceiverOptions) {
	t.Helper()
	r, err := c.NewReceiverForQueue(queue, opts)
	if err != nil {
		t.Fatalf("receiver for %s: %v", queue, err)
	}
	defer r.Close(ctx)
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		msgs, err := r.ReceiveMessages(rctx, 50, nil)
		cancel()
		if len(msgs) == 0 || err != nil {
			return
		}
		for _, m := range msgs {
			_ = r.CompleteMessage(ctx, m, nil)
		}
	}
}
