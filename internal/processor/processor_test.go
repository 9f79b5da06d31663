package processor_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/metricreg"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// forEachBackend runs a protocol test on every real store.
func forEachBackend(t *testing.T, fn func(t *testing.T, backend string)) {
	for _, be := range backends {
		t.Run(be, func(t *testing.T) {
			t.Parallel()
			fn(t, be)
		})
	}
}

func TestSuccessPath(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		opts := b.options()
		opts.Metrics = metricreg.ProcessorMetrics(nil)
		b.start(opts)
		b.send("m1", "pay", `{"amount":1}`, nil)
		b.waitIdle()

		if got := countCompleted(b.q, "m1"); got != 1 {
			t.Errorf("completed %d times, want 1", got)
		}
		if got := b.eff.Performed("m1"); got != 1 {
			t.Errorf("effect performed %d times, want 1", got)
		}
		c := b.claimOf("m1")
		if c.State != claim.StateProcessed || c.ProcessedAt == nil {
			t.Errorf("claim state %s processed_at %v, want processed", c.State, c.ProcessedAt)
		}
		if c.Payload != nil {
			t.Errorf("payload kept after processing: %q", c.Payload)
		}
		if c.Consumer != "billing" || c.Entity != "orders" {
			t.Errorf("claim consumer/entity = %q/%q", c.Consumer, c.Entity)
		}
		// The final log line and metric follow the settlement.
		b.eventually("the final log line and metric", func() bool {
			return outcomes(opts.Metrics, processor.ResultProcessed) == 1 &&
				strings.Contains(b.logs.String(), `"outcome":"processed"`)
		})
	})
}

func TestDuplicatePathCompletes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		opts := b.options()
		opts.Metrics = metricreg.ProcessorMetrics(nil)
		b.start(opts)
		b.send("m1", "pay", `{"a":1}`, nil)
		b.waitIdle()
		b.send("m1", "pay", `{"a":1}`, nil) // a producer retry
		b.waitIdle()

		if got := countCompleted(b.q, "m1"); got != 2 {
			t.Errorf("completed %d times, want 2 (success and duplicate path)", got)
		}
		if got := b.eff.Calls("m1"); got != 1 {
			t.Errorf("effect called %d times, want 1", got)
		}
		if len(b.claims()) != 1 {
			t.Errorf("want one claim row")
		}
		b.eventually("one duplicate outcome", func() bool { return outcomes(opts.Metrics, processor.ResultDuplicate) == 1 })
		if s := b.q.Stats(); s.DeadLettered != 0 {
			t.Errorf("dead-lettered %d, want 0", s.DeadLettered)
		}
	})
}

func TestConflictDeadLetters(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.start(b.options())
		b.send("m1", "pay", `{"amount":1}`, nil)
		b.waitIdle()
		b.send("m1", "pay", `{"amount":1000}`, nil)
		b.waitIdle()

		if got := b.deadLetterReasons()["m1"]; got != processor.ReasonIdempotencyKeyConflict {
			t.Errorf("dead-letter reason %q, want %q", got, processor.ReasonIdempotencyKeyConflict)
		}
		dl := b.q.DeadLetters()[0]
		if dl.DeadLetterErrorDescription == nil || !strings.Contains(*dl.DeadLetterErrorDescription, "another payload") {
			t.Errorf("description %v does not explain the conflict", dl.DeadLetterErrorDescription)
		}
		if got := b.eff.Calls("m1"); got != 1 {
			t.Errorf("effect called %d times, want 1", got)
		}
		if c := b.claimOf("m1"); c.State != claim.StateProcessed {
			t.Errorf("original claim state %s, want processed", c.State)
		}
	})
}

func TestRetryableReleasesAndRedeliveryTakesOver(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.eff.behave = func(_, _ string, call int) error {
			if call == 1 {
				return sideeffects.Retryable(errors.New("downstream 503"))
			}
			return nil
		}
		opts := b.options()
		opts.NoDeferral = true // the abandon path: released, redelivered at once
		opts.Metrics = metricreg.ProcessorMetrics(nil)
		b.start(opts)
		b.send("m1", "pay", `{}`, nil)
		b.waitIdle()

		if got := b.eff.Calls("m1"); got != 2 {
			t.Errorf("effect called %d times, want 2", got)
		}
		if got := b.eff.Performed("m1"); got != 1 {
			t.Errorf("effect performed %d times, want 1", got)
		}
		if got := countCompleted(b.q, "m1"); got != 1 {
			t.Errorf("completed %d, want 1", got)
		}
		c := b.claimOf("m1")
		if c.State != claim.StateProcessed || c.DeliveryCount != 2 {
			t.Errorf("claim %s delivery %d, want processed by delivery 2", c.State, c.DeliveryCount)
		}
		if c.ReleasedAt == nil && !strings.Contains(c.LastError, "503") {
			t.Errorf("no trace of the release on the claim: %+v", c)
		}
		if s := b.q.Stats(); s.Abandoned != 1 {
			t.Errorf("abandoned %d, want 1", s.Abandoned)
		}
		b.eventually("one released and one processed outcome", func() bool {
			return outcomes(opts.Metrics, processor.ResultReleased) == 1 && outcomes(opts.Metrics, processor.ResultProcessed) == 1
		})
	})
}

// TestPermanentFailsTheClaimAndDeadLetters: a permanent answer (not
// performed, never will be) is final: the claim is failed, the message
// dead-lettered EffectFailed.
func TestPermanentFailsTheClaimAndDeadLetters(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.eff.behave = func(_, _ string, _ int) error {
			return sideeffects.Permanent(errors.New("downstream 400: bad account"))
		}
		b.start(b.options())
		b.send("m1", "pay", `{}`, nil)
		b.waitIdle()

		if got := b.deadLetterReasons()["m1"]; got != processor.ReasonEffectFailed {
			t.Errorf("dead-letter reason %q, want %q", got, processor.ReasonEffectFailed)
		}
		if got := b.eff.Performed("m1"); got != 0 {
			t.Errorf("performed %d, want 0", got)
		}
		c := b.claimOf("m1")
		if c.State != claim.StateFailed || c.FailReason != processor.ReasonEffectFailed || !strings.Contains(c.LastError, "bad account") || c.ReleasedAt != nil {
			t.Errorf("claim %s (%s) last error %q released at %v, want failed with the error", c.State, c.FailReason, c.LastError, c.ReleasedAt)
		}
	})
}

// TestUnknownOutcomeIsRepeatedAfterTheHolderGoesSilent: an attempt whose
// outcome stays unknown keeps its claim and abandons the message; the
// redelivery finds the claim held, waits until its holder has shown no
// life for TakeoverAfter (by the database clock), takes it over and
// repeats the effect with the same key.
func TestUnknownOutcomeIsRepeatedAfterTheHolderGoesSilent(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.eff.behave = func(_, _ string, call int) error {
			if call <= 3 {
				return errPerformedThenLost
			}
			return nil
		}
		opts := b.options()
		opts.NoDeferral = true // the abandon path: released, redelivered at once
		opts.Retry = sideeffects.RetryPolicy{MaxAttempts: 3, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond, Budget: 5 * time.Second}
		opts.Metrics = metricreg.ProcessorMetrics(nil)
		b.start(opts)
		b.send("m1", "pay", `{}`, nil)
		b.waitIdle()

		if got := b.eff.Calls("m1"); got != 4 {
			t.Errorf("effect called %d times, want 4 (three unknown attempts, then the take-over's)", got)
		}
		c := b.claimOf("m1")
		if c.State != claim.StateProcessed || c.TakeOvers != 1 || c.TakeOverPath != claim.PathRedelivery {
			t.Fatalf("claim %s, take-overs %d by %q; want processed after one redelivery take-over", c.State, c.TakeOvers, c.TakeOverPath)
		}
		if c.Attempts != 3 || !strings.Contains(c.LastError, "response lost") {
			t.Errorf("attempts %d last error %q, want the first delivery's 3 unknown attempts", c.Attempts, c.LastError)
		}
		// The redelivery really waited for the holder's silence: it took
		// over no earlier than TakeoverAfter after the claim's last sign
		// of life (the claim was taken at ClaimedAt and its attempts ran
		// within milliseconds).
		if d := c.TakenOverAt.Sub(c.ClaimedAt); d < 3*opts.HeartbeatInterval {
			t.Errorf("taken over %s after the claim, before TakeoverAfter (%s)", d, 3*opts.HeartbeatInterval)
		}
		if got := countCompleted(b.q, "m1"); got != 1 {
			t.Errorf("completed %d, want 1", got)
		}
		b.eventually("one unknown and one processed outcome", func() bool {
			return outcomes(opts.Metrics, processor.ResultUnknown) == 1 && outcomes(opts.Metrics, processor.ResultProcessed) == 1
		})
		if got := metricValue(opts.Metrics.TakeOvers.With("redelivery")); got != 1 {
			t.Errorf("sbclaim_takeovers_total{path=redelivery} = %v, want 1", got)
		}
		if got := metricValue(opts.Metrics.DuplicateWaits); got != 1 {
			t.Errorf("sbclaim_duplicate_waits_total = %v, want 1", got)
		}
	})
}

// TestUnknownOutcomeOnAManualRouteIsNeverRepeated: a manual route's
// downstream does not honour the key: the first unknown attempt ends the
// retries, and the redelivery does not take the silent holder's claim
// over; it completes its copy and leaves the claim for the reconciler to
// flag.
func TestUnknownOutcomeOnAManualRouteIsNeverRepeated(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	b.eff.behave = func(_, _ string, _ int) error { return errPerformedThenLost }
	opts := b.options()
	opts.Retry = sideeffects.RetryPolicy{MaxAttempts: 5, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond, Budget: 5 * time.Second}
	opts.Metrics = metricreg.ProcessorMetrics(nil)
	b.start(opts)
	b.send("m1", "manual", `{}`, nil)
	b.waitIdle()
	if got := b.eff.Calls("m1"); got != 1 {
		t.Errorf("effect called %d times on a manual route, want 1 (never repeated after an unknown outcome)", got)
	}
	c := b.claimOf("m1")
	if c.State != claim.StateClaimed || c.TakeOvers != 0 || c.Payload == nil {
		t.Errorf("claim %s, take-overs %d, payload kept %v; want claimed, never taken over, payload kept for the operator", c.State, c.TakeOvers, c.Payload != nil)
	}
	if got := countCompleted(b.q, "m1"); got != 1 {
		t.Errorf("completed %d, want 1 (the redelivery, once the holder was silent)", got)
	}
	b.eventually("one unknown and one duplicate outcome", func() bool {
		return outcomes(opts.Metrics, processor.ResultUnknown) == 1 && outcomes(opts.Metrics, processor.ResultDuplicate) == 1
	})
}

func TestBadInputIsDeadLetteredWithReason(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		opts := b.options()
		key, err := processor.ParseKeySpec("property:order_id")
		if err != nil {
			t.Fatal(err)
		}
		opts.Key = key
		b.start(opts)

		b.send("nokey", "pay", `{}`, nil)
		b.send("long", "pay", `{}`, map[string]any{"order_id": strings.Repeat("k", 129)})
		b.send("big", "pay", strings.Repeat("x", 1025), map[string]any{"order_id": "o-big"})
		b.send("route", "noroute", `{}`, map[string]any{"order_id": "o-route"})
		b.send("json", "json", `{not json`, map[string]any{"order_id": "o-json"})
		b.send("good", "json", `{"ok":true}`, map[string]any{"order_id": "o-good"})
		b.send("ctrl", "pay", `{}`, map[string]any{"order_id": "o\x00ctrl"})
		b.send("space", "pay", `{}`, map[string]any{"order_id": "o-space "})
		// A NUL in a property is stored sanitised (PostgreSQL refuses NUL
		// in text): the message is processed, not stuck.
		b.send("nul", "pay", `{}`, map[string]any{"order_id": "o-nul", "note": "a\x00b"})
		b.waitIdle()

		want := map[string]string{
			"ctrl":  processor.ReasonInvalidDedupKey,
			"space": processor.ReasonInvalidDedupKey,
			"nokey": processor.ReasonMissingDedupKey,
			"long":  processor.ReasonDedupKeyTooLong,
			"big":   processor.ReasonBodyTooLarge,
			"route": sideeffects.ReasonNoRoute,
			"json":  sideeffects.ReasonMalformedBody,
		}
		got := b.deadLetterReasons()
		for id, reason := range want {
			if got[id] != reason {
				t.Errorf("%s: dead-letter reason %q, want %q", id, got[id], reason)
			}
		}
		for _, m := range b.q.DeadLetters() {
			if m.DeadLetterErrorDescription == nil || *m.DeadLetterErrorDescription == "" {
				t.Errorf("%s: no ErrorDescription", m.MessageID)
			}
		}
		if len(got) != len(want) {
			t.Errorf("dead-lettered %v, want exactly %v", got, want)
		}
		if n := len(b.claims()); n != 2 {
			t.Errorf("%d claims, want 2: bad input is never claimed", n)
		}
		if b.eff.Performed("o-good") != 1 || b.eff.Performed("o-nul") != 1 {
			t.Errorf("the good messages were not processed under their property keys")
		}
	})
}

// TestStoreOutageHoldsThenRecovers: the store goes down while the
// processor runs; the batch received meanwhile keeps its messages locked
// (their locks renewed) instead of abandoning them, which would spend one
// delivery of each per outage; the processor stops receiving until the
// store is back, then claims and processes them, each once, on their
// first delivery. (A store down at start is never received for:
// TestStartUpSaysTheStoreDoesNotAnswer; an outage longer than the lock's
// renewal: TestStoreOutageLongerThanTheRenewalAbandons.)
func TestStoreOutageHoldsThenRecovers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		fs := &flakyStore{Store: b.store}
		opts := b.options()
		opts.Store = fs
		opts.Metrics = metricreg.ProcessorMetrics(nil)
		b.start(opts)
		// Once the start-up store probe has passed, the processor receives.
		b.eventually("the start-up store probe", func() bool { return fs.probed.Load() >= 1 })
		fs.down.Store(true)
		for i := range 5 {
			b.send(fmt.Sprintf("m%d", i), "pay", `{}`, nil)
		}
		b.eventually("a message received and held", func() bool { return b.q.Stats().Locked >= 1 })
		// While the store is down the processor pings it instead of
		// receiving, so the messages' delivery counts do not run out.
		b.eventually("pings during the outage", func() bool { return fs.fails.Load() >= 5 })
		if s := b.q.Stats(); s.Deliveries > 5 {
			t.Errorf("%d deliveries during the outage: the processor kept receiving and abandoning", s.Deliveries)
		}
		if got := len(b.q.Completed()); got != 0 {
			t.Fatalf("%d messages completed while the store was down", got)
		}
		if n := len(b.claims()); n != 0 {
			t.Fatalf("%d claims written during the outage", n)
		}
		fs.down.Store(false) // the store comes back; the processor keeps running
		b.waitIdle()
		for i := range 5 {
			key := fmt.Sprintf("m%d", i)
			if b.eff.Performed(key) != 1 || countCompleted(b.q, key) != 1 {
				t.Errorf("%s: performed %d completed %d, want 1 and 1", key, b.eff.Performed(key), countCompleted(b.q, key))
			}
		}
		if s := b.q.Stats(); s.Abandoned != 0 || s.Redeliveries != 0 {
			t.Errorf("abandoned %d, redelivered %d: an outage must not spend deliveries", s.Abandoned, s.Redeliveries)
		}
		if s := b.q.Stats(); s.DeadLettered != 0 {
			t.Errorf("dead-lettered %d during an outage, want 0", s.DeadLettered)
		}
	})
}

// TestStoreOutageLongerThanTheRenewalAbandons: a delivery holds its
// message through a store outage only as long as its lock may be
// renewed; then it gives the message back (one delivery spent), and the
// redelivery is processed once the store is back.
func TestStoreOutageLongerThanTheRenewalAbandons(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	fs := &flakyStore{Store: b.store}
	opts := b.options()
	opts.Store = fs
	opts.MaxLockRenewal = time.Second // the least the take-over window allows
	opts.Retry.Budget = 500 * time.Millisecond

	opts.Metrics = metricreg.ProcessorMetrics(nil)
	b.start(opts)
	b.eventually("the start-up store probe", func() bool { return fs.probed.Load() >= 1 })
	fs.down.Store(true)
	b.send("m1", "pay", `{}`, nil)
	b.eventually("the message given back at the end of its renewal", func() bool { return b.q.Stats().Abandoned == 1 })
	fs.down.Store(false)
	b.waitIdle()
	if b.eff.Performed("m1") != 1 || countCompleted(b.q, "m1") != 1 {
		t.Fatalf("performed %d completed %d, want 1 and 1", b.eff.Performed("m1"), countCompleted(b.q, "m1"))
	}
	if !strings.Contains(b.logs.String(), "still refuses work at the end of the lock's renewal") {
		t.Errorf("the abandon does not say why:\n%s", b.logs.tail(10))
	}
}

// ledgerEffect is a transactional effect: it writes a ledger row in the
// claim's transaction, or fails when the body says so.
func ledgerEffect(t *testing.T, db *sql.DB, backend string) sideeffects.TxEffect {
	insert := map[string]string{
		"sqlite":    `INSERT INTO ledger (message_id, body) VALUES (?, ?)`,
		"postgres":  `INSERT INTO ledger (message_id, body) VALUES ($1, $2)`,
		"sqlserver": `INSERT INTO ledger (message_id, body) VALUES (@p1, @p2)`,
	}[backend]
	if _, err := db.Exec(`CREATE TABLE ledger (message_id VARCHAR(128) NOT NULL, body VARCHAR(200) NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return sideeffects.TxEffectFunc(func(ctx context.Context, tx *sql.Tx, msg *azservicebus.ReceivedMessage, key string) error {
		if string(msg.Body) == "fail" {
			return errors.New("ledger rejected the entry")
		}
		if string(msg.Body) == "invalid" {
			return sideeffects.Permanent(errors.New("ledger says never"))
		}
		_, err := tx.ExecContext(ctx, insert, key, string(msg.Body))
		return err
	})
}

type dbStore interface{ DB() *sql.DB }

func TestTransactionalEffect(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{MaxDeliveryCount: 2})
		db := b.store.(dbStore).DB()
		b.router.tx = ledgerEffect(t, db, be)
		b.start(b.options())

		b.send("t1", "tx", "credit", nil)
		b.waitIdle()
		b.send("t1", "tx", "credit", nil) // duplicate
		b.send("t2", "tx", "fail", nil)   // rolls back every time
		b.send("t3", "tx", "invalid", nil)
		b.waitIdle()

		var n int
		if err := db.QueryRow(`SELECT COUNT(*) FROM ledger WHERE message_id = 't1'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("ledger rows for t1 = %d, want 1", n)
		}
		if err := db.QueryRow(`SELECT COUNT(*) FROM ledger WHERE message_id <> 't1'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("ledger rows of failed effects = %d, want 0", n)
		}
		if got := countCompleted(b.q, "t1"); got != 2 {
			t.Errorf("t1 completed %d, want 2", got)
		}
		dl := b.deadLetterReasons()
		if dl["t2"] != membus.ReasonMaxDeliveryCountExceeded {
			t.Errorf("t2 dead-letter reason %q, want %q (abandoned until the broker gave up)", dl["t2"], membus.ReasonMaxDeliveryCountExceeded)
		}
		if dl["t3"] != processor.ReasonEffectFailed {
			t.Errorf("t3 dead-letter reason %q, want %q", dl["t3"], processor.ReasonEffectFailed)
		}
		cs := b.claims()
		if len(cs) != 1 || cs[0].MessageID != "t1" || cs[0].State != claim.StateProcessed {
			t.Errorf("claims = %v, want only t1 processed (a rolled-back effect leaves no marker)", cs)
		}
	})
}

// TestReplicasRace: three processors on one queue, every message sent
// twice and some three times: each effect runs once.
func TestReplicasRace(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.eff.delay = 2 * time.Millisecond
		for range 3 {
			// The race under test is the claim's: a holder must not be
			// taken over because a loaded machine delayed its heartbeat
			// past 3 × 200ms (a take-over repeats the effect, which this
			// test's counter, unlike an idempotent downstream, counts).
			opts := b.options()
			opts.TakeoverAfter = 10 * time.Second
			b.start(opts)
		}
		const n = 150
		var wg sync.WaitGroup
		for i := range n {
			copies := 2
			if i%5 == 0 {
				copies = 3
			}
			for range copies {
				wg.Add(1)
				go func() {
					defer wg.Done()
					b.send(fmt.Sprintf("m%03d", i), "pay", fmt.Sprintf(`{"n":%d}`, i), nil)
				}()
			}
		}
		wg.Wait()
		b.waitIdle()

		performed := b.eff.PerformedAll()
		if len(performed) != n {
			t.Errorf("%d keys performed, want %d", len(performed), n)
		}
		for k, v := range performed {
			if v != 1 {
				t.Errorf("%s performed %d times", k, v)
			}
		}
		s := b.q.Stats()
		if s.DeadLettered != 0 || s.Completed != s.Sent {
			t.Errorf("stats %+v: want every copy completed, none dead-lettered", s)
		}
		for _, c := range b.claims() {
			if c.State != claim.StateProcessed {
				t.Errorf("claim %s left %s", c.MessageID, c.State)
			}
		}
	})
}

// TestLockRenewal: an effect slower than the lock keeps its lock through
// renewal; with renewal off the broker redelivers and the redelivery takes
// the duplicate path — so renewal is what prevents the redelivery.
func TestLockRenewal(t *testing.T) {
	for _, renew := range []bool{true, false} {
		t.Run(fmt.Sprintf("renew=%v", renew), func(t *testing.T) {
			t.Parallel()
			// Renewal off needs a lock that outlasts the take-over window
			// (LockDuration - SettleTimeout > TakeoverAfter + heartbeat).
			lock := 700 * time.Millisecond
			b := setup(t, "sqlite", membus.QueueOptions{LockDuration: lock})
			b.eff.delay = 3 * lock
			opts := b.options()
			opts.Metrics = metricreg.ProcessorMetrics(nil)
			if !renew {
				opts.MaxLockRenewal = -1
				opts.LockDuration = lock
				opts.HeartbeatInterval = 100 * time.Millisecond
				opts.SettleTimeout = 200 * time.Millisecond
			}
			b.start(opts)
			b.start(opts) // a second replica to take a redelivery
			b.send("slow", "pay", `{}`, nil)
			b.waitIdle()

			s := b.q.Stats()
			if got := b.eff.Calls("slow"); got != 1 {
				t.Errorf("effect called %d times, want 1", got)
			}
			// Without renewal the duplicate path completes the message while
			// the first attempt still runs; the claim records the outcome.
			b.eventually("the claim processed", func() bool { return b.claimOf("slow").State == claim.StateProcessed })
			if renew {
				if s.Redeliveries != 0 || s.Renewals == 0 {
					t.Errorf("with renewal: redeliveries %d renewals %d, want 0 and >0", s.Redeliveries, s.Renewals)
				}
				if outcomes(opts.Metrics, processor.ResultDuplicate) != 0 {
					t.Errorf("with renewal a duplicate path was taken")
				}
			} else {
				if s.Redeliveries == 0 {
					t.Errorf("without renewal: no redelivery, the test proves nothing")
				}
				b.eventually("the redelivery on the duplicate path", func() bool {
					return outcomes(opts.Metrics, processor.ResultDuplicate) > 0
				})
			}
		})
	}
}

// TestHeartbeat: a running effect's claim heartbeat moves forward.
func TestHeartbeat(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	b.eff.gate = make(chan struct{})
	b.eff.started = make(chan string, 1)
	opts := b.options()
	opts.HeartbeatInterval = 50 * time.Millisecond
	b.start(opts)
	b.send("hb", "pay", `{}`, nil)
	<-b.eff.started
	first := b.claimOf("hb").HeartbeatAt
	b.eventually("a heartbeat", func() bool { return b.claimOf("hb").HeartbeatAt.After(first) })
	close(b.eff.gate)
	b.waitIdle()
}

// TestGracefulShutdown: on cancel, in-flight effects finish and are
// completed, messages not yet claimed are handed back, Run returns nil.
func TestGracefulShutdown(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	b.eff.gate = make(chan struct{})
	b.eff.started = make(chan string, 16)
	opts := b.options()
	opts.MaxConcurrentCalls = 2
	_, stop := b.start(opts)
	for i := range 6 {
		b.send(fmt.Sprintf("m%d", i), "pay", `{}`, nil)
	}
	inflight := []string{<-b.eff.started, <-b.eff.started}

	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	time.Sleep(100 * time.Millisecond) // let the cancel land while effects are blocked
	select {
	case <-stopped:
		t.Fatal("Run returned before in-flight effects finished")
	default:
	}
	close(b.eff.gate)
	<-stopped

	for _, k := range inflight {
		if countCompleted(b.q, k) != 1 || b.claimOf(k).State != claim.StateProcessed {
			t.Errorf("in-flight %s: completed %d state %s, want completed and processed", k, countCompleted(b.q, k), b.claimOf(k).State)
		}
	}
	for _, c := range b.claims() {
		if c.State != claim.StateProcessed {
			t.Errorf("claim %s left %s after shutdown", c.MessageID, c.State)
		}
	}
	if got := len(b.claims()); got != 2 {
		t.Errorf("%d claims, want only the 2 in flight", got)
	}
	if s := b.q.Stats(); s.Active+s.Locked != 4 {
		// Never received, or received during shutdown and abandoned:
		// either way still in the queue.
		t.Errorf("stats %+v: want the 4 unworked messages still in the queue", s)
	}
}

// TestShutdownTimeoutCancelsEffects: effects that outlive the shutdown
// timeout are cancelled; their claims stay (outcome unknown) and the
// messages are abandoned, not completed.
func TestShutdownTimeoutCancelsEffects(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	b.eff.gate = make(chan struct{}) // never opens
	b.eff.started = make(chan string, 1)
	opts := b.options()
	opts.NoDeferral = true // the abandon path: released, redelivered at once
	opts.ShutdownTimeout = 200 * time.Millisecond
	_, stop := b.start(opts)
	b.send("stuck", "pay", `{}`, nil)
	<-b.eff.started
	stop()
	if got := countCompleted(b.q, "stuck"); got != 0 {
		t.Errorf("a cancelled effect's message was completed")
	}
	if c := b.claimOf("stuck"); c.State != claim.StateClaimed {
		t.Errorf("claim %s, want claimed (the reconciler decides)", c.State)
	}
}

// TestReceiverRecreatedOnConnectionLoss: CodeConnectionLost from a receive
// makes the processor open a new receiver and carry on.
func TestReceiverRecreatedOnConnectionLoss(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	opts := b.options()
	opts.Metrics = metricreg.ProcessorMetrics(nil)
	b.q.FailReceives(2, azservicebus.CodeConnectionLost)
	p, _ := b.start(opts)
	b.send("m1", "pay", `{}`, nil)
	b.waitIdle()
	if b.eff.Performed("m1") != 1 {
		t.Errorf("message not processed after the receiver was recreated")
	}
	if got := int(testutilCounter(opts.Metrics)); got < 2 {
		t.Errorf("receivers opened %d, want >= 2", got)
	}
	if !p.Ready() {
		t.Errorf("not ready after recreating the receiver")
	}
}

// TestSettlementFailureIsRecovered: a completion that fails leaves the
// message locked; it is redelivered and settled on the duplicate path.
func TestSettlementFailureIsRecovered(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{LockDuration: 300 * time.Millisecond})
	b.start(b.options())
	b.q.FailSettlements(1)
	b.send("m1", "pay", `{}`, nil)
	b.waitIdle()
	if b.eff.Calls("m1") != 1 || countCompleted(b.q, "m1") != 1 {
		t.Errorf("calls %d completed %d, want 1 and 1", b.eff.Calls("m1"), countCompleted(b.q, "m1"))
	}
}

// TestTakeOverRace: a released claim redelivered to several replicas at
// once is taken over by exactly one of them.
func TestReleasedClaimRedeliveredToManyReplicas(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	b.eff.behave = func(_, _ string, call int) error {
		if call == 1 {
			return sideeffects.Retryable(errors.New("try later"))
		}
		return nil
	}
	for range 3 {
		b.start(noDeferral(b.options()))
	}
	b.send("r1", "pay", `{}`, nil)
	b.eventually("the release", func() bool {
		cs := b.claims()
		return len(cs) == 1 && (cs[0].State == claim.StateReleased || cs[0].State == claim.StateProcessed)
	})
	// Producer retries land while the claim is released.
	for range 3 {
		b.send("r1", "pay", `{}`, nil)
	}
	b.waitIdle()
	if got := b.eff.Performed("r1"); got != 1 {
		t.Errorf("performed %d, want 1", got)
	}
	if c := b.claimOf("r1"); c.State != claim.StateProcessed {
		t.Errorf("claim %s, want processed", c.State)
	}
}

var _ = context.Background

// TestTransactionalRouteMeetsReleasedClaim: a released two-phase claim
// whose key arrives on a (since changed) transactional route is completed
// as a duplicate and left released for the reconciler — never run twice,
// never a crash.
func TestTransactionalRouteMeetsReleasedClaim(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	db := b.store.(dbStore).DB()
	b.router.tx = ledgerEffect(t, db, "sqlite")
	ctx := context.Background()
	res, err := b.store.ClaimBatch(ctx, &claim.ClaimBatchParams{Claims: []claim.ClaimParams{{
		KeyForm:   claim.KeyFormRaw,
		Owner:     uuid.New(),
		MessageID: "rel", Consumer: "billing", PayloadHash: claim.HashPayload([]byte("credit"))}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.Release(ctx, &claim.ReleaseParams{ID: res[0].Claim.ID, Owner: res[0].Claim.Owner, Error: "503"}); err != nil {
		t.Fatal(err)
	}
	b.start(b.options())
	b.send("rel", "tx", "credit", nil)
	b.waitIdle()
	if got := countCompleted(b.q, "rel"); got != 1 {
		t.Errorf("completed %d, want 1", got)
	}
	if c := b.claimOf("rel"); c.State != claim.StateReleased {
		t.Errorf("claim %s, want still released (for the reconciler)", c.State)
	}
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM ledger`).Scan(&n); err != nil || n != 0 {
		t.Errorf("ledger rows %d (%v), want 0", n, err)
	}
}

// refusingStore refuses any batch that holds the key "poison", the way
// a database refuses a whole statement for one bad row.
type refusingStore struct{ claim.Store }

func (r refusingStore) ClaimBatch(ctx context.Context, p *claim.ClaimBatchParams) ([]claim.ClaimResult, error) {
	for _, c := range p.Claims {
		if c.MessageID == "poison" {
			return nil, errors.New("invalid byte sequence for encoding UTF8")
		}
	}
	return r.Store.ClaimBatch(ctx, p)
}

// TestRefusedBatchFallsBackToOneByOne: one message the store refuses does
// not hold back the others received with it.
func TestRefusedBatchFallsBackToOneByOne(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{MaxDeliveryCount: 3})
	opts := b.options()
	opts.Store = refusingStore{b.store}
	for i := range 4 {
		b.send(fmt.Sprintf("ok%d", i), "pay", `{}`, nil)
	}
	b.send("poison", "pay", `{}`, nil)
	b.start(opts) // after the sends, so one receive returns them together
	b.waitIdle()
	for i := range 4 {
		if k := fmt.Sprintf("ok%d", i); b.eff.Performed(k) != 1 || countCompleted(b.q, k) != 1 {
			t.Errorf("%s: performed %d completed %d, want 1 and 1", k, b.eff.Performed(k), countCompleted(b.q, k))
		}
	}
	if !strings.Contains(b.logs.String(), "claiming one by one") {
		t.Errorf("the batch was never refused: the test proves nothing")
	}
	if got := b.deadLetterReasons()["poison"]; got != membus.ReasonMaxDeliveryCountExceeded {
		t.Errorf("poison dead-letter reason %q, want %q (abandoned until the broker gave up)", got, membus.ReasonMaxDeliveryCountExceeded)
	}
}

// TestEffectCutOffAtMaxLockRenewal: an effect still running when its
// message's lock-renewal window ends is cut off (unknown outcome), its
// heartbeats stop, and the redelivery takes the silent claim over.
func TestEffectCutOffAtMaxLockRenewal(t *testing.T) {
	// Windows a loaded machine cannot miss: the take-over's delivery must
	// get to its attempt within its own MaxLockRenewal.
	b := setup(t, "sqlite", membus.QueueOptions{LockDuration: 600 * time.Millisecond})
	b.eff.behave = func(_, _ string, call int) error { return nil }
	var hung atomic.Bool
	b.eff.hang = func(call int) bool { return call == 1 && hung.CompareAndSwap(false, true) }
	opts := b.options()
	opts.NoDeferral = true // the abandon path: released, redelivered at once
	opts.MaxLockRenewal = 2 * time.Second
	opts.HeartbeatInterval = 150 * time.Millisecond
	b.start(opts)
	b.send("hang", "pay", `{}`, nil)
	b.waitIdle()
	c := b.claimOf("hang")
	if c.State != claim.StateProcessed || c.TakeOvers != 1 || !strings.Contains(c.LastError, "deadline") {
		t.Errorf("claim %s, take-overs %d, last error %q; want processed after a take-over, the first attempt's deadline recorded", c.State, c.TakeOvers, c.LastError)
	}
	if got := b.eff.Calls("hang"); got != 2 {
		t.Errorf("effect called %d times, want 2 (the cut-off one, the take-over's)", got)
	}
}

// New refuses options that would break the protocol, each in the
// component it is about: negative values, a take-over window shorter than
// three heartbeats or longer than the reconciler's stale window, a retry
// budget that outlives the lock renewal, a shutdown budget beyond the
// grace period, a group commit out of range.
func TestNewRejectsNegativeOptions(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	for name, edit := range map[string]func(*processor.Options){
		"concurrency":         func(o *processor.Options) { o.MaxConcurrentCalls = -1 },
		"heartbeat":           func(o *processor.Options) { o.HeartbeatInterval = -time.Second },
		"retry":               func(o *processor.Options) { o.Retry.MaxAttempts = -1 },
		"take-over too soon":  func(o *processor.Options) { o.HeartbeatInterval, o.TakeoverAfter = time.Second, 2*time.Second },
		"take-over too late":  func(o *processor.Options) { o.TakeoverAfter, o.StaleAfter = time.Hour, time.Minute },
		"budget beyond locks": func(o *processor.Options) { o.MaxLockRenewal, o.Retry.Budget = time.Minute, 2*time.Minute },
		// The default budget (30s) counts too.
		"default budget beyond locks": func(o *processor.Options) {
			o.MaxLockRenewal, o.Retry.Budget, o.HeartbeatInterval = 10*time.Second, 0, 100*time.Millisecond
		},
		"shutdown beyond SIGKILL": func(o *processor.Options) {
			o.TerminationGracePeriod, o.ShutdownTimeout = 10*time.Second, 20*time.Second
		},
		"group commit batch": func(o *processor.Options) { o.GroupCommit.MaxBatch = 100000 },
	} {
		opts := b.options()
		edit(&opts)
		if _, err := processor.New(opts); err == nil {
			t.Errorf("%s: negative value accepted", name)
		}
	}
}

// lossyStore commits MarkProcessed/Release and then reports the store
// unavailable (the answer was lost), or refuses Release outright.
type lossyStore struct {
	claim.Store
	lostAnswers   atomic.Int64 // writes committed, answer "lost"
	refuseRelease atomic.Bool
}

func (l *lossyStore) MarkProcessed(ctx context.Context, p *claim.MarkProcessedParams) error {
	if err := l.Store.MarkProcessed(ctx, p); err != nil {
		return err
	}
	l.lostAnswers.Add(1)
	return fmt.Errorf("connection reset after commit: %w", claim.ErrUnavailable)
}

func (l *lossyStore) Release(ctx context.Context, p *claim.ReleaseParams) error {
	if l.refuseRelease.Load() {
		return fmt.Errorf("database down: %w", claim.ErrUnavailable)
	}
	return l.Store.Release(ctx, p)
}

// TestMarkProcessedAnswerLost: MarkProcessed commits but its answer is
// lost; the retry finds the claim processed under our own owner and the
// message is completed as processed.
func TestMarkProcessedAnswerLost(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	ls := &lossyStore{Store: b.store}
	opts := b.options()
	opts.Store = ls
	opts.Metrics = metricreg.ProcessorMetrics(nil)
	b.start(opts)
	b.send("m1", "pay", `{}`, nil)
	b.waitIdle()
	if ls.lostAnswers.Load() == 0 {
		t.Fatal("no answer was lost: the test proves nothing")
	}
	if c := b.claimOf("m1"); c.State != claim.StateProcessed {
		t.Errorf("claim %s, want processed", c.State)
	}
	b.eventually("a processed outcome", func() bool { return outcomes(opts.Metrics, processor.ResultProcessed) == 1 })
	if got := outcomes(opts.Metrics, processor.ResultFlagged); got != 0 {
		t.Errorf("%d flagged outcomes for our own lost answer", got)
	}
}

// TestReleaseFailureKeepsClaim: when the release cannot be written, the
// claim stays claimed and the outcome is unknown, not released; the
// redelivery takes the silent claim over and runs the effect.
func TestReleaseFailureKeepsClaim(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	ls := &lossyStore{Store: b.store}
	ls.refuseRelease.Store(true)
	b.eff.behave = func(_, _ string, call int) error {
		if call == 1 {
			return sideeffects.Retryable(errors.New("503"))
		}
		return nil
	}
	opts := b.options()
	opts.Store = ls
	opts.Metrics = metricreg.ProcessorMetrics(nil)
	b.start(opts)
	b.send("m1", "pay", `{}`, nil)
	b.eventually("an unknown outcome", func() bool { return outcomes(opts.Metrics, processor.ResultUnknown) == 1 })
	if c := b.claimOf("m1"); c.State != claim.StateClaimed || c.Attempts != 1 {
		t.Errorf("claim %s attempts %d, want claimed (the release never got through)", c.State, c.Attempts)
	}
	ls.refuseRelease.Store(false)
	b.waitIdle()
	if got := outcomes(opts.Metrics, processor.ResultReleased); got != 0 {
		t.Errorf("%d released outcomes, want 0", got)
	}
	if c := b.claimOf("m1"); c.State != claim.StateProcessed || c.TakeOvers != 1 {
		t.Errorf("claim %s take-overs %d, want processed after a take-over", c.State, c.TakeOvers)
	}
}

// TestErrorTextIsStorable: an effect error with NUL and invalid UTF-8 is
// still recorded on the claim (PostgreSQL refuses both in text), bounded
// and cut on a UTF-8 boundary, and so is the dead-letter description.
func TestErrorTextIsStorable(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.eff.behave = func(_, _ string, _ int) error {
			return sideeffects.Permanent(errors.New("bad \x00 answer \xff" + strings.Repeat("é", 5000)))
		}
		b.start(b.options())
		b.send("m1", "pay", `{}`, nil)
		b.waitIdle()
		c := b.claimOf("m1")
		if c.State != claim.StateFailed || !strings.Contains(c.LastError, "bad") || len(c.LastError) > claim.MaxErrorText+len("…") ||
			!utf8.ValidString(c.LastError) || strings.ContainsRune(c.LastError, 0) {
			t.Errorf("claim %s, last error %d bytes (valid UTF-8 %v), want failed with a bounded, storable error", c.State, len(c.LastError), utf8.ValidString(c.LastError))
		}
		dl := b.q.DeadLetters()
		if len(dl) != 1 || dl[0].DeadLetterErrorDescription == nil {
			t.Fatalf("dead letters %d", len(dl))
		}
		if desc := *dl[0].DeadLetterErrorDescription; len(desc) > 1024 || !utf8.ValidString(desc) || !strings.HasPrefix(desc, "permanent: bad") {
			t.Errorf("dead-letter description %d bytes, valid UTF-8 %v: %.40q", len(desc), utf8.ValidString(desc), desc)
		}
	})
}

// TestReceivesOnlyForFreeSlots: the SDK has no prefetch, so the processor
// must never hold more locked messages than it has workers: with two
// slots busy it stops receiving, and the rest stay available to other
// replicas.
func TestReceivesOnlyForFreeSlots(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	b.eff.gate = make(chan struct{})
	b.eff.started = make(chan string, 16)
	opts := b.options()
	opts.MaxConcurrentCalls = 2
	b.start(opts)
	for i := range 10 {
		b.send(fmt.Sprintf("m%d", i), "pay", `{}`, nil)
	}
	<-b.eff.started
	<-b.eff.started
	time.Sleep(200 * time.Millisecond) // room for a wrong extra receive
	if s := b.q.Stats(); s.Locked != 2 || s.Active != 8 {
		t.Errorf("locked %d active %d with 2 busy slots, want 2 and 8", s.Locked, s.Active)
	}
	close(b.eff.gate)
	b.waitIdle()
	if got := len(b.claims()); got != 10 {
		t.Errorf("%d claims, want 10", got)
	}
}

// TestEffectFinishingAfterFlag (a lost claim stops its effect): the claim
// is flagged (or taken over) while its effect runs. (It used to flag with
// FlagStale(StaleAfter: 1ns), which a heartbeat written in the same
// millisecond — SQLite's time resolution — could dodge: 3 runs in 8 failed.
// It now flags with the guarded Flag on the held claim's owner.) The next heartbeat finds it lost and cancels the
// effect's context; nothing more is written for the old holder (no
// attempt, no release), the outcome is "lost", and the message, whose
// claim is now in operators' hands, is completed. An effect that ignores
// its context and succeeds anyway is recorded on the claim as a late
// success — loudly when an operator had discarded the claim.
func TestEffectFinishingAfterFlag(t *testing.T) {
	for _, tc := range []struct {
		name               string
		ignoreCtx, discard bool
	}{{"cooperative effect", false, false}, {"effect ignores its context", true, false}, {"late success after discard", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t, "sqlite", membus.QueueOptions{})
			b.eff.gate = make(chan struct{})
			b.eff.ignoreCtx = tc.ignoreCtx
			b.eff.started = make(chan string, 1)
			b.eff.behave = func(_, _ string, _ int) error { return sideeffects.Retryable(errors.New("must not be recorded")) }
			if tc.ignoreCtx {
				b.eff.behave = nil // succeeds
			}
			opts := b.options()
			opts.HeartbeatInterval = 50 * time.Millisecond
			opts.Metrics = metricreg.ProcessorMetrics(nil)
			b.start(opts)
			b.send("late", "pay", `{}`, nil)
			<-b.eff.started
			ctx := context.Background()
			held := b.claimOf("late")
			flagged, err := b.store.Flag(ctx, &claim.FlagParams{ID: held.ID, Owner: held.Owner, State: claim.StateClaimed, Reason: "test: looked stuck"})
			if err != nil {
				t.Fatalf("flag: %v", err)
			}
			if tc.discard {
				if _, err := b.store.Resolve(ctx, &claim.ResolveParams{ID: flagged.ID, Resolution: claim.ResolutionDiscarded, By: "op", Note: "looked stuck"}); err != nil {
					t.Fatal(err)
				}
			}
			b.eventually("the heartbeat to find the claim lost", func() bool {
				return strings.Contains(b.logs.String(), "claim lost while its effect ran")
			})
			close(b.eff.gate)
			b.waitIdle()
			b.eventually("a lost outcome", func() bool { return outcomes(opts.Metrics, processor.ResultLost) == 1 })
			if got := countCompleted(b.q, "late"); got != 1 {
				t.Errorf("completed %d, want 1", got)
			}
			c := b.claimOf("late")
			want := claim.StateFlagged
			if tc.discard {
				want = claim.StateResolved
			}
			if c.State != want || c.ProcessedAt != nil || c.Attempts != 0 || c.LastError != "" {
				t.Errorf("claim %s processed_at %v attempts %d last error %q; want %s, untouched by the lost holder", c.State, c.ProcessedAt, c.Attempts, c.LastError, want)
			}
			if got := b.eff.Calls("late"); got != 1 {
				t.Errorf("effect called %d times, want 1 (no retry after the claim was lost)", got)
			}
			late := metricValue(opts.Metrics.LateEffects)
			if tc.ignoreCtx {
				if c.LateSuccessAt == nil || !strings.Contains(c.LateSuccessBy, held.Owner.String()) || late != 1 {
					t.Errorf("late success at %v by %q, metric %v; want recorded with the lost owner's token and counted", c.LateSuccessAt, c.LateSuccessBy, late)
				}
			} else if c.LateSuccessAt != nil || late != 0 || b.eff.Performed("late") != 0 {
				t.Errorf("a cancelled effect: late success %v, metric %v, performed %d; want none", c.LateSuccessAt, late, b.eff.Performed("late"))
			}
			loud := strings.Contains(b.logs.String(), "AFTER an operator discarded")
			if loud != tc.discard {
				t.Errorf("error about a discarded claim logged: %v, want %v", loud, tc.discard)
			}
		})
	}
}

// takeOverDown fails TakeOver as unavailable.
type takeOverDown struct{ claim.Store }

func (takeOverDown) TakeOver(context.Context, *claim.TakeOverParams) (*claim.Claim, error) {
	return nil, fmt.Errorf("connection refused: %w", claim.ErrUnavailable)
}

// TestTakeOverUnavailableAbandons: a released claim that cannot be taken
// over because the store is down is abandoned, not completed, and stays
// released for the next delivery.
func TestTakeOverUnavailableAbandons(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{MaxDeliveryCount: 2})
	ctx := context.Background()
	res, err := b.store.ClaimBatch(ctx, &claim.ClaimBatchParams{Claims: []claim.ClaimParams{{
		KeyForm:   claim.KeyFormRaw,
		Owner:     uuid.New(),
		MessageID: "rel", Consumer: "billing", PayloadHash: claim.HashPayload([]byte("{}"))}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.Release(ctx, &claim.ReleaseParams{ID: res[0].Claim.ID, Owner: res[0].Claim.Owner, Error: "503"}); err != nil {
		t.Fatal(err)
	}
	opts := b.options()
	opts.Store = takeOverDown{b.store}
	b.start(opts)
	b.send("rel", "pay", `{}`, nil)
	b.waitIdle()
	if got := countCompleted(b.q, "rel"); got != 0 {
		t.Errorf("completed %d times without the effect", got)
	}
	if got := b.deadLetterReasons()["rel"]; got != membus.ReasonMaxDeliveryCountExceeded {
		t.Errorf("dead-letter reason %q, want %q (abandoned every time)", got, membus.ReasonMaxDeliveryCountExceeded)
	}
	if c := b.claimOf("rel"); c.State != claim.StateReleased || b.eff.Calls("rel") != 0 {
		t.Errorf("claim %s, effect calls %d: want still released, no call", c.State, b.eff.Calls("rel"))
	}
}

// TestNewRefusesAWatchShorterThanTheTakeOver: a redelivery of a dead
// holder's message watches the claim only while it holds the message (its
// lock-renewal window); a window that ends before the holder can have been
// silent for TakeoverAfter (plus one poll, at most a heartbeat interval)
// completes the message instead of taking the claim over. New refuses it,
// naming both settings and their values.
func TestNewRefusesAWatchShorterThanTheTakeOver(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	opts := b.options()
	opts.HeartbeatInterval, opts.TakeoverAfter, opts.MaxLockRenewal = time.Second, 90*time.Second, time.Minute
	_, err := processor.New(opts)
	if err == nil {
		t.Fatal("New accepted a lock-renewal window (1m) shorter than TakeoverAfter (1m30s)")
	}
	for _, want := range []string{"MaxLockRenewal", "1m0s", "TakeoverAfter", "1m30s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	// The window must also cover one poll after the take-over window.
	opts.MaxLockRenewal = 90*time.Second + 500*time.Millisecond
	if _, err := processor.New(opts); err == nil {
		t.Error("New accepted a lock-renewal window that ends within a heartbeat interval of TakeoverAfter")
	}
	opts.MaxLockRenewal = 2 * time.Minute
	if _, err := processor.New(opts); err != nil {
		t.Errorf("New refused a lock-renewal window of 2m with TakeoverAfter 1m30s: %v", err)
	}

	// Renewal off: the window is the lock itself, which must be known.
	opts.MaxLockRenewal = -1
	if _, err := processor.New(opts); err == nil || !strings.Contains(err.Error(), "LockDuration") {
		t.Errorf("renewal off without LockDuration: %v, want an error naming LockDuration", err)
	}
	opts.LockDuration = time.Minute // Service Bus's default; minus SettleTimeout (5s)
	_, err = processor.New(opts)
	if err == nil {
		t.Fatal("New accepted renewal off with a 1m lock and TakeoverAfter 1m30s")
	}
	for _, want := range []string{"LockDuration", "1m0s", "SettleTimeout", "TakeoverAfter", "1m30s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	opts.LockDuration = 5 * time.Minute
	if _, err := processor.New(opts); err != nil {
		t.Errorf("New refused renewal off with a 5m lock and TakeoverAfter 1m30s: %v", err)
	}
}

// lookFailStore fails the next fails reads of a claim (Get) with an error
// before commit, as a deadlock victim or a dropped connection presents.
type lookFailStore struct {
	claim.Store
	fails, failed atomic.Int64
}

func (s *lookFailStore) Get(ctx context.Context, id int64) (*claim.Claim, error) {
	if s.fails.Add(-1) >= 0 {
		s.failed.Add(1)
		return nil, fmt.Errorf("injected: %w", claim.ErrAborted)
	}
	return s.Store.Get(ctx, id)
}

// TestAFailedLookWhileWatchingKeepsWatching: a copy watching a live
// holder reads the claim again and again; reads that fail (here three in
// a row) are tried again within the watch, instead of abandoning the copy
// and spending one of its deliveries each time (the simulation's seed
// 1158: a few such abandons dead-lettered a message by its delivery
// count).
func TestAFailedLookWhileWatchingKeepsWatching(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		holding, release := make(chan struct{}), make(chan struct{})
		b.eff.behaveCtx = func(ctx context.Context, _ string, call int) error {
			if call == 1 {
				close(holding)
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		}
		st := &lookFailStore{Store: b.store}
		opts := b.options()
		opts.Store = st
		opts.Metrics = metricreg.ProcessorMetrics(nil)
		b.start(opts)
		b.send("m1", "pay", `{}`, nil)
		<-holding
		b.send("m1", "pay", `{}`, nil) // a copy: it watches the live holder
		b.eventually("the copy waits for the holder", func() bool {
			return metricValue(opts.Metrics.DuplicateWaits) == 1
		})
		st.fails.Store(3)
		b.eventually("the copy's looks fail", func() bool { return st.failed.Load() == 3 })
		close(release)
		b.waitIdle()
		if got := countCompleted(b.q, "m1"); got != 2 {
			t.Fatalf("completed %d times, want 2 (the holder's and the copy's)", got)
		}
		if s := b.q.Stats(); s.Abandoned != 0 || s.Redeliveries != 0 {
			t.Fatalf("abandoned %d, redelivered %d: a failed look must not give the copy back", s.Abandoned, s.Redeliveries)
		}
		if got := b.eff.Calls("m1"); got != 1 {
			t.Fatalf("effect called %d times, want 1", got)
		}
	})
}

// TestStoreOutageHoldsATransactionalEffect: a transactional effect whose
// claim transaction the store refuses store-wide keeps its message, as a
// plain claim does, and runs once the store is back: one ledger row, no
// delivery spent.
func TestStoreOutageHoldsATransactionalEffect(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	db := b.store.(dbStore).DB()
	b.router.tx = ledgerEffect(t, db, "sqlite")
	fs := &flakyStore{Store: b.store}
	opts := b.options()
	opts.Store = fs
	b.start(opts)
	b.eventually("the start-up store probe", func() bool { return fs.probed.Load() >= 1 })
	fs.down.Store(true)
	b.send("t1", "tx", "credit", nil)
	b.eventually("the transaction refused and the message held", func() bool { return fs.fails.Load() >= 2 && b.q.Stats().Locked == 1 })
	fs.down.Store(false)
	b.waitIdle()
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM ledger WHERE message_id = 't1'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 || countCompleted(b.q, "t1") != 1 {
		t.Fatalf("ledger rows %d, completed %d; want 1 and 1", n, countCompleted(b.q, "t1"))
	}
	if s := b.q.Stats(); s.Abandoned != 0 || s.Redeliveries != 0 {
		t.Fatalf("abandoned %d, redelivered %d: an outage must not spend deliveries\n%s", s.Abandoned, s.Redeliveries, b.logs.tail(12))
	}
}
