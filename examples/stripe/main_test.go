package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// setup starts a processor with the Charge route on an in-memory queue and
// returns the queue, the claims store and the test Stripe API.
func setup(t *testing.T, qopts *sbclaimtest.QueueOptions, opts ...sbclaimtest.Option) (*sbclaimtest.Queue, *sbclaim.Store, *stripeAPI) {
	t.Helper()
	api, sc := newStripe(t)
	router, err := sbclaim.NewRouter(sbclaim.Route{
		Name: "charge", Match: sbclaim.MatchSubject("payment.requested"), Handler: Charge(sc), JSONBody: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	store := sbclaimtest.NewStore(t)
	queue := sbclaimtest.NewQueue(qopts)
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "billing", Store: store, Router: router}, queue, opts...)
	return queue, store, api
}

func payment(id string, order, cents int) *azservicebus.Message {
	subject := "payment.requested"
	return &azservicebus.Message{
		MessageID: &id, Subject: &subject,
		Body: fmt.Appendf(nil, `{"order":%d,"amount_cents":%d}`, order, cents),
	}
}

func sendAndWait(t *testing.T, q *sbclaimtest.Queue, msgs ...*azservicebus.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := q.Send(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	if err := q.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
}

func onlyClaim(t *testing.T, store *sbclaim.Store) *sbclaim.Claim {
	t.Helper()
	claims, err := store.Claims(context.Background(), sbclaim.ClaimFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(claims) != 1 {
		t.Fatalf("%d claims, want 1", len(claims))
	}
	return claims[0]
}

// The producer sent the event twice: Stripe sees one request, one charge,
// and both copies are completed.
func TestDuplicateChargesOnce(t *testing.T) {
	queue, store, api := setup(t, nil)
	sendAndWait(t, queue, payment("order-42", 42, 1999), payment("order-42", 42, 1999))

	keys, charges, _, _ := api.seen()
	cl := onlyClaim(t, store)
	if len(keys) != 1 || keys[0] != cl.IdempotencyKey || charges != 1 {
		t.Errorf("Stripe saw keys %q and created %d PaymentIntents: want one request with the claim's key %q, one charge",
			keys, charges, cl.IdempotencyKey)
	}
	if cl.State != sbclaim.StateProcessed {
		t.Errorf("claim %s, want processed", cl.State)
	}
	if got := queue.Completed(); len(got) != 2 {
		t.Errorf("completed %v, want both copies", got)
	}
}

// A card decline is Stripe's final answer: the claim fails and the message
// is dead-lettered once, EffectRejected, after one request.
func TestDeclineIsDeadLetteredOnce(t *testing.T) {
	queue, store, api := setup(t, nil)
	sendAndWait(t, queue, payment("order-7", 7, declinedAmount))

	keys, charges, declines, _ := api.seen()
	if len(keys) != 1 || declines != 1 || charges != 0 {
		t.Errorf("Stripe saw %d requests, %d declines, %d charges: want one declined request", len(keys), declines, charges)
	}
	dead := queue.DeadLetters()
	if len(dead) != 1 || dead[0].DeadLetterReason == nil || *dead[0].DeadLetterReason != "EffectRejected" {
		t.Fatalf("dead letters %v, want order-7 once with reason EffectRejected", dead)
	}
	if cl := onlyClaim(t, store); cl.State != sbclaim.StateFailed || cl.FailReason != "EffectRejected" {
		t.Errorf("claim %s %s, want failed EffectRejected", cl.State, cl.FailReason)
	}
}

// The replica dies after Stripe charged the card, before sbclaim recorded
// it: the redelivery takes the claim over and sends the same request with
// the same key, and Stripe replays the PaymentIntent instead of charging
// again.
func TestCrashAfterChargeIsReplayed(t *testing.T) {
	queue, store, api := setup(t, &sbclaimtest.QueueOptions{LockDuration: 500 * time.Millisecond}, sbclaimtest.CrashAfterEffect(1))
	sendAndWait(t, queue, payment("order-9", 9, 2500))

	keys, charges, _, replays := api.seen()
	if len(keys) != 2 || keys[0] != keys[1] {
		t.Fatalf("Stripe saw keys %q: want the request twice with one key", keys)
	}
	if charges != 1 || replays != 1 {
		t.Errorf("%d charges, %d replays: want one charge, replayed once", charges, replays)
	}
	if cl := onlyClaim(t, store); cl.State != sbclaim.StateProcessed || cl.TakeOvers != 1 {
		t.Errorf("claim %s after %d take-overs, want processed after one", cl.State, cl.TakeOvers)
	}
	if got := queue.Completed(); len(got) != 1 {
		t.Errorf("completed %v, want order-9 once", got)
	}
}

// A failure Stripe stored under the key is replayed to every repeat with
// Idempotent-Replayed: true. The handler says a person must decide: the
// claim is flagged at the first replay, with its answer, and the message
// completed; not retried until the broker gives up.
func TestStoredFailureIsFlaggedAtTheFirstReplay(t *testing.T) {
	queue, store, api := setup(t, nil)
	sendAndWait(t, queue, payment("order-6", 6, failedAmount))

	keys, charges, _, replays := api.seen()
	if len(keys) != 2 || keys[0] != keys[1] || charges != 0 || replays != 1 {
		t.Errorf("Stripe saw keys %q, %d charges, %d replays: want the failure and one replay, one key", keys, charges, replays)
	}
	cl := onlyClaim(t, store)
	if cl.State != sbclaim.StateFlagged || cl.Answer == nil || cl.Answer.Status != 500 || cl.Answer.Headers["Idempotent-Replayed"] != "true" {
		t.Errorf("claim %s, answer %+v: want flagged with the replayed 500", cl.State, cl.Answer)
	}
	if got := queue.Completed(); len(got) != 1 || len(queue.DeadLetters()) != 0 {
		t.Errorf("completed %v, dead letters %d: want order-6 completed once", got, len(queue.DeadLetters()))
	}
}

// A 429 means Stripe did nothing: NotPerformed, and the next attempt, with
// the same key, charges once.
func TestRateLimitedIsNotPerformed(t *testing.T) {
	queue, store, api := setup(t, nil)
	api.mu.Lock()
	api.limit = 1
	api.mu.Unlock()
	sendAndWait(t, queue, payment("order-5", 5, 1000))

	keys, charges, _, replays := api.seen()
	if len(keys) != 2 || keys[0] != keys[1] || charges != 1 || replays != 0 {
		t.Errorf("Stripe saw keys %q, %d charges, %d replays: want two requests with one key, one charge", keys, charges, replays)
	}
	if cl := onlyClaim(t, store); cl.State != sbclaim.StateProcessed {
		t.Errorf("claim %s, want processed", cl.State)
	}
}
