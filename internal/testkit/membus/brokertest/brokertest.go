// Package brokertest is the broker contract suite: the Service Bus
// behaviours the processor relies on, written once and run against every
// broker sbclaim is tested with. internal/testkit/membus runs it on every test run
// (membus's TestContract), so that the protocol tests and the chaos verdicts,
// which all run on membus, rest on a broker that was checked against the
// same list; TestServiceBusContract in this package runs it against a real
// namespace or the emulator when SBCLAIM_TEST_SERVICEBUS_CONNECTION_STRING
// is set.
//
// The behaviours, and what in the processor depends on them:
//
//   - peek-lock: a received message is locked to its receiver (another
//     receiver does not get it) until it is settled or its lock runs out;
//     DeliveryCount is 1 on the first delivery; LockedUntil is at least the
//     entity's lock duration after EnqueuedTime. The processor's lock
//     renewal interval comes from it.
//   - DeliveryCount grows by one on each redelivery, after an abandon and
//     after a lock ran out: the processor logs it and a take-over relies on
//     the redelivery happening at all.
//   - after MaxDeliveryCount deliveries the broker dead-letters the message
//     with reason MaxDeliveryCountExceeded and a description, readable from
//     the dead-letter queue; an explicit DeadLetterMessage keeps the
//     processor's reason and description (operators read them there).
//   - RenewMessageLock moves LockedUntil later (the processor renews while
//     an effect runs); renewing a settled delivery fails with CodeLockLost.
//   - settling or renewing a delivery whose lock ran out fails with
//     CodeLockLost, and does not touch the redelivery that replaced it (the
//     processor counts and logs a lost lock and lets the claim decide).
//   - a second settlement of a delivery: see Features.SecondSettlementIsNoOp.
//   - every subscription of a topic gets its own copy of each message, with
//     the same MessageID (one consumer per subscription, claims per consumer).
//   - deferral (the processor's delayed retries): a deferred message is not
//     delivered by ReceiveMessages; ReceiveDeferredMessages fetches it by
//     its sequence number, locked (it settles like any delivery), with
//     DeliveryCount + 1 (Features.DeferredReceiveCounts); a lock that ends
//     without settlement leaves it deferred; a sequence number that names
//     no deferred message (completed) fetches nothing; deferring in one
//     subscription leaves the other subscriptions' copies alone.
//   - sessions (the processor's session mode), on a session-enabled queue
//     (Harness.NewSessionQueue; skipped when nil): accept-next hands out
//     a session with messages and one receiver holds it at a time (a
//     second accept gets no session while the first holds it; Close
//     releases it at once); a session's messages arrive in the order
//     they were sent, and an abandoned one comes back before the next;
//     RenewSessionLock moves the session's LockedUntil later; session
//     state set by one holder is read by the next, and nil clears it; a
//     session whose lock ran out is accepted again with its unsettled
//     message (DeliveryCount + 1), and the old receiver's settlement
//     fails with CodeLockLost.
//
// As in the claim-store suite (internal/claim/claimtest), what differs
// between brokers is said per feature, in Features, and the suite checks
// each broker against what its harness declares.
package brokertest

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// Receiver is the part of *azservicebus.Receiver the processor uses (the
// same method set as processor.Receiver); *membus.Receiver has it too.
type Receiver interface {
	ReceiveMessages(ctx context.Context, maxMessages int, options *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	CompleteMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.CompleteMessageOptions) error
	AbandonMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.AbandonMessageOptions) error
	DeadLetterMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.DeadLetterOptions) error
	RenewMessageLock(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.RenewMessageLockOptions) error
	DeferMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.DeferMessageOptions) error
	ReceiveDeferredMessages(ctx context.Context, sequenceNumbers []int64, options *azservicebus.ReceiveDeferredMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	PeekMessages(ctx context.Context, maxMessageCount int, options *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	Close(ctx context.Context) error
}

var _ Receiver = (*azservicebus.Receiver)(nil)

// Sender sends to a queue or a topic (*azservicebus.Sender, *membus.Queue,
// *membus.Topic).
type Sender interface {
	SendMessage(ctx context.Context, message *azservicebus.Message, options *azservicebus.SendMessageOptions) error
}

var _ Sender = (*azservicebus.Sender)(nil)

// Entity is a queue or a topic subscription under test.
type Entity struct {
	// Sender sends to the queue; nil for a subscription (send to the topic).
	Sender Sender
	// NewReceiver opens a peek-lock receiver (closed by t.Cleanup).
	NewReceiver func(t *testing.T) Receiver
	// DeadLetter returns the dead-lettered copy of messageID, waiting for
	// it until ctx ends if the broker needs time, and fails the test if
	// there is none.
	DeadLetter func(ctx context.Context, t *testing.T, messageID string) *azservicebus.ReceivedMessage
	// Holds reports whether the entity still holds messageID (active or
	// locked, not dead-lettered). Nil: the suite does not check it.
	Holds func(ctx context.Context, t *testing.T, messageID string) bool
	// ExpireLock ends the lock of a delivery now, as if it had run out.
	// Nil: the suite waits for the real lock to run out, when LockDuration
	// is at most Harness.MaxLockWait, and skips the case otherwise.
	ExpireLock func(t *testing.T, m *azservicebus.ReceivedMessage)
	// LockDuration and MaxDeliveryCount are the entity's settings.
	LockDuration     time.Duration
	MaxDeliveryCount int
}

// SessionReceiver is the part of *azservicebus.SessionReceiver the
// processor's session mode uses; *membus.SessionReceiver has it too.
type SessionReceiver interface {
	SessionID() string
	LockedUntil() time.Time
	ReceiveMessages(ctx context.Context, maxMessages int, options *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	CompleteMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.CompleteMessageOptions) error
	AbandonMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.AbandonMessageOptions) error
	DeadLetterMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.DeadLetterOptions) error
	RenewSessionLock(ctx context.Context, options *azservicebus.RenewSessionLockOptions) error
	GetSessionState(ctx context.Context, options *azservicebus.GetSessionStateOptions) ([]byte, error)
	SetSessionState(ctx context.Context, state []byte, options *azservicebus.SetSessionStateOptions) error
	Close(ctx context.Context) error
}

var _ SessionReceiver = (*azservicebus.SessionReceiver)(nil)

// SessionEntity is a session-enabled queue under test.
type SessionEntity struct {
	Sender Sender
	// AcceptNext accepts the next session with messages, waiting until
	// ctx ends (a session-less wait fails with CodeTimeout or ctx's
	// error). The suite closes what it accepts.
	AcceptNext func(ctx context.Context) (SessionReceiver, error)
	// ExpireSessionLock ends r's session lock now. Nil: the suite waits
	// for the real lock to run out when LockDuration is at most
	// Harness.MaxLockWait, and skips the case otherwise.
	ExpireSessionLock func(t *testing.T, r SessionReceiver)
	LockDuration      time.Duration
}

// Topic is a topic and at least two of its subscriptions.
type Topic struct {
	Sender        Sender
	Subscriptions []Entity
}

// Harness tells the suite how to reach one broker.
type Harness struct {
	// NewQueue returns an empty queue for one case: a fresh one, or a
	// shared one drained of earlier messages (then set Sequential).
	NewQueue func(t *testing.T) Entity
	// NewTopic returns a topic whose subscriptions are empty.
	NewTopic func(t *testing.T) Topic
	// NewSessionQueue returns an empty session-enabled queue for one case
	// (nil: the session cases are skipped).
	NewSessionQueue func(t *testing.T) SessionEntity
	// Sequential runs the cases one at a time (entities are shared).
	Sequential bool
	// MaxLockWait is the longest lock the suite waits out when the entity
	// has no ExpireLock (default 30s).
	MaxLockWait time.Duration
	Features    Features
}

// Features says what differs between brokers.
type Features struct {
	// SecondSettlementIsNoOp: settling a delivery a second time (complete
	// after complete, or after an abandon or a dead-letter) returns nil and
	// changes nothing. True of the Go SDK on the link the message came
	// from: go-amqp marks the delivery settled once the broker answered
	// its first disposition, and sends nothing for a later one (go-amqp
	// v1.7 Receiver.messageDisposition). False of membus, which refuses it
	// with CodeLockLost, like the broker itself does for a lock token
	// settled through the management link. The processor settles each
	// delivery once and treats both answers alike (logged, counted as a
	// lost lock); the difference is recorded so that neither side changes
	// unnoticed.
	SecondSettlementIsNoOp bool
	// MaxDeliveryDescription, when set, is the exact
	// DeadLetterErrorDescription (a fmt format of the max delivery count)
	// the broker gives a message it dead-letters after too many
	// deliveries. Empty: only a non-empty description is required (the
	// emulator's text is not documented).
	MaxDeliveryDescription string
	// DeferredReceiveCounts: a delivery by ReceiveDeferredMessages counts
	// like any other (DeliveryCount + 1). membus models it so; for Service
	// Bus it is our reading of the service (a deferral counts against
	// MaxDeliveryCount: Azure/azure-service-bus#375), which a run against
	// a real namespace confirms or refutes.
	DeferredReceiveCounts bool
	// DeferredNotFoundCode, when set, is the code of the error
	// ReceiveDeferredMessages returns for a sequence number that names no
	// deferred message. Empty: an error or an empty result is accepted
	// (the service answers 404, which the SDK maps to CodeNotFound, or 204
	// "no messages", which it returns as a plain error).
	DeferredNotFoundCode azservicebus.Code
}

// ServiceBusMaxDeliveryDescription is the description Azure Service Bus
// gives a message dead-lettered with ReasonMaxDeliveryCountExceeded.
const ServiceBusMaxDeliveryDescription = "Message could not be consumed after %d delivery attempts."

// ReasonMaxDeliveryCountExceeded is the DeadLetterReason Service Bus sets
// when it dead-letters a message after too many deliveries.
const ReasonMaxDeliveryCountExceeded = "MaxDeliveryCountExceeded"

// Exercise runs the contract suite against h.
func Exercise(t *testing.T, h Harness) {
	if h.NewQueue == nil || h.NewTopic == nil {
		t.Fatal("brokertest: Harness.NewQueue and Harness.NewTopic are required")
	}
	if h.MaxLockWait == 0 {
		h.MaxLockWait = 30 * time.Second
	}
	s := &suite{h: h}
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"PeekLock", s.peekLock},
		{"AbandonRedeliversWithDeliveryCountPlusOne", s.abandon},
		{"LockExpiryRedeliversWithDeliveryCountPlusOne", s.lockExpiry},
		{"SettlingAfterLockExpiryFailsWithLockLost", s.settleAfterExpiry},
		{"DeadLetteredAtMaxDeliveryCount", s.maxDeliveries},
		{"DeadLetterKeepsReasonAndDescription", s.deadLetter},
		{"RenewMessageLockMovesLockedUntil", s.renew},
		{"SecondSettlement", s.secondSettlement},
		{"EverySubscriptionGetsACopy", s.fanOut},
		{"DeferredIsFetchedOnlyBySequenceNumber", s.deferFetch},
		{"DeferredLockEndLeavesItDeferred", s.deferLockEnd},
		{"DeferralInOneSubscriptionLeavesTheOthers", s.deferFanOut},
		{"PeekBySequenceNumberSeesLockedAndDeferred", s.peekBySeq},
		{"SessionFIFOAndAbandonKeepsItsPlace", s.sessionOrder},
		{"SessionHeldByOneReceiverUntilClosed", s.sessionExclusive},
		{"SessionStatePassesToTheNextHolder", s.sessionState},
		{"RenewSessionLockMovesLockedUntil", s.sessionRenew},
		{"SessionLockExpiryHandsTheSessionOver", s.sessionExpiry},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !h.Sequential {
				t.Parallel()
			}
			tc.fn(t)
		})
	}
}

type suite struct{ h Harness }

// run makes message ids unique across runs against a shared entity.
var (
	run = time.Now().UnixNano()
	seq atomic.Int64
)

func newID(t *testing.T) string {
	return fmt.Sprintf("bt-%d-%d-%s", run, seq.Add(1), path.Base(t.Name()))
}

// ctxFor bounds a case: generous, since a real broker may be slow and the
// lock-expiry cases wait for a real lock. It guards against a hang; no
// assertion depends on it.
func ctxFor(t *testing.T, e Entity) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute+2*e.LockDuration)
	t.Cleanup(cancel)
	return ctx
}

func send(ctx context.Context, t *testing.T, s Sender, id string) {
	t.Helper()
	subject := "brokertest"
	err := s.SendMessage(ctx, &azservicebus.Message{
		MessageID:             &id,
		Subject:               &subject,
		Body:                  []byte(`{"id":"` + id + `"}`),
		ApplicationProperties: map[string]any{"case": "brokertest"},
	}, nil)
	if err != nil {
		t.Fatalf("send %s: %v", id, err)
	}
}

// receive returns the next delivery of id. Other messages (left by an
// earlier run in a shared entity) are completed and logged.
func receive(ctx context.Context, t *testing.T, r Receiver, id string) *azservicebus.ReceivedMessage {
	t.Helper()
	for {
		msgs, err := r.ReceiveMessages(ctx, 1, nil)
		if err != nil {
			t.Fatalf("receiving %s: %v", id, err)
		}
		for _, m := range msgs {
			if m.MessageID == id {
				return m
			}
			t.Logf("completing a leftover message %s (DeliveryCount %d)", m.MessageID, m.DeliveryCount)
			_ = r.CompleteMessage(ctx, m, nil)
		}
	}
}

// notDelivered checks that r does not get id within a short window (much
// shorter than the lock, so a passing lock expiry cannot break it).
func notDelivered(ctx context.Context, t *testing.T, r Receiver, id string, window time.Duration) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, window)
	defer cancel()
	msgs, err := r.ReceiveMessages(wctx, 1, nil)
	for _, m := range msgs {
		if m.MessageID == id {
			t.Fatalf("a second receiver got %s (DeliveryCount %d) while the first held its lock", id, m.DeliveryCount)
		}
		_ = r.AbandonMessage(ctx, m, nil)
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		t.Fatalf("second receiver: %v", err)
	}
}

func wantCode(t *testing.T, what string, err error, code azservicebus.Code) {
	t.Helper()
	var sbErr *azservicebus.Error
	if !errors.As(err, &sbErr) || sbErr.Code != code {
		t.Fatalf("%s: error = %v, want an *azservicebus.Error with code %q", what, err, code)
	}
}

func ok(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func gone(ctx context.Context, t *testing.T, e Entity, id string) {
	t.Helper()
	if e.Holds != nil && e.Holds(ctx, t, id) {
		t.Fatalf("%s is still in the entity after it was settled", id)
	}
}

// expire makes m's lock run out: at once with ExpireLock, else by waiting
// for the broker (the caller's next receive blocks until the redelivery).
func (s *suite) expire(t *testing.T, e Entity, m *azservicebus.ReceivedMessage) {
	t.Helper()
	if e.ExpireLock != nil {
		e.ExpireLock(t, m)
		return
	}
	t.Logf("waiting for the %v lock of %s to run out", e.LockDuration, m.MessageID)
}

func (s *suite) needExpiry(t *testing.T, e Entity) {
	t.Helper()
	if e.ExpireLock == nil && e.LockDuration > s.h.MaxLockWait {
		t.Skipf("the entity's lock duration %v is longer than Harness.MaxLockWait %v and the broker cannot expire a lock on request; use an entity with a lock of at most %v (the emulator's brokertest queue has PT5S)",
			e.LockDuration, s.h.MaxLockWait, s.h.MaxLockWait)
	}
}

func (s *suite) peekLock(t *testing.T) {
	e := s.h.NewQueue(t)
	ctx := ctxFor(t, e)
	id := newID(t)
	send(ctx, t, e.Sender, id)
	r := e.NewReceiver(t)
	m := receive(ctx, t, r, id)

	if string(m.Body) != `{"id":"`+id+`"}` || m.Subject == nil || *m.Subject != "brokertest" || m.ApplicationProperties["case"] != "brokertest" {
		t.Errorf("body, subject or application properties not carried: body %q subject %v properties %v", m.Body, m.Subject, m.ApplicationProperties)
	}
	if m.DeliveryCount != 1 {
		t.Errorf("first delivery has DeliveryCount %d, want 1", m.DeliveryCount)
	}
	if m.LockToken == ([16]byte{}) || m.SequenceNumber == nil || m.EnqueuedTime == nil || m.LockedUntil == nil {
		t.Fatalf("broker properties missing: lock token %x, sequence number %v, enqueued %v, locked until %v", m.LockToken, m.SequenceNumber, m.EnqueuedTime, m.LockedUntil)
	}
	// Both times come from the broker's clock; one second of slack for
	// brokers that round.
	if min := m.EnqueuedTime.Add(e.LockDuration - time.Second); m.LockedUntil.Before(min) {
		t.Errorf("LockedUntil %v is less than the lock duration %v after EnqueuedTime %v", m.LockedUntil, e.LockDuration, m.EnqueuedTime)
	}

	// While the lock is held, another receiver does not get the message.
	notDelivered(ctx, t, e.NewReceiver(t), id, min(e.LockDuration/10, 500*time.Millisecond))

	ok(t, "complete", r.CompleteMessage(ctx, m, nil))
	gone(ctx, t, e, id)
}

func (s *suite) abandon(t *testing.T) {
	e := s.h.NewQueue(t)
	ctx := ctxFor(t, e)
	id := newID(t)
	send(ctx, t, e.Sender, id)
	r := e.NewReceiver(t)
	first := receive(ctx, t, r, id)
	ok(t, "abandon", r.AbandonMessage(ctx, first, nil))
	second := receive(ctx, t, r, id)
	if second.DeliveryCount != first.DeliveryCount+1 {
		t.Errorf("after an abandon DeliveryCount is %d, want %d", second.DeliveryCount, first.DeliveryCount+1)
	}
	if second.LockToken == first.LockToken {
		t.Error("the redelivery has the abandoned delivery's lock token")
	}
	ok(t, "complete the redelivery", r.CompleteMessage(ctx, second, nil))
	gone(ctx, t, e, id)
}

func (s *suite) lockExpiry(t *testing.T) {
	e := s.h.NewQueue(t)
	s.needExpiry(t, e)
	ctx := ctxFor(t, e)
	id := newID(t)
	send(ctx, t, e.Sender, id)
	r := e.NewReceiver(t)
	first := receive(ctx, t, r, id)
	s.expire(t, e, first)
	second := receive(ctx, t, r, id)
	if second.DeliveryCount != first.DeliveryCount+1 {
		t.Errorf("after a lock expiry DeliveryCount is %d, want %d", second.DeliveryCount, first.DeliveryCount+1)
	}
	if second.LockToken == first.LockToken {
		t.Error("the redelivery has the expired delivery's lock token")
	}
	ok(t, "complete the redelivery", r.CompleteMessage(ctx, second, nil))
	gone(ctx, t, e, id)
}

func (s *suite) settleAfterExpiry(t *testing.T) {
	e := s.h.NewQueue(t)
	s.needExpiry(t, e)
	ctx := ctxFor(t, e)
	id := newID(t)
	send(ctx, t, e.Sender, id)
	r := e.NewReceiver(t)
	stale := receive(ctx, t, r, id)
	s.expire(t, e, stale)
	// The redelivery proves the first lock is gone, whatever the clocks.
	fresh := receive(ctx, t, r, id)

	// Renewal goes through the management link; then the settlement on the
	// delivery's own link (after which the SDK considers it settled, see
	// Features.SecondSettlementIsNoOp, so nothing else is tried on it).
	wantCode(t, "renewing an expired lock", r.RenewMessageLock(ctx, stale, nil), azservicebus.CodeLockLost)
	wantCode(t, "completing after the lock expired", r.CompleteMessage(ctx, stale, nil), azservicebus.CodeLockLost)

	// The stale settlement did not settle the redelivery.
	ok(t, "complete the redelivery", r.CompleteMessage(ctx, fresh, nil))
	gone(ctx, t, e, id)
}

func (s *suite) maxDeliveries(t *testing.T) {
	e := s.h.NewQueue(t)
	if e.MaxDeliveryCount < 1 || e.MaxDeliveryCount > 20 {
		t.Skipf("the entity's MaxDeliveryCount is %d; this case abandons the message that often, use an entity with 1..20", e.MaxDeliveryCount)
	}
	ctx := ctxFor(t, e)
	id := newID(t)
	send(ctx, t, e.Sender, id)
	r := e.NewReceiver(t)
	for i := 1; i <= e.MaxDeliveryCount; i++ {
		m := receive(ctx, t, r, id)
		if int(m.DeliveryCount) != i {
			t.Fatalf("delivery %d has DeliveryCount %d", i, m.DeliveryCount)
		}
		ok(t, fmt.Sprintf("abandon delivery %d", i), r.AbandonMessage(ctx, m, nil))
	}
	dl := e.DeadLetter(ctx, t, id)
	if dl.DeadLetterReason == nil || *dl.DeadLetterReason != ReasonMaxDeliveryCountExceeded {
		t.Errorf("DeadLetterReason = %v, want %s", deref(dl.DeadLetterReason), ReasonMaxDeliveryCountExceeded)
	}
	desc := deref(dl.DeadLetterErrorDescription)
	if f := s.h.Features.MaxDeliveryDescription; f != "" {
		if want := fmt.Sprintf(f, e.MaxDeliveryCount); desc != want {
			t.Errorf("DeadLetterErrorDescription = %q, want %q", desc, want)
		}
	} else if desc == "" {
		t.Error("DeadLetterErrorDescription is empty")
	}
	if string(dl.Body) != `{"id":"`+id+`"}` {
		t.Errorf("the dead-lettered copy has body %q", dl.Body)
	}
	gone(ctx, t, e, id)
}

func (s *suite) deadLetter(t *testing.T) {
	e := s.h.NewQueue(t)
	ctx := ctxFor(t, e)
	id := newID(t)
	send(ctx, t, e.Sender, id)
	r := e.NewReceiver(t)
	m := receive(ctx, t, r, id)
	reason, desc := "NoRoute", "no route matches subject brokertest"
	ok(t, "dead-letter", r.DeadLetterMessage(ctx, m, &azservicebus.DeadLetterOptions{Reason: &reason, ErrorDescription: &desc}))
	dl := e.DeadLetter(ctx, t, id)
	if deref(dl.DeadLetterReason) != reason || deref(dl.DeadLetterErrorDescription) != desc {
		t.Errorf("dead-lettered with reason %q description %q; read back reason %q description %q",
			reason, desc, deref(dl.DeadLetterReason), deref(dl.DeadLetterErrorDescription))
	}
	// Service Bus adds the dead-letter properties to the copy's
	// application properties; the message's own must survive.
	if dl.ApplicationProperties["case"] != "brokertest" {
		t.Errorf("the dead-lettered copy lost its application properties: %v", dl.ApplicationProperties)
	}
	gone(ctx, t, e, id)
}

func (s *suite) renew(t *testing.T) {
	e := s.h.NewQueue(t)
	ctx := ctxFor(t, e)
	id := newID(t)
	send(ctx, t, e.Sender, id)
	r := e.NewReceiver(t)
	m := receive(ctx, t, r, id)
	before := *m.LockedUntil
	// Let the broker's clock (millisecond precision) move on, so that a
	// renewal has something to move; much shorter than any lock.
	time.Sleep(min(e.LockDuration/5, time.Second))
	ok(t, "renew", r.RenewMessageLock(ctx, m, nil))
	if m.LockedUntil == nil || !m.LockedUntil.After(before) {
		t.Fatalf("after RenewMessageLock LockedUntil is %v, was %v: it must move later", m.LockedUntil, before)
	}
	ok(t, "complete after renewing", r.CompleteMessage(ctx, m, nil))
	wantCode(t, "renewing a completed delivery", r.RenewMessageLock(ctx, m, nil), azservicebus.CodeLockLost)
	gone(ctx, t, e, id)
}

func (s *suite) secondSettlement(t *testing.T) {
	e := s.h.NewQueue(t)
	ctx := ctxFor(t, e)
	r := e.NewReceiver(t)
	for _, first := range []string{"complete", "abandon", "dead-letter"} {
		id := newID(t) + "-" + first
		send(ctx, t, e.Sender, id)
		m := receive(ctx, t, r, id)
		switch first {
		case "complete":
			ok(t, "complete", r.CompleteMessage(ctx, m, nil))
		case "abandon":
			ok(t, "abandon", r.AbandonMessage(ctx, m, nil))
		case "dead-letter":
			reason := "Test"
			ok(t, "dead-letter", r.DeadLetterMessage(ctx, m, &azservicebus.DeadLetterOptions{Reason: &reason}))
		}
		err := r.CompleteMessage(ctx, m, nil)
		if s.h.Features.SecondSettlementIsNoOp {
			ok(t, "complete after "+first+" (a no-op on this broker)", err)
		} else {
			wantCode(t, "complete after "+first, err, azservicebus.CodeLockLost)
		}
		switch first {
		case "complete":
			gone(ctx, t, e, id)
		case "abandon":
			// The abandon stood: the message comes back, one delivery on.
			again := receive(ctx, t, r, id)
			if again.DeliveryCount != m.DeliveryCount+1 {
				t.Errorf("after abandon + complete the redelivery has DeliveryCount %d, want %d", again.DeliveryCount, m.DeliveryCount+1)
			}
			ok(t, "complete the redelivery", r.CompleteMessage(ctx, again, nil))
			gone(ctx, t, e, id)
		case "dead-letter":
			// The dead-letter stood.
			if dl := e.DeadLetter(ctx, t, id); deref(dl.DeadLetterReason) != "Test" {
				t.Errorf("dead-lettered copy has reason %q", deref(dl.DeadLetterReason))
			}
		}
	}
}

func (s *suite) fanOut(t *testing.T) {
	tp := s.h.NewTopic(t)
	if len(tp.Subscriptions) < 2 {
		t.Fatalf("the harness's topic has %d subscriptions, want at least 2", len(tp.Subscriptions))
	}
	ctx := ctxFor(t, tp.Subscriptions[0])
	id := newID(t)
	send(ctx, t, tp.Sender, id)
	for i, sub := range tp.Subscriptions {
		r := sub.NewReceiver(t)
		m := receive(ctx, t, r, id)
		if m.DeliveryCount != 1 || string(m.Body) != `{"id":"`+id+`"}` {
			t.Errorf("subscription %d: copy has DeliveryCount %d and body %q", i, m.DeliveryCount, m.Body)
		}
		// Completing the earlier subscriptions' copies left this one.
		ok(t, fmt.Sprintf("complete in subscription %d", i), r.CompleteMessage(ctx, m, nil))
		gone(ctx, t, sub, id)
	}
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// fetchDeferred fetches the deferred message seq, which must be id.
func fetchDeferred(ctx context.Context, t *testing.T, r Receiver, id string, seq int64) *azservicebus.ReceivedMessage {
	t.Helper()
	msgs, err := r.ReceiveDeferredMessages(ctx, []int64{seq}, nil)
	ok(t, "ReceiveDeferredMessages", err)
	if len(msgs) != 1 || msgs[0].MessageID != id || msgs[0].SequenceNumber == nil || *msgs[0].SequenceNumber != seq {
		t.Fatalf("ReceiveDeferredMessages(%d) = %d messages, want %s", seq, len(msgs), id)
	}
	if msgs[0].LockedUntil == nil || msgs[0].LockToken == [16]byte{} {
		t.Fatalf("a deferred message was fetched without a lock (LockedUntil %v)", msgs[0].LockedUntil)
	}
	return msgs[0]
}

func (s *suite) wantDeliveryCount(t *testing.T, what string, m *azservicebus.ReceivedMessage, counted, notCounted uint32) {
	t.Helper()
	want := notCounted
	if s.h.Features.DeferredReceiveCounts {
		want = counted
	}
	if m.DeliveryCount != want {
		t.Fatalf("%s: DeliveryCount %d, want %d (Features.DeferredReceiveCounts %v)", what, m.DeliveryCount, want, s.h.Features.DeferredReceiveCounts)
	}
}

func (s *suite) wantNotFetched(ctx context.Context, t *testing.T, r Receiver, seq int64) {
	t.Helper()
	msgs, err := r.ReceiveDeferredMessages(ctx, []int64{seq}, nil)
	if len(msgs) != 0 {
		t.Fatalf("ReceiveDeferredMessages(%d) of a completed message returned %d messages", seq, len(msgs))
	}
	if code := s.h.Features.DeferredNotFoundCode; code != "" {
		wantCode(t, "ReceiveDeferredMessages of a completed message", err, code)
	}
}

func (s *suite) deferFetch(t *testing.T) {
	e := s.h.NewQueue(t)
	ctx := ctxFor(t, e)
	id := newID(t)
	send(ctx, t, e.Sender, id)
	r := e.NewReceiver(t)
	m := receive(ctx, t, r, id)
	seq := *m.SequenceNumber
	ok(t, "DeferMessage", r.DeferMessage(ctx, m, nil))
	// Not delivered by ReceiveMessages, to this receiver or another.
	notDelivered(ctx, t, e.NewReceiver(t), id, 300*time.Millisecond)
	d := fetchDeferred(ctx, t, r, id, seq)
	s.wantDeliveryCount(t, "fetched by sequence number", d, 2, 1)
	ok(t, "RenewMessageLock of a fetched deferred message", r.RenewMessageLock(ctx, d, nil))
	ok(t, "CompleteMessage of a fetched deferred message", r.CompleteMessage(ctx, d, nil))
	gone(ctx, t, e, id)
	s.wantNotFetched(ctx, t, r, seq)
}

func (s *suite) deferLockEnd(t *testing.T) {
	e := s.h.NewQueue(t)
	s.needExpiry(t, e)
	if e.MaxDeliveryCount < 3 {
		t.Skipf("the entity's MaxDeliveryCount %d leaves no room for three deliveries", e.MaxDeliveryCount)
	}
	ctx := ctxFor(t, e)
	id := newID(t)
	send(ctx, t, e.Sender, id)
	r := e.NewReceiver(t)
	m := receive(ctx, t, r, id)
	seq := *m.SequenceNumber
	ok(t, "DeferMessage", r.DeferMessage(ctx, m, nil))
	d := fetchDeferred(ctx, t, r, id, seq)
	s.expire(t, e, d)
	if e.ExpireLock == nil {
		time.Sleep(e.LockDuration + time.Second) // the real lock must run out; the fetch below does not wait
	}
	// Back among the deferred messages: not delivered by ReceiveMessages,
	// fetched again by its sequence number.
	notDelivered(ctx, t, e.NewReceiver(t), id, 300*time.Millisecond)
	d = fetchDeferred(ctx, t, r, id, seq)
	s.wantDeliveryCount(t, "fetched again after its lock ran out", d, 3, 1)
	ok(t, "CompleteMessage", r.CompleteMessage(ctx, d, nil))
	gone(ctx, t, e, id)
}

// peekBySeq: peeking from a sequence number finds the message while it
// is locked by a receiver and while it is deferred (State says so), with
// its delivery count, and not once it is completed. The processor peeks
// a claim's deferred message this way before it completes a copy on that
// message's behalf.
func (s *suite) peekBySeq(t *testing.T) {
	e := s.h.NewQueue(t)
	ctx := ctxFor(t, e)
	id := newID(t)
	send(ctx, t, e.Sender, id)
	r := e.NewReceiver(t)
	m := receive(ctx, t, r, id)
	seq := *m.SequenceNumber
	peek := func(what string) *azservicebus.ReceivedMessage {
		t.Helper()
		ms, err := e.NewReceiver(t).PeekMessages(ctx, 1, &azservicebus.PeekMessagesOptions{FromSequenceNumber: &seq})
		ok(t, "PeekMessages "+what, err)
		if len(ms) == 0 || *ms[0].SequenceNumber != seq {
			return nil
		}
		return ms[0]
	}
	if p := peek("of a locked message"); p == nil || p.MessageID != id {
		t.Fatalf("peeking from sequence number %d while the message is locked: got %v, want message %s", seq, p, id)
	}
	ok(t, "DeferMessage", r.DeferMessage(ctx, m, nil))
	p := peek("of a deferred message")
	switch {
	case p == nil:
		t.Fatalf("peeking from sequence number %d found no deferred message", seq)
	case p.State != azservicebus.MessageStateDeferred:
		t.Errorf("peeked deferred message has State %v, want deferred", p.State)
	case p.DeliveryCount != m.DeliveryCount:
		t.Errorf("peeked deferred message has DeliveryCount %d, want %d (peeking does not count)", p.DeliveryCount, m.DeliveryCount)
	}
	d := fetchDeferred(ctx, t, r, id, seq)
	if p := peek("of a fetched deferred message"); p == nil {
		t.Fatalf("peeking from sequence number %d found no message while the fetched deferred message is locked", seq)
	}
	ok(t, "CompleteMessage", r.CompleteMessage(ctx, d, nil))
	if p := peek("of a completed message"); p != nil {
		t.Fatalf("peeking from sequence number %d found the completed message", seq)
	}
}

func (s *suite) deferFanOut(t *testing.T) {
	tp := s.h.NewTopic(t)
	if len(tp.Subscriptions) < 2 {
		t.Fatalf("the harness's topic has %d subscriptions, want at least 2", len(tp.Subscriptions))
	}
	ctx := ctxFor(t, tp.Subscriptions[0])
	id := newID(t)
	send(ctx, t, tp.Sender, id)
	first := tp.Subscriptions[0].NewReceiver(t)
	m := receive(ctx, t, first, id)
	seq := *m.SequenceNumber
	ok(t, "DeferMessage in subscription 0", first.DeferMessage(ctx, m, nil))
	for i, sub := range tp.Subscriptions[1:] {
		r := sub.NewReceiver(t)
		c := receive(ctx, t, r, id)
		if c.DeliveryCount != 1 {
			t.Errorf("subscription %d: its copy has DeliveryCount %d, want 1", i+1, c.DeliveryCount)
		}
		ok(t, fmt.Sprintf("complete in subscription %d", i+1), r.CompleteMessage(ctx, c, nil))
		notDelivered(ctx, t, r, id, 300*time.Millisecond) // one copy each: the deferral added none
		gone(ctx, t, sub, id)
	}
	d := fetchDeferred(ctx, t, first, id, seq)
	ok(t, "complete the deferred message in subscription 0", first.CompleteMessage(ctx, d, nil))
	gone(ctx, t, tp.Subscriptions[0], id)
}
