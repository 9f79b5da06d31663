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

// purgeByCurrentState: a claim that failed long ago and was processed a
// moment ago (an operator's retry) is as old as its processing, not as
// its failure. Purging it at once would let the next copy of the message
// (a re-submitted dead letter, the redelivery after a lost completion)
// claim afresh and repeat the effect.
func (s *suite) purgeByCurrentState(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	c := mustWin(t, st, msg("", "billing", "b"))
	if err := st.Fail(ctx, &claim.FailParams{ID: c.ID, Owner: c.Owner, Reason: claim.FailRejected, Error: "HTTP 401"}); err != nil {
		t.Fatal(err)
	}
	s.backdate(t, st, c.ID, 10*time.Hour)
	retried, err := st.TakeOver(ctx, retryParams(mustGet(t, st, c.ID), "operator:ann"))
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: retried.ID, Owner: retried.Owner}); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, st, c.ID); got.FailedAt == nil || got.State != claim.StateProcessed {
		t.Fatalf("claim %+v: want processed with its old FailedAt kept", got)
	}
	n, err := st.PurgeProcessed(ctx, &claim.PurgeParams{OlderThan: 5 * time.Hour, Limit: 100})
	if err != nil || n != 0 {
		t.Fatalf("purge of a claim processed just now (failed 10h ago): deleted %d (%v), want 0", n, err)
	}
	mustGet(t, st, c.ID)
	s.backdate(t, st, c.ID, 10*time.Hour)
	if n, err := st.PurgeProcessed(ctx, &claim.PurgeParams{OlderThan: 5 * time.Hour, Limit: 100}); err != nil || n != 1 {
		t.Fatalf("purge once it was processed 10h ago: deleted %d (%v), want 1", n, err)
	}
}

// purgeKeepsDeferred: a finished claim that still names a deferred
// message (its holder died before settling it: the stranded sweep settles
// it) is not purged, however old: the purge would leave the message
// deferred for good (a failed claim's message would never reach the
// dead-letter queue). Once the message is settled (ClearDeferred) it is.
func (s *suite) purgeKeepsDeferred(t *testing.T) {
	st, d := s.deferrer(t)
	ctx := ctxT(t)
	var ids []int64
	for i, finish := range []func(c *claim.Claim) error{
		func(c *claim.Claim) error {
			return st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner})
		},
		func(c *claim.Claim) error {
			return st.Fail(ctx, &claim.FailParams{ID: c.ID, Owner: c.Owner, Reason: claim.FailRejected, Error: "declined"})
		},
	} {
		c := s.strandedClaim(t, st, d, "billing", int64(61+i), finish)
		s.backdate(t, st, c.ID, 10*time.Hour)
		ids = append(ids, c.ID)
	}
	n, err := st.PurgeProcessed(ctx, &claim.PurgeParams{OlderThan: 5 * time.Hour, Limit: 100})
	if err != nil || n != 0 {
		t.Fatalf("purge of finished claims that name a deferred message: deleted %d (%v), want 0", n, err)
	}
	for i, id := range ids {
		if err := d.ClearDeferred(ctx, &claim.ClearDeferredParams{ID: id, Seq: int64(61 + i)}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := st.PurgeProcessed(ctx, &claim.PurgeParams{OlderThan: 5 * time.Hour, Limit: 100}); err != nil || n != 2 {
		t.Fatalf("purge once their messages were settled: deleted %d (%v), want 2", n, err)
	}
}
