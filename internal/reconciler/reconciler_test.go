package reconciler_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/reconciler"
)

func newRec(t *testing.T, st claim.Store, cfg reconciler.Config) *reconciler.Reconciler {
	t.Helper()
	if cfg.HeartbeatInterval == 0 && cfg.StaleAfter > 0 {
		cfg.HeartbeatInterval = min(cfg.StaleAfter/3, reconciler.DefaultHeartbeatInterval)
	}
	r, err := reconciler.New(st, cfg, testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A claim whose processor keeps heartbeating is never flagged; one whose
// heartbeat stopped is flagged, once, by the database clock.
func TestFreshHeartbeatNeverFlagged(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		cs := claimN(t, tdb.store, "hb", 2, nil)
		alive, dead := cs[0], cs[1]

		// The live processor heartbeats every 100ms; StaleAfter is 20x that.
		hbCtx, stopHB := context.WithCancel(ctx)
		hbDone := make(chan error, 1)
		go func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-hbCtx.Done():
					hbDone <- nil
					return
				case <-tick.C:
					if err := tdb.store.Heartbeat(hbCtx, &claim.HeartbeatParams{ID: alive.ID, Owner: alive.Owner}); err != nil && hbCtx.Err() == nil {
						hbDone <- err
						return
					}
				}
			}
		}()

		rec := newRec(t, tdb.store, reconciler.Config{StaleAfter: 2 * time.Second})
		var flagged []*claim.Claim
		deadline := time.Now().Add(30 * time.Second)
		for len(flagged) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the claim without heartbeat was never flagged")
			}
			res, err := rec.RunOnce(ctx)
			if err != nil {
				t.Fatalf("tick: %v", err)
			}
			flagged = append(flagged, res.Flagged...)
			time.Sleep(50 * time.Millisecond)
		}
		// A few more ticks: the live claim stays unflagged, the dead one
		// is not flagged twice.
		for range 5 {
			res, err := rec.RunOnce(ctx)
			if err != nil {
				t.Fatalf("tick: %v", err)
			}
			flagged = append(flagged, res.Flagged...)
			time.Sleep(100 * time.Millisecond)
		}
		stopHB()
		if err := <-hbDone; err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
		if len(flagged) != 1 || flagged[0].ID != dead.ID {
			t.Fatalf("flagged %v, want only claim %d", ids(flagged), dead.ID)
		}
		if got := mustGet(t, tdb.store, alive.ID); got.State != claim.StateClaimed {
			t.Errorf("live claim is %s, want claimed", got.State)
		}
		got := mustGet(t, tdb.store, dead.ID)
		if got.State != claim.StateFlagged || got.FlaggedAt == nil || got.FlagReason == "" {
			t.Errorf("dead claim = state %s flagged_at %v reason %q, want flagged with a reason", got.State, got.FlaggedAt, got.FlagReason)
		}
	})
}

// Two reconcilers ticking at the same moment flag each stale claim once:
// with the database lock (one of them skips), and without it (the guarded
// UPDATE alone decides).
func TestConcurrentTicksFlagOnce(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		for _, mode := range []string{"with-lock", "without-lock"} {
			t.Run(mode, func(t *testing.T) {
				ctx := context.Background()
				stA, stB := tdb.store, tdb.openAnother(t)
				if mode == "without-lock" {
					stA, stB = noLock{stA}, noLock{stB}
				}
				cs := claimN(t, tdb.store, "conc-"+mode, 60, nil)
				tdb.backdateHeartbeat(t, time.Hour, ids(cs)...)

				cfg := reconciler.Config{StaleAfter: time.Minute, FlagBatchSize: 7}
				recs := []*reconciler.Reconciler{newRec(t, stA, cfg), newRec(t, stB, cfg)}
				results := make([]*reconciler.TickResult, 2)
				errs := make([]error, 2)
				var start, wg sync.WaitGroup
				start.Add(1)
				for i := range recs {
					wg.Go(func() {
						start.Wait()
						results[i], errs[i] = recs[i].RunOnce(ctx)
					})
				}
				start.Done()
				wg.Wait()

				var all []int64
				for i := range recs {
					if errs[i] != nil {
						t.Fatalf("reconciler %d: %v", i, errs[i])
					}
					all = append(all, ids(results[i].Flagged)...)
				}
				slices.Sort(all)
				if want := ids(cs); !slices.Equal(all, want) {
					t.Fatalf("flagged %d claims %v, want each of %d exactly once", len(all), all, len(want))
				}
				for _, c := range cs {
					if got := mustGet(t, tdb.store, c.ID); got.State != claim.StateFlagged {
						t.Errorf("claim %d is %s, want flagged", c.ID, got.State)
					}
				}
			})
		}
	})
}

// MarkProcessed and the flag pass race on the same stale claims, many
// times: every claim ends either processed (and not flagged) or flagged
// (and MarkProcessed refused), never both.
func TestMarkProcessedRacesFlag(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		cfg := reconciler.Config{StaleAfter: time.Minute, FlagBatchSize: 3}
		other := tdb.openAnother(t)
		recs := []*reconciler.Reconciler{newRec(t, noLock{tdb.store}, cfg), newRec(t, noLock{other}, cfg)}
		var processedWins, flaggedWins int
		for round := range 10 {
			cs := claimN(t, tdb.store, "race-"+string(rune('a'+round)), 20, nil)
			tdb.backdateHeartbeat(t, time.Hour, ids(cs)...)

			markErrs := make([]error, len(cs))
			var flagged []*claim.Claim
			var mu sync.Mutex
			var start, wg sync.WaitGroup
			start.Add(1)
			for i, c := range cs {
				wg.Go(func() {
					start.Wait()
					markErrs[i] = tdb.store.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner})
				})
			}
			for _, rec := range recs {
				wg.Go(func() {
					start.Wait()
					res, err := rec.RunOnce(ctx)
					if err != nil {
						t.Errorf("tick: %v", err)
						return
					}
					mu.Lock()
					flagged = append(flagged, res.Flagged...)
					mu.Unlock()
				})
			}
			start.Done()
			wg.Wait()

			flaggedIDs := map[int64]int{}
			for _, c := range flagged {
				flaggedIDs[c.ID]++
			}
			for i, c := range cs {
				got := mustGet(t, tdb.store, c.ID)
				n := flaggedIDs[c.ID]
				switch {
				case markErrs[i] == nil && n == 0 && got.State == claim.StateProcessed && got.FlaggedAt == nil:
					processedWins++
				case errors.Is(markErrs[i], claim.ErrStateChanged) && n == 1 && got.State == claim.StateFlagged && got.ProcessedAt == nil:
					flaggedWins++
				default:
					t.Fatalf("round %d claim %d: MarkProcessed err=%v, flagged %d time(s), final state %s processed_at=%v flagged_at=%v",
						round, c.ID, markErrs[i], n, got.State, got.ProcessedAt, got.FlaggedAt)
				}
			}
		}
		t.Logf("processed won %d races, flag won %d", processedWins, flaggedWins)
	})
}

// A released claim that no redelivery takes over is flagged; one that is
// taken over (and heartbeating) is not.
func TestReleasedClaims(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		cs := claimN(t, tdb.store, "rel", 2, nil)
		orphan, takenOver := cs[0], cs[1]
		for _, c := range cs {
			if err := tdb.store.Release(ctx, &claim.ReleaseParams{ID: c.ID, Owner: c.Owner, Error: "503 from downstream"}); err != nil {
				t.Fatalf("release: %v", err)
			}
		}
		tdb.backdateHeartbeat(t, time.Hour, orphan.ID, takenOver.ID)
		if _, err := tdb.store.TakeOver(ctx, &claim.TakeOverParams{ID: takenOver.ID, PreviousOwner: takenOver.Owner, Owner: uuid.New(),
			Path: claim.PathRedelivery, SilentFor: time.Minute, By: "host-b", DeliveryCount: 2}); err != nil {
			t.Fatalf("take over: %v", err)
		}

		res, err := newRec(t, tdb.store, reconciler.Config{StaleAfter: time.Minute}).RunOnce(ctx)
		if err != nil {
			t.Fatalf("tick: %v", err)
		}
		if got := ids(res.Flagged); !slices.Equal(got, []int64{orphan.ID}) {
			t.Fatalf("flagged %v, want only the orphaned released claim %d", got, orphan.ID)
		}
		if got := mustGet(t, tdb.store, orphan.ID); got.State != claim.StateFlagged || !strings.Contains(strings.ToLower(got.FlagReason), "releas") {
			t.Errorf("orphan: state %s reason %q, want flagged with a reason about the release", got.State, got.FlagReason)
		}
		if got := mustGet(t, tdb.store, takenOver.ID); got.State != claim.StateClaimed {
			t.Errorf("taken over claim is %s, want claimed", got.State)
		}
	})
}

// The purge deletes 10 000 processed claims in bounded batches and leaves
// every unfinished and flagged claim.
func TestPurgeInBatches(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		// Flagged and unfinished claims, old enough that a purge bug
		// keyed on time alone would take them.
		flagged := claimN(t, tdb.store, "keep-flagged", 25, nil)
		tdb.backdateHeartbeat(t, 30*24*time.Hour, ids(flagged)...)
		if res, err := newRec(t, tdb.store, reconciler.Config{StaleAfter: time.Minute}).RunOnce(ctx); err != nil || len(res.Flagged) != 25 {
			t.Fatalf("flag setup: %v, flagged %d", err, len(res.Flagged))
		}
		unfinished := claimN(t, tdb.store, "keep-claimed", 25, nil)
		released := claimN(t, tdb.store, "keep-released", 5, nil)
		for _, c := range released {
			if err := tdb.store.Release(ctx, &claim.ReleaseParams{ID: c.ID, Owner: c.Owner, Error: "x"}); err != nil {
				t.Fatal(err)
			}
		}
		// Recently processed: inside the retention, kept.
		recent := claimN(t, tdb.store, "keep-recent", 10, nil)
		tdb.markAllProcessedAgo(t, "keep-recent", time.Hour)

		claimN(t, tdb.store, "old", 10_000, []byte(`{}`))
		if n := tdb.markAllProcessedAgo(t, "old", 10*24*time.Hour); n != 10_000 {
			t.Fatalf("marked %d processed, want 10000", n)
		}

		cs := &countingStore{Store: tdb.store}
		rec := newRec(t, cs, reconciler.Config{
			StaleAfter: 100 * 24 * time.Hour, Retention: 7 * 24 * time.Hour, PurgeBatchSize: 500,
		})
		res, err := rec.RunOnce(ctx)
		if err != nil {
			t.Fatalf("tick: %v", err)
		}
		if res.Purged != 10_000 {
			t.Errorf("purged %d, want 10000", res.Purged)
		}
		// 20 full batches, then one short (empty) batch that ends the pass.
		if len(cs.purgeLimits) != 21 || res.PurgeBatches != 21 {
			t.Errorf("purge calls = %d (result says %d), want 21: %v", len(cs.purgeLimits), res.PurgeBatches, cs.purged)
		}
		for i, l := range cs.purgeLimits {
			if l != 500 {
				t.Errorf("purge call %d limit %d, want 500", i, l)
			}
		}
		for i, n := range cs.purged {
			if want := int64(500); i == len(cs.purged)-1 {
				want = 0
				if n != want {
					t.Errorf("last purge call deleted %d, want 0", n)
				}
			} else if n != want {
				t.Errorf("purge call %d deleted %d, want 500", i, n)
			}
		}
		for _, group := range [][]*claim.Claim{flagged, unfinished, released, recent} {
			for _, c := range group {
				if _, err := tdb.store.Get(ctx, c.ID); err != nil {
					t.Fatalf("claim %d (%s) was purged: %v", c.ID, c.MessageID, err)
				}
			}
		}
		st, err := tdb.store.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Flagged != 25 || st.Claimed != 25 || st.Released != 5 {
			t.Errorf("stats after purge = %+v, want 25 flagged, 25 claimed, 5 released", st)
		}
	})
}

// MaxPurgePerTick bounds one tick; the next tick carries on.
func TestPurgeMaxPerTick(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		claimN(t, tdb.store, "old", 1300, []byte(`{}`))
		tdb.markAllProcessedAgo(t, "old", 10*24*time.Hour)
		cs := &countingStore{Store: tdb.store}
		rec := newRec(t, cs, reconciler.Config{PurgeBatchSize: 500, MaxPurgePerTick: 1200})
		res, err := rec.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Purged != 1200 || !slices.Equal(cs.purgeLimits, []int{500, 500, 200}) {
			t.Fatalf("purged %d with limits %v, want 1200 with [500 500 200]", res.Purged, cs.purgeLimits)
		}
		res, err = rec.RunOnce(ctx)
		if err != nil || res.Purged != 100 {
			t.Fatalf("second tick purged %d (err %v), want the remaining 100", res.Purged, err)
		}
	})
}

// When another reconciler holds the lock the tick does nothing.
func TestTickSkipsWhenLocked(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		cs := claimN(t, tdb.store, "locked", 3, nil)
		tdb.backdateHeartbeat(t, time.Hour, ids(cs)...)
		unlock, ok, err := tdb.store.TryLock(ctx, reconciler.LockName)
		if err != nil || !ok {
			t.Fatalf("take lock: ok=%v err=%v", ok, err)
		}
		cnt := &countingStore{Store: tdb.openAnother(t)}
		rec := newRec(t, cnt, reconciler.Config{StaleAfter: time.Minute})
		res, err := rec.RunOnce(ctx)
		if err != nil || res.Locked || len(res.Flagged) != 0 || cnt.flagCalls.Load() != 0 {
			t.Fatalf("tick while locked: err=%v locked=%v flagged=%d flag calls=%d, want a quiet skip",
				err, res.Locked, len(res.Flagged), cnt.flagCalls.Load())
		}
		if err := unlock(ctx); err != nil {
			t.Fatal(err)
		}
		res, err = rec.RunOnce(ctx)
		if err != nil || !res.Locked || len(res.Flagged) != 3 {
			t.Fatalf("tick after unlock: err=%v locked=%v flagged=%d, want 3", err, res.Locked, len(res.Flagged))
		}
	})
}

func TestMetrics(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		reg := prometheus.NewRegistry()
		m := reconciler.NewMetrics(reg)
		stale := claimN(t, tdb.store, "m-stale", 4, nil)
		tdb.backdateHeartbeat(t, time.Hour, ids(stale)...)
		claimN(t, tdb.store, "m-live", 2, nil)
		claimN(t, tdb.store, "m-old", 3, nil)
		tdb.markAllProcessedAgo(t, "m-old", 30*24*time.Hour)

		rec, err := reconciler.New(tdb.store, reconciler.Config{StaleAfter: time.Minute, HeartbeatInterval: 20 * time.Second}, testLogger(t), m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rec.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		for name, want := range map[string]float64{
			"flagged":    4,
			"purged":     3,
			"unfinished": 2,
			"flaggedNow": 4,
			"tickErrors": 0,
		} {
			var got float64
			switch name {
			case "flagged":
				got = testutil.ToFloat64(m.Flagged)
			case "purged":
				got = testutil.ToFloat64(m.Purged)
			case "unfinished":
				got = testutil.ToFloat64(m.Unfinished)
			case "flaggedNow":
				got = testutil.ToFloat64(m.FlaggedNow)
			case "tickErrors":
				got = testutil.ToFloat64(m.TickErrors)
			}
			if got != want {
				t.Errorf("%s = %v, want %v", name, got, want)
			}
		}
		if age := testutil.ToFloat64(m.OldestUnfinished); age < 0 || age > 3600 {
			t.Errorf("oldest unfinished age = %v s, want the live claims' age (small)", age)
		}
		if n := testutil.CollectAndCount(reg, "sbclaim_reconciler_tick_duration_seconds"); n != 1 {
			t.Errorf("tick duration histogram: %d series, want 1", n)
		}

		// A failing tick counts an error.
		tdb.store.Close()
		if _, err := rec.RunOnce(ctx); err == nil {
			t.Fatal("tick on a closed store succeeded")
		}
		if got := testutil.ToFloat64(m.TickErrors); got != 1 {
			t.Errorf("tick errors = %v, want 1", got)
		}
	})
}
