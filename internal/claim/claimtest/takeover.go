package claimtest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// The take-over primitive: one guarded UPDATE behind a redelivery that
// finds its claim released or its holder silent, the reconciler's recovery
// and an operator's redrive; and the guarded writes around it (Flag,
// FindStale, Resolve by the redrive's owner, own rows recognised by their
// owner token).

func (s *suite) takeOverTests() []struct {
	name string
	fn   func(t *testing.T)
} {
	return []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"TakeOverRefusesAFreshHeartbeatAndTakesASilentOne", s.takeOverSilent},
		{"TakeOverOfASilentHolderHasOneWinnerOf50", s.takeOverSilentOnceOf50},
		{"TakeOverStalenessIsJudgedByTheDatabaseClock", s.takeOverDBClock},
		{"TakeOverPathsQualifyTheirStates", s.takeOverPaths},
		{"TakeOverEnforcesTheRouteFingerprint", s.takeOverRoute},
		{"TakeOverByTheReconcilerWaitsForTheNextAttempt", s.takeOverNextAttempt},
		{"OperatorRedriveHoldsTheClaim", s.operatorHold},
		{"FlagIsGuardedOnOwnerStateAndSilence", s.flagGuarded},
		{"FindStaleListsRecoveryCandidates", s.findStale},
		{"RecordLateSuccess", s.lateSuccess},
		{"RetriedBatchRecognisesItsOwnRows", s.ownRows},
		{"RetriedBatchWinsItsOwnRowOnlyWhileClaimed", s.ownRowStates},
	}
}

// redelivery is the take-over a new delivery of c's message asks for:
// released, or holder silent for an hour.
func redelivery(c *claim.Claim, by string, deliveryCount int) *claim.TakeOverParams {
	return &claim.TakeOverParams{
		ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(), Path: claim.PathRedelivery, SilentFor: time.Hour,
		By: by, Reason: "test redelivery", DeliveryCount: deliveryCount, Route: c.Route, Fingerprint: c.Fingerprint,
	}
}

func (s *suite) takeOverSilent(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	c := mustWin(t, st, msg("", "billing", "b"))

	// Fresh heartbeat: refused, the row comes back as it is, unchanged.
	p := redelivery(c, "host-b", 2)
	now, err := st.TakeOver(ctx, p)
	wantErr(t, "take-over of a holder that just claimed", err, claim.ErrStateChanged)
	if now == nil || now.Owner != c.Owner || now.State != claim.StateClaimed || now.TakeOvers != 0 {
		t.Fatalf("refused take-over returned %+v, want the unchanged claim", now)
	}
	if err := st.Heartbeat(ctx, &claim.HeartbeatParams{ID: c.ID, Owner: c.Owner}); err != nil {
		t.Fatal(err)
	}

	// Silent for two hours: taken, audited, and the old holder is out.
	s.backdate(t, st, c.ID, 2*time.Hour)
	p.Reason = "holder host-a silent"
	taken, err := st.TakeOver(ctx, p)
	if err != nil {
		t.Fatalf("take-over of a holder silent for 2h (SilentFor 1h): %v", err)
	}
	if taken.State != claim.StateClaimed || taken.Owner != p.Owner || taken.ClaimedBy != "host-b" || taken.DeliveryCount != 2 {
		t.Fatalf("taken over: state %s owner %s by %q delivery %d", taken.State, taken.Owner, taken.ClaimedBy, taken.DeliveryCount)
	}
	if taken.TakeOvers != 1 || taken.TakenOverAt == nil || taken.TakeOverPath != claim.PathRedelivery ||
		taken.TakeOverReason != "holder host-a silent" || taken.PreviousOwner != c.Owner || taken.PreviousHolder != "host-a" {
		t.Fatalf("take-over audit: count %d at %v path %q reason %q previous %s/%q",
			taken.TakeOvers, taken.TakenOverAt, taken.TakeOverPath, taken.TakeOverReason, taken.PreviousOwner, taken.PreviousHolder)
	}
	if !taken.HeartbeatAt.Equal(*taken.TakenOverAt) || time.Since(taken.HeartbeatAt) > time.Hour {
		t.Fatalf("heartbeat %v after a take-over at %v: want the take-over's time", taken.HeartbeatAt, *taken.TakenOverAt)
	}
	if got := mustGet(t, st, c.ID); got.Owner != p.Owner || got.TakeOvers != 1 || got.PreviousHolder != "host-a" {
		t.Fatalf("stored after take-over: %+v", got)
	}
	for op, err := range map[string]error{
		"Heartbeat":     st.Heartbeat(ctx, &claim.HeartbeatParams{ID: c.ID, Owner: c.Owner}),
		"MarkProcessed": st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner}),
		"Release":       st.Release(ctx, &claim.ReleaseParams{ID: c.ID, Owner: c.Owner}),
		"RecordAttempt": st.RecordAttempt(ctx, &claim.RecordAttemptParams{ID: c.ID, Owner: c.Owner}),
	} {
		wantErr(t, op+" by the holder that was taken over", err, claim.ErrStateChanged)
	}
	// The same take-over again (the old owner is gone): refused.
	_, err = st.TakeOver(ctx, p)
	wantErr(t, "a second take-over naming the old owner", err, claim.ErrStateChanged)
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: p.Owner}); err != nil {
		t.Fatalf("MarkProcessed by the new owner: %v", err)
	}
	// A processed claim is never taken over, however old.
	s.backdate(t, st, c.ID, 5*time.Hour)
	done := mustGet(t, st, c.ID)
	_, err = st.TakeOver(ctx, redelivery(done, "host-c", 3))
	wantErr(t, "take-over of a processed claim", err, claim.ErrStateChanged)
}

func (s *suite) takeOverSilentOnceOf50(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	c := mustWin(t, st, msg("", "billing", "b"))
	s.backdate(t, st, c.ID, 2*time.Hour)
	const n = 50
	// Open the pool's connections before the race: every goroutine pings
	// and waits at the barrier, so the take-overs start together instead
	// of one after another behind slow logins.
	var ready, done sync.WaitGroup
	ready.Add(n)
	start := make(chan struct{})
	type result struct {
		owner uuid.UUID
		now   *claim.Claim
		err   error
	}
	results := make([]result, n)
	for i := range n {
		done.Go(func() {
			err := st.Ping(ctx)
			ready.Done()
			if err != nil {
				results[i].err = err
				return
			}
			<-start
			p := redelivery(c, fmt.Sprintf("host-%d", i), 2)
			results[i].owner = p.Owner
			results[i].now, results[i].err = st.TakeOver(ctx, p)
		})
	}
	ready.Wait()
	close(start)
	done.Wait()
	var winner uuid.UUID
	wins := 0
	for i, r := range results {
		switch {
		case r.err == nil:
			wins++
			winner = r.owner
		case errors.Is(r.err, claim.ErrStateChanged):
		default:
			t.Fatalf("goroutine %d: %v", i, r.err)
		}
	}
	if wins != 1 {
		t.Fatalf("%d of %d concurrent take-overs of one silent holder won, want exactly 1", wins, n)
	}
	got := mustGet(t, st, c.ID)
	if got.Owner != winner || got.TakeOvers != 1 || got.PreviousOwner != c.Owner {
		t.Fatalf("after the race: owner %s (winner %s), take-overs %d, previous %s", got.Owner, winner, got.TakeOvers, got.PreviousOwner)
	}
	for i, r := range results {
		if r.err != nil && (r.now == nil || r.now.Owner == c.Owner && r.now.TakeOvers == 0) {
			t.Fatalf("loser %d: returned claim %+v, want the claim as the winner left it", i, r.now)
		}
	}
}

func (s *suite) takeOverDBClock(t *testing.T) {
	// TakeOverParams carries durations, never instants: whether a holder is
	// silent is decided inside the UPDATE, from the stored heartbeat and the
	// database's own clock, so a replica with a skewed clock cannot take a
	// live holder's claim. Here: heartbeat 90s old by the database clock.
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	c := mustWin(t, st, msg("", "billing", "b"))
	s.backdate(t, st, c.ID, 90*time.Second)
	p := redelivery(c, "host-b", 2)
	p.SilentFor = 2 * time.Minute
	if _, err := st.TakeOver(ctx, p); !errors.Is(err, claim.ErrStateChanged) {
		t.Fatalf("SilentFor 2m, heartbeat 90s old: %v, want ErrStateChanged", err)
	}
	p.SilentFor = time.Minute
	if _, err := st.TakeOver(ctx, p); err != nil {
		t.Fatalf("SilentFor 1m, heartbeat 90s old: %v, want taken", err)
	}
}

func (s *suite) takeOverPaths(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)

	// Released: a redelivery takes it at once; the reconciler only once the
	// release is older than SilentFor.
	r := mustWin(t, st, msg("", "billing", "released"))
	if err := st.Release(ctx, &claim.ReleaseParams{ID: r.ID, Owner: r.Owner, Error: "503"}); err != nil {
		t.Fatal(err)
	}
	r = mustGet(t, st, r.ID)
	rec := &claim.TakeOverParams{ID: r.ID, PreviousOwner: r.Owner, Owner: uuid.New(), Path: claim.PathReconciler,
		SilentFor: time.Minute, By: "reconciler", Reason: "recovery", Route: r.Route, Fingerprint: r.Fingerprint}
	_, err := st.TakeOver(ctx, rec)
	wantErr(t, "reconciler take-over of a fresh release", err, claim.ErrStateChanged)
	taken, err := st.TakeOver(ctx, redelivery(r, "host-b", 2))
	if err != nil {
		t.Fatalf("redelivery take-over of a released claim: %v", err)
	}
	if taken.Recoveries != 0 {
		t.Fatalf("a redelivery counted as a recovery: %d", taken.Recoveries)
	}

	// Claimed and stale: the reconciler takes it and counts a recovery.
	c := mustWin(t, st, msg("", "billing", "stale"))
	s.backdate(t, st, c.ID, time.Hour)
	rec = &claim.TakeOverParams{ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(), Path: claim.PathReconciler,
		SilentFor: time.Minute, By: "reconciler-1", Reason: "recovery", Route: c.Route, Fingerprint: c.Fingerprint}
	taken, err = st.TakeOver(ctx, rec)
	if err != nil {
		t.Fatalf("reconciler take-over of a stale claim: %v", err)
	}
	if taken.TakeOverPath != claim.PathReconciler || taken.Recoveries != 1 || taken.ClaimedBy != "reconciler-1" {
		t.Fatalf("reconciler take-over: path %q recoveries %d by %q", taken.TakeOverPath, taken.Recoveries, taken.ClaimedBy)
	}

	// The operator path takes flagged claims only.
	op := &claim.TakeOverParams{ID: taken.ID, PreviousOwner: taken.Owner, Owner: uuid.New(), Path: claim.PathOperator,
		By: "operator:ann", Reason: "redrive", Route: c.Route, Fingerprint: c.Fingerprint}
	_, err = st.TakeOver(ctx, op)
	wantErr(t, "operator take-over of a claimed claim", err, claim.ErrStateChanged)

	// A flagged claim is never taken by a redelivery or the reconciler.
	f := s.flagged(t, st, msg("", "billing", "flagged"))
	for _, path := range []claim.TakeOverPath{claim.PathRedelivery, claim.PathReconciler} {
		_, err := st.TakeOver(ctx, &claim.TakeOverParams{ID: f.ID, PreviousOwner: f.Owner, Owner: uuid.New(), Path: path,
			SilentFor: time.Nanosecond, By: "x", Route: f.Route, Fingerprint: f.Fingerprint})
		wantErr(t, string(path)+" take-over of a flagged claim", err, claim.ErrStateChanged)
	}

	// Bad params are refused before any SQL.
	for name, p := range map[string]*claim.TakeOverParams{
		"no path":           {ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(), SilentFor: time.Minute, By: "x"},
		"no new owner":      {ID: c.ID, PreviousOwner: c.Owner, Path: claim.PathRedelivery, SilentFor: time.Minute, By: "x"},
		"no previous owner": {ID: c.ID, Owner: uuid.New(), Path: claim.PathRedelivery, SilentFor: time.Minute, By: "x"},
		"no silence":        {ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(), Path: claim.PathRedelivery, By: "x"},
		"no holder":         {ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(), Path: claim.PathRedelivery, SilentFor: time.Minute},
		"same owner":        {ID: c.ID, PreviousOwner: c.Owner, Owner: c.Owner, Path: claim.PathRedelivery, SilentFor: time.Minute, By: "x"},
		"route name too long": {ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(), Path: claim.PathRedelivery, SilentFor: time.Minute, By: "x",
			Route: strings.Repeat("r", 65)},
	} {
		if _, err := st.TakeOver(ctx, p); err == nil || errors.Is(err, claim.ErrStateChanged) {
			t.Errorf("%s: TakeOver error %v, want a validation error", name, err)
		}
	}
}

func (s *suite) takeOverRoute(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	p := msg("", "billing", "b")
	p.Route, p.Fingerprint = "invoice", "fp-a"
	c := mustWin(t, st, p)
	if c.Route != "invoice" || c.Fingerprint != "fp-a" {
		t.Fatalf("claim recorded route %q fingerprint %q", c.Route, c.Fingerprint)
	}
	s.backdate(t, st, c.ID, 2*time.Hour)
	for name, rf := range map[string][2]string{
		"another route":       {"email", "fp-a"},
		"another fingerprint": {"invoice", "fp-b"},
		"no route":            {"", ""},
	} {
		tp := redelivery(c, "host-b", 2)
		tp.Route, tp.Fingerprint = rf[0], rf[1]
		now, err := st.TakeOver(ctx, tp)
		wantErr(t, name, err, claim.ErrRouteChanged)
		if !strings.Contains(err.Error(), `"invoice"`) || (rf[0] != "" && !strings.Contains(err.Error(), `"`+rf[0]+`"`)) {
			t.Errorf("%s: error %q does not name both routes", name, err)
		}
		if now == nil || now.Owner != c.Owner || now.TakeOvers != 0 {
			t.Fatalf("%s: the refused take-over changed the claim: %+v", name, now)
		}
	}
	tp := redelivery(c, "host-b", 2)
	if _, err := st.TakeOver(ctx, tp); err != nil {
		t.Fatalf("take-over under the claim's own route: %v", err)
	}

	// A row that recorded no route (claimed before routes were recorded)
	// gets the taker's.
	old := msg("", "billing", "old")
	if _, err := s.h.DB(t, st).ExecContext(ctx, s.h.Features.InsertClaimSQL, old.MessageID, old.Consumer, old.Owner.String(), old.PayloadHash); err != nil {
		t.Fatal(err)
	}
	rows, err := st.List(ctx, &claim.ListParams{Consumer: "billing", States: []claim.State{claim.StateClaimed}, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var legacy *claim.Claim
	for _, r := range rows {
		if r.MessageID == old.MessageID {
			legacy = r
		}
	}
	if legacy == nil || legacy.Route != "" {
		t.Fatalf("raw-inserted claim: %+v", legacy)
	}
	s.backdate(t, st, legacy.ID, 2*time.Hour)
	lp := redelivery(legacy, "host-b", 2)
	lp.Route, lp.Fingerprint = "invoice", "fp-a"
	taken, err := st.TakeOver(ctx, lp)
	if err != nil {
		t.Fatalf("take-over of a claim with no recorded route: %v", err)
	}
	if taken.Route != "invoice" || taken.Fingerprint != "fp-a" {
		t.Fatalf("take-over recorded route %q fingerprint %q, want the taker's", taken.Route, taken.Fingerprint)
	}
}

func (s *suite) takeOverNextAttempt(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	c := mustWin(t, st, msg("", "billing", "b"))
	if err := st.RecordAttempt(ctx, &claim.RecordAttemptParams{ID: c.ID, Owner: c.Owner, Error: "timeout", NextAttemptIn: 30 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	got := mustGet(t, st, c.ID)
	if got.NextAttemptAt == nil || got.NextAttemptAt.Sub(got.HeartbeatAt) < 29*time.Minute {
		t.Fatalf("NextAttemptAt %v after RecordAttempt with NextAttemptIn 30m (heartbeat %v)", got.NextAttemptAt, got.HeartbeatAt)
	}
	// Stale for 10 minutes, but the next attempt is 20 minutes away.
	s.backdate(t, st, c.ID, 10*time.Minute)
	rec := &claim.TakeOverParams{ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(), Path: claim.PathReconciler,
		SilentFor: time.Minute, By: "reconciler", Route: c.Route, Fingerprint: c.Fingerprint}
	_, err := st.TakeOver(ctx, rec)
	wantErr(t, "reconciler take-over before the next attempt is due", err, claim.ErrStateChanged)
	if found := findStale(t, st, time.Minute); containsID(found, c.ID) {
		t.Fatal("FindStale listed a claim whose next attempt is not due")
	}
	s.backdate(t, st, c.ID, 30*time.Minute)
	if found := findStale(t, st, time.Minute); !containsID(found, c.ID) {
		t.Fatal("FindStale did not list a stale claim whose next attempt is due")
	}
	taken, err := st.TakeOver(ctx, rec)
	if err != nil {
		t.Fatalf("reconciler take-over once the next attempt is due: %v", err)
	}
	if taken.NextAttemptAt != nil {
		t.Fatalf("a take-over left NextAttemptAt %v (the new holder's attempt decides the next)", taken.NextAttemptAt)
	}
	// A release with a backoff sets it; a plain release clears it.
	if err := st.Release(ctx, &claim.ReleaseParams{ID: c.ID, Owner: taken.Owner, Error: "503", NextAttemptIn: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, st, c.ID); got.State != claim.StateReleased || got.NextAttemptAt == nil {
		t.Fatalf("release with NextAttemptIn: %+v", got)
	}
}

func findStale(t *testing.T, st claim.Store, after time.Duration) []*claim.Claim {
	t.Helper()
	found, err := st.FindStale(ctxT(t), &claim.FindStaleParams{StaleAfter: after, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

func containsID(cs []*claim.Claim, id int64) bool {
	for _, c := range cs {
		if c.ID == id {
			return true
		}
	}
	return false
}

func (s *suite) operatorHold(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	f := s.flagged(t, st, msg("", "billing", "b"))

	op := &claim.TakeOverParams{ID: f.ID, PreviousOwner: f.Owner, Owner: uuid.New(), Path: claim.PathOperator,
		By: "operator:ann", Reason: "redrive: checked the PSP", Route: f.Route, Fingerprint: f.Fingerprint}
	held, err := st.TakeOver(ctx, op)
	if err != nil {
		t.Fatalf("operator take-over of a flagged claim: %v", err)
	}
	if held.State != claim.StateClaimed || held.ClaimedBy != "operator:ann" || held.TakeOverPath != claim.PathOperator || held.FlaggedAt == nil {
		t.Fatalf("held by the redrive: state %s by %q path %q flagged at %v", held.State, held.ClaimedBy, held.TakeOverPath, held.FlaggedAt)
	}
	// A second redrive, and an operator's resolve, are refused while the
	// first redrive holds it.
	op2 := *op
	op2.Owner, op2.By = uuid.New(), "operator:bob"
	_, err = st.TakeOver(ctx, &op2)
	wantErr(t, "a second redrive", err, claim.ErrStateChanged)
	_, err = st.Resolve(ctx, &claim.ResolveParams{ID: f.ID, Resolution: claim.ResolutionDiscarded, By: "bob", Note: "n"})
	wantErr(t, "resolve while a redrive holds the claim", err, claim.ErrStateChanged)
	_, err = st.Resolve(ctx, &claim.ResolveParams{ID: f.ID, Resolution: claim.ResolutionRedriven, By: "bob", Owner: uuid.New()})
	wantErr(t, "resolve by another owner", err, claim.ErrStateChanged)
	_, err = st.Resolve(ctx, &claim.ResolveParams{ID: f.ID, Resolution: claim.ResolutionDone, By: "ann", Owner: op.Owner})
	if err == nil || errors.Is(err, claim.ErrStateChanged) {
		t.Fatalf("resolve as done with an owner: %v, want a validation error (owner only for redriven)", err)
	}

	// The redrive failed: back to flagged, with its reason.
	back, err := st.Flag(ctx, &claim.FlagParams{ID: f.ID, Owner: op.Owner, State: claim.StateClaimed, Reason: "redrive by ann failed: 500"})
	if err != nil {
		t.Fatal(err)
	}
	if back.State != claim.StateFlagged || back.FlagReason != "redrive by ann failed: 500" {
		t.Fatalf("flagged again: %+v", back)
	}
	// Redriven: the holder resolves it, processed, payload dropped.
	op3 := *op
	op3.PreviousOwner, op3.Owner = op.Owner, uuid.New()
	held, err = st.TakeOver(ctx, &op3)
	if err != nil {
		t.Fatal(err)
	}
	res, err := st.Resolve(ctx, &claim.ResolveParams{ID: f.ID, Resolution: claim.ResolutionRedriven, By: "ann", Note: "ok", Owner: held.Owner})
	if err != nil {
		t.Fatalf("resolve by the redrive that holds the claim: %v", err)
	}
	if res.State != claim.StateResolved || res.Resolution != claim.ResolutionRedriven || res.ProcessedAt == nil || res.Payload != nil ||
		res.TakeOvers != 2 || res.ResolvedBy != "ann" {
		t.Fatalf("redriven: %+v", res)
	}
}

func (s *suite) flagGuarded(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	c := mustWin(t, st, msg("", "billing", "b"))
	for name, p := range map[string]*claim.FlagParams{
		"wrong owner":       {ID: c.ID, Owner: uuid.New(), State: claim.StateClaimed, Reason: "r"},
		"wrong state":       {ID: c.ID, Owner: c.Owner, State: claim.StateReleased, Reason: "r"},
		"holder not silent": {ID: c.ID, Owner: c.Owner, State: claim.StateClaimed, SilentFor: time.Minute, Reason: "r"},
	} {
		_, err := st.Flag(ctx, p)
		wantErr(t, "Flag with "+name, err, claim.ErrStateChanged)
	}
	_, err := st.Flag(ctx, &claim.FlagParams{ID: c.ID + 1000, Owner: c.Owner, State: claim.StateClaimed, Reason: "r"})
	wantErr(t, "Flag of a missing claim", err, claim.ErrNotFound)
	if _, err := st.Flag(ctx, &claim.FlagParams{ID: c.ID, Owner: c.Owner, State: claim.StateClaimed}); err == nil {
		t.Fatal("Flag without a reason succeeded")
	}
	if got := mustGet(t, st, c.ID); got.State != claim.StateClaimed || got.FlaggedAt != nil {
		t.Fatalf("refused flags changed the claim: %+v", got)
	}
	s.backdate(t, st, c.ID, time.Hour)
	f, err := st.Flag(ctx, &claim.FlagParams{ID: c.ID, Owner: c.Owner, State: claim.StateClaimed, SilentFor: time.Minute,
		Reason: `route "billing" is manual`})
	if err != nil {
		t.Fatal(err)
	}
	if f.State != claim.StateFlagged || f.FlaggedAt == nil || f.FlagReason != `route "billing" is manual` || f.Owner != c.Owner {
		t.Fatalf("flagged: %+v", f)
	}
}

func (s *suite) findStale(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	fresh := mustWin(t, st, msg("", "billing", "fresh"))
	older := mustWin(t, st, msg("", "billing", "older"))
	old := mustWin(t, st, msg("", "billing", "old"))
	released := mustWin(t, st, msg("", "billing", "released"))
	if err := st.Release(ctx, &claim.ReleaseParams{ID: released.ID, Owner: released.Owner}); err != nil {
		t.Fatal(err)
	}
	done := mustWin(t, st, msg("", "billing", "done"))
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: done.ID, Owner: done.Owner}); err != nil {
		t.Fatal(err)
	}
	flagged := s.flagged(t, st, msg("", "billing", "flagged"))
	s.backdate(t, st, older.ID, 3*time.Hour)
	s.backdate(t, st, old.ID, 2*time.Hour)
	s.backdate(t, st, released.ID, time.Hour)
	s.backdate(t, st, done.ID, 5*time.Hour)
	s.backdate(t, st, flagged.ID, 5*time.Hour)

	got := findStale(t, st, time.Minute)
	want := []int64{older.ID, old.ID, released.ID}
	if fmt.Sprint(ids(got)) != fmt.Sprint(want) {
		t.Fatalf("FindStale = %v, want %v (oldest heartbeat first; not fresh %d, processed %d, flagged %d)",
			ids(got), want, fresh.ID, done.ID, flagged.ID)
	}
	page, err := st.FindStale(ctx, &claim.FindStaleParams{StaleAfter: time.Minute, Limit: 2})
	if err != nil || len(page) != 2 {
		t.Fatalf("FindStale with Limit 2: %v %v", ids(page), err)
	}
	if got := mustGet(t, st, old.ID); got.State != claim.StateClaimed {
		t.Fatalf("FindStale changed a claim: %+v", got)
	}
	if _, err := st.FindStale(ctx, &claim.FindStaleParams{}); err == nil {
		t.Fatal("FindStale without StaleAfter succeeded")
	}
}

func (s *suite) lateSuccess(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	f := s.flagged(t, st, msg("", "billing", "b"))
	lost := uuid.New()
	if err := st.RecordLateSuccess(ctx, &claim.LateSuccessParams{ID: f.ID, Owner: lost, By: "host-a"}); err != nil {
		t.Fatal(err)
	}
	got := mustGet(t, st, f.ID)
	if got.LateSuccessAt == nil || !strings.Contains(got.LateSuccessBy, "host-a") || !strings.Contains(got.LateSuccessBy, lost.String()) {
		t.Fatalf("late success: at %v by %q", got.LateSuccessAt, got.LateSuccessBy)
	}
	if got.State != claim.StateFlagged || got.Owner != f.Owner {
		t.Fatalf("RecordLateSuccess changed the state or owner: %+v", got)
	}
	err := st.RecordLateSuccess(ctx, &claim.LateSuccessParams{ID: f.ID + 1000, Owner: lost, By: "host-a"})
	wantErr(t, "RecordLateSuccess of a missing claim", err, claim.ErrNotFound)
}

func (s *suite) ownRows(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	a := msg("", "billing", "a")
	b := msg("", "billing", "b")
	// The first try committed a but its answer was lost; the retry of the
	// same attempt (same tokens) sends a and b.
	first, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "h", Claims: []claim.ClaimParams{a}})
	if err != nil || first[0].Outcome != claim.OutcomeWon {
		t.Fatalf("first try: %v %v", first, err)
	}
	retry, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "h", Claims: []claim.ClaimParams{a, b}})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range retry {
		if r.Outcome != claim.OutcomeWon {
			t.Fatalf("retry, message %d: %s, want won (its own row)", i, r.Outcome)
		}
	}
	if retry[0].Claim.ID != first[0].Claim.ID || retry[0].Claim.Owner != a.Owner {
		t.Fatalf("retry won claim %d owner %s, want claim %d owner %s", retry[0].Claim.ID, retry[0].Claim.Owner, first[0].Claim.ID, a.Owner)
	}
	// Another delivery (another token) is a duplicate.
	other := a
	other.Owner = uuid.New()
	res, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "h2", Claims: []claim.ClaimParams{other}})
	if err != nil || res[0].Outcome != claim.OutcomeDuplicate {
		t.Fatalf("another delivery: %v %v, want duplicate", res, err)
	}
	// Once our own row is no longer claimed (processed), it is a duplicate
	// even for our own token: its effect is done.
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: first[0].Claim.ID, Owner: a.Owner}); err != nil {
		t.Fatal(err)
	}
	res, err = st.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "h", Claims: []claim.ClaimParams{a}})
	if err != nil || res[0].Outcome != claim.OutcomeDuplicate {
		t.Fatalf("own token, processed row: %v %v, want duplicate", res, err)
	}
	if _, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{Claims: []claim.ClaimParams{{MessageID: "x", Consumer: "c", PayloadHash: a.PayloadHash}}}); err == nil {
		t.Fatal("ClaimBatch without an owner token succeeded")
	}
}

// ownRowStates holds every store to one rule for a row that carries the
// caller's own owner token (a batch retried with the same tokens after its
// first try committed, or after the claim moved on): it is won again only
// while it is still claimed with the same payload hash. Released,
// processed, failed, flagged and resolved rows are duplicates (a released
// claim is taken over with a new token, the others are settled or an
// operator's), a row taken over since is a duplicate (another token holds
// it), and another payload hash is a conflict in every state. The retry
// changes no row.
func (s *suite) ownRowStates(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name string
		// move brings c, just won by the attempt, to the state under test.
		move func(t *testing.T, c *claim.Claim)
		want claim.Outcome
	}{
		{"claimed", func(*testing.T, *claim.Claim) {}, claim.OutcomeWon},
		{"released", func(t *testing.T, c *claim.Claim) {
			if err := st.Release(ctx, &claim.ReleaseParams{ID: c.ID, Owner: c.Owner, Error: "refused"}); err != nil {
				t.Fatal(err)
			}
		}, claim.OutcomeDuplicate},
		{"processed", func(t *testing.T, c *claim.Claim) {
			if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner}); err != nil {
				t.Fatal(err)
			}
		}, claim.OutcomeDuplicate},
		{"failed", func(t *testing.T, c *claim.Claim) {
			if err := st.Fail(ctx, &claim.FailParams{ID: c.ID, Owner: c.Owner, Reason: claim.FailRejected, Error: "declined"}); err != nil {
				t.Fatal(err)
			}
		}, claim.OutcomeDuplicate},
		{"flagged", func(t *testing.T, c *claim.Claim) {
			if _, err := st.Flag(ctx, &claim.FlagParams{ID: c.ID, Owner: c.Owner, State: claim.StateClaimed, Reason: "test"}); err != nil {
				t.Fatal(err)
			}
		}, claim.OutcomeDuplicate},
		{"resolved", func(t *testing.T, c *claim.Claim) {
			if _, err := st.Flag(ctx, &claim.FlagParams{ID: c.ID, Owner: c.Owner, State: claim.StateClaimed, Reason: "test"}); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Resolve(ctx, &claim.ResolveParams{ID: c.ID, Resolution: claim.ResolutionDone, By: "op"}); err != nil {
				t.Fatal(err)
			}
		}, claim.OutcomeDuplicate},
		{"taken over", func(t *testing.T, c *claim.Claim) {
			if err := st.Release(ctx, &claim.ReleaseParams{ID: c.ID, Owner: c.Owner, Error: "refused"}); err != nil {
				t.Fatal(err)
			}
			if _, err := st.TakeOver(ctx, redelivery(c, "host-b", 2)); err != nil {
				t.Fatal(err)
			}
		}, claim.OutcomeDuplicate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := msg("", "billing", "b")
			first, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "h", Claims: []claim.ClaimParams{p}})
			if err != nil || first[0].Outcome != claim.OutcomeWon {
				t.Fatalf("first try: %v %v", first, err)
			}
			c := first[0].Claim
			tc.move(t, c)
			before := mustGet(t, st, c.ID)
			if own := before.Owner == p.Owner; own != (tc.name != "taken over") {
				t.Fatalf("the %s row's owner is %s, the attempt's token %s", tc.name, before.Owner, p.Owner)
			}

			// The retry of the same attempt, in a batch with a new key.
			fresh := msg("", "billing", "fresh")
			res, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "h", Claims: []claim.ClaimParams{p, fresh}})
			if err != nil {
				t.Fatal(err)
			}
			if res[0].Outcome != tc.want || res[1].Outcome != claim.OutcomeWon {
				t.Fatalf("own token, %s row: %s (new key %s), want %s (new key won)", tc.name, res[0].Outcome, res[1].Outcome, tc.want)
			}
			if got := res[0].Claim; got.ID != c.ID || got.State != before.State || got.Owner != before.Owner {
				t.Fatalf("own token, %s row: claim %d %s owner %s, want the row as it is (claim %d %s owner %s)",
					tc.name, got.ID, got.State, got.Owner, c.ID, before.State, before.Owner)
			}

			// The same token with another payload: a conflict, whatever
			// the state.
			other := p
			other.PayloadHash = claim.HashPayload([]byte("another body"))
			res, err = st.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "h", Claims: []claim.ClaimParams{other}})
			if err != nil {
				t.Fatal(err)
			}
			if res[0].Outcome != claim.OutcomeConflict || res[0].Claim.ID != c.ID {
				t.Fatalf("own token, another payload, %s row: %s claim %d, want conflict with claim %d", tc.name, res[0].Outcome, res[0].Claim.ID, c.ID)
			}

			after := mustGet(t, st, c.ID)
			if after.State != before.State || after.Owner != before.Owner || after.TakeOvers != before.TakeOvers || !after.HeartbeatAt.Equal(before.HeartbeatAt) {
				t.Fatalf("the retries changed the %s row: %+v, was %+v", tc.name, after, before)
			}
		})
	}
}

func (s *suite) takeOverOnce(t *testing.T) {
	st := s.h.NewStore(t)
	c := mustWin(t, st, msg("", "billing", "b"))
	if err := st.Release(ctxT(t), &claim.ReleaseParams{ID: c.ID, Owner: c.Owner, Error: "e"}); err != nil {
		t.Fatal(err)
	}
	const n = 20
	warm(t, s.h.DB(t, st), n)
	var (
		wg      sync.WaitGroup
		ready   sync.WaitGroup
		start   = make(chan struct{})
		winners atomic.Int64
		owner   atomic.Value
		errs    = make(chan error, n)
	)
	ctx := ctxT(t)
	ready.Add(n)
	for i := range n {
		wg.Go(func() {
			params := redelivery(c, fmt.Sprintf("host-%d", i), 2)
			ready.Done()
			<-start
			got, err := st.TakeOver(ctx, params)
			switch {
			case err == nil:
				winners.Add(1)
				owner.Store(got.Owner)
			case errors.Is(err, claim.ErrStateChanged):
			default:
				errs <- err
			}
		})
	}
	ready.Wait() // every caller is parked on the barrier, on a warm pool
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if winners.Load() != 1 {
		t.Fatalf("%d callers took the claim over, want exactly 1", winners.Load())
	}
	if got := mustGet(t, st, c.ID); got.State != claim.StateClaimed || got.Owner != owner.Load().(uuid.UUID) {
		t.Fatalf("after take-over: %+v", got)
	}
}
