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
// returns the queue, the claims store and the test Stripe API. The route's
// delayed retries and breaker probe are quick (tens of milliseconds), so a
// postponed payment is tried again within the test.
func setup(t *testing.T, qopts *sbclaimtest.QueueOptions, opts ...sbclaimtest.Option) (*sbclaimtest.Queue, *sbclaim.Store, *stripeAPI) {
	t.Helper()
	api, sc := newStripe(t)
	router, err := sbclaim.NewRouter(sbclaim.Route{
		Name: "charge", Match: sbclaim.MatchSubject("payment.requested"), Handler: Charge(sc), JSONBody: true,
		Backoff: sbclaim.Backoff{First: 20 * time.Millisecond, Factor: 1, Max: 20 * time.Millisecond},
		Breaker: sbclaim.Breaker{ProbeAfter: 50 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	store := sbclaimtest.NewStore(t)
	queue := sbclaimtest.NewQueue(qopts)
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "billing", Store: store, Router: router, DeferPollInterval: 10 * time.Millisecond}, queue, opts...)
	return queue, store, api
}

// waitClaim waits until the only claim is in state (a postponed payment
// is settled by a later fetch, after the queue went idle once).
func waitClaim(t *testing.T, store *sbclaim.Store, state sbclaim.ClaimState) *sbclaim.Claim {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		claims, err := store.Claims(context.Background(), sbclaim.ClaimFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(claims) == 1 && claims[0].State == state {
			return claims[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("claims %v: want one, %s", claims, state)
		}
		time.Sleep(10 * time.Millisecond)
	}
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

// A 401 (a wrong or rotated API key) is the route's configuration, not the
// payment's fault: Misconfigured opens the route's breaker, the payment is
// postponed, not failed, and once the key works the probe charges it once,
// with the same idempotency key. Nothing is dead-lettered.
func TestUnauthorizedPostponesThenCharges(t *testing.T) {
	queue, store, api := setup(t, nil)
	api.mu.Lock()
	api.unauthorized = 1
	api.mu.Unlock()
	sendAndWait(t, queue, payment("order-11", 11, 1100))
	cl := waitClaim(t, store, sbclaim.StateProcessed)

	keys, charges, _, _ := api.seen()
	if len(keys) != 2 || keys[0] != keys[1] || keys[0] != cl.IdempotencyKey || charges != 1 {
		t.Errorf("Stripe saw keys %q and created %d PaymentIntents: want the 401, then one charge, one key", keys, charges)
	}
	if len(queue.DeadLetters()) != 0 || cl.FailReason != "" {
		t.Errorf("dead letters %d, fail reason %q: a 401 must never fail a payment", len(queue.DeadLetters()), cl.FailReason)
	}
}

// 409 idempotency_key_in_use: another request with the same key is still
// running at Stripe (a take-over during a slow call). Not performed: the
// payment is retried with the same key and charged once.
func TestIdempotencyKeyInUseIsRetriedWithTheSameKey(t *testing.T) {
	queue, store, api := setup(t, nil)
	api.mu.Lock()
	api.inUse = 1
	api.mu.Unlock()
	sendAndWait(t, queue, payment("order-12", 12, 1200))
	cl := waitClaim(t, store, sbclaim.StateProcessed)

	keys, charges, _, _ := api.seen()
	if len(keys) != 2 || keys[0] != keys[1] || charges != 1 {
		t.Errorf("Stripe saw keys %q and created %d PaymentIntents: want the 409, then one charge, one key", keys, charges)
	}
	if len(queue.DeadLetters()) != 0 || cl.FailReason != "" {
		t.Errorf("dead letters %d, fail reason %q: want none", len(queue.DeadLetters()), cl.FailReason)
	}
}

// 400 idempotency_error: Stripe saw this key with other parameters. A key
// conflict is final: the claim fails and the message is dead-lettered
// once, IdempotencyKeyConflict, after one request.
func TestIdempotencyErrorIsAKeyConflict(t *testing.T) {
	queue, store, api := setup(t, nil)
	api.mu.Lock()
	api.conflict = 1
	api.mu.Unlock()
	sendAndWait(t, queue, payment("order-13", 13, 1300))

	keys, charges, _, _ := api.seen()
	if len(keys) != 1 || charges != 0 {
		t.Errorf("Stripe saw %d requests, %d charges: want one refused request", len(keys), charges)
	}
	dead := queue.DeadLetters()
	if len(dead) != 1 || dead[0].DeadLetterReason == nil || *dead[0].DeadLetterReason != "IdempotencyKeyConflict" {
		t.Fatalf("dead letters %v, want order-13 once with reason IdempotencyKeyConflict", dead)
	}
	if cl := onlyClaim(t, store); cl.State != sbclaim.StateFailed || cl.FailReason != "IdempotencyKeyConflict" {
		t.Errorf("claim %s %s, want failed IdempotencyKeyConflict", cl.State, cl.FailReason)
	}
}
