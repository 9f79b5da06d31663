package processor_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/sideeffects/routesfile"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// TestTwoConsumersOfOneMessageBothPerformTheirEffect (issue 20, finding
// 8): two consumers (two subscriptions of one topic) receive the same
// message and call the same payment API, whose idempotency keys are per
// account. With the raw message id as the key the second consumer's
// request was answered with the first one's stored answer and its own
// effect never happened; the key scoped to the consumer (the default for
// new claims) makes them two requests.
func TestTwoConsumersOfOneMessageBothPerformTheirEffect(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		fake := fakedownstream.New(fakedownstream.Options{})
		srv := httptest.NewServer(fake)
		t.Cleanup(srv.Close)
		router, err := routesfile.Parse([]byte(`version: 1
routes:
  - name: payments
    match: {subject: "*"}
    url: "`+srv.URL+`/v1/charges"
    timeout: 5s
`), func(string) string { return "" }, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		second := membus.NewQueue("shipping", membus.QueueOptions{LockDuration: 2 * time.Second, MaxDeliveryCount: 10})
		for _, c := range []struct {
			consumer string
			q        *membus.Queue
		}{{"billing", b.q}, {"shipping", second}} {
			opts := b.options()
			opts.Router, opts.Consumer, opts.Entity = router, c.consumer, "orders/"+c.consumer
			q := c.q
			opts.NewReceiver = func(context.Context) (processor.Receiver, error) { return q.NewReceiver(), nil }
			b.start(opts)
		}
		const id = "evt-7"
		b.send(id, "payment", `{"amount":1000}`, nil)
		mid, subj := id, "payment"
		if err := second.SendMessage(context.Background(), &azservicebus.Message{MessageID: &mid, Subject: &subj, Body: []byte(`{"amount":1000}`)}, nil); err != nil {
			t.Fatal(err)
		}
		b.waitIdle()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := second.WaitIdle(ctx); err != nil {
			t.Fatal(err)
		}
		if n := fake.TotalEffects(); n != 2 {
			t.Fatalf("the payment API performed %d effects for two consumers of %s (keys %q), want 2", n, id, fake.Keys())
		}
		for _, consumer := range []string{"billing", "shipping"} {
			key := claim.KeyFor(claim.KeyFormScoped, consumer, id, 0)
			if fake.Effects(key) != 1 || fake.Replays(key) != 0 {
				t.Errorf("consumer %s: %d effects, %d replays under %q", consumer, fake.Effects(key), fake.Replays(key), key)
			}
		}
	})
}
