package claimtest

import (
	"fmt"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
)

func (s *suite) list(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	var billing []*claim.Claim
	for range 5 {
		billing = append(billing, mustWin(t, st, msg("", "billing", "b")))
	}
	shipping := mustWin(t, st, msg("", "shipping", "b"))
	if err := st.Release(ctx, &claim.ReleaseParams{ID: billing[1].ID, Owner: billing[1].Owner}); err != nil {
		t.Fatal(err)
	}
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: billing[2].ID, Owner: billing[2].Owner}); err != nil {
		t.Fatal(err)
	}
	s.backdate(t, st, billing[3].ID, 2*time.Hour)
	s.backdate(t, st, shipping.ID, 2*time.Hour)

	check := func(name string, p *claim.ListParams, want ...int64) {
		t.Helper()
		got, err := st.List(ctx, p)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if fmt.Sprint(ids(got)) != fmt.Sprint(want) {
			t.Fatalf("%s: got %v, want %v", name, ids(got), want)
		}
	}
	b := func(i int) int64 { return billing[i].ID }
	check("all", &claim.ListParams{}, b(0), b(1), b(2), b(3), b(4), shipping.ID)
	check("consumer", &claim.ListParams{Consumer: "shipping"}, shipping.ID)
	check("states", &claim.ListParams{States: []claim.State{claim.StateReleased, claim.StateProcessed}}, b(1), b(2))
	check("state and consumer", &claim.ListParams{States: []claim.State{claim.StateClaimed}, Consumer: "billing"}, b(0), b(3), b(4))
	check("older than", &claim.ListParams{OlderThan: time.Hour}, b(3), shipping.ID)
	check("older than and consumer", &claim.ListParams{OlderThan: time.Hour, Consumer: "billing"}, b(3))
	check("page 1", &claim.ListParams{Limit: 2}, b(0), b(1))
	check("page 2", &claim.ListParams{Limit: 2, AfterID: b(1)}, b(2), b(3))
	check("page 3", &claim.ListParams{Limit: 2, AfterID: b(3)}, b(4), shipping.ID)
	check("page 4", &claim.ListParams{Limit: 2, AfterID: shipping.ID})
	if _, err := st.List(ctx, &claim.ListParams{States: []claim.State{"bogus"}}); err == nil {
		t.Fatal("List with an unknown state succeeded")
	}
}

func (s *suite) stats(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	empty, err := st.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if empty.Claimed != 0 || empty.Released != 0 || empty.Flagged != 0 || empty.OldestUnfinished != nil || empty.Now.IsZero() {
		t.Fatalf("stats of an empty table: %+v", empty)
	}
	s.flagged(t, st, msg("", "billing", "b"))
	oldest := mustWin(t, st, msg("", "billing", "b"))
	s.backdate(t, st, oldest.ID, 10*time.Minute) // not stale for s.flagged's 30m
	mustWin(t, st, msg("", "billing", "b"))
	r := mustWin(t, st, msg("", "billing", "b"))
	if err := st.Release(ctx, &claim.ReleaseParams{ID: r.ID, Owner: r.Owner}); err != nil {
		t.Fatal(err)
	}
	p := mustWin(t, st, msg("", "billing", "b"))
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: p.ID, Owner: p.Owner}); err != nil {
		t.Fatal(err)
	}
	got, err := st.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := mustGet(t, st, oldest.ID).ClaimedAt
	if got.Claimed != 2 || got.Released != 1 || got.Flagged != 1 || got.OldestUnfinished == nil || !got.OldestUnfinished.Equal(want) {
		t.Fatalf("stats %+v (oldest %v), want 2 claimed, 1 released, 1 flagged, oldest %v", got, got.OldestUnfinished, want)
	}
}

func (s *suite) dbClock(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	before, err := st.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := mustWin(t, st, msg("", "billing", "b"))
	after, err := st.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name, tm := range map[string]time.Time{"Now": before, "ClaimedAt": c.ClaimedAt} {
		if tm.Location() != time.UTC {
			t.Errorf("%s is in %v, want UTC", name, tm.Location())
		}
	}
	if c.ClaimedAt.Before(before) || c.ClaimedAt.After(after) {
		t.Fatalf("ClaimedAt %v is not between the database clock readings %v and %v", c.ClaimedAt, before, after)
	}
	// The returned times are the stored ones, not values computed in Go.
	got := mustGet(t, st, c.ID)
	if !got.ClaimedAt.Equal(c.ClaimedAt) || !got.HeartbeatAt.Equal(c.HeartbeatAt) {
		t.Fatalf("stored times %v/%v differ from returned %v/%v", got.ClaimedAt, got.HeartbeatAt, c.ClaimedAt, c.HeartbeatAt)
	}
	// Backdating the row in the database moves what the store reports, and
	// staleness is judged against the database's clock.
	s.backdate(t, st, c.ID, 3*time.Hour)
	got = mustGet(t, st, c.ID)
	if d := c.ClaimedAt.Sub(got.ClaimedAt); d != 3*time.Hour {
		t.Fatalf("backdated ClaimedAt moved by %v, want 3h", d)
	}
	st2, err := st.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st2.Now.Before(after) {
		t.Fatalf("Stats.Now %v is before Now %v", st2.Now, after)
	}
}
