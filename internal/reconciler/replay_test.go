package reconciler_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/reconciler"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

// A Stripe-like route: keys kept for 24h, a replayed stored failure is
// final for the key.
const stripeLikeRoutes = `version: 1
routes:
  - name: payments
    match: {subject: payment}
    url: "%s/payments"
    timeout: 5s
    keyLifetime: 24h
    answers:
      - {status: 5xx, header: Idempotent-Replayed, value: "true", outcome: flag}
    record:
      headers: [Idempotent-Replayed]
    allowNewKey: true
`

const keyExpiredReason = "the downstream keeps keys for 24h; this claim is 25h old: a repeat would not be deduplicated"

// backdateClaimedAt moves a claim's ClaimedAt d into the past, by the
// database clock.
func (tdb *testDB) backdateClaimedAt(t *testing.T, d time.Duration, ids ...int64) {
	t.Helper()
	for _, id := range ids {
		q := `UPDATE claims SET claimed_utc = strftime('%Y-%m-%dT%H:%M:%f','now',?1) WHERE id = ?2`
		args := []any{fmt.Sprintf("-%.3f seconds", d.Seconds()), id}
		if tdb.dialect != "sqlite" {
			q = `UPDATE claims SET claimed_utc = now() - $1 * interval '1 millisecond' WHERE id = $2`
			args = []any{d.Milliseconds(), id}
		}
		if _, err := tdb.db.ExecContext(context.Background(), q, args...); err != nil {
			t.Fatalf("backdate claimed_utc of claim %d: %v", id, err)
		}
	}
}

// storeFailure has the fake store a 500 under key (the key's first
// request failed inside the API): every repeat gets it replayed.
func storeFailure(t *testing.T, fake *fakedownstream.Server, router sideeffects.Router, c *claim.Claim) {
	t.Helper()
	fake.SetKeyReply(c.MessageID, fakedownstream.ReplyCachedFailure)
	msg := reconciler.MessageFromClaim(c)
	h, err := router.Route(msg)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Effect.Perform(context.Background(), msg, c.Key()); sideeffects.Classify(err) != sideeffects.OutcomeUnknown || fake.CachedFailures(c.MessageID) != 1 {
		t.Fatalf("storing the failure: %v", err)
	}
}

// TestRecoveryFlagsAnExpiredKey: the recovery pass does not repeat a
// stale claim older than its route's key lifetime — claimed or released —
// with the same key: it flags it with a reason naming the lifetime. A
// younger stale claim is recovered as usual.
func TestRecoveryFlagsAnExpiredKey(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		fake, router := routesFile(t, stripeLikeRoutes)
		cs := claimN(t, tdb.store, "life", 3, nil)
		old, oldReleased, young := cs[0], cs[1], cs[2]
		if err := tdb.store.Release(ctx, &claim.ReleaseParams{ID: oldReleased.ID, Owner: oldReleased.Owner, Error: "503"}); err != nil {
			t.Fatal(err)
		}
		tdb.backdateClaimedAt(t, 25*time.Hour, old.ID, oldReleased.ID)
		tdb.backdateClaimedAt(t, 23*time.Hour, young.ID)
		tdb.backdateHeartbeat(t, time.Hour, old.ID, oldReleased.ID, young.ID)

		res, err := recoveryRec(t, tdb.store, reconciler.Routes{"billing": router}).RunOnce(ctx)
		if err != nil || res.Recovered != 1 || len(res.Flagged) != 2 {
			t.Fatalf("recovered %d, flagged %v (%v); want the young claim recovered, the two old ones flagged", res.Recovered, ids(res.Flagged), err)
		}
		for _, c := range []*claim.Claim{old, oldReleased} {
			got := mustGet(t, tdb.store, c.ID)
			if got.State != claim.StateFlagged || got.FlagReason != keyExpiredReason || got.TakeOvers != 0 {
				t.Errorf("%s: %s (%q), take-overs %d; want flagged: %q", c.MessageID, got.State, got.FlagReason, got.TakeOvers, keyExpiredReason)
			}
			if n := fake.Requests(c.MessageID); n != 0 {
				t.Errorf("%s: %d requests, want none", c.MessageID, n)
			}
		}
		if got := mustGet(t, tdb.store, young.ID); got.State != claim.StateProcessed || fake.Effects(young.MessageID) != 1 {
			t.Errorf("young: %s, %d effects; want recovered once", got.State, fake.Effects(young.MessageID))
		}
	})
}

// TestRecoveryFlagsAReplayedFailureAtOnce: a recovery whose answer is a
// replayed stored failure flags the claim at once, with the answer,
// instead of postponing it for another recovery attempt.
func TestRecoveryFlagsAReplayedFailureAtOnce(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		fake, router := routesFile(t, stripeLikeRoutes)
		c := claimN(t, tdb.store, "replay", 1, nil)[0]
		storeFailure(t, fake, router, c)
		tdb.backdateHeartbeat(t, time.Hour, c.ID)

		res, err := recoveryRec(t, tdb.store, reconciler.Routes{"billing": router}).RunOnce(ctx)
		if err != nil || len(res.Flagged) != 1 || res.Postponed != 0 {
			t.Fatalf("flagged %v, postponed %d (%v); want flagged at once", ids(res.Flagged), res.Postponed, err)
		}
		got := mustGet(t, tdb.store, c.ID)
		if got.State != claim.StateFlagged || !strings.Contains(got.FlagReason, "needs an operator") || !strings.Contains(got.FlagReason, "HTTP 500 (answers[0])") {
			t.Errorf("claim %s, reason %q; want flagged, naming the rule", got.State, got.FlagReason)
		}
		if got.Answer == nil || got.Answer.Status != 500 || got.Answer.Headers["Idempotent-Replayed"] != "true" || got.Recoveries != 1 {
			t.Errorf("answer %+v, recoveries %d; want the replayed 500 from one recovery", got.Answer, got.Recoveries)
		}
		if n := fake.Requests(c.MessageID); n != 2 {
			t.Errorf("%d requests, want 2 (the stored failure, one replay)", n)
		}
	})
}

// TestRedriveKeyLifetime: an operator's redrive with the claim's own key
// is refused once the key is older than its route's key lifetime (the
// claim stays flagged, nothing is sent); a redrive under a new key is
// still allowed on an allowNewKey route, and the new key's age counts
// from when it was chosen.
func TestRedriveKeyLifetime(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		fake, router := routesFile(t, stripeLikeRoutes)
		routes := reconciler.Routes{"": router}
		c := flaggedClaim(t, tdb, "old")
		tdb.backdateClaimedAt(t, 25*time.Hour, c.ID)

		_, err := reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "alice", Routes: routes, Retry: fastRetry})
		var re *reconciler.RefusedError
		if !errors.Is(err, reconciler.ErrKeyExpired) || !errors.As(err, &re) || !strings.Contains(re.Why, keyExpiredReason) ||
			!strings.Contains(re.Why, "redrive it under a new key") {
			t.Fatalf("redrive with the old key: %v; want ErrKeyExpired naming the lifetime and the way out", err)
		}
		if got := mustGet(t, tdb.store, c.ID); got.State != claim.StateFlagged || got.TakeOvers != 0 || fake.Requests(c.MessageID) != 0 {
			t.Errorf("after the refusal: %s, take-overs %d, %d requests; want untouched", got.State, got.TakeOvers, fake.Requests(c.MessageID))
		}

		got, err := reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "alice", Note: "checked: no charge under the old key",
			NewKey: true, Routes: routes, Retry: fastRetry})
		if err != nil || got.State != claim.StateResolved || fake.Effects(c.MessageID+":r1") != 1 {
			t.Fatalf("redrive under a new key: %v, claim %+v, %d effects under %s:r1", err, got, fake.Effects(c.MessageID+":r1"), c.MessageID)
		}
	})
}

// TestRedriveOfAReplayedFailureFlagsAgainAtOnce: a redrive whose answer is
// a replayed stored failure stops at its first attempt and flags the claim
// again, saying a person must decide.
func TestRedriveOfAReplayedFailureFlagsAgainAtOnce(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		fake, router := routesFile(t, stripeLikeRoutes)
		c := flaggedClaim(t, tdb, "replayed")
		storeFailure(t, fake, router, c)

		_, err := reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "alice", Routes: reconciler.Routes{"": router},
			Retry: sideeffects.RetryPolicy{MaxAttempts: 5, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond}})
		var ee *reconciler.EffectError
		if !errors.As(err, &ee) || ee.Attempts != 1 || !ee.Reflagged || ee.Answer == nil || ee.Answer.Status != 500 {
			t.Fatalf("redrive: %v; want an EffectError after one attempt, flagged again with the answer", err)
		}
		got := mustGet(t, tdb.store, c.ID)
		if got.State != claim.StateFlagged || !strings.Contains(got.FlagReason, "redrive by alice: needs an operator") {
			t.Errorf("claim %s, reason %q; want flagged again by the redrive", got.State, got.FlagReason)
		}
		if n := fake.Requests(c.MessageID); n != 2 {
			t.Errorf("%d requests, want 2 (the stored failure, one replay)", n)
		}
	})
}
