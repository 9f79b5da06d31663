package sbclaim_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// A handler's follow-ups are sent once its outcome is recorded, each with
// the MessageId derived from its claim's key and position, and the
// handled message's key as CorrelationID; a transactional handler's
// commit with its transaction.
func TestPublishSendsFollowUpsWithDeterministicIDs(t *testing.T) {
	st := sbclaimtest.NewStore(t)
	router, err := sbclaim.NewRouter(
		sbclaim.Route{Name: "charge", Match: sbclaim.MatchSubject("charge"),
			Handler: sbclaim.JSON(func(_ context.Context, d *sbclaim.Delivery, o order) error {
				if err := d.Publish(sbclaim.FollowUp{To: "nowhere-valid", Body: nil, Properties: map[string]string{"": "x"}}); err == nil {
					return errors.New("an invalid follow-up was accepted")
				}
				return d.Publish(sbclaim.FollowUp{To: "receipts", Subject: "payment.charged", Body: []byte(o.ID),
					Properties: map[string]string{"amount": "250"}})
			})},
		sbclaim.Route{Name: "ship", Match: sbclaim.MatchSubject("ship"),
			TxHandler: sbclaim.JSONTx(func(ctx context.Context, tx *sql.Tx, d *sbclaim.Delivery, o order) error {
				for _, to := range []string{"receipts", "shipping"} {
					if err := d.Publish(sbclaim.FollowUp{To: to, Subject: "order.shipped", Body: []byte(o.ID), CorrelationID: "trace-1"}); err != nil {
						return err
					}
				}
				return nil
			})})
	if err != nil {
		t.Fatal(err)
	}
	ob := sbclaimtest.NewOutbox("receipts", "shipping")
	q := sbclaimtest.NewQueue(nil)
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "orders", Store: st, Router: router, Outbox: ob.Config()}, q)
	send(t, q, message("c-1", "charge", `{"id":"o-1","amount":250}`), message("s-1", "ship", `{"id":"o-2"}`))
	waitIdle(t, q)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	receipts, err := ob.WaitSent(ctx, "receipts", 2)
	if err != nil {
		t.Fatalf("receipts: %v (%d sent)", err, len(receipts))
	}
	shipping, err := ob.WaitSent(ctx, "shipping", 1)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]string{}
	for _, m := range append(receipts, shipping...) {
		byID[*m.MessageID] = string(m.Body) + " " + *m.CorrelationID
	}
	want := map[string]string{
		sbclaim.FollowUpMessageID("orders", "c-1", 1): "o-1 c-1",
		sbclaim.FollowUpMessageID("orders", "s-1", 1): "o-2 trace-1",
		sbclaim.FollowUpMessageID("orders", "s-1", 2): "o-2 trace-1",
	}
	if len(byID) != len(want) {
		t.Fatalf("sent %v, want %v", byID, want)
	}
	for id, w := range want {
		if byID[id] != w {
			t.Errorf("follow-up %s: %q, want %q", id, byID[id], w)
		}
	}
}

// Without ProcessorConfig.Outbox, Publish fails with ErrNoOutbox.
func TestPublishWithoutAnOutbox(t *testing.T) {
	st := sbclaimtest.NewStore(t)
	errs := make(chan error, 1)
	router, err := sbclaim.NewRouter(sbclaim.Route{Name: "charge", Handler: func(_ context.Context, d *sbclaim.Delivery) error {
		errs <- d.Publish(sbclaim.FollowUp{To: "receipts"})
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	q := sbclaimtest.NewQueue(nil)
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "orders", Store: st, Router: router}, q)
	send(t, q, message("c-2", "charge", `{}`))
	if err := <-errs; !errors.Is(err, sbclaim.ErrNoOutbox) {
		t.Fatalf("Publish: %v, want ErrNoOutbox", err)
	}
	waitIdle(t, q)
}
