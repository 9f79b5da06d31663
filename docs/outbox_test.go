package docs_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// docs/outbox.md shows chargeAndPublish and outboxConfig.

type payment struct {
	ID          string `json:"id"`
	AmountCents int64  `json:"amount_cents"`
}

// chargeAndPublish charges a payment with the claim's idempotency key,
// then publishes payment.charged: recorded with the outcome, sent by the
// outbox.
func chargeAndPublish(charge func(ctx context.Context, p payment, key string) error) sbclaim.HandlerFunc {
	return sbclaim.JSON(func(ctx context.Context, d *sbclaim.Delivery, p payment) error {
		if err := charge(ctx, p, d.IdempotencyKey()); err != nil {
			return err
		}
		body, err := json.Marshal(p)
		if err != nil {
			return sbclaim.Permanent(err)
		}
		return d.Publish(sbclaim.FollowUp{To: "payment-charged", Subject: "payment.charged",
			Body: body, ContentType: "application/json"})
	})
}

// outboxConfig sends the follow-ups with the client the receiver uses.
func outboxConfig(client *azservicebus.Client) sbclaim.OutboxConfig {
	return sbclaim.OutboxConfig{NewSender: func(to string) (sbclaim.Sender, error) {
		return client.NewSender(to, nil)
	}}
}

func TestChargeAndPublish(t *testing.T) {
	_ = outboxConfig // wired as runBinary wires its client; not reachable here
	st := sbclaimtest.NewStore(t)
	router, err := sbclaim.NewRouter(sbclaim.Route{Name: "charge", Handler: chargeAndPublish(
		func(context.Context, payment, string) error { return nil })})
	if err != nil {
		t.Fatal(err)
	}
	ob := sbclaimtest.NewOutbox("payment-charged")
	q := sbclaimtest.NewQueue(nil)
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "payments", Store: st, Router: router, Outbox: ob.Config()}, q)
	id := "pay-1"
	if err := q.Send(context.Background(), &azservicebus.Message{MessageID: &id, Body: []byte(`{"id":"pay-1","amount_cents":250}`)}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sent, err := ob.WaitSent(ctx, "payment-charged", 1)
	if err != nil {
		t.Fatal(err)
	}
	if *sent[0].MessageID != sbclaim.FollowUpMessageID("payments", "pay-1", 1) || *sent[0].Subject != "payment.charged" {
		t.Fatalf("sent %s %s", *sent[0].MessageID, *sent[0].Subject)
	}
}
