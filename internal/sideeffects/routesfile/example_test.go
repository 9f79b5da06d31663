package routesfile_test

import (
	"context"
	"fmt"
	"log"
	"net/http/httptest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/sideeffects/routesfile"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

func ExampleParse() {
	// A downstream with Idempotency-Key support, failing its first answer.
	fake := fakedownstream.New(fakedownstream.Options{})
	fake.FailNext(1, fakedownstream.FaultUnavailable)
	srv := httptest.NewServer(fake)
	defer srv.Close()

	routes := fmt.Sprintf(`
routes:
  - name: payments
    match: {subject: payment.requested}
    body: json
    url: %s/payments
    timeout: 5s
    headers:
      Authorization: {fromEnv: PAYMENTS_TOKEN}
`, srv.URL)
	getenv := func(name string) string {
		return map[string]string{"PAYMENTS_TOKEN": "Bearer example"}[name]
	}
	router, err := routesfile.Parse([]byte(routes), getenv, nil, nil)
	if err != nil {
		log.Fatal(err)
	}

	subject := "payment.requested"
	msg := &azservicebus.ReceivedMessage{MessageID: "order-42", Subject: &subject, Body: []byte(`{"amount":1000}`)}
	h, err := router.Route(msg)
	if err != nil {
		log.Fatal(err) // an *sideeffects.InputError: dead-letter the message
	}

	policy := sideeffects.RetryPolicy{MaxAttempts: 3, InitialInterval: 10 * time.Millisecond, Budget: 30 * time.Second}
	err = policy.Do(context.Background(), func(ctx context.Context) error {
		return h.Effect.Perform(ctx, msg, msg.MessageID)
	}, func(attempt int, err error) {
		fmt.Printf("attempt %d: %v\n", attempt, sideeffects.Classify(err))
	})
	fmt.Println("route:", h.Name, "outcome:", sideeffects.Classify(err))
	fmt.Println("effects:", fake.Effects("order-42"), "requests:", fake.Requests("order-42"))
	// Output:
	// attempt 1: retryable
	// route: payments outcome: ok
	// effects: 1 requests: 2
}
