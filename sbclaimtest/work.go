package sbclaimtest

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/bridge"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/operator"
)

// SendAndWait sends msgs and waits (a minute at most) until the queue is
// idle: every message completed or dead-lettered, none locked or
// deferred. It ends the test on a failure.
func (q *Queue) SendAndWait(t testing.TB, msgs ...*azservicebus.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := q.Send(ctx, msgs...); err != nil {
		t.Fatalf("sbclaimtest: send: %v", err)
	}
	if err := q.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
}

// Message builds a message with MessageId id and Subject subject (none
// when ""). A []byte, string or json.RawMessage body is sent as it is;
// any other value is encoded as JSON (ContentType application/json). A
// value that does not encode ends the test.
func Message(t testing.TB, id, subject string, body any) *azservicebus.Message {
	t.Helper()
	m := &azservicebus.Message{MessageID: &id}
	if subject != "" {
		m.Subject = &subject
	}
	switch b := body.(type) {
	case []byte:
		m.Body = b
	case string:
		m.Body = []byte(b)
	case json.RawMessage:
		m.Body = b
	default:
		enc, err := json.Marshal(body)
		if err != nil {
			t.Fatalf("sbclaimtest: message %s: body: %v", id, err)
		}
		ct := "application/json"
		m.Body, m.ContentType = enc, &ct
	}
	return m
}

// ClaimByKey returns the claim of the message whose dedup key (its
// MessageId by default) is key, or nil when there is none. It ends the
// test when the store cannot be read, or when several consumers hold a
// claim on the key (filter those with Store.AllClaims).
func ClaimByKey(t testing.TB, store *sbclaim.Store, key string) *sbclaim.Claim {
	t.Helper()
	var found []*sbclaim.Claim
	for c, err := range store.AllClaims(context.Background(), sbclaim.ClaimFilter{}) {
		if err != nil {
			t.Fatalf("sbclaimtest: claims: %v", err)
		}
		if c.DedupKey == key {
			found = append(found, c)
		}
	}
	switch len(found) {
	case 0:
		return nil
	case 1:
		return found[0]
	}
	t.Fatalf("sbclaimtest: %d claims hold key %q (one per consumer): read them with Store.AllClaims", len(found), key)
	return nil
}

// Settlement is how the processor settled a delivery.
type Settlement string

// The settlements.
const (
	Completed    Settlement = "completed"     // done: processed, or a duplicate of a settled claim
	Abandoned    Settlement = "abandoned"     // handed back for a redelivery
	DeadLettered Settlement = "dead-lettered" // see Result.DeadLetterReason
	Deferred     Settlement = "deferred"      // postponed: a delayed retry (Backoff)
)

// Result is what became of the one delivery Work ran.
type Result struct {
	Settlement Settlement
	// DeadLetterReason and DeadLetterDescription are the dead letter's
	// (DeadLettered only).
	DeadLetterReason, DeadLetterDescription string
	// Calls is how many times the handler ran in this delivery (the
	// in-delivery retries included; 0: it did not run — a duplicate, no
	// route, bad input, an open breaker).
	Calls int
	// Outcome and Err are the handler's last attempt's: its outcome as
	// the processor classified it, and the error it returned (a panic is
	// unknown, with an error saying so). Outcome is "" when it did not
	// run.
	Outcome sbclaim.Outcome
	Err     error
	// Claim is the message's claim after the delivery, and History its
	// history (nil: no claim, as for a transactional handler whose
	// attempt rolled back, or a message refused before its claim).
	Claim   *sbclaim.Claim
	History []operator.HistoryEntry
}

// Work runs one delivery of msg through a real processor (claim,
// handler, record, settle) and returns what happened, once the processor
// settled it — the synchronous way to unit-test a handler:
//
//	res := sbclaimtest.Work(t, sbclaim.ProcessorConfig{Router: router}, sbclaimtest.Message(t, "order-1", "", order))
//	if res.Outcome != sbclaim.OutcomeOK || res.Claim.State != sbclaim.StateProcessed { ... }
//
// cfg takes Start's test values for what it leaves zero, and a new
// store (NewStore) when it has none; pass the same Store to several Work
// calls to see a duplicate, a take-over or a repeat. The message is
// delivered once (DeliveryCount 1): a message the processor defers or
// abandons is not fetched again (Settlement says which, the claim when it
// is due). Work ends the test when the processor does not settle the
// delivery within a minute, or when the claim cannot be read.
func Work(t testing.TB, cfg sbclaim.ProcessorConfig, msg *azservicebus.Message) *Result {
	t.Helper()
	if cfg.Store == nil {
		cfg.Store = NewStore(t)
	}
	if cfg.Router == nil {
		t.Fatal("sbclaimtest: Work: cfg.Router is required")
	}
	res := &Result{}
	var mu sync.Mutex
	var claimID int64
	router := bridge.RouterOf(cfg.Router)
	cfg.Router = bridge.NewRouter(fastRouter{inner: router, observe: func(ctx context.Context, err error) {
		mu.Lock()
		defer mu.Unlock()
		res.Calls++
		res.Err = err
		res.Outcome = sbclaim.Outcome(sideeffects.Classify(err).String())
		if c, ok := sideeffects.CallOf(ctx); ok {
			claimID = c.ClaimID
		}
	}}).(*sbclaim.Router)
	cfg = testConfig(t, cfg)
	q := NewQueue(nil)
	settled := make(chan struct{})
	state := &onceState{mu: &mu, res: res, settled: settled}
	cfg.NewReceiver = func(ctx context.Context) (sbclaim.Receiver, error) {
		inner, err := q.NewReceiver(ctx)
		if err != nil {
			return nil, err
		}
		return &onceReceiver{Receiver: inner, s: state}, nil
	}
	if err := q.Send(context.Background(), msg); err != nil {
		t.Fatalf("sbclaimtest: Work: send: %v", err)
	}
	stop := run(t, cfg, options{})
	t.Cleanup(stop)
	select {
	case <-settled:
	case <-time.After(time.Minute):
		stop()
		t.Fatalf("sbclaimtest: Work: the delivery was not settled within a minute (%+v)", q.q.Stats())
	}
	stop()

	ctx := context.Background()
	mu.Lock()
	id := claimID
	mu.Unlock()
	var c *sbclaim.Claim
	if id != 0 {
		var err error
		if c, err = cfg.Store.Claim(ctx, id); err != nil && !errors.Is(err, sbclaim.ErrNotFound) {
			t.Fatalf("sbclaimtest: Work: claim %d: %v", id, err)
		}
	} else if msg.MessageID != nil {
		c = claimOf(t, cfg.Store, cfg.Consumer, *msg.MessageID)
	}
	if c != nil {
		h, err := operator.History(ctx, cfg.Store, c.ID)
		if err != nil {
			t.Fatalf("sbclaimtest: Work: history of claim %d: %v", c.ID, err)
		}
		res.Claim, res.History = c, h
	}
	return res
}

// claimOf returns consumer's claim on key, or nil.
func claimOf(t testing.TB, st *sbclaim.Store, consumer, key string) *sbclaim.Claim {
	t.Helper()
	for c, err := range st.AllClaims(context.Background(), sbclaim.ClaimFilter{Consumer: consumer}) {
		if err != nil {
			t.Fatalf("sbclaimtest: Work: claims: %v", err)
		}
		if c.DedupKey == key {
			return c
		}
	}
	return nil
}

// onceState is what the receivers of one Work share.
type onceState struct {
	mu        *sync.Mutex
	res       *Result
	delivered bool
	settled   chan struct{}
	done      bool
}

// onceReceiver hands out one delivery, records its first settlement, and
// then receives nothing more (a deferred message is not fetched again).
type onceReceiver struct {
	sbclaim.Receiver
	s *onceState
}

func (r *onceReceiver) ReceiveMessages(ctx context.Context, n int, o *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	r.s.mu.Lock()
	delivered := r.s.delivered
	r.s.mu.Unlock()
	if delivered {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	msgs, err := r.Receiver.ReceiveMessages(ctx, 1, o)
	if len(msgs) > 0 {
		r.s.mu.Lock()
		r.s.delivered = true
		r.s.mu.Unlock()
	}
	return msgs, err
}

func (r *onceReceiver) ReceiveDeferredMessages(ctx context.Context, _ []int64, _ *azservicebus.ReceiveDeferredMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// settle records the first successful settlement.
func (r *onceReceiver) settle(err error, how Settlement, reason, desc *string) error {
	if err != nil {
		return err
	}
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if r.s.done {
		return nil
	}
	r.s.done = true
	r.s.res.Settlement = how
	if reason != nil {
		r.s.res.DeadLetterReason = *reason
	}
	if desc != nil {
		r.s.res.DeadLetterDescription = *desc
	}
	close(r.s.settled)
	return nil
}

func (r *onceReceiver) CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.CompleteMessageOptions) error {
	return r.settle(r.Receiver.CompleteMessage(ctx, m, o), Completed, nil, nil)
}

func (r *onceReceiver) AbandonMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.AbandonMessageOptions) error {
	return r.settle(r.Receiver.AbandonMessage(ctx, m, o), Abandoned, nil, nil)
}

func (r *onceReceiver) DeadLetterMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.DeadLetterOptions) error {
	var reason, desc *string
	if o != nil {
		reason, desc = o.Reason, o.ErrorDescription
	}
	return r.settle(r.Receiver.DeadLetterMessage(ctx, m, o), DeadLettered, reason, desc)
}

func (r *onceReceiver) DeferMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.DeferMessageOptions) error {
	return r.settle(r.Receiver.DeferMessage(ctx, m, o), Deferred, nil, nil)
}
