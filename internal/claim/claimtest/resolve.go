package claimtest

import (
	"testing"

	"github.com/sbclaim/sbclaim/internal/claim"
)

func (s *suite) resolve(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	done := s.flagged(t, st, msg("", "billing", "b"))
	if _, err := st.Resolve(ctx, &claim.ResolveParams{ID: done.ID, Resolution: "bogus", By: "op"}); err == nil {
		t.Fatal("Resolve with an unknown resolution succeeded")
	}
	r, err := st.Resolve(ctx, &claim.ResolveParams{ID: done.ID, Resolution: claim.ResolutionDone, By: "alice", Note: "checked the ledger"})
	if err != nil {
		t.Fatal(err)
	}
	if r.State != claim.StateResolved || r.Resolution != claim.ResolutionDone || r.ResolvedBy != "alice" ||
		r.ResolutionNote != "checked the ledger" || r.ResolvedAt == nil || r.ProcessedAt != nil || r.FlaggedAt == nil {
		t.Fatalf("resolved done: %+v", r)
	}
	if got := mustGet(t, st, done.ID); got.State != claim.StateResolved || got.ResolvedBy != "alice" {
		t.Fatalf("resolution not stored: %+v", got)
	}
	_, err = st.Resolve(ctx, &claim.ResolveParams{ID: done.ID, Resolution: claim.ResolutionDiscarded, By: "bob"})
	wantErr(t, "second Resolve", err, claim.ErrStateChanged)
	_, err = st.Resolve(ctx, &claim.ResolveParams{ID: done.ID + 1000, Resolution: claim.ResolutionDone, By: "bob"})
	wantErr(t, "Resolve of a missing claim", err, claim.ErrNotFound)

	redriven := s.flagged(t, st, msg("", "billing", "b"))
	if redriven.Payload == nil {
		t.Fatal("flagged claim lost its payload (needed for redrive)")
	}
	r, err = st.Resolve(ctx, &claim.ResolveParams{ID: redriven.ID, Resolution: claim.ResolutionRedriven, By: "carol"})
	if err != nil {
		t.Fatal(err)
	}
	if r.State != claim.StateResolved || r.Resolution != claim.ResolutionRedriven || r.ProcessedAt == nil || r.Payload != nil || r.ResolvedAt == nil {
		t.Fatalf("resolved redriven: %+v", r)
	}
}
