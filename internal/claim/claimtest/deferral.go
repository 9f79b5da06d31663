package claimtest

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// The delayed-retry tests (claim.Deferrer): a holder records that its
// message is deferred, a processor finds and takes the due claim once,
// another message's redelivery is refused while the claim's message is
// deferred, and the reconciler leaves the claim alone until its grace.
func (s *suite) deferralTests() []struct {
	name string
	fn   func(t *testing.T)
} {
	return []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"DeferRecordsTheMessageAndItsDueTime", s.deferRecords},
		{"DeferIsGuardedOnOwnerAndState", s.deferGuarded},
		{"FindDueSkipsWhatIsNotDueAndOtherConsumers", s.findDueSkips},
		{"TakeDeferredHasExactlyOneWinner", s.takeDeferredOnce},
		{"TakeDeferredRetakesFromASilentHolder", s.takeDeferredSilent},
		{"RedeliveryOfAnotherMessageIsRefusedWhileDeferred", s.deferredRefusesOtherRedelivery},
		{"RecoveryLeavesADeferredClaimUntilItsGrace", s.deferredNotStale},
		{"DeferringClaimIsFetchedOnlyOnceItsHolderIsSilent", s.deferringSilent},
		{"ReleaseKeepsTheDeferredMessageUntilItIsCleared", s.releaseKeeps},
		{"RecoveryKeepsTheDeferredMessage", s.recoveryKeeps},
		{"FindStrandedFindsFinishedClaimsThatNameAMessage", s.findStranded},
		{"TakeStrandedHasExactlyOneWinner", s.takeStrandedOnce},
		{"ClearDeferredEndsTheWaitForTheMessage", s.clearEndsTheWait},
	}
}

func (s *suite) deferrer(t *testing.T) (claim.Store, claim.Deferrer) {
	t.Helper()
	st := s.h.NewStore(t)
	d, ok := st.(claim.Deferrer)
	if !ok {
		t.Skipf("%T does not implement claim.Deferrer", st)
	}
	return st, d
}

// deferOne claims a fresh message and defers it under seq, due in dueIn.
func deferOne(t *testing.T, st claim.Store, d claim.Deferrer, consumer string, seq int64, dueIn, grace time.Duration) *claim.Claim {
	t.Helper()
	c := mustWin(t, st, msg("", consumer, "body"))
	if err := d.Defer(ctxT(t), &claim.DeferParams{ID: c.ID, Owner: c.Owner, Seq: seq, DueIn: dueIn, Grace: grace,
		Error: "HTTP 503", Answer: &claim.Answer{Status: 503}}); err != nil {
		t.Fatalf("Defer: %v", err)
	}
	if got := mustGet(t, st, c.ID); got.DueAt != nil || got.Deferred() {
		t.Fatalf("after Defer, before SetDue: DueAt %v; want none (the message is not deferred yet)", got.DueAt)
	}
	if err := d.SetDue(ctxT(t), &claim.SetDueParams{ID: c.ID, Owner: c.Owner, Seq: seq, DueIn: dueIn}); err != nil {
		t.Fatalf("SetDue: %v", err)
	}
	return mustGet(t, st, c.ID)
}

func (s *suite) deferRecords(t *testing.T) {
	st, d := s.deferrer(t)
	c := deferOne(t, st, d, "billing", 42, time.Hour, 30*time.Minute)
	switch {
	case c.State != claim.StateReleased:
		t.Fatalf("state %s, want released", c.State)
	case c.DeferredSeq == nil || *c.DeferredSeq != 42:
		t.Fatalf("DeferredSeq %v, want 42", c.DeferredSeq)
	case c.DueAt == nil || c.NextAttemptAt == nil || c.PostponedAt == nil || c.ReleasedAt == nil:
		t.Fatalf("DueAt %v, NextAttemptAt %v, PostponedAt %v, ReleasedAt %v: want all set", c.DueAt, c.NextAttemptAt, c.PostponedAt, c.ReleasedAt)
	case c.Postponements != 1 || c.LastError != "HTTP 503" || c.Answer == nil || c.Answer.Status != 503:
		t.Fatalf("Postponements %d, LastError %q, Answer %+v", c.Postponements, c.LastError, c.Answer)
	case !c.Deferred():
		t.Fatal("Deferred() is false")
	}
	if got := c.DueAt.Sub(*c.ReleasedAt); got < 59*time.Minute || got > 61*time.Minute {
		t.Errorf("DueAt - ReleasedAt = %s, want 1h (database clock)", got)
	}
	if got := c.NextAttemptAt.Sub(*c.DueAt); got < 29*time.Minute || got > 31*time.Minute {
		t.Errorf("NextAttemptAt - DueAt = %s, want the 30m grace", got)
	}
	first := *c.PostponedAt

	// A second deferral counts, and keeps the first postponement's time.
	owner := uuid.New()
	taken, err := st.TakeOver(ctxT(t), &claim.TakeOverParams{ID: c.ID, PreviousOwner: c.Owner, Owner: owner,
		Path: claim.PathRedelivery, SilentFor: time.Minute, By: "host-b", Reason: "test", Seq: ptr(int64(42)),
		Route: c.Route, Fingerprint: c.Fingerprint})
	if err != nil {
		t.Fatalf("TakeOver by the deferred message itself: %v", err)
	}
	if taken.DeferredSeq != nil || taken.DueAt != nil {
		t.Fatalf("after a take-over DeferredSeq %v, DueAt %v: want both cleared", taken.DeferredSeq, taken.DueAt)
	}
	if err := d.Defer(ctxT(t), &claim.DeferParams{ID: c.ID, Owner: owner, Seq: 43, DueIn: time.Minute}); err != nil {
		t.Fatalf("second Defer: %v", err)
	}
	c = mustGet(t, st, c.ID)
	if c.Postponements != 2 || c.PostponedAt == nil || !c.PostponedAt.Equal(first) || *c.DeferredSeq != 43 {
		t.Fatalf("after a second deferral: Postponements %d, PostponedAt %v (first %v), DeferredSeq %d", c.Postponements, c.PostponedAt, first, *c.DeferredSeq)
	}
}

func ptr[T any](v T) *T { return &v }

func (s *suite) deferGuarded(t *testing.T) {
	st, d := s.deferrer(t)
	c := mustWin(t, st, msg("", "billing", "body"))
	err := d.Defer(ctxT(t), &claim.DeferParams{ID: c.ID, Owner: uuid.New(), Seq: 1})
	wantErr(t, "Defer by another owner", err, claim.ErrStateChanged)
	if err := d.Defer(ctxT(t), &claim.DeferParams{ID: c.ID, Owner: c.Owner, Seq: 1}); err != nil {
		t.Fatalf("Defer: %v", err)
	}
	err = d.Defer(ctxT(t), &claim.DeferParams{ID: c.ID, Owner: c.Owner, Seq: 1})
	wantErr(t, "Defer of a released claim", err, claim.ErrStateChanged)
	if err := d.Defer(ctxT(t), &claim.DeferParams{ID: c.ID, Owner: c.Owner, Seq: 1, DueIn: -time.Second}); err == nil {
		t.Fatal("Defer with a negative DueIn: no error")
	}
}

func (s *suite) findDueSkips(t *testing.T) {
	st, d := s.deferrer(t)
	due := deferOne(t, st, d, "billing", 1, 0, time.Hour)
	later := deferOne(t, st, d, "billing", 2, time.Hour, time.Hour)
	other := deferOne(t, st, d, "shipping", 3, 0, time.Hour)
	plain := mustWin(t, st, msg("", "billing", "body")) // claimed, fresh, never deferred
	got, err := d.FindDue(ctxT(t), &claim.FindDueParams{Consumer: "billing", Entity: due.Entity, SilentFor: time.Minute})
	if err != nil {
		t.Fatalf("FindDue: %v", err)
	}
	if len(got) != 1 || got[0].ID != due.ID {
		ids := []int64{}
		for _, c := range got {
			ids = append(ids, c.ID)
		}
		t.Fatalf("FindDue = %v, want only the due claim %d (not due %d, other consumer %d, never deferred %d)", ids, due.ID, later.ID, other.ID, plain.ID)
	}
	got, err = d.FindDue(ctxT(t), &claim.FindDueParams{Consumer: "billing", Entity: "another/entity", SilentFor: time.Minute})
	if err != nil || len(got) != 0 {
		t.Fatalf("FindDue of another entity = %d claims, %v; want none", len(got), err)
	}
	_, err = d.TakeDeferred(ctxT(t), &claim.TakeDeferredParams{ID: later.ID, PreviousOwner: later.Owner, Owner: uuid.New(),
		Seq: 2, SilentFor: time.Minute, By: "host-b"})
	wantErr(t, "TakeDeferred of a claim not yet due", err, claim.ErrStateChanged)
}

func (s *suite) takeDeferredOnce(t *testing.T) {
	st, d := s.deferrer(t)
	c := deferOne(t, st, d, "billing", 7, 0, time.Hour)
	const racers = 8
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		wins   []*claim.Claim
		guards int
	)
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			taken, err := d.TakeDeferred(ctxT(t), &claim.TakeDeferredParams{ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(),
				Seq: 7, SilentFor: time.Minute, By: "host-" + string(rune('a'+i)), Reason: "deferred message due"})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins = append(wins, taken)
			case errors.Is(err, claim.ErrStateChanged):
				guards++
			default:
				t.Errorf("TakeDeferred: %v", err)
			}
		}()
	}
	wg.Wait()
	if len(wins) != 1 || guards != racers-1 {
		t.Fatalf("%d winners and %d refused by the guard, want 1 and %d", len(wins), guards, racers-1)
	}
	w := wins[0]
	if w.State != claim.StateClaimed || w.DeferredSeq == nil || *w.DeferredSeq != 7 || w.DueAt != nil || w.NextAttemptAt != nil ||
		w.TakeOverPath != claim.PathRedelivery || w.PreviousOwner != c.Owner {
		t.Fatalf("winner's claim: state %s, DeferredSeq %v, DueAt %v, NextAttemptAt %v, path %s, previous owner %s",
			w.State, w.DeferredSeq, w.DueAt, w.NextAttemptAt, w.TakeOverPath, w.PreviousOwner)
	}
	// The history: the claim, its deferral (claimed → released) and the
	// one take-over; the refused racers and SetDue (no change of owner or
	// state) wrote none.
	h := s.history(t, st, c.ID)
	if len(h) != 3 || h[0].What != claim.ChangeClaimed ||
		h[1].What != claim.ChangeReleased || h[1].From != claim.StateClaimed || h[1].To != claim.StateReleased ||
		!strings.Contains(h[1].Reason, "deferred (sequence number 7)") ||
		h[2].What != claim.ChangeTakenOver || h[2].From != claim.StateReleased || h[2].To != claim.StateClaimed ||
		h[2].Path != claim.PathRedelivery || h[2].PreviousOwner != c.Owner || h[2].Owner != w.Owner || h[2].By != w.ClaimedBy {
		t.Fatalf("history %+v: want claimed, released (deferred), taken over by the winner", h)
	}
	// The holder is alive: nobody finds or takes it.
	got, err := d.FindDue(ctxT(t), &claim.FindDueParams{Consumer: "billing", Entity: c.Entity, SilentFor: time.Minute})
	if err != nil || len(got) != 0 {
		t.Fatalf("FindDue with a live holder = %d claims, %v; want none", len(got), err)
	}
}

func (s *suite) takeDeferredSilent(t *testing.T) {
	st, d := s.deferrer(t)
	c := deferOne(t, st, d, "billing", 9, 0, time.Hour)
	first, err := d.TakeDeferred(ctxT(t), &claim.TakeDeferredParams{ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(),
		Seq: 9, SilentFor: time.Minute, By: "host-a"})
	if err != nil {
		t.Fatalf("TakeDeferred: %v", err)
	}
	s.backdate(t, st, c.ID, 10*time.Minute)
	got, err := d.FindDue(ctxT(t), &claim.FindDueParams{Consumer: "billing", Entity: c.Entity, SilentFor: time.Minute})
	if err != nil || len(got) != 1 {
		t.Fatalf("FindDue with a silent holder = %d claims, %v; want it", len(got), err)
	}
	_, err = d.TakeDeferred(ctxT(t), &claim.TakeDeferredParams{ID: c.ID, PreviousOwner: first.Owner, Owner: uuid.New(),
		Seq: 10, SilentFor: time.Minute, By: "host-b"})
	wantErr(t, "TakeDeferred naming another sequence number", err, claim.ErrStateChanged)
	if _, err := d.TakeDeferred(ctxT(t), &claim.TakeDeferredParams{ID: c.ID, PreviousOwner: first.Owner, Owner: uuid.New(),
		Seq: 9, SilentFor: time.Minute, By: "host-b"}); err != nil {
		t.Fatalf("TakeDeferred from a silent holder: %v", err)
	}
}

func (s *suite) deferredRefusesOtherRedelivery(t *testing.T) {
	st, d := s.deferrer(t)
	c := deferOne(t, st, d, "billing", 11, time.Hour, time.Hour)
	take := func(seq *int64) (*claim.Claim, error) {
		return st.TakeOver(ctxT(t), &claim.TakeOverParams{ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(),
			Path: claim.PathRedelivery, SilentFor: time.Minute, By: "host-b", Reason: "released", Seq: seq,
			Route: c.Route, Fingerprint: c.Fingerprint})
	}
	now, err := take(ptr(int64(12)))
	wantErr(t, "redelivery of another message", err, claim.ErrStateChanged)
	if now == nil || !now.Deferred() {
		t.Fatalf("refused take-over returned %+v, want the deferred claim", now)
	}
	_, err = take(nil)
	wantErr(t, "redelivery without a sequence number", err, claim.ErrStateChanged)
	// The deferred message itself (redelivered because DeferMessage never
	// happened) takes its claim back.
	if _, err := take(ptr(int64(11))); err != nil {
		t.Fatalf("redelivery of the deferred message: %v", err)
	}
}

func (s *suite) deferredNotStale(t *testing.T) {
	st, d := s.deferrer(t)
	c := deferOne(t, st, d, "billing", 13, 0, time.Hour)
	s.backdate(t, st, c.ID, 2*time.Minute) // heartbeat 2 minutes old; next attempt still ~58 minutes ahead
	stale, err := st.FindStale(ctxT(t), &claim.FindStaleParams{StaleAfter: time.Minute})
	if err != nil {
		t.Fatalf("FindStale: %v", err)
	}
	for _, sc := range stale {
		if sc.ID == c.ID {
			t.Fatal("FindStale returned a deferred claim inside its grace")
		}
	}
	_, err = st.TakeOver(ctxT(t), &claim.TakeOverParams{ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(),
		Path: claim.PathReconciler, SilentFor: time.Minute, By: "reconciler", Reason: "stale",
		Route: c.Route, Fingerprint: c.Fingerprint})
	wantErr(t, "recovery inside the grace", err, claim.ErrStateChanged)
	flagged, err := st.FlagStale(ctxT(t), &claim.FlagStaleParams{StaleAfter: time.Minute, Limit: 100})
	if err != nil {
		t.Fatalf("FlagStale: %v", err)
	}
	for _, fc := range flagged {
		if fc.ID == c.ID {
			t.Fatal("FlagStale flagged a deferred claim inside its grace")
		}
	}
	s.backdate(t, st, c.ID, 2*time.Hour) // past the grace
	if _, err := st.TakeOver(ctxT(t), &claim.TakeOverParams{ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(),
		Path: claim.PathReconciler, SilentFor: time.Minute, By: "reconciler", Reason: "stale",
		Route: c.Route, Fingerprint: c.Fingerprint}); err != nil {
		t.Fatalf("recovery past the grace: %v", err)
	}
}

func (s *suite) deferringSilent(t *testing.T) {
	st, d := s.deferrer(t)
	c := mustWin(t, st, msg("", "billing", "body"))
	if err := d.Defer(ctxT(t), &claim.DeferParams{ID: c.ID, Owner: c.Owner, Seq: 21, Grace: time.Hour}); err != nil {
		t.Fatalf("Defer: %v", err)
	}
	find := func() []*claim.Claim {
		got, err := d.FindDue(ctxT(t), &claim.FindDueParams{Consumer: "billing", Entity: c.Entity, SilentFor: time.Minute})
		if err != nil {
			t.Fatalf("FindDue: %v", err)
		}
		return got
	}
	if got := find(); len(got) != 0 {
		t.Fatal("FindDue returned a claim whose holder is deferring its message right now")
	}
	err := d.SetDue(ctxT(t), &claim.SetDueParams{ID: c.ID, Owner: uuid.New(), Seq: 21})
	wantErr(t, "SetDue by another owner", err, claim.ErrStateChanged)
	err = d.SetDue(ctxT(t), &claim.SetDueParams{ID: c.ID, Owner: c.Owner, Seq: 22})
	wantErr(t, "SetDue naming another message", err, claim.ErrStateChanged)
	// The holder died between Defer and SetDue: once silent, the claim is
	// found, and taken, so its message is looked for.
	s.backdate(t, st, c.ID, 10*time.Minute)
	if got := find(); len(got) != 1 {
		t.Fatalf("FindDue after the holder went silent = %d claims, want it", len(got))
	}
	taken, err := d.TakeDeferred(ctxT(t), &claim.TakeDeferredParams{ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(),
		Seq: 21, SilentFor: time.Minute, By: "host-b"})
	if err != nil {
		t.Fatalf("TakeDeferred of a silent deferring claim: %v", err)
	}
	// Finished, the claim is never found due again, however old: it keeps
	// the sequence number of the message it was fetched with until that
	// message is settled (FindStranded finds it, not FindDue).
	if err := st.MarkProcessed(ctxT(t), &claim.MarkProcessedParams{ID: c.ID, Owner: taken.Owner}); err != nil {
		t.Fatalf("MarkProcessed: %v", err)
	}
	s.backdate(t, st, c.ID, time.Hour)
	if got := find(); len(got) != 0 {
		t.Fatalf("FindDue returned a processed claim (state %s)", got[0].State)
	}
	_, err = d.TakeDeferred(ctxT(t), &claim.TakeDeferredParams{ID: c.ID, PreviousOwner: taken.Owner, Owner: uuid.New(),
		Seq: 21, SilentFor: time.Minute, By: "host-c"})
	wantErr(t, "TakeDeferred of a processed claim", err, claim.ErrStateChanged)
}

// releaseKeeps: a Release keeps the message the claim names (a fetched
// message its holder hands back returns to deferred, and a poller must
// find it); only ClearDeferred, once the message is settled or gone,
// forgets it, and then another message may take the claim.
func (s *suite) releaseKeeps(t *testing.T) {
	st, d := s.deferrer(t)
	c := deferOne(t, st, d, "billing", 31, 0, time.Hour)
	taken, err := d.TakeDeferred(ctxT(t), &claim.TakeDeferredParams{ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(),
		Seq: 31, SilentFor: time.Minute, By: "host-b"})
	if err != nil {
		t.Fatalf("TakeDeferred: %v", err)
	}
	err = d.SetDue(ctxT(t), &claim.SetDueParams{ID: c.ID, Owner: taken.Owner, Seq: 31})
	wantErr(t, "SetDue of a claimed claim", err, claim.ErrStateChanged)
	if err := st.Release(ctxT(t), &claim.ReleaseParams{ID: c.ID, Owner: taken.Owner, Error: "abandoned"}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	got := mustGet(t, st, c.ID)
	if got.DeferredSeq == nil || *got.DeferredSeq != 31 || got.DueAt != nil {
		t.Fatalf("after Release: DeferredSeq %v, DueAt %v; want 31 kept, no due time", got.DeferredSeq, got.DueAt)
	}
	takeOther := func() error {
		_, err := st.TakeOver(ctxT(t), &claim.TakeOverParams{ID: c.ID, PreviousOwner: taken.Owner, Owner: uuid.New(),
			Path: claim.PathRedelivery, SilentFor: time.Minute, By: "host-c", Reason: "released", Seq: ptr(int64(99)),
			Route: c.Route, Fingerprint: c.Fingerprint})
		return err
	}
	wantErr(t, "redelivery of another message while the claim names its own", takeOther(), claim.ErrStateChanged)
	s.backdate(t, st, c.ID, 10*time.Minute)
	due, err := d.FindDue(ctxT(t), &claim.FindDueParams{Consumer: "billing", Entity: c.Entity, SilentFor: time.Minute})
	if err != nil || len(due) != 1 || due[0].ID != c.ID {
		t.Fatalf("FindDue of a released claim naming its message = %d claims, %v; want it (a poller fetches the message)", len(due), err)
	}
	wantErr(t, "ClearDeferred naming another message", d.ClearDeferred(ctxT(t), &claim.ClearDeferredParams{ID: c.ID, Seq: 32}), claim.ErrStateChanged)
	if err := d.ClearDeferred(ctxT(t), &claim.ClearDeferredParams{ID: c.ID, Seq: 31}); err != nil {
		t.Fatalf("ClearDeferred: %v", err)
	}
	wantErr(t, "ClearDeferred again", d.ClearDeferred(ctxT(t), &claim.ClearDeferredParams{ID: c.ID, Seq: 31}), claim.ErrStateChanged)
	if got := mustGet(t, st, c.ID); got.DeferredSeq != nil || got.State != claim.StateReleased {
		t.Fatalf("after ClearDeferred: DeferredSeq %v, state %s; want none, still released", got.DeferredSeq, got.State)
	}
	if err := takeOther(); err != nil {
		t.Fatalf("redelivery of another message once the claim forgot its own: %v", err)
	}
}

// recoveryKeeps: the reconciler's recovery of a deferred claim past its
// grace keeps the message the claim names, so once the claim is finished
// its message is still found and settled (FindStranded).
func (s *suite) recoveryKeeps(t *testing.T) {
	st, d := s.deferrer(t)
	c := deferOne(t, st, d, "billing", 33, 0, 0)
	s.backdate(t, st, c.ID, 10*time.Minute)
	taken, err := st.TakeOver(ctxT(t), &claim.TakeOverParams{ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(),
		Path: claim.PathReconciler, SilentFor: time.Minute, By: "reconciler", Reason: "stale",
		Route: c.Route, Fingerprint: c.Fingerprint})
	if err != nil {
		t.Fatalf("recovery past the grace: %v", err)
	}
	if taken.DeferredSeq == nil || *taken.DeferredSeq != 33 || taken.DueAt != nil {
		t.Fatalf("after recovery: DeferredSeq %v, DueAt %v; want 33 kept, no due time", taken.DeferredSeq, taken.DueAt)
	}
	findDue := func() int {
		t.Helper()
		got, err := d.FindDue(ctxT(t), &claim.FindDueParams{Consumer: "billing", Entity: c.Entity, SilentFor: time.Minute})
		if err != nil {
			t.Fatalf("FindDue: %v", err)
		}
		return len(got)
	}
	// The reconciler holds it: even silent (its recovery got an unknown
	// outcome and wrote nothing), it is the reconciler's to finish, not a
	// poller's to fetch.
	s.backdate(t, st, c.ID, 10*time.Minute)
	if n := findDue(); n != 0 {
		t.Fatalf("FindDue returned a claim the reconciler holds (%d)", n)
	}
	_, err = d.TakeDeferred(ctxT(t), &claim.TakeDeferredParams{ID: c.ID, PreviousOwner: taken.Owner, Owner: uuid.New(),
		Seq: 33, SilentFor: time.Minute, By: "host-b"})
	wantErr(t, "TakeDeferred of a claim the reconciler holds", err, claim.ErrStateChanged)
	if err := st.MarkProcessed(ctxT(t), &claim.MarkProcessedParams{ID: c.ID, Owner: taken.Owner}); err != nil {
		t.Fatalf("MarkProcessed: %v", err)
	}
	s.backdate(t, st, c.ID, 10*time.Minute)
	got, err := d.FindStranded(ctxT(t), &claim.FindDueParams{Consumer: "billing", Entity: c.Entity, SilentFor: time.Minute})
	if err != nil || len(got) != 1 || got[0].ID != c.ID {
		t.Fatalf("FindStranded after the recovery finished = %d claims, %v; want it", len(got), err)
	}
}

// strandedClaim defers a claim under seq, fetches it and finishes it as
// finish says; it returns the finished claim.
func (s *suite) strandedClaim(t *testing.T, st claim.Store, d claim.Deferrer, consumer string, seq int64, finish func(c *claim.Claim) error) *claim.Claim {
	t.Helper()
	c := deferOne(t, st, d, consumer, seq, 0, time.Hour)
	taken, err := d.TakeDeferred(ctxT(t), &claim.TakeDeferredParams{ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(),
		Seq: seq, SilentFor: time.Minute, By: "host-a"})
	if err != nil {
		t.Fatalf("TakeDeferred: %v", err)
	}
	if err := finish(taken); err != nil {
		t.Fatalf("finishing claim %d: %v", c.ID, err)
	}
	return mustGet(t, st, c.ID)
}

func (s *suite) findStranded(t *testing.T) {
	st, d := s.deferrer(t)
	processed := s.strandedClaim(t, st, d, "billing", 51, func(c *claim.Claim) error {
		return st.MarkProcessed(ctxT(t), &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner})
	})
	failed := s.strandedClaim(t, st, d, "billing", 52, func(c *claim.Claim) error {
		return st.Fail(ctxT(t), &claim.FailParams{ID: c.ID, Owner: c.Owner, Reason: claim.FailRejected, Error: "declined"})
	})
	flagged := s.strandedClaim(t, st, d, "billing", 53, func(c *claim.Claim) error {
		_, err := st.Flag(ctxT(t), &claim.FlagParams{ID: c.ID, Owner: c.Owner, State: claim.StateClaimed, Reason: "horizon", By: "host-a"})
		return err
	})
	settled := s.strandedClaim(t, st, d, "billing", 54, func(c *claim.Claim) error {
		if err := st.MarkProcessed(ctxT(t), &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner}); err != nil {
			return err
		}
		return d.ClearDeferred(ctxT(t), &claim.ClearDeferredParams{ID: c.ID, Seq: 54})
	})
	other := s.strandedClaim(t, st, d, "shipping", 55, func(c *claim.Claim) error {
		return st.MarkProcessed(ctxT(t), &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner})
	})
	held := deferOne(t, st, d, "billing", 56, time.Hour, time.Hour) // deferred, not finished
	plain := mustWin(t, st, msg("", "billing", "body"))
	if err := st.MarkProcessed(ctxT(t), &claim.MarkProcessedParams{ID: plain.ID, Owner: plain.Owner}); err != nil {
		t.Fatalf("MarkProcessed: %v", err)
	}
	find := func() map[int64]claim.State {
		t.Helper()
		got, err := d.FindStranded(ctxT(t), &claim.FindDueParams{Consumer: "billing", Entity: processed.Entity, SilentFor: time.Minute})
		if err != nil {
			t.Fatalf("FindStranded: %v", err)
		}
		out := map[int64]claim.State{}
		for _, c := range got {
			out[c.ID] = c.State
		}
		return out
	}
	if got := find(); len(got) != 0 {
		t.Fatalf("FindStranded with fresh holders = %v, want none (a holder may still be settling)", got)
	}
	for _, c := range []*claim.Claim{processed, failed, flagged, settled, other, held, plain} {
		s.backdate(t, st, c.ID, 10*time.Minute)
	}
	got := find()
	want := map[int64]claim.State{processed.ID: claim.StateProcessed, failed.ID: claim.StateFailed, flagged.ID: claim.StateFlagged}
	if len(got) != len(want) || got[processed.ID] != claim.StateProcessed || got[failed.ID] != claim.StateFailed || got[flagged.ID] != claim.StateFlagged {
		t.Fatalf("FindStranded = %v, want %v (not: settled %d, other consumer %d, unfinished %d, never deferred %d)",
			got, want, settled.ID, other.ID, held.ID, plain.ID)
	}
	if got, err := d.FindStranded(ctxT(t), &claim.FindDueParams{Consumer: "billing", Entity: "another/entity", SilentFor: time.Minute}); err != nil || len(got) != 0 {
		t.Fatalf("FindStranded of another entity = %d claims, %v; want none", len(got), err)
	}
	// Finished just now by someone else than its silent holder (the
	// reconciler flagging it, say): the finish counts as the last sign of
	// life, however old the heartbeat.
	late := deferOne(t, st, d, "billing", 57, 0, time.Hour)
	lateHeld, err := d.TakeDeferred(ctxT(t), &claim.TakeDeferredParams{ID: late.ID, PreviousOwner: late.Owner, Owner: uuid.New(),
		Seq: 57, SilentFor: time.Minute, By: "host-a"})
	if err != nil {
		t.Fatalf("TakeDeferred: %v", err)
	}
	s.backdate(t, st, late.ID, 10*time.Minute)
	if _, err := st.Flag(ctxT(t), &claim.FlagParams{ID: late.ID, Owner: lateHeld.Owner, State: claim.StateClaimed, Reason: "stale", By: "reconciler"}); err != nil {
		t.Fatalf("Flag: %v", err)
	}
	if got := find(); len(got) != len(want) {
		t.Fatalf("FindStranded = %v: it returned a claim finished a moment ago (%d) whose heartbeat is old", got, late.ID)
	}
}

func (s *suite) takeStrandedOnce(t *testing.T) {
	st, d := s.deferrer(t)
	c := s.strandedClaim(t, st, d, "billing", 61, func(c *claim.Claim) error {
		return st.MarkProcessed(ctxT(t), &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner})
	})
	take := func(seq int64, state claim.State) error {
		return d.TakeStranded(ctxT(t), &claim.TakeStrandedParams{ID: c.ID, Seq: seq, State: state, SilentFor: time.Minute})
	}
	wantErr(t, "TakeStranded of a fresh claim", take(61, claim.StateProcessed), claim.ErrStateChanged)
	s.backdate(t, st, c.ID, 10*time.Minute)
	wantErr(t, "TakeStranded naming another message", take(62, claim.StateProcessed), claim.ErrStateChanged)
	wantErr(t, "TakeStranded naming another state", take(61, claim.StateFailed), claim.ErrStateChanged)
	if err := take(61, claim.StateClaimed); err == nil || errors.Is(err, claim.ErrStateChanged) {
		t.Fatalf("TakeStranded of an unfinished state: %v, want a validation error", err)
	}
	const racers = 8
	var (
		wg           sync.WaitGroup
		mu           sync.Mutex
		wins, guards int
	)
	for range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := take(61, claim.StateProcessed)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
			case errors.Is(err, claim.ErrStateChanged):
				guards++
			default:
				t.Errorf("TakeStranded: %v", err)
			}
		}()
	}
	wg.Wait()
	if wins != 1 || guards != racers-1 {
		t.Fatalf("%d winners and %d refused by the guard, want 1 and %d", wins, guards, racers-1)
	}
	got := mustGet(t, st, c.ID)
	if got.State != claim.StateProcessed || got.Owner != c.Owner || got.DeferredSeq == nil || *got.DeferredSeq != 61 {
		t.Fatalf("after TakeStranded: state %s, owner %s (was %s), DeferredSeq %v; want only the heartbeat changed", got.State, got.Owner, c.Owner, got.DeferredSeq)
	}
	// The winner settles it; until it is silent nobody else finds it.
	if found, err := d.FindStranded(ctxT(t), &claim.FindDueParams{Consumer: "billing", Entity: c.Entity, SilentFor: time.Minute}); err != nil || len(found) != 0 {
		t.Fatalf("FindStranded while the winner settles = %d claims, %v; want none", len(found), err)
	}
	if err := d.ClearDeferred(ctxT(t), &claim.ClearDeferredParams{ID: c.ID, Seq: 61}); err != nil {
		t.Fatalf("ClearDeferred: %v", err)
	}
	s.backdate(t, st, c.ID, 10*time.Minute)
	if found, err := d.FindStranded(ctxT(t), &claim.FindDueParams{Consumer: "billing", Entity: c.Entity, SilentFor: time.Minute}); err != nil || len(found) != 0 {
		t.Fatalf("FindStranded once settled = %d claims, %v; want none", len(found), err)
	}
}

// clearEndsTheWait: a deferred claim whose message is settled by someone
// else (ClearDeferred) waits for nothing: the reconciler's recovery finds
// it at once instead of after its grace.
func (s *suite) clearEndsTheWait(t *testing.T) {
	st, d := s.deferrer(t)
	c := deferOne(t, st, d, "billing", 71, time.Hour, time.Hour)
	if err := d.ClearDeferred(ctxT(t), &claim.ClearDeferredParams{ID: c.ID, Seq: 71}); err != nil {
		t.Fatalf("ClearDeferred: %v", err)
	}
	got := mustGet(t, st, c.ID)
	if got.State != claim.StateReleased || got.DeferredSeq != nil || got.DueAt != nil || got.NextAttemptAt != nil {
		t.Fatalf("after ClearDeferred: state %s, DeferredSeq %v, DueAt %v, NextAttemptAt %v; want released, all cleared", got.State, got.DeferredSeq, got.DueAt, got.NextAttemptAt)
	}
	s.backdate(t, st, c.ID, 10*time.Minute)
	stale, err := st.FindStale(ctxT(t), &claim.FindStaleParams{StaleAfter: time.Minute})
	if err != nil {
		t.Fatalf("FindStale: %v", err)
	}
	found := false
	for _, sc := range stale {
		found = found || sc.ID == c.ID
	}
	if !found {
		t.Fatal("FindStale did not find a released claim whose message was settled")
	}
	// A claim that waits on its own schedule (a hand-off: released with
	// a next attempt, no due time) keeps it.
	h := mustWin(t, st, msg("", "billing", "body"))
	if err := d.Defer(ctxT(t), &claim.DeferParams{ID: h.ID, Owner: h.Owner, Seq: 72}); err != nil {
		t.Fatalf("Defer: %v", err)
	}
	s.backdate(t, st, h.ID, 10*time.Minute)
	taken, err := d.TakeDeferred(ctxT(t), &claim.TakeDeferredParams{ID: h.ID, PreviousOwner: h.Owner, Owner: uuid.New(), Seq: 72, SilentFor: time.Minute, By: "host-b"})
	if err != nil {
		t.Fatalf("TakeDeferred: %v", err)
	}
	if err := st.Release(ctxT(t), &claim.ReleaseParams{ID: h.ID, Owner: taken.Owner, Error: "handed off", NextAttemptIn: time.Hour}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := d.ClearDeferred(ctxT(t), &claim.ClearDeferredParams{ID: h.ID, Seq: 72}); err != nil {
		t.Fatalf("ClearDeferred: %v", err)
	}
	if got := mustGet(t, st, h.ID); got.DeferredSeq != nil || got.NextAttemptAt == nil {
		t.Fatalf("hand-off after ClearDeferred: DeferredSeq %v, NextAttemptAt %v; want none and its next attempt kept", got.DeferredSeq, got.NextAttemptAt)
	}
}
