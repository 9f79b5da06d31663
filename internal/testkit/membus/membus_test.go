package membus_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// receiver is the interface the processor depends on; both the SDK's
// receiver and membus's must satisfy it.
type receiver interface {
	ReceiveMessages(ctx context.Context, maxMessages int, options *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	CompleteMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.CompleteMessageOptions) error
	AbandonMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.AbandonMessageOptions) error
	DeadLetterMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.DeadLetterOptions) error
	RenewMessageLock(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.RenewMessageLockOptions) error
	Close(ctx context.Context) error
}

var (
	_ receiver = (*azservicebus.Receiver)(nil)
	_ receiver = (*membus.Receiver)(nil)
)

// sender is the SDK Sender method membus queues and topics share.
type sender interface {
	SendMessage(ctx context.Context, message *azservicebus.Message, options *azservicebus.SendMessageOptions) error
}

var (
	_ sender = (*azservicebus.Sender)(nil)
	_ sender = (*membus.Queue)(nil)
	_ sender = (*membus.Topic)(nil)
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func send(t *testing.T, s sender, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if err := s.SendMessage(t.Context(), &azservicebus.Message{MessageID: &id, Body: []byte("body-" + id)}, nil); err != nil {
			t.Fatalf("send %s: %v", id, err)
		}
	}
}

func receiveOne(t *testing.T, r receiver) *azservicebus.ReceivedMessage {
	t.Helper()
	msgs, err := r.ReceiveMessages(testCtx(t), 1, nil)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("receive: %d messages, err %v", len(msgs), err)
	}
	return msgs[0]
}

func wantCode(t *testing.T, err error, code azservicebus.Code) {
	t.Helper()
	var sbErr *azservicebus.Error
	if !errors.As(err, &sbErr) || sbErr.Code != code {
		t.Fatalf("error = %v, want *azservicebus.Error with code %q", err, code)
	}
}

func TestPeekLockComplete(t *testing.T) {
	t.Parallel()
	q := membus.NewQueue("q", membus.QueueOptions{})
	r := q.NewReceiver()
	id, subject := "m1", "order.created"
	err := q.SendMessage(t.Context(), &azservicebus.Message{
		MessageID: &id, Body: []byte(`{"n":1}`), Subject: &subject,
		ApplicationProperties: map[string]any{"ce_source": "shop"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := receiveOne(t, r)
	if m.MessageID != id || string(m.Body) != `{"n":1}` || *m.Subject != subject || m.ApplicationProperties["ce_source"] != "shop" {
		t.Fatalf("properties not carried: %+v", m)
	}
	if m.DeliveryCount != 1 || m.LockToken == ([16]byte{}) || !m.LockedUntil.After(time.Now()) ||
		*m.SequenceNumber != 1 || m.EnqueuedTime == nil || m.State != azservicebus.MessageStateActive {
		t.Fatalf("broker properties wrong: %+v", m)
	}
	if s := q.Stats(); s.Locked != 1 || s.Active != 0 {
		t.Fatalf("stats %+v", s)
	}
	if err := r.CompleteMessage(t.Context(), m, nil); err != nil {
		t.Fatal(err)
	}
	wantCode(t, r.CompleteMessage(t.Context(), m, nil), azservicebus.CodeLockLost)
	if s := q.Stats(); s.Completed != 1 || s.LockLosses != 1 || !q.Drained() {
		t.Fatalf("stats %+v", s)
	}
	if got := q.Completed(); len(got) != 1 || got[0] != id {
		t.Fatalf("Completed() = %v", got)
	}

	// A nil MessageID gets one, as the service assigns.
	if err := q.SendMessage(t.Context(), &azservicebus.Message{}, nil); err != nil {
		t.Fatal(err)
	}
	if m := receiveOne(t, r); m.MessageID == "" || *m.SequenceNumber != 2 {
		t.Fatalf("generated id %q, seq %d", m.MessageID, *m.SequenceNumber)
	}
}

func TestAbandonRedelivers(t *testing.T) {
	t.Parallel()
	q := membus.NewQueue("q", membus.QueueOptions{})
	r := q.NewReceiver()
	send(t, q, "m1")
	first := receiveOne(t, r)
	err := r.AbandonMessage(t.Context(), first, &azservicebus.AbandonMessageOptions{PropertiesToModify: map[string]any{"attempt": 1}})
	if err != nil {
		t.Fatal(err)
	}
	second := receiveOne(t, r)
	if second.MessageID != "m1" || second.DeliveryCount != 2 || second.LockToken == first.LockToken || second.ApplicationProperties["attempt"] != 1 {
		t.Fatalf("redelivery %+v", second)
	}
	if first.DeliveryCount != 1 {
		t.Fatal("a delivery must not change after it was handed out")
	}
	wantCode(t, r.CompleteMessage(t.Context(), first, nil), azservicebus.CodeLockLost)
	if err := r.CompleteMessage(t.Context(), second, nil); err != nil {
		t.Fatal(err)
	}
}

func TestLockExpiryRedelivers(t *testing.T) {
	t.Parallel()
	q := membus.NewQueue("q", membus.QueueOptions{LockDuration: 100 * time.Millisecond})
	a, b := q.NewReceiver(), q.NewReceiver()
	send(t, q, "m1")
	first := receiveOne(t, a)
	second := receiveOne(t, b) // blocks until the first lock runs out
	if second.MessageID != "m1" || second.DeliveryCount != 2 {
		t.Fatalf("redelivery %+v", second)
	}
	err := a.CompleteMessage(t.Context(), first, nil)
	wantCode(t, err, azservicebus.CodeLockLost)
	wantCode(t, a.RenewMessageLock(t.Context(), first, nil), azservicebus.CodeLockLost)
	// Settlement goes by lock token, so any receiver may settle.
	if err := a.CompleteMessage(t.Context(), second, nil); err != nil {
		t.Fatal(err)
	}
	if s := q.Stats(); s.LockExpiries != 1 || s.LockLosses != 2 || s.Redeliveries != 1 || s.Completed != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestRenewKeepsLock(t *testing.T) {
	t.Parallel()
	const lock = 400 * time.Millisecond
	q := membus.NewQueue("q", membus.QueueOptions{LockDuration: lock})
	a, b := q.NewReceiver(), q.NewReceiver()
	send(t, q, "m1")
	m := receiveOne(t, a)
	before := *m.LockedUntil

	ctx, cancel := context.WithCancel(t.Context())
	renewed := make(chan error, 1)
	go func() {
		tick := time.NewTicker(lock / 20)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				renewed <- nil
				return
			case <-tick.C:
				if err := a.RenewMessageLock(t.Context(), m, nil); err != nil {
					renewed <- err
					return
				}
			}
		}
	}()
	rctx, rcancel := context.WithTimeout(t.Context(), 4*lock)
	defer rcancel()
	msgs, err := b.ReceiveMessages(rctx, 1, nil)
	cancel()
	if err := <-renewed; err != nil {
		t.Fatalf("renew: %v", err)
	}
	if len(msgs) != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("renewed message was redelivered: %d messages, err %v", len(msgs), err)
	}
	if !m.LockedUntil.After(before) {
		t.Fatal("RenewMessageLock did not update LockedUntil")
	}
	if err := a.CompleteMessage(t.Context(), m, nil); err != nil {
		t.Fatal(err)
	}
}

func TestMaxDeliveryCountDeadLetters(t *testing.T) {
	t.Parallel()
	q := membus.NewQueue("q", membus.QueueOptions{MaxDeliveryCount: 3, LockDuration: 100 * time.Millisecond})
	r := q.NewReceiver()
	send(t, q, "abandoned", "expired")
	for range 3 {
		m := receiveOne(t, r)
		if err := r.AbandonMessage(t.Context(), m, nil); err != nil {
			t.Fatal(err)
		}
	}
	// The second message is never settled: its lock runs out three times.
	for i := range 3 {
		if m := receiveOne(t, r); m.MessageID != "expired" || m.DeliveryCount != uint32(i+1) {
			t.Fatalf("delivery %d: %s count %d", i+1, m.MessageID, m.DeliveryCount)
		}
	}
	if err := q.WaitIdle(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	dls := q.DeadLetters()
	if len(dls) != 2 {
		t.Fatalf("%d dead letters", len(dls))
	}
	for _, m := range dls {
		if *m.DeadLetterReason != membus.ReasonMaxDeliveryCountExceeded || m.DeliveryCount != 3 ||
			*m.DeadLetterErrorDescription != "Message could not be consumed after 3 delivery attempts." {
			t.Fatalf("dead letter %s: %s / %s, count %d", m.MessageID, *m.DeadLetterReason, *m.DeadLetterErrorDescription, m.DeliveryCount)
		}
	}
	if s := q.Stats(); s.DeadLettered != 2 || s.DeadLetterReasons[membus.ReasonMaxDeliveryCountExceeded] != 2 {
		t.Fatalf("stats %+v", s)
	}
}

func TestDeadLetterExplicit(t *testing.T) {
	t.Parallel()
	q := membus.NewQueue("q", membus.QueueOptions{})
	r := q.NewReceiver()
	send(t, q, "m1")
	m := receiveOne(t, r)
	reason, desc := "IdempotencyKeyConflict", "same key, different payload"
	err := r.DeadLetterMessage(t.Context(), m, &azservicebus.DeadLetterOptions{
		Reason: &reason, ErrorDescription: &desc, PropertiesToModify: map[string]any{"consumer": "billing"},
	})
	if err != nil {
		t.Fatal(err)
	}
	dls := q.DeadLetters()
	if len(dls) != 1 || *dls[0].DeadLetterReason != reason || *dls[0].DeadLetterErrorDescription != desc ||
		dls[0].ApplicationProperties["consumer"] != "billing" || string(dls[0].Body) != "body-m1" {
		t.Fatalf("dead letters %+v", dls)
	}
	wantCode(t, r.CompleteMessage(t.Context(), m, nil), azservicebus.CodeLockLost)
	if !q.Drained() || q.Stats().DeadLetterReasons[reason] != 1 {
		t.Fatalf("stats %+v", q.Stats())
	}
}

func TestClosedReceiver(t *testing.T) {
	t.Parallel()
	q := membus.NewQueue("q", membus.QueueOptions{})
	r := q.NewReceiver()
	send(t, q, "m1")
	m := receiveOne(t, r)

	blocked := make(chan error, 1)
	go func() {
		_, err := r.ReceiveMessages(t.Context(), 1, nil)
		blocked <- err
	}()
	// Give the receive time to block. Whether it blocked before Close or
	// started after it, it must fail with CodeClosed.
	time.Sleep(20 * time.Millisecond)
	if err := r.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantCode(t, <-blocked, azservicebus.CodeClosed)
	_, err := r.ReceiveMessages(t.Context(), 1, nil)
	wantCode(t, err, azservicebus.CodeClosed)
	wantCode(t, r.CompleteMessage(t.Context(), m, nil), azservicebus.CodeClosed)
	wantCode(t, r.AbandonMessage(t.Context(), m, nil), azservicebus.CodeClosed)
	wantCode(t, r.DeadLetterMessage(t.Context(), m, nil), azservicebus.CodeClosed)
	wantCode(t, r.RenewMessageLock(t.Context(), m, nil), azservicebus.CodeClosed)
	if err := r.Close(t.Context()); err != nil {
		t.Fatal("second Close:", err)
	}
	// The closed receiver's lock stays until it runs out (forced here), then
	// another receiver gets the message.
	if s := q.Stats(); s.Locked != 1 {
		t.Fatalf("stats after Close %+v", s)
	}
	q.ExpireLock("m1")
	if m2 := receiveOne(t, q.NewReceiver()); m2.MessageID != "m1" || m2.DeliveryCount != 2 {
		t.Fatalf("redelivery %+v", m2)
	}
}

func TestFaults(t *testing.T) {
	t.Parallel()
	q := membus.NewQueue("q", membus.QueueOptions{})
	r := q.NewReceiver()
	send(t, q, "m1")

	q.FailReceives(2, azservicebus.CodeConnectionLost)
	for range 2 {
		_, err := r.ReceiveMessages(t.Context(), 1, nil)
		wantCode(t, err, azservicebus.CodeConnectionLost)
	}
	m := receiveOne(t, r)

	q.FailSettlements(1)
	q.FailRenewals(1)
	wantCode(t, r.RenewMessageLock(t.Context(), m, nil), azservicebus.CodeConnectionLost)
	wantCode(t, r.CompleteMessage(t.Context(), m, nil), azservicebus.CodeConnectionLost)
	if s := q.Stats(); s.Locked != 1 || s.Completed != 0 {
		t.Fatalf("a failed settlement must not settle: %+v", s)
	}
	if err := r.CompleteMessage(t.Context(), m, nil); err != nil {
		t.Fatal(err)
	}

	q.DuplicateSends(true)
	send(t, q, "dup")
	q.DuplicateSends(false)
	msgs, err := r.ReceiveMessages(testCtx(t), 10, nil)
	if err != nil || len(msgs) != 2 || msgs[0].MessageID != "dup" || msgs[1].MessageID != "dup" ||
		*msgs[0].SequenceNumber == *msgs[1].SequenceNumber {
		t.Fatalf("duplicate send: %d messages, err %v", len(msgs), err)
	}

	if n := q.ExpireLock("dup"); n != 2 {
		t.Fatalf("ExpireLock expired %d locks, want 2", n)
	}
	wantCode(t, r.CompleteMessage(t.Context(), msgs[0], nil), azservicebus.CodeLockLost)
	msgs, err = r.ReceiveMessages(testCtx(t), 10, nil)
	if err != nil || len(msgs) != 2 || msgs[0].DeliveryCount != 2 {
		t.Fatalf("after ExpireLock: %d messages, err %v", len(msgs), err)
	}
	if n := q.ExpireAllLocks(); n != 2 {
		t.Fatalf("ExpireAllLocks expired %d locks, want 2", n)
	}
	s := q.Stats()
	if s.ReceiveFaults != 2 || s.SettleFaults != 1 || s.RenewFaults != 1 || s.Sent != 3 || s.Active != 2 || s.LockExpiries != 4 {
		t.Fatalf("stats %+v", s)
	}
}

func TestReceiveMessagesMaxAndContext(t *testing.T) {
	t.Parallel()
	q := membus.NewQueue("q", membus.QueueOptions{})
	r := q.NewReceiver()
	send(t, q, "1", "2", "3", "4", "5")
	msgs, err := r.ReceiveMessages(testCtx(t), 3, nil)
	if err != nil || len(msgs) != 3 || msgs[0].MessageID != "1" || msgs[2].MessageID != "3" {
		t.Fatalf("max 3: %d messages, err %v", len(msgs), err)
	}
	msgs, err = r.ReceiveMessages(testCtx(t), 10, &azservicebus.ReceiveMessagesOptions{TimeAfterFirstMessage: time.Millisecond})
	if err != nil || len(msgs) != 2 {
		t.Fatalf("max 10 of 2: %d messages, err %v", len(msgs), err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	msgs, err = r.ReceiveMessages(ctx, 1, nil)
	if len(msgs) != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("empty queue: %d messages, err %v", len(msgs), err)
	}
	// A cancelled caller gets nothing locked, even when messages wait.
	send(t, q, "6")
	msgs, err = r.ReceiveMessages(ctx, 1, nil)
	if len(msgs) != 0 || err == nil || q.Stats().Locked != 5 {
		t.Fatalf("cancelled ctx: %d messages, err %v, stats %+v", len(msgs), err, q.Stats())
	}
	if _, err := r.ReceiveMessages(t.Context(), 0, nil); err == nil {
		t.Fatal("maxMessages 0 accepted")
	}
}

func TestTopicFansOut(t *testing.T) {
	t.Parallel()
	topic := membus.NewTopic("orders")
	billing := topic.Subscription("billing", membus.QueueOptions{})
	shipping := topic.Subscription("shipping", membus.QueueOptions{})
	if err := topic.SendMessage(t.Context(), &azservicebus.Message{Body: []byte("x")}, nil); err != nil {
		t.Fatal(err)
	}
	a, b := receiveOne(t, billing.NewReceiver()), receiveOne(t, shipping.NewReceiver())
	if a.MessageID == "" || a.MessageID != b.MessageID || topic.Subscription("billing", membus.QueueOptions{}) != billing {
		t.Fatalf("fan-out: %q vs %q", a.MessageID, b.MessageID)
	}
}

// TestConcurrentReceivers runs 10 receivers on one queue of 1000 messages,
// abandoning some first deliveries, and checks every message is completed
// exactly once and none is lost.
func TestConcurrentReceivers(t *testing.T) {
	t.Parallel()
	const receivers, messages = 10, 1000
	q := membus.NewQueue("q", membus.QueueOptions{})
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()

	var mu sync.Mutex
	completed := map[string]int{}
	var wg sync.WaitGroup
	errs := make(chan error, receivers)
	for range receivers {
		r := q.NewReceiver()
		wg.Go(func() {
			defer r.Close(context.Background())
			for {
				msgs, err := r.ReceiveMessages(ctx, 10, nil)
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				for _, m := range msgs {
					if m.DeliveryCount == 1 && *m.SequenceNumber%7 == 0 {
						err = r.AbandonMessage(ctx, m, nil)
					} else {
						err = r.CompleteMessage(ctx, m, nil)
						mu.Lock()
						completed[m.MessageID]++
						mu.Unlock()
					}
					if err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	for i := range messages {
		send(t, q, fmt.Sprint(i))
	}
	if err := q.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(completed) != messages {
		t.Fatalf("%d distinct messages completed, want %d", len(completed), messages)
	}
	for id, n := range completed {
		if n != 1 {
			t.Errorf("message %s completed %d times", id, n)
		}
	}
	if s := q.Stats(); s.Completed != messages || s.Abandoned != messages/7 || s.DeadLettered != 0 || s.LockLosses != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestUnreachableBroker: while the broker is unreachable nothing is
// delivered (the receive blocks until its context ends), a peek and a
// settlement fail with CodeConnectionLost, and locks still run out;
// afterwards delivery resumes.
func TestUnreachableBroker(t *testing.T) {
	q := membus.NewQueue("q", membus.QueueOptions{LockDuration: time.Minute})
	id := "m1"
	if err := q.SendMessage(context.Background(), &azservicebus.Message{MessageID: &id}, nil); err != nil {
		t.Fatal(err)
	}
	r := q.NewReceiver()
	got, err := r.PeekMessages(context.Background(), 10, nil)
	if err != nil || len(got) != 1 || got[0].MessageID != "m1" || got[0].LockedUntil != nil {
		t.Fatalf("peek: %v %v", got, err)
	}
	msgs, err := r.ReceiveMessages(context.Background(), 1, nil)
	if err != nil || len(msgs) != 1 {
		t.Fatal(msgs, err)
	}
	q.SetUnreachable(true)
	var sbErr *azservicebus.Error
	if err := r.CompleteMessage(context.Background(), msgs[0], nil); !errors.As(err, &sbErr) || sbErr.Code != azservicebus.CodeConnectionLost {
		t.Fatalf("complete while unreachable: %v", err)
	}
	if _, err := r.PeekMessages(context.Background(), 1, nil); !errors.As(err, &sbErr) || sbErr.Code != azservicebus.CodeConnectionLost {
		t.Fatalf("peek while unreachable: %v", err)
	}
	q.ExpireLock("m1") // the lock runs out meanwhile; the message is available again
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if got, err := r.ReceiveMessages(ctx, 1, nil); err == nil || len(got) != 0 {
		t.Fatalf("receive while unreachable: %v %v, want nothing until the context ends", got, err)
	}
	q.SetUnreachable(false)
	msgs, err = r.ReceiveMessages(context.Background(), 1, nil)
	if err != nil || len(msgs) != 1 || msgs[0].DeliveryCount != 2 {
		t.Fatalf("receive after the outage: %v %v", msgs, err)
	}
}
