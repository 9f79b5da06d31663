package reconciler_test

import (
	"context"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/reconciler"
)

// TestRecoveryLeavesADeferredClaimToItsMessage: a claim whose message is
// deferred at the broker is not re-run from its payload while it waits —
// however old its release — but only once its grace past the due time has
// run out (the processors never fetched it); then it is recovered like any
// released claim, with the same key.
func TestRecoveryLeavesADeferredClaimToItsMessage(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		d, ok := tdb.store.(claim.Deferrer)
		if !ok {
			t.Skipf("%T has no delayed retries", tdb.store)
		}
		_, router := routesFile(t, paymentRoutes)
		cs := claimN(t, tdb.store, "deferred", 2, nil)
		waiting, abandoned := cs[0], cs[1]
		for i, c := range cs {
			grace := time.Hour // still waiting for its message
			if c == abandoned {
				grace = 0 // due now and past its grace: nobody fetched it
			}
			if err := d.Defer(ctx, &claim.DeferParams{ID: c.ID, Owner: c.Owner, Seq: int64(100 + i), DueIn: 0, Grace: grace, Error: "HTTP 503"}); err != nil {
				t.Fatal(err)
			}
			if err := d.SetDue(ctx, &claim.SetDueParams{ID: c.ID, Owner: c.Owner, Seq: int64(100 + i)}); err != nil {
				t.Fatal(err)
			}
		}
		tdb.backdateHeartbeat(t, time.Hour, waiting.ID, abandoned.ID)

		res, err := recoveryRec(t, tdb.store, reconciler.Routes{"billing": router}).RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Recovered != 1 || len(res.Flagged) != 0 {
			t.Fatalf("recovered %d, flagged %d; want only the claim past its grace", res.Recovered, len(res.Flagged))
		}
		if c := mustGet(t, tdb.store, waiting.ID); !c.Deferred() {
			t.Fatalf("the waiting claim is %s (deferred %v): recovery took it from its message", c.State, c.Deferred())
		}
		if c := mustGet(t, tdb.store, abandoned.ID); c.State != claim.StateProcessed || c.TakeOverPath != claim.PathReconciler {
			t.Fatalf("the claim past its grace is %s (path %s), want processed by the reconciler", c.State, c.TakeOverPath)
		}

		// A flag-only reconciler leaves the waiting claim alone too.
		flagOnly := newRec(t, tdb.store, reconciler.Config{StaleAfter: time.Minute, HeartbeatInterval: 50 * time.Millisecond})
		res, err = flagOnly.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Flagged) != 0 {
			t.Fatalf("the flag-only reconciler flagged %d claims, want none (the claim waits for its message)", len(res.Flagged))
		}
	})
}
