package processor_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/metricreg"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// outboxBundle is a bundle whose processor sends follow-ups to a
// "receipts" queue (duplicate detection on) of an in-memory namespace.
type outboxBundle struct {
	*bundle
	ns       *membus.Namespace
	receipts *membus.Queue
}

func setupOutbox(t *testing.T, backend string) *outboxBundle {
	b := &outboxBundle{bundle: setup(t, backend, membus.QueueOptions{}), ns: membus.NewNamespace(),
		receipts: membus.NewQueue("receipts", membus.QueueOptions{})}
	b.ns.AddQueue(b.receipts, true)
	return b
}

func (b *outboxBundle) options() processor.Options {
	o := b.bundle.options()
	o.Outbox = processor.OutboxOptions{
		NewSender:     func(target string) (processor.Sender, error) { return b.ns.NewSender(target) },
		Lease:         time.Second,
		SendTimeout:   500 * time.Millisecond,
		SweepInterval: 50 * time.Millisecond,
		MinBackoff:    10 * time.Millisecond,
		MaxBackoff:    50 * time.Millisecond,
	}
	return o
}

func (b *outboxBundle) outbox() claim.Outbox { return b.store.(claim.Outbox) }

func (b *outboxBundle) followUps(id int64) []*claim.StoredFollowUp {
	b.t.Helper()
	fus, err := b.outbox().FollowUps(context.Background(), id)
	if err != nil {
		b.t.Fatal(err)
	}
	return fus
}

// allSent waits until claim id has n follow-ups, all sent.
func (b *outboxBundle) allSent(id int64, n int) []*claim.StoredFollowUp {
	b.t.Helper()
	var fus []*claim.StoredFollowUp
	b.eventually(fmt.Sprintf("%d follow-ups of claim %d sent", n, id), func() bool {
		fus = b.followUps(id)
		if len(fus) != n {
			return false
		}
		for _, f := range fus {
			if f.State != claim.FollowUpSent {
				return false
			}
		}
		return true
	})
	return fus
}

func publish(ctx context.Context, to, body string) error {
	return claim.FollowUpSinkOf(ctx).Publish(claim.FollowUp{To: to, Body: []byte(body), Subject: "payment.charged",
		Properties: map[string]string{"kind": "receipt"}})
}

// receivedIDs drains the receipts queue and returns the MessageIds it
// delivered, in order.
func receivedIDs(t *testing.T, q *membus.Queue, want int) []string {
	t.Helper()
	r := q.NewReceiver()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ids []string
	for len(ids) < want {
		msgs, err := r.ReceiveMessages(ctx, want-len(ids), nil)
		if err != nil {
			t.Fatalf("receive from %s: %v (got %v)", q.Name(), err, ids)
		}
		for _, m := range msgs {
			ids = append(ids, m.MessageID)
			if err := r.CompleteMessage(ctx, m, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	return ids
}

// A plain handler's follow-ups are written with its outcome and sent at
// once, each with its deterministic MessageId.
func TestOutboxSendsAPlainHandlersFollowUps(t *testing.T) {
	for _, be := range backends {
		t.Run(be, func(t *testing.T) {
			b := setupOutbox(t, be)
			b.eff.behaveCtx = func(ctx context.Context, key string, call int) error {
				if err := publish(ctx, "receipts", "receipt of "+key); err != nil {
					return err
				}
				return publish(ctx, "receipts", "audit of "+key)
			}
			o := b.options()
			m := metricreg.ProcessorMetrics(nil)
			o.Metrics = m
			b.start(o)
			b.send("pay-1", "", `{}`, nil)
			b.waitIdle()
			c := b.claimOf("pay-1")
			fus := b.allSent(c.ID, 2)
			for i, f := range fus {
				if f.MessageID != claim.FollowUpMessageID("billing", "pay-1", i+1) || f.SentAt == nil || f.Attempts != 1 {
					t.Fatalf("follow-up %d: %+v", i+1, f)
				}
			}
			ids := receivedIDs(t, b.receipts, 2)
			if ids[0] != fus[0].MessageID || ids[1] != fus[1].MessageID {
				t.Fatalf("receipts received %v", ids)
			}
			sent := b.ns.Sent("receipts")
			if got := string(sent[0].Body); got != "receipt of pay-1" || *sent[0].Subject != "payment.charged" || sent[0].ApplicationProperties["kind"] != "receipt" {
				t.Fatalf("sent %q %+v", got, sent[0])
			}
			if n := metricValue(m.FollowUpSends.With("sent")); n != 2 {
				t.Fatalf("sends metric %v, want 2", n)
			}
		})
	}
}

// outboxStore is a store with an outbox whose MarkProcessed can be made to
// fail (the outcome write of a performed effect).
type outboxStore interface {
	claim.Store
	claim.Outbox
}

type failingMarks struct {
	outboxStore
	fail atomic.Bool
}

func (s *failingMarks) MarkProcessed(ctx context.Context, p *claim.MarkProcessedParams) error {
	if s.fail.Load() {
		return fmt.Errorf("mark processed claim %d: %w", p.ID, claim.ErrUnavailable)
	}
	return s.outboxStore.MarkProcessed(ctx, p)
}

// A plain handler whose outcome write failed leaves no follow-up; the
// repeat of its effect records them with the same MessageIds.
func TestOutboxFollowUpsExistOnlyOnceTheOutcomeIsRecorded(t *testing.T) {
	b := setupOutbox(t, "sqlite")
	fs := &failingMarks{outboxStore: b.store.(outboxStore)}
	fs.fail.Store(true)
	b.store = fs
	calls := make(chan int, 10)
	b.eff.behaveCtx = func(ctx context.Context, key string, call int) error {
		calls <- call
		return publish(ctx, "receipts", "receipt of "+key)
	}
	o := b.options()
	o.TakeoverAfter = 3 * o.HeartbeatInterval
	b.start(o)
	b.send("pay-2", "", `{}`, nil)
	if call := <-calls; call != 1 {
		t.Fatalf("first call %d", call)
	}
	var c *claim.Claim
	b.eventually("the claim of the failed write", func() bool {
		cs := b.claims()
		if len(cs) == 1 {
			c = cs[0]
		}
		return c != nil
	})
	// The effect was performed; its outcome write keeps failing: no
	// follow-up exists.
	b.eventually("the outcome write to fail", func() bool { return strings.Contains(b.logs.String(), "the claim write failed") })
	if fus := b.followUps(c.ID); len(fus) != 0 {
		t.Fatalf("%d follow-ups before the outcome was recorded", len(fus))
	}
	if got := b.ns.Sent("receipts"); len(got) != 0 {
		t.Fatalf("%d follow-ups sent before the outcome was recorded", len(got))
	}
	fs.fail.Store(false)
	// The redelivery takes the silent claim over and repeats the effect
	// with the same key; its outcome and follow-ups are recorded.
	b.waitIdle()
	if got := b.claimOf("pay-2"); got.State != claim.StateProcessed {
		t.Fatalf("claim %s", got.State)
	}
	fus := b.allSent(c.ID, 1)
	if fus[0].MessageID != claim.FollowUpMessageID("billing", "pay-2", 1) {
		t.Fatalf("message id %q", fus[0].MessageID)
	}
	if n := b.eff.Calls("pay-2"); n < 2 {
		t.Fatalf("effect called %d times, want the repeat", n)
	}
	if ids := receivedIDs(t, b.receipts, 1); ids[0] != fus[0].MessageID {
		t.Fatalf("received %v", ids)
	}
}

// A transactional handler's follow-ups commit with its transaction: a
// rolled-back transaction leaves none.
func TestOutboxTransactionalHandlersFollowUps(t *testing.T) {
	for _, be := range backends {
		t.Run(be, func(t *testing.T) {
			b := setupOutbox(t, be)
			var fail atomic.Bool
			fail.Store(true)
			b.router.tx = sideeffects.TxEffectFunc(func(ctx context.Context, tx *sql.Tx, msg *azservicebus.ReceivedMessage, key string) error {
				if err := publish(ctx, "receipts", "ledger entry "+key); err != nil {
					return err
				}
				if fail.Swap(false) {
					return errors.New("the ledger refuses it this once") // rolled back
				}
				return nil
			})
			b.start(b.options())
			b.send("tx-1", "tx", `{}`, nil)
			b.waitIdle()
			c := b.claimOf("tx-1")
			fus := b.allSent(c.ID, 1)
			if fus[0].MessageID != claim.FollowUpMessageID("billing", "tx-1", 1) {
				t.Fatalf("message id %q", fus[0].MessageID)
			}
			// The rolled-back attempt left nothing: one follow-up, sent once.
			if got := b.ns.Sent("receipts"); len(got) != 1 {
				t.Fatalf("%d sends, want 1", len(got))
			}
			st, err := b.outbox().OutboxStats(context.Background())
			if err != nil || st.Pending != 0 {
				t.Fatalf("outbox stats %+v %v", st, err)
			}
		})
	}
}

// A relay that dies between a follow-up's send and its mark leaves it
// pending; once its lease runs out the sweep sends it again with the same
// MessageId, which duplicate detection drops. A failed send is retried
// after its backoff.
func TestOutboxResendsWhatWasSentButNotMarked(t *testing.T) {
	b := setupOutbox(t, "sqlite")
	b.eff.behaveCtx = func(ctx context.Context, key string, call int) error { return publish(ctx, "receipts", key) }
	var crashes atomic.Int32
	o := b.options()
	o.Outbox.AfterSend = func(ctx context.Context, f *claim.StoredFollowUp) error {
		if f.Attempts == 1 && crashes.Add(1) == 1 {
			return processor.ErrCrash
		}
		return nil
	}
	b.ns.FailSends(1) // the first send fails: Service Bus refused it
	m := metricreg.ProcessorMetrics(nil)
	o.Metrics = m
	b.start(o)
	b.send("pay-3", "", `{}`, nil)
	b.send("pay-4", "", `{}`, nil)
	b.waitIdle()
	for _, key := range []string{"pay-3", "pay-4"} {
		c := b.claimOf(key)
		b.allSent(c.ID, 1)
	}
	sent := b.ns.Sent("receipts")
	ids := map[string]int{}
	for _, m := range sent {
		ids[*m.MessageID]++
	}
	if len(ids) != 2 || len(sent) != 3 {
		t.Fatalf("sent %d messages with ids %v: want 3 sends of 2 ids (one resend)", len(sent), ids)
	}
	if b.ns.Dropped("receipts") != 1 {
		t.Fatalf("duplicate detection dropped %d, want 1", b.ns.Dropped("receipts"))
	}
	if got := receivedIDs(t, b.receipts, 2); got[0] == got[1] {
		t.Fatalf("the receipts queue got %v", got)
	}
	if metricValue(m.FollowUpSends.With("failed")) != 1 || metricValue(m.FollowUpResends) != 2 {
		t.Fatalf("failed %v, resends %v: want 1 and 2 (after the failure, after the crash)",
			metricValue(m.FollowUpSends.With("failed")), metricValue(m.FollowUpResends))
	}
}

// Without an outbox a handler's Publish fails, naming why.
func TestOutboxOffRefusesPublish(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	errs := make(chan error, 1)
	b.eff.behaveCtx = func(ctx context.Context, key string, call int) error {
		err := publish(ctx, "receipts", key)
		errs <- err
		return sideeffects.Permanent(err)
	}
	b.start(b.options())
	b.send("pay-5", "", `{}`, nil)
	if err := <-errs; !errors.Is(err, claim.ErrNoOutbox) {
		t.Fatalf("publish without an outbox: %v", err)
	}
	b.waitIdle()
}

// The sweep sends what no fast path did (here a follow-up recorded by
// someone else), and waits while Service Bus does not answer the
// processor.
func TestOutboxSweepWaitsForServiceBus(t *testing.T) {
	b := setupOutbox(t, "sqlite")
	ctx := context.Background()
	res, err := b.store.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "elsewhere", Claims: []claim.ClaimParams{{
		MessageID: "pay-9", Consumer: "billing", Owner: uuid.New(), PayloadHash: claim.HashPayload([]byte("x"))}}})
	if err != nil {
		t.Fatal(err)
	}
	c := res[0].Claim
	fus := claim.NumberFollowUps("billing", "pay-9", []claim.FollowUp{{To: "receipts", Body: []byte("r")}})
	if err := b.store.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner, FollowUps: fus}); err != nil {
		t.Fatal(err)
	}
	b.q.SetUnreachable(true)
	o := b.options()
	o.BrokerProbeInterval = 100 * time.Millisecond // an idle entity: the probe says when Service Bus answers again
	m := metricreg.ProcessorMetrics(nil)
	o.Metrics = m
	b.start(o)
	// Several sweep intervals pass (the sweep runs every 50ms) with
	// nothing sent, whatever the machine's load.
	time.Sleep(300 * time.Millisecond)
	if n := len(b.ns.Sent("receipts")); n != 0 {
		t.Fatalf("%d sends while Service Bus did not answer", n)
	}
	b.q.SetUnreachable(false)
	got := b.allSent(c.ID, 1)
	if got[0].MessageID != fus[0].MessageID {
		t.Fatalf("sent %q", got[0].MessageID)
	}
	b.eventually("the pending gauge to read 0", func() bool { return metricValue(m.FollowUpsPending) == 0 })
}
