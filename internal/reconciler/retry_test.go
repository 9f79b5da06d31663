package reconciler_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/reconciler"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/sideeffects/routesfile"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

// misconfigured is a Stripe-like downstream behind a gate that answers
// 401 while the caller's API key is "wrong" (before its idempotency
// layer: nothing is stored under the key), and the routes to it, with
// and without allowNewKey.
type misconfigured struct {
	fake        *fakedownstream.Server
	broken      atomic.Bool
	newKey      sideeffects.Router // allowNewKey: true
	sameKeyOnly sideeffects.Router // allowNewKey: false
	unauth      atomic.Int64
}

func newMisconfigured(t *testing.T) *misconfigured {
	t.Helper()
	m := &misconfigured{fake: fakedownstream.New(fakedownstream.Options{ConflictStyle: fakedownstream.ConflictStripe})}
	m.broken.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m.broken.Load() {
			m.unauth.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error":{"type":"invalid_request_error","message":"Invalid API Key provided"}}`)
			return
		}
		m.fake.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	yml := strings.Replace(stripeRoutes, "    answers:\n", "    answers:\n      - {status: 401, outcome: permanent}\n", 1)
	parse := func(yml string) sideeffects.Router {
		router, err := routesfile.Parse([]byte(strings.ReplaceAll(yml, "%s", srv.URL)), func(string) string { return "" }, nil, testLogger(t))
		if err != nil {
			t.Fatalf("routes: %v", err)
		}
		return router
	}
	m.newKey = parse(yml)
	m.sameKeyOnly = parse(strings.Replace(yml, "allowNewKey: true", "allowNewKey: false", 1))
	return m
}

// failedByRecovery claims n messages and lets the reconciler's recovery
// run them against the misconfigured downstream: every one is failed
// (401 is final), payload kept.
func failedByRecovery(t *testing.T, tdb *testDB, m *misconfigured, prefix string, n int) []*claim.Claim {
	t.Helper()
	cs := claimN(t, tdb.store, prefix, n, []byte(`{"amount":100}`))
	tdb.backdateHeartbeat(t, 3600e9, ids(cs)...)
	rec := newRec(t, tdb.store, reconciler.Config{StaleAfter: 60e9, Routes: reconciler.Routes{"": m.newKey}})
	if _, err := rec.RunOnce(context.Background()); err != nil {
		t.Fatalf("recovery: %v", err)
	}
	out := make([]*claim.Claim, n)
	for i, c := range cs {
		out[i] = mustGet(t, tdb.store, c.ID)
		if out[i].State != claim.StateFailed || out[i].Payload == nil {
			t.Fatalf("claim %d after the misconfigured run: %s (payload %v), want failed with its payload", c.ID, out[i].State, out[i].Payload != nil)
		}
	}
	return out
}

func TestRetryAFailedClaimWithTheSameKey(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		m := newMisconfigured(t)
		c := failedByRecovery(t, tdb, m, "retry-same", 1)[0]
		m.broken.Store(false) // the operator fixed the API key
		got, err := reconciler.Retry(ctx, tdb.store, &reconciler.RetryParams{ID: c.ID, By: "alice", Note: "API key fixed (Bearer)",
			Routes: reconciler.Routes{"": m.sameKeyOnly}, Retry: fastRetry})
		if err != nil {
			t.Fatalf("retry: %v", err)
		}
		if got.State != claim.StateResolved || got.Resolution != claim.ResolutionRedriven || got.Key() != c.Key() || got.FailedAt == nil {
			t.Fatalf("after the retry: %s %s key %q (was %q) failed at %v", got.State, got.Resolution, got.Key(), c.Key(), got.FailedAt)
		}
		if n := m.fake.Effects(c.MessageID); n != 1 {
			t.Fatalf("%d effects with key %q, want 1", n, c.MessageID)
		}
		h, err := tdb.store.History(ctx, c.ID)
		if err != nil {
			t.Fatal(err)
		}
		var retried []claim.HistoryEntry
		for _, e := range h {
			if e.What == claim.ChangeRetried {
				retried = append(retried, e)
			}
		}
		if len(retried) != 1 || retried[0].By != "operator:alice" || retried[0].From != claim.StateFailed || retried[0].Key != c.Key() ||
			!strings.Contains(retried[0].Reason, "API key fixed") || !strings.Contains(retried[0].Reason, string(c.FailReason)) {
			t.Fatalf("retried history rows %+v", retried)
		}
		// A second retry is refused: the claim is no longer failed.
		_, err = reconciler.Retry(ctx, tdb.store, &reconciler.RetryParams{ID: c.ID, By: "bob", Note: "again",
			Routes: reconciler.Routes{"": m.sameKeyOnly}, Retry: fastRetry})
		var refused *reconciler.RefusedError
		if !errors.As(err, &refused) || !errors.Is(err, reconciler.ErrNotFailed) {
			t.Fatalf("second retry: %v, want refused (not failed)", err)
		}
	})
}

func TestRetryAFailedClaimWithANewKey(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		m := newMisconfigured(t)
		c := failedByRecovery(t, tdb, m, "retry-new", 1)[0]
		m.broken.Store(false)
		// Refused on a route without allowNewKey, changing nothing.
		_, err := reconciler.Retry(ctx, tdb.store, &reconciler.RetryParams{ID: c.ID, By: "alice", Note: "stored under the key", NewKey: true,
			Routes: reconciler.Routes{"": m.sameKeyOnly}, Retry: fastRetry})
		if !errors.Is(err, reconciler.ErrNewKeyNotAllowed) {
			t.Fatalf("new-key retry on a route without allowNewKey: %v", err)
		}
		if now := mustGet(t, tdb.store, c.ID); now.State != claim.StateFailed || now.KeyRevision != 0 {
			t.Fatalf("a refused retry changed the claim: %s revision %d", now.State, now.KeyRevision)
		}
		got, err := reconciler.Retry(ctx, tdb.store, &reconciler.RetryParams{ID: c.ID, By: "alice", Note: "stored under the key", NewKey: true,
			Routes: reconciler.Routes{"": m.newKey}, Retry: fastRetry})
		if err != nil {
			t.Fatalf("new-key retry: %v", err)
		}
		if got.State != claim.StateResolved || got.KeyRevision != 1 || got.Key() != c.NextKey() {
			t.Fatalf("after the retry: %s revision %d key %q", got.State, got.KeyRevision, got.Key())
		}
		if m.fake.Effects(c.NextKey()) != 1 || m.fake.Effects(c.Key()) != 0 {
			t.Fatalf("effects: new key %d, old key %d; want 1 and 0", m.fake.Effects(c.NextKey()), m.fake.Effects(c.Key()))
		}
	})
}

// TestRetryStillMisconfiguredFailsAgain: a retry before the fix gets the
// same final answer: the claim is failed again, and can be retried again.
func TestRetryStillMisconfiguredFailsAgain(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		m := newMisconfigured(t)
		c := failedByRecovery(t, tdb, m, "retry-again", 1)[0]
		routes := reconciler.Routes{"": m.newKey}
		_, err := reconciler.Retry(ctx, tdb.store, &reconciler.RetryParams{ID: c.ID, By: "alice", Note: "too early", Routes: routes, Retry: fastRetry})
		var ee *reconciler.EffectError
		if !errors.As(err, &ee) || !ee.Failed {
			t.Fatalf("retry before the fix: %v, want an EffectError that failed the claim", err)
		}
		if now := mustGet(t, tdb.store, c.ID); now.State != claim.StateFailed || now.DeadLetterSeq != nil {
			t.Fatalf("after the early retry: %s, dead letter %v", now.State, now.DeadLetterSeq)
		}
		m.broken.Store(false)
		if _, err := reconciler.Retry(ctx, tdb.store, &reconciler.RetryParams{ID: c.ID, By: "alice", Note: "fixed now", Routes: routes, Retry: fastRetry}); err != nil {
			t.Fatalf("retry after the fix: %v", err)
		}
		if m.fake.Effects(c.Key()) != 1 {
			t.Fatalf("%d effects, want 1", m.fake.Effects(c.Key()))
		}
	})
}

// TestConcurrentRetriesRunOnce: of operators retrying one claim at once
// (and one resolving it), one runs the effect; the others are refused.
func TestConcurrentRetriesRunOnce(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		m := newMisconfigured(t)
		c := failedByRecovery(t, tdb, m, "retry-race", 1)[0]
		m.broken.Store(false)
		const racers = 6
		var wg sync.WaitGroup
		var ok, refused atomic.Int64
		for i := range racers {
			wg.Go(func() {
				_, err := reconciler.Retry(ctx, tdb.store, &reconciler.RetryParams{ID: c.ID, By: fmt.Sprint("op", i), Note: "fixed",
					Routes: reconciler.Routes{"": m.newKey}, Retry: fastRetry})
				var r *reconciler.RefusedError
				switch {
				case err == nil:
					ok.Add(1)
				case errors.As(err, &r):
					refused.Add(1)
				default:
					t.Errorf("retry %d: %v", i, err)
				}
			})
		}
		wg.Wait()
		if ok.Load() != 1 || refused.Load() != racers-1 {
			t.Fatalf("%d retries ran, %d refused; want 1 and %d", ok.Load(), refused.Load(), racers-1)
		}
		if m.fake.Effects(c.Key()) != 1 {
			t.Fatalf("%d effects, want 1", m.fake.Effects(c.Key()))
		}
	})
}

// TestRetryRefusesWhatIsNotFailed: a flagged, claimed or processed claim
// is not retried (a flagged one is redriven).
func TestRetryRefusesWhatIsNotFailed(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		m := newMisconfigured(t)
		f := flaggedClaim(t, tdb, "retry-flagged")
		_, err := reconciler.Retry(context.Background(), tdb.store, &reconciler.RetryParams{ID: f.ID, By: "a", Note: "n",
			Routes: reconciler.Routes{"": m.newKey}, Retry: fastRetry})
		if !errors.Is(err, reconciler.ErrNotFailed) || !strings.Contains(err.Error(), "redriven") {
			t.Fatalf("retry of a flagged claim: %v", err)
		}
		if _, err := reconciler.Retry(context.Background(), tdb.store, &reconciler.RetryParams{ID: f.ID, By: "a"}); err == nil {
			t.Fatal("retry without a note was accepted")
		}
	})
}

// TestRetryHandOffReleasesTheClaim: without the route's code (the console
// for a Go handler) the retry releases the claim for the reconciler that
// runs it, which performs it once.
func TestRetryHandOffReleasesTheClaim(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		m := newMisconfigured(t)
		c := failedByRecovery(t, tdb, m, "retry-handoff", 1)[0]
		m.broken.Store(false)
		got, err := reconciler.Retry(ctx, tdb.store, &reconciler.RetryParams{ID: c.ID, By: "alice", Note: "fixed", HandOff: true})
		if err != nil {
			t.Fatalf("hand-off retry: %v", err)
		}
		if got.State != claim.StateReleased || got.TakeOverPath != claim.PathOperator {
			t.Fatalf("after the hand-off retry: %s via %s", got.State, got.TakeOverPath)
		}
		tdb.backdateHeartbeat(t, 3600e9, c.ID)
		rec := newRec(t, tdb.store, reconciler.Config{StaleAfter: 60e9, Routes: reconciler.Routes{"": m.newKey}})
		if _, err := rec.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if now := mustGet(t, tdb.store, c.ID); now.State != claim.StateProcessed || m.fake.Effects(c.Key()) != 1 {
			t.Fatalf("after the reconciler: %s, %d effects", now.State, m.fake.Effects(c.Key()))
		}
	})
}

// TestRetryWaitsForTheFailedMessageToBeSettled: a fetched deferred
// message's holder failed its claim (a final answer) and dead-lettered
// the message, or died before it did, and never recorded the settlement:
// the failed claim still names the message. A retry without a stored
// payload hands the claim to the next delivery of its message (the
// operator re-submits the dead letter); while the claim names the old
// message, that copy would be taken for a second message moving for the
// claim and completed unprocessed — swallowed — and the claim would end
// flagged with nothing to redrive from. The retry is refused until the
// processors' stranded sweep has settled the message and the claim
// forgets it; then it hands the claim off.
func TestRetryWaitsForTheFailedMessageToBeSettled(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		d := tdb.store.(claim.Deferrer)
		res, err := tdb.store.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "host-a", Claims: []claim.ClaimParams{{
			KeyForm: claim.KeyFormRaw, Owner: uuid.New(), MessageID: "m-unsettled", Consumer: "billing", Entity: "payments",
			Subject: "payment", PayloadHash: claim.HashPayload([]byte(`{}`)), DeliveryCount: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		c := res[0].Claim
		const seq = 7
		if err := d.Defer(ctx, &claim.DeferParams{ID: c.ID, Owner: c.Owner, Seq: seq, Error: "HTTP 503"}); err != nil {
			t.Fatal(err)
		}
		if err := d.SetDue(ctx, &claim.SetDueParams{ID: c.ID, Owner: c.Owner, Seq: seq}); err != nil {
			t.Fatal(err)
		}
		taken, err := d.TakeDeferred(ctx, &claim.TakeDeferredParams{ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(), Seq: seq, SilentFor: time.Minute, By: "host-b"})
		if err != nil {
			t.Fatal(err)
		}
		dl := int64(seq)
		if err := tdb.store.Fail(ctx, &claim.FailParams{ID: c.ID, Owner: taken.Owner, Reason: claim.FailRejected, Error: "declined", DeadLetterSeq: &dl}); err != nil {
			t.Fatal(err)
		}
		retry := func() (*claim.Claim, error) {
			return reconciler.Retry(ctx, tdb.store, &reconciler.RetryParams{ID: c.ID, By: "alice", Note: "the customer topped up"})
		}
		got, err := retry()
		var refused *reconciler.RefusedError
		if !errors.As(err, &refused) || !errors.Is(err, reconciler.ErrMessageUnsettled) || !strings.Contains(refused.Why, "sequence number 7") {
			t.Fatalf("retry of a failed claim that still names its message: %v; want refused (ErrMessageUnsettled), naming the message", err)
		}
		if now := mustGet(t, tdb.store, c.ID); now.State != claim.StateFailed || got.State != claim.StateFailed {
			t.Fatalf("after the refused retry: %s; want failed, unchanged", now.State)
		}
		if err := d.ClearDeferred(ctx, &claim.ClearDeferredParams{ID: c.ID, Seq: seq}); err != nil {
			t.Fatal(err)
		}
		got, err = retry()
		if err != nil || got.State != claim.StateReleased || got.DeferredSeq != nil {
			t.Fatalf("retry once the message was settled: %v (%+v); want handed off, released", err, got)
		}
	})
}
