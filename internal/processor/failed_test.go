package processor_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
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
	"github.com/sbclaim/sbclaim/internal/sideeffects/routesfile"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// decline answers like a payment API's card decline: the answer is
// reported (and so recorded on the claim) and the error is rejected.
func decline(ctx context.Context) error {
	sideeffects.ReportAnswer(ctx, sideeffects.Answer{Status: 402, Headers: map[string]string{"Request-Id": "req_7"},
		Fields: map[string]string{"/error/charge": "ch_declined"}})
	return sideeffects.Rejected(errors.New("HTTP 402 (answers[0]): a final answer: card_declined"))
}

// answering is an effect built on b.eff whose call reports an answer:
// fn decides what the call does.
func (b *bundle) answering(fn func(ctx context.Context, key string, call int) error) {
	b.eff.mu.Lock()
	defer b.eff.mu.Unlock()
	b.eff.behave, b.eff.behaveCtx = nil, fn
}

// deadLettersOf returns the dead letters of message id.
func (b *bundle) deadLettersOf(id string) []*azservicebus.ReceivedMessage {
	var out []*azservicebus.ReceivedMessage
	for _, m := range b.q.DeadLetters() {
		if m.MessageID == id {
			out = append(out, m)
		}
	}
	return out
}

// TestRejectedAnswerFailsTheClaimAndIsDeadLetteredOnce: a decline is a
// final answer: the claim is failed with the answer on it, the message
// dead-lettered EffectRejected once; every later copy completes without
// calling the downstream.
func TestRejectedAnswerFailsTheClaimAndIsDeadLetteredOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.answering(func(ctx context.Context, _ string, _ int) error { return decline(ctx) })
		opts := b.options()
		opts.Metrics = metricreg.ProcessorMetrics(nil)
		b.start(opts)
		b.send("m1", "pay", `{"amount":1}`, nil)
		b.waitIdle()
		for range 3 {
			b.send("m1", "pay", `{"amount":1}`, nil) // producer retries
			b.waitIdle()
		}

		dl := b.deadLettersOf("m1")
		if len(dl) != 1 || *dl[0].DeadLetterReason != processor.ReasonEffectRejected ||
			!strings.Contains(*dl[0].DeadLetterErrorDescription, "402") || !strings.Contains(*dl[0].DeadLetterErrorDescription, "card_declined") {
			t.Fatalf("dead letters of m1: %d (%v), want one EffectRejected naming the 402", len(dl), b.deadLetterReasons())
		}
		if got := b.eff.Calls("m1"); got != 1 {
			t.Errorf("the downstream was called %d times, want once", got)
		}
		if got := countCompleted(b.q, "m1"); got != 3 {
			t.Errorf("completed %d copies, want 3", got)
		}
		c := b.claimOf("m1")
		if c.State != claim.StateFailed || c.FailReason != processor.ReasonEffectRejected || c.FailedAt == nil || c.Payload == nil || // kept for an operator's retry
			c.DeadLetterSeq == nil || *c.DeadLetterSeq != *dl[0].SequenceNumber || c.LastError != *dl[0].DeadLetterErrorDescription {
			t.Errorf("claim %s (%s) at %v, dead letter %v (the dead-lettered message is %d), last error %q",
				c.State, c.FailReason, c.FailedAt, c.DeadLetterSeq, *dl[0].SequenceNumber, c.LastError)
		}
		if c.Answer == nil || c.Answer.Status != 402 || c.Answer.Fields["/error/charge"] != "ch_declined" || c.Answer.Headers["Request-Id"] != "req_7" || c.AnswerAt == nil {
			t.Errorf("answer on the claim: %+v", c.Answer)
		}
		if c.FlaggedAt != nil || c.ReleasedAt != nil || c.TakeOvers != 0 {
			t.Errorf("a failed claim was flagged, released or taken over: %+v", c)
		}
		b.eventually("one failed and three duplicate outcomes", func() bool {
			return outcomes(opts.Metrics, processor.ResultFailed) == 1 && outcomes(opts.Metrics, processor.ResultDuplicate) == 3
		})
		logs := b.logs.String()
		for _, want := range []string{`"effect_outcome":"rejected"`, `"outcome":"failed"`, `"claim_state":"failed"`} {
			if !strings.Contains(logs, want) {
				t.Errorf("logs lack %s", want)
			}
		}
	})
}

// TestCopiesRacingARejectionCompleteWithoutADeadLetter: copies that
// arrive while the first delivery's effect runs wait for the live holder,
// see the claim failed and complete: one dead letter, one call. The race
// is proved: every copy waited on the holder (DuplicateWaits) before the
// effect was let go.
func TestCopiesRacingARejectionCompleteWithoutADeadLetter(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.answering(func(ctx context.Context, _ string, _ int) error { return decline(ctx) })
		b.eff.gate = make(chan struct{})
		b.eff.started = make(chan string, 1)
		opts := b.options()
		opts.Metrics = metricreg.ProcessorMetrics(nil)
		b.start(opts)
		b.send("m1", "pay", `{}`, nil)
		<-b.eff.started
		const copies = 3
		for range copies {
			b.send("m1", "pay", `{}`, nil)
		}
		b.eventually("every copy to wait on the live holder", func() bool {
			return metricValue(opts.Metrics.DuplicateWaits) == copies
		})
		close(b.eff.gate)
		b.waitIdle()

		if dl := b.deadLettersOf("m1"); len(dl) != 1 || *dl[0].DeadLetterReason != processor.ReasonEffectRejected {
			t.Fatalf("dead letters of m1: %d, want one EffectRejected", len(dl))
		}
		if got := countCompleted(b.q, "m1"); got != copies {
			t.Errorf("completed %d, want %d copies", got, copies)
		}
		if got := b.eff.Calls("m1"); got != 1 {
			t.Errorf("calls %d, want 1", got)
		}
		if c := b.claimOf("m1"); c.State != claim.StateFailed || c.TakeOvers != 0 {
			t.Errorf("claim %s take-overs %d", c.State, c.TakeOvers)
		}
	})
}

// TestConflictAnswerFailsTheClaim: the downstream says the key is held by
// another payload (Stripe's 400 idempotency_error through an answer rule):
// final, dead-lettered IdempotencyKeyConflict once.
func TestConflictAnswerFailsTheClaim(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.answering(func(ctx context.Context, _ string, _ int) error {
			sideeffects.ReportAnswer(ctx, sideeffects.Answer{Status: 400, Fields: map[string]string{"/error/type": "idempotency_error"}})
			return sideeffects.Conflict(errors.New("HTTP 400 (answers[1]): the key was already used with another payload"))
		})
		b.start(b.options())
		b.send("m1", "pay", `{}`, nil)
		b.waitIdle()
		b.send("m1", "pay", `{}`, nil)
		b.waitIdle()
		if dl := b.deadLettersOf("m1"); len(dl) != 1 || *dl[0].DeadLetterReason != processor.ReasonIdempotencyKeyConflict {
			t.Fatalf("dead letters of m1: %v, want one IdempotencyKeyConflict", b.deadLetterReasons())
		}
		c := b.claimOf("m1")
		if c.State != claim.StateFailed || c.FailReason != claim.FailConflict || c.Answer == nil || c.Answer.Fields["/error/type"] != "idempotency_error" {
			t.Errorf("claim %s (%s) answer %+v", c.State, c.FailReason, c.Answer)
		}
		if b.eff.Calls("m1") != 1 || countCompleted(b.q, "m1") != 1 {
			t.Errorf("calls %d completed %d, want 1 and 1", b.eff.Calls("m1"), countCompleted(b.q, "m1"))
		}
	})
}

// TestDeadLetterThatDidNotLandIsDoneByTheRedelivery: the claim is failed
// but the dead-letter call fails (the settlement never reached the
// broker) or the replica dies before it; the lock runs out and the same
// message comes back: the claim names it, so it is dead-lettered now. A
// copy (another sequence number) completes. One dead letter either way.
func TestDeadLetterThatDidNotLandIsDoneByTheRedelivery(t *testing.T) {
	for _, how := range []string{"settlement lost", "crash after fail"} {
		t.Run(how, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, be string) {
				b := setup(t, be, membus.QueueOptions{LockDuration: 300 * time.Millisecond})
				b.answering(func(ctx context.Context, _ string, _ int) error { return decline(ctx) })
				opts := b.options()
				var crashes atomic.Int64
				if how == "crash after fail" {
					opts.Hooks.AfterFail = func(context.Context, *azservicebus.ReceivedMessage) error {
						if crashes.Add(1) == 1 {
							return processor.ErrCrash
						}
						return nil
					}
				} else {
					b.q.FailSettlements(1)
				}
				b.start(opts)
				b.send("m1", "pay", `{}`, nil)
				b.waitIdle()
				b.send("m1", "pay", `{}`, nil)
				b.waitIdle()

				dl := b.deadLettersOf("m1")
				if len(dl) != 1 || *dl[0].DeadLetterReason != processor.ReasonEffectRejected || dl[0].DeliveryCount < 2 {
					t.Fatalf("dead letters of m1: %d (reasons %v), want one, by the redelivery", len(dl), b.deadLetterReasons())
				}
				c := b.claimOf("m1")
				if c.State != claim.StateFailed || c.DeadLetterSeq == nil || *c.DeadLetterSeq != *dl[0].SequenceNumber {
					t.Errorf("claim %s dead letter %v, want failed naming message %d", c.State, c.DeadLetterSeq, *dl[0].SequenceNumber)
				}
				if b.eff.Calls("m1") != 1 || countCompleted(b.q, "m1") != 1 {
					t.Errorf("calls %d completed %d, want 1 (the first delivery) and 1 (the copy)", b.eff.Calls("m1"), countCompleted(b.q, "m1"))
				}
				if *dl[0].DeadLetterErrorDescription != c.LastError {
					t.Errorf("the redelivery's description %q, want the claim's last error %q", *dl[0].DeadLetterErrorDescription, c.LastError)
				}
			})
		})
	}
}

// TestClaimFailedWithoutAMessageIsDeadLetteredByOneCopy: a claim the
// reconciler or a redrive failed names no delivery: the first copy that
// arrives takes the dead letter (with the claim's reason and last error),
// the next completes; neither calls the downstream.
func TestClaimFailedWithoutAMessageIsDeadLetteredByOneCopy(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		ctx := context.Background()
		res, err := b.store.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "reconciler", Claims: []claim.ClaimParams{{
			KeyForm:   claim.KeyFormRaw,
			MessageID: "m1", Consumer: "billing", Owner: uuid.New(), Route: "effect", Fingerprint: "fp-effect",
			PayloadHash: claim.HashPayload([]byte(`{}`)), Payload: []byte(`{}`),
		}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.store.Fail(ctx, &claim.FailParams{ID: res[0].Claim.ID, Owner: res[0].Claim.Owner, Reason: claim.FailRejected,
			Error: "recovery: HTTP 402: declined"}); err != nil {
			t.Fatal(err)
		}
		b.start(b.options())
		b.send("m1", "pay", `{}`, nil)
		b.waitIdle()
		b.send("m1", "pay", `{}`, nil)
		b.waitIdle()
		dl := b.deadLettersOf("m1")
		if len(dl) != 1 || *dl[0].DeadLetterReason != claim.FailRejected || *dl[0].DeadLetterErrorDescription != "recovery: HTTP 402: declined" {
			t.Fatalf("dead letters of m1: %d (%v), want one with the claim's reason and error", len(dl), b.deadLetterReasons())
		}
		if c := b.claimOf("m1"); c.DeadLetterSeq == nil || *c.DeadLetterSeq != *dl[0].SequenceNumber {
			t.Errorf("claim dead letter %v, want message %d", c.DeadLetterSeq, *dl[0].SequenceNumber)
		}
		if b.eff.Calls("m1") != 0 || countCompleted(b.q, "m1") != 1 {
			t.Errorf("calls %d completed %d, want 0 and 1", b.eff.Calls("m1"), countCompleted(b.q, "m1"))
		}
	})
}

// TestInvalidContentTypeIsDeadLetteredBeforeAnyClaim: a ContentType that
// cannot be a Content-Type header (CR/LF) is refused before any claim on
// every route, Go routes included (the HTTP router checks it too).
func TestInvalidContentTypeIsDeadLetteredBeforeAnyClaim(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	b.start(b.options())
	for id, ct := range map[string]string{"crlf": "text/plain\r\nX-Injected: 1", "notype": "plain", "ok": "application/json; charset=utf-8"} {
		id, ct, subj := id, ct, "pay"
		if err := b.q.SendMessage(context.Background(), &azservicebus.Message{MessageID: &id, Subject: &subj, ContentType: &ct, Body: []byte(`{}`)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	b.waitIdle()
	reasons := b.deadLetterReasons()
	for _, id := range []string{"crlf", "notype"} {
		if reasons[id] != sideeffects.ReasonInvalidContentType || b.eff.Calls(id) != 0 {
			t.Errorf("%s: dead-letter reason %q, calls %d; want InvalidContentType before any call", id, reasons[id], b.eff.Calls(id))
		}
	}
	for _, c := range b.claims() {
		if c.MessageID != "ok" {
			t.Errorf("a claim was taken for %q", c.MessageID)
		}
	}
	if b.eff.Calls("ok") != 1 {
		t.Errorf("a valid ContentType was refused: %v", reasons)
	}
	for _, m := range b.q.DeadLetters() {
		if strings.ContainsAny(*m.DeadLetterErrorDescription, "\r\n") {
			t.Errorf("the description quotes the raw value: %q", *m.DeadLetterErrorDescription)
		}
	}
}

// TestEveryOutcomeRecordsTheAnswer: a released attempt records its answer
// with the release, and the success that follows replaces it.
func TestEveryOutcomeRecordsTheAnswer(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.answering(func(ctx context.Context, _ string, call int) error {
			if call == 1 {
				sideeffects.ReportAnswer(ctx, sideeffects.Answer{Status: 503, Headers: map[string]string{"Retry-After": "0"}})
				return sideeffects.Retryable(errors.New("HTTP 503"))
			}
			sideeffects.ReportAnswer(ctx, sideeffects.Answer{Status: 201, Fields: map[string]string{"/id": "ch_1"}})
			return nil
		})
		released := make(chan struct{})
		opts := b.options()
		opts.Store = &releaseWatch{Store: b.store, released: released}
		b.start(opts)
		b.send("m1", "pay", `{}`, nil)
		<-released
		if c := b.claimOf("m1"); c.Answer == nil || c.Answer.Status != 503 {
			t.Errorf("the released claim's answer %+v, want the 503", c.Answer)
		}
		b.waitIdle()
		c := b.claimOf("m1")
		if c.State != claim.StateProcessed || c.Answer == nil || c.Answer.Status != 201 || c.Answer.Fields["/id"] != "ch_1" {
			t.Errorf("claim %s answer %+v, want processed with the 201", c.State, c.Answer)
		}
	})
}

// releaseWatch signals the first Release once it committed.
type releaseWatch struct {
	claim.Store
	released chan struct{}
	once     atomic.Bool
}

func (r *releaseWatch) Release(ctx context.Context, p *claim.ReleaseParams) error {
	err := r.Store.Release(ctx, p)
	if err == nil && r.once.CompareAndSwap(false, true) {
		close(r.released)
	}
	return err
}

// TestRedeliveryUsesTheOperatorsNewKey: an operator's redrive under a new
// key took the claim and died; the redelivery that takes it over runs the
// effect with the recorded key, never the old one.
func TestRedeliveryUsesTheOperatorsNewKey(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		ctx := context.Background()
		res, err := b.store.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "host-a", Claims: []claim.ClaimParams{{
			KeyForm:   claim.KeyFormRaw,
			MessageID: "m1", Consumer: "billing", Owner: uuid.New(), Route: "effect", Fingerprint: "fp-effect",
			PayloadHash: claim.HashPayload([]byte(`{}`)), Payload: []byte(`{}`),
		}}})
		if err != nil {
			t.Fatal(err)
		}
		c := res[0].Claim
		f, err := b.store.Flag(ctx, &claim.FlagParams{ID: c.ID, Owner: c.Owner, State: claim.StateClaimed, Reason: "still 500"})
		if err != nil {
			t.Fatal(err)
		}
		held, err := b.store.TakeOver(ctx, &claim.TakeOverParams{ID: f.ID, PreviousOwner: f.Owner, Owner: uuid.New(), Path: claim.PathOperator,
			By: "operator:ann", Reason: "cached 500", Route: "effect", Fingerprint: "fp-effect", NewKey: true})
		if err != nil || held.Key() != "m1:r1" {
			t.Fatalf("redrive take-over: %+v %v", held, err)
		}
		opts := b.options()
		opts.Metrics = metricreg.ProcessorMetrics(nil)
		b.start(opts) // the redrive's holder never heartbeats: it is silent
		b.send("m1", "pay", `{}`, nil)
		b.waitIdle()
		if got := b.eff.Calls("m1:r1"); got != 1 {
			t.Errorf("calls with the new key %d, want 1", got)
		}
		if got := b.eff.Calls("m1"); got != 0 {
			t.Errorf("calls with the old key %d, want 0", got)
		}
		if c := b.claimOf("m1"); c.State != claim.StateProcessed || c.Key() != "m1:r1" || c.TakeOverPath != claim.PathRedelivery {
			t.Errorf("claim %s key %q path %s", c.State, c.Key(), c.TakeOverPath)
		}
	})
}

// TestPaymentAPIAnswersAcrossReplicas: two replicas, every message sent
// twice (a producer retry), the HTTP effect of a Stripe-style routes file
// against the fake payment API, whose keys are declined, held by another
// payload (a 400 idempotency_error) or charged. Every declined key and
// every conflict is dead-lettered exactly once, with its claim failed and
// never flagged; every other key is charged once; the downstream records
// one decline per declined key.
func TestPaymentAPIAnswersAcrossReplicas(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		fake := fakedownstream.New(fakedownstream.Options{ConflictStyle: fakedownstream.ConflictStripe, Latency: 20 * time.Millisecond})
		srv := httptest.NewServer(fake)
		t.Cleanup(srv.Close)
		router, err := routesfile.Parse([]byte(`version: 1
routes:
  - name: payments
    key: raw
    match: {subject: "*"}
    url: "`+srv.URL+`/v1/charges"
    timeout: 5s
    answers:
      - {status: 402, outcome: rejected}
      - {status: 400, field: /error/type, equals: idempotency_error, outcome: conflict}
      - {status: 409, outcome: retryable}
    record:
      headers: [Request-Id]
      fields: [/id, /error/charge]
`), func(string) string { return "" }, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		const n = 24
		want := map[string]string{} // key → dead-letter reason ("" for charged)
		for i := range n {
			key := fmt.Sprintf("pay-%02d", i)
			switch i % 3 {
			case 0:
				fake.SetKeyReply(key, fakedownstream.ReplyDecline)
				want[key] = processor.ReasonEffectRejected
			case 1:
				fake.SetKeyReply(key, fakedownstream.ReplyConflict)
				want[key] = processor.ReasonIdempotencyKeyConflict
			default:
				want[key] = ""
			}
		}
		metrics := metricreg.ProcessorMetrics(nil)
		for _, host := range []string{"replica-a", "replica-b"} {
			opts := b.options()
			opts.Router, opts.Host, opts.Metrics = router, host, metrics
			opts.Retry = sideeffects.RetryPolicy{MaxAttempts: 3, InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond}
			// No take-over of a live holder whose heartbeat a loaded
			// machine delayed: its delivery would end "lost", which the
			// outcome count below does not expect.
			opts.TakeoverAfter = 10 * time.Second
			b.start(opts)
		}
		b.q.DuplicateSends(true)
		for key := range want {
			b.send(key, "payment", `{"amount":1000}`, nil)
		}
		b.waitIdle()

		dl := map[string][]string{}
		for _, m := range b.q.DeadLetters() {
			dl[m.MessageID] = append(dl[m.MessageID], *m.DeadLetterReason)
		}
		for key, reason := range want {
			c := b.claimOf(key)
			switch {
			case reason == "":
				if len(dl[key]) != 0 || c.State != claim.StateProcessed || fake.Effects(key) != 1 || c.Answer == nil || c.Answer.Fields["/id"] == "" {
					t.Errorf("%s: dead letters %v, claim %s, effects %d, answer %+v; want charged once, processed with the charge id",
						key, dl[key], c.State, fake.Effects(key), c.Answer)
				}
			default:
				if len(dl[key]) != 1 || dl[key][0] != reason || c.State != claim.StateFailed || c.FailReason != reason || c.FlaggedAt != nil ||
					fake.Effects(key) != 0 || c.Answer == nil {
					t.Errorf("%s: dead letters %v, claim %s (%s) flagged at %v, effects %d, answer %+v; want one %s dead letter, failed, never flagged",
						key, dl[key], c.State, c.FailReason, c.FlaggedAt, fake.Effects(key), c.Answer, reason)
				}
			}
			if reason == processor.ReasonEffectRejected && fake.Rejections(key) != 1 {
				t.Errorf("%s: %d declines recorded downstream, want 1", key, fake.Rejections(key))
			}
			if got := countCompleted(b.q, key) + len(dl[key]); got != 2 {
				t.Errorf("%s: %d of its 2 copies settled", key, got)
			}
		}
		b.eventually("the final outcomes", func() bool {
			return outcomes(metrics, processor.ResultFailed)+outcomes(metrics, processor.ResultProcessed)+outcomes(metrics, processor.ResultDuplicate) == 2*n
		})
		if got := outcomes(metrics, processor.ResultFailed); got != 2*n/3 {
			t.Errorf("%d failed outcomes, want %d (one per declined or conflicting key)", got, 2*n/3)
		}
		if got := outcomes(metrics, processor.ResultDuplicate); got != n {
			t.Errorf("%d duplicate outcomes, want %d (the second copy of every key)", got, n)
		}
		// The copies raced their first: some met it while its effect ran
		// and waited for its outcome (a failed claim among them).
		if metricValue(metrics.DuplicateWaits) == 0 {
			t.Error("no copy met a live holder: the copies never raced")
		}
		raced := false
		for _, line := range strings.Split(b.logs.String(), "\n") {
			raced = raced || (strings.Contains(line, `"msg":"message finished"`) && strings.Contains(line, `"waited":true`) &&
				strings.Contains(line, `"claim_state":"failed"`) && strings.Contains(line, `"outcome":"duplicate"`))
		}
		if !raced {
			t.Error("no copy waited on a holder that then failed the claim: the race this test is about did not happen")
		}
	})
}

// TestDeadLetterDescriptionIsValidAndBounded: whatever text ends in a
// dead-letter description (here a dedup key function's error with invalid
// UTF-8, NUL and multi-byte characters past the bound) is sent as valid
// UTF-8 of at most 1024 bytes, cut on a rune boundary.
func TestDeadLetterDescriptionIsValidAndBounded(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	opts := b.options()
	opts.Key = func(*azservicebus.ReceivedMessage) (string, error) {
		return "", errors.New("no key \xff\x00 in " + strings.Repeat("é", 2000))
	}
	b.start(opts)
	b.send("m1", "pay", `{}`, nil)
	b.waitIdle()
	dl := b.deadLettersOf("m1")
	if len(dl) != 1 {
		t.Fatalf("dead letters %d", len(dl))
	}
	desc := *dl[0].DeadLetterErrorDescription
	if len(desc) > 1024 || !utf8.ValidString(desc) || strings.ContainsRune(desc, 0) || !strings.HasPrefix(desc, "no key \uFFFD\uFFFD in é") || !strings.HasSuffix(desc, "é…") {
		t.Errorf("description %d bytes, valid UTF-8 %v: %q…%q", len(desc), utf8.ValidString(desc), desc[:12], desc[len(desc)-6:])
	}
}

// TestClaimFailedByAHolderWithoutAMessageWhileACopyWatches: the
// reconciler's recovery (or an operator's redrive) holds a claim: it has
// no message to dead-letter. A copy of the message watches the live holder
// past its lock-renewal window; it must not complete (the holder may yet
// reach a final answer that only a copy can dead-letter) but hand the
// message back, so that when the holder fails the claim a copy takes the
// dead letter: exactly one among the copies, with the claim's reason, the
// other completed, the effect never called.
func TestClaimFailedByAHolderWithoutAMessageWhileACopyWatches(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		ctx := context.Background()
		res, err := b.store.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "host-dead", Claims: []claim.ClaimParams{{
			MessageID: "m1", Consumer: "billing", Owner: uuid.New(), Route: "effect", Fingerprint: "fp-effect",
			PayloadHash: claim.HashPayload([]byte(`{}`)), Payload: []byte(`{}`), DeliveryCount: 1,
		}}})
		if err != nil {
			t.Fatal(err)
		}
		// The reconciler's recovery takes the dead holder's claim over and
		// keeps it alive while its effect runs.
		held, stopBeat := b.holdAsRecovery(res[0].Claim)
		defer stopBeat()

		opts := b.options()
		// A take-over window far beyond the recovery's heartbeats (a late
		// heartbeat on a loaded machine must not make the copies take the
		// live recovery's claim over), and a watch just longer than it.
		opts.HeartbeatInterval, opts.TakeoverAfter, opts.MaxLockRenewal = 100*time.Millisecond, 2*time.Second, 2500*time.Millisecond
		b.start(opts)
		b.start(opts) // two replicas, two copies: each watches
		b.send("m1", "pay", `{}`, nil)
		b.send("m1", "pay", `{}`, nil)
		b.eventually("the copies' watch to end", func() bool { s := b.q.Stats(); return s.Completed+s.Abandoned > 1 })

		// The recovery gets a final answer: the claim is failed, naming no
		// delivery.
		stopBeat()
		if err := b.store.Fail(ctx, &claim.FailParams{ID: held.ID, Owner: held.Owner, Reason: claim.FailRejected,
			Error: "recovery: HTTP 402: declined"}); err != nil {
			t.Fatal(err)
		}
		b.waitIdle()

		dl := b.deadLettersOf("m1")
		if len(dl) != 1 || *dl[0].DeadLetterReason != claim.FailRejected || *dl[0].DeadLetterErrorDescription != "recovery: HTTP 402: declined" {
			t.Fatalf("dead letters of m1: %d (%v), want one with the claim's reason and error (completed %d)",
				len(dl), b.deadLetterReasons(), countCompleted(b.q, "m1"))
		}
		if c := b.claimOf("m1"); c.DeadLetterSeq == nil || *c.DeadLetterSeq != *dl[0].SequenceNumber {
			t.Errorf("claim dead letter %v, want message %d", c.DeadLetterSeq, *dl[0].SequenceNumber)
		}
		if b.eff.Calls("m1") != 0 || countCompleted(b.q, "m1") != 1 {
			t.Errorf("calls %d completed %d, want 0 and 1 (the other copy)", b.eff.Calls("m1"), countCompleted(b.q, "m1"))
		}
	})
}

// holdAsRecovery takes claim c over as the reconciler's recovery does (no
// message) and keeps its heartbeat fresh until stop is called.
func (b *bundle) holdAsRecovery(c *claim.Claim) (held *claim.Claim, stop func()) {
	b.t.Helper()
	ctx := context.Background()
	b.eventually("the recovery to take the claim over", func() bool {
		var err error
		held, err = b.store.TakeOver(ctx, &claim.TakeOverParams{ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(),
			Path: claim.PathReconciler, SilentFor: time.Millisecond, By: "reconciler@r1", Reason: "stale", Route: "effect", Fingerprint: "fp-effect"})
		return err == nil
	})
	beating, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for beating.Err() == nil {
			_ = b.store.Heartbeat(beating, &claim.HeartbeatParams{ID: held.ID, Owner: held.Owner})
			select {
			case <-beating.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	var once sync.Once
	return held, func() { once.Do(func() { cancel(); <-done }) }
}

// TestClaimTakenFromItsDeliveryByTheRecoveryIsDeadLetteredOnFailure: a
// delivery whose claim the reconciler's recovery takes over while its
// effect runs loses the claim; it must not complete its message (the
// recovery has none), so that when the recovery fails the claim the
// message's redelivery carries the dead letter.
func TestClaimTakenFromItsDeliveryByTheRecoveryIsDeadLetteredOnFailure(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		b.eff.mu.Lock()
		b.eff.hang = func(call int) bool { return call == 1 } // until the claim is lost
		b.eff.mu.Unlock()
		opts := b.options()
		// The redelivery must not take the live recovery's claim over.
		opts.HeartbeatInterval, opts.TakeoverAfter = 100*time.Millisecond, 2*time.Second
		b.start(opts)
		b.send("m1", "pay", `{}`, nil)
		b.eventually("the effect to run", func() bool { return b.eff.Calls("m1") == 1 })

		held, stopBeat := b.holdAsRecovery(b.claimOf("m1"))
		defer stopBeat()
		b.eventually("the first delivery to end", func() bool { s := b.q.Stats(); return s.Completed+s.Abandoned > 0 })

		stopBeat()
		if err := b.store.Fail(context.Background(), &claim.FailParams{ID: held.ID, Owner: held.Owner, Reason: claim.FailRejected,
			Error: "recovery: HTTP 402: declined"}); err != nil {
			t.Fatal(err)
		}
		b.waitIdle()

		dl := b.deadLettersOf("m1")
		if len(dl) != 1 || *dl[0].DeadLetterReason != claim.FailRejected {
			t.Fatalf("dead letters of m1: %d (%v), want one with the claim's reason (completed %d)",
				len(dl), b.deadLetterReasons(), countCompleted(b.q, "m1"))
		}
		if b.eff.Calls("m1") != 1 || countCompleted(b.q, "m1") != 0 {
			t.Errorf("calls %d completed %d, want 1 (the lost one) and 0", b.eff.Calls("m1"), countCompleted(b.q, "m1"))
		}
	})
}
