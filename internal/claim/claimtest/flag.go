package claimtest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
)

func (s *suite) flagSkipsFresh(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	fresh := mustWin(t, st, msg("", "billing", "b"))
	heartbeated := mustWin(t, st, msg("", "billing", "b"))
	stale := mustWin(t, st, msg("", "billing", "b"))
	processed := mustWin(t, st, msg("", "billing", "b"))
	for _, c := range []*claim.Claim{heartbeated, stale, processed} {
		s.backdate(t, st, c.ID, time.Hour)
	}
	if err := st.Heartbeat(ctx, &claim.HeartbeatParams{ID: heartbeated.ID, Owner: heartbeated.Owner}); err != nil {
		t.Fatal(err)
	}
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: processed.ID, Owner: processed.Owner}); err != nil {
		t.Fatal(err)
	}
	s.backdate(t, st, processed.ID, time.Hour)

	flagged, err := st.FlagStale(ctx, &claim.FlagStaleParams{StaleAfter: 10 * time.Minute, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(flagged) != 1 || flagged[0].ID != stale.ID {
		t.Fatalf("flagged %v, want only claim %d", ids(flagged), stale.ID)
	}
	f := flagged[0]
	if f.State != claim.StateFlagged || f.FlaggedAt == nil || !strings.HasPrefix(f.FlagReason, "no heartbeat since ") {
		t.Fatalf("flagged claim: state %s, at %v, reason %q", f.State, f.FlaggedAt, f.FlagReason)
	}
	for _, c := range []*claim.Claim{fresh, heartbeated} {
		if got := mustGet(t, st, c.ID); got.State != claim.StateClaimed || got.FlaggedAt != nil {
			t.Fatalf("claim %d with a fresh heartbeat was touched: %+v", c.ID, got)
		}
	}
	// A flagged claim is no longer the owner's.
	err = st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: stale.ID, Owner: stale.Owner})
	wantErr(t, "MarkProcessed of a flagged claim", err, claim.ErrStateChanged)
	// Flagging again finds nothing.
	if again, err := st.FlagStale(ctx, &claim.FlagStaleParams{StaleAfter: 10 * time.Minute}); err != nil || len(again) != 0 {
		t.Fatalf("second FlagStale: %v %v", ids(again), err)
	}
	if _, err := st.FlagStale(ctx, &claim.FlagStaleParams{}); err == nil {
		t.Fatal("FlagStale with StaleAfter 0 succeeded")
	}
}

func ids(cs []*claim.Claim) []int64 {
	out := make([]int64, len(cs))
	for i, c := range cs {
		out[i] = c.ID
	}
	return out
}

func (s *suite) flagReleased(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	c := mustWin(t, st, msg("", "billing", "b"))
	s.backdate(t, st, c.ID, time.Hour)
	if err := st.Release(ctx, &claim.ReleaseParams{ID: c.ID, Owner: c.Owner, Error: "e"}); err != nil {
		t.Fatal(err)
	}
	// Released just now: not stale even though claimed (and last
	// heartbeated) an hour ago, because release is a sign of life.
	flagged, err := st.FlagStale(ctx, &claim.FlagStaleParams{StaleAfter: time.Minute, Limit: 10})
	if err != nil || len(flagged) != 0 {
		t.Fatalf("fresh release flagged: %v %v", ids(flagged), err)
	}
	s.backdate(t, st, c.ID, time.Hour)
	flagged, err = st.FlagStale(ctx, &claim.FlagStaleParams{StaleAfter: time.Minute, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(flagged) != 1 || flagged[0].ID != c.ID || !strings.HasPrefix(flagged[0].FlagReason, "released and not taken over since ") {
		t.Fatalf("flagged %+v, want claim %d with the released reason", flagged, c.ID)
	}
	_, err = st.TakeOver(ctx, redelivery(flagged[0], "x", 0))
	wantErr(t, "TakeOver of a flagged claim", err, claim.ErrStateChanged)
}

func (s *suite) flagBounded(t *testing.T) {
	st := s.h.NewStore(t)
	for range 5 {
		c := mustWin(t, st, msg("", "billing", "b"))
		s.backdate(t, st, c.ID, time.Hour)
	}
	var got []int
	for range 4 {
		flagged, err := st.FlagStale(ctxT(t), &claim.FlagStaleParams{StaleAfter: time.Minute, Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, len(flagged))
	}
	if fmt.Sprint(got) != "[2 2 1 0]" {
		t.Fatalf("batches flagged %v, want [2 2 1 0]", got)
	}
}

func (s *suite) flagVersusProcess(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	const rounds = 25
	for i := range rounds {
		c := mustWin(t, st, msg("", "billing", "b"))
		s.backdate(t, st, c.ID, time.Hour)
		warm(t, s.h.DB(t, st), 2)
		var (
			wg      sync.WaitGroup
			ready   sync.WaitGroup
			start   = make(chan struct{})
			flagged []*claim.Claim
			flagErr error
			markErr error
		)
		ready.Add(2)
		wg.Go(func() {
			ready.Done()
			<-start
			flagged, flagErr = st.FlagStale(ctx, &claim.FlagStaleParams{StaleAfter: time.Minute, Limit: 10})
		})
		wg.Go(func() {
			ready.Done()
			<-start
			markErr = st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner})
		})
		ready.Wait() // both parked on the barrier, on a warm pool
		close(start)
		wg.Wait()
		if flagErr != nil {
			t.Fatalf("round %d: FlagStale: %v", i, flagErr)
		}
		if markErr != nil && !errors.Is(markErr, claim.ErrStateChanged) {
			t.Fatalf("round %d: MarkProcessed: %v", i, markErr)
		}
		wasFlagged := len(flagged) == 1 && flagged[0].ID == c.ID
		if len(flagged) > 1 || (len(flagged) == 1 && !wasFlagged) {
			t.Fatalf("round %d: flagged %v, want at most claim %d", i, ids(flagged), c.ID)
		}
		processed := markErr == nil
		if wasFlagged == processed {
			t.Fatalf("round %d: flagged %v and processed %v; want exactly one", i, wasFlagged, processed)
		}
		got := mustGet(t, st, c.ID)
		if (processed && (got.State != claim.StateProcessed || got.FlaggedAt != nil)) ||
			(wasFlagged && (got.State != claim.StateFlagged || got.ProcessedAt != nil)) {
			t.Fatalf("round %d: final row %+v", i, got)
		}
	}
}

// flagged returns a claim in state flagged.
func (s *suite) flagged(t *testing.T, st claim.Store, p claim.ClaimParams) *claim.Claim {
	t.Helper()
	c := mustWin(t, st, p)
	s.backdate(t, st, c.ID, time.Hour)
	flagged, err := st.FlagStale(ctxT(t), &claim.FlagStaleParams{StaleAfter: 30 * time.Minute, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range flagged {
		if f.ID == c.ID {
			return f
		}
	}
	t.Fatalf("claim %d was not flagged (flagged %v)", c.ID, ids(flagged))
	return nil
}
