package claimtest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
)

func (s *suite) purge(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	// Flagged and resolved claims first: FlagStale flags every stale claim.
	flagged := s.flagged(t, st, msg("", "billing", "b"))
	resolved := s.flagged(t, st, msg("", "billing", "b"))
	if _, err := st.Resolve(ctx, &claim.ResolveParams{ID: resolved.ID, Resolution: claim.ResolutionDiscarded, By: "op"}); err != nil {
		t.Fatal(err)
	}
	oldProcessed := make([]*claim.Claim, 2)
	for i := range oldProcessed {
		c := mustWin(t, st, msg("", "billing", "b"))
		if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner}); err != nil {
			t.Fatal(err)
		}
		oldProcessed[i] = c
	}
	recent := mustWin(t, st, msg("", "billing", "b"))
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: recent.ID, Owner: recent.Owner}); err != nil {
		t.Fatal(err)
	}
	claimed := mustWin(t, st, msg("", "billing", "b"))
	released := mustWin(t, st, msg("", "billing", "b"))
	if err := st.Release(ctx, &claim.ReleaseParams{ID: released.ID, Owner: released.Owner}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*claim.Claim{flagged, resolved, oldProcessed[0], oldProcessed[1], claimed, released} {
		s.backdate(t, st, c.ID, 10*time.Hour)
	}

	var got []int64
	for range 5 {
		n, err := st.PurgeProcessed(ctx, &claim.PurgeParams{OlderThan: 5 * time.Hour, Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, n)
	}
	if fmt.Sprint(got) != "[1 1 1 0 0]" {
		t.Fatalf("purge batches deleted %v, want [1 1 1 0 0]", got)
	}
	for _, c := range []*claim.Claim{resolved, oldProcessed[0], oldProcessed[1]} {
		if _, err := st.Get(ctx, c.ID); !errors.Is(err, claim.ErrNotFound) {
			t.Fatalf("finished claim %d survived the purge: %v", c.ID, err)
		}
	}
	for _, c := range []*claim.Claim{flagged, recent, claimed, released} {
		mustGet(t, st, c.ID)
	}
	s.backdate(t, st, recent.ID, time.Hour)
	n, err := st.PurgeProcessed(ctx, &claim.PurgeParams{OlderThan: 30 * time.Minute, Limit: 100})
	if err != nil || n != 1 {
		t.Fatalf("purge after the recent claim aged: %d %v, want 1", n, err)
	}
}
