package claimtest

import (
	"testing"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

func (s *suite) lifecycle(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	c := mustWin(t, st, msg("", "billing", "b"))
	own := c.Owner

	if err := st.RecordAttempt(ctx, &claim.RecordAttemptParams{ID: c.ID, Owner: own, Error: "timeout"}); err != nil {
		t.Fatal(err)
	}
	if err := st.Heartbeat(ctx, &claim.HeartbeatParams{ID: c.ID, Owner: own}); err != nil {
		t.Fatal(err)
	}
	got := mustGet(t, st, c.ID)
	if got.Attempts != 1 || got.LastError != "timeout" || got.HeartbeatAt.Before(c.HeartbeatAt) {
		t.Fatalf("after attempt and heartbeat: %+v", got)
	}

	if err := st.Release(ctx, &claim.ReleaseParams{ID: c.ID, Owner: own, Error: "503 not performed"}); err != nil {
		t.Fatal(err)
	}
	got = mustGet(t, st, c.ID)
	if got.State != claim.StateReleased || got.ReleasedAt == nil || got.LastError != "503 not performed" ||
		got.HeartbeatAt.Before(*got.ReleasedAt) || got.Payload == nil {
		t.Fatalf("released: %+v", got)
	}

	taken, err := st.TakeOver(ctx, redelivery(got, "host-b", 2))
	if err != nil {
		t.Fatal(err)
	}
	if taken.State != claim.StateClaimed || taken.Owner == own || taken.Owner == uuid.Nil ||
		taken.ClaimedBy != "host-b" || taken.DeliveryCount != 2 || taken.HeartbeatAt.Before(got.HeartbeatAt) {
		t.Fatalf("taken over: %+v", taken)
	}
	// The old owner lost it.
	err = st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: own})
	wantErr(t, "MarkProcessed by the previous owner", err, claim.ErrStateChanged)

	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: taken.Owner}); err != nil {
		t.Fatal(err)
	}
	got = mustGet(t, st, c.ID)
	if got.State != claim.StateProcessed || got.ProcessedAt == nil || got.Payload != nil {
		t.Fatalf("processed: %+v", got)
	}
}

func (s *suite) guardedOps(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	c := mustWin(t, st, msg("", "billing", "b"))
	wrong := uuid.New()
	ops := func(id int64, owner uuid.UUID) map[string]error {
		return map[string]error{
			"Heartbeat":     st.Heartbeat(ctx, &claim.HeartbeatParams{ID: id, Owner: owner}),
			"RecordAttempt": st.RecordAttempt(ctx, &claim.RecordAttemptParams{ID: id, Owner: owner, Error: "e"}),
			"Release":       st.Release(ctx, &claim.ReleaseParams{ID: id, Owner: owner, Error: "e"}),
			"MarkProcessed": st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: id, Owner: owner}),
		}
	}
	for op, err := range ops(c.ID, wrong) {
		wantErr(t, op+" with the wrong owner", err, claim.ErrStateChanged)
	}
	for op, err := range ops(c.ID+1000, c.Owner) {
		wantErr(t, op+" on a missing claim", err, claim.ErrStateChanged)
	}
	if got := mustGet(t, st, c.ID); got.State != claim.StateClaimed || got.Attempts != 0 || got.LastError != "" {
		t.Fatalf("refused ops changed the claim: %+v", got)
	}
	_, err := st.TakeOver(ctx, redelivery(c, "x", 0))
	wantErr(t, "TakeOver of a claimed claim with a fresh heartbeat", err, claim.ErrStateChanged)
	_, err = st.Resolve(ctx, &claim.ResolveParams{ID: c.ID, Resolution: claim.ResolutionDone, By: "op"})
	wantErr(t, "Resolve of a claimed claim", err, claim.ErrStateChanged)

	// Wrong state: a released claim refuses the owner's claimed-only ops.
	if err := st.Release(ctx, &claim.ReleaseParams{ID: c.ID, Owner: c.Owner}); err != nil {
		t.Fatal(err)
	}
	for op, err := range ops(c.ID, c.Owner) {
		wantErr(t, op+" on a released claim", err, claim.ErrStateChanged)
	}
	// And a processed one too.
	p := mustWin(t, st, msg("", "billing", "b"))
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: p.ID, Owner: p.Owner}); err != nil {
		t.Fatal(err)
	}
	for op, err := range ops(p.ID, p.Owner) {
		wantErr(t, op+" on a processed claim", err, claim.ErrStateChanged)
	}
	_, err = st.TakeOver(ctx, redelivery(p, "x", 0))
	wantErr(t, "TakeOver of a processed claim", err, claim.ErrStateChanged)
}
