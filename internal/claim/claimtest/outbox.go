package claimtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// The outbox's tests (claim.Outbox): follow-ups written with the outcome
// and in ClaimTx's transaction, leased, marked and purged with their claim.
func (s *suite) outboxTests() []struct {
	name string
	fn   func(t *testing.T)
} {
	return []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"OutboxFollowUpsAreWrittenWithTheOutcome", s.followUpsWithOutcome},
		{"OutboxBatchWritesFollowUpsOnlyWhereTheGuardHeld", s.followUpsInBatch},
		{"OutboxClaimTxWritesFollowUpsInItsTransaction", s.followUpsInClaimTx},
		{"OutboxLeaseIsGuarded", s.followUpLease},
		{"OutboxConcurrentLeasesTakeEachRowOnce", s.followUpLeaseRace},
		{"OutboxRetryBacksOff", s.followUpRetry},
		{"OutboxPurgeDeletesFollowUpsWithTheirClaim", s.followUpPurge},
		{"OutboxARedrivesResolutionWritesItsFollowUps", s.followUpsOfARedrive},
	}
}

func (s *suite) outbox(t *testing.T) (claim.Store, claim.Outbox) {
	t.Helper()
	if s.h.Features.BackdateFollowUpsSQL == "" {
		t.Fatal("Harness.Features.BackdateFollowUpsSQL is empty")
	}
	st := s.h.NewStore(t)
	ob, ok := st.(claim.Outbox)
	if !ok {
		t.Fatalf("%T is not a claim.Outbox", st)
	}
	return st, ob
}

func (s *suite) backdateFollowUps(t *testing.T, st claim.Store, id int64, by time.Duration) {
	t.Helper()
	if _, err := s.h.DB(t, st).ExecContext(ctxT(t), s.h.Features.BackdateFollowUpsSQL, int64(by/time.Second), id); err != nil {
		t.Fatalf("backdate the follow-ups of claim %d: %v", id, err)
	}
}

func sampleFollowUps(c *claim.Claim) []claim.FollowUp {
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	return claim.NumberFollowUps(c.Consumer, c.MessageID, []claim.FollowUp{
		{To: "receipts", Body: []byte(`{"charged":10}`), Subject: "payment.charged", ContentType: "application/json",
			CorrelationID: c.MessageID, SessionID: "customer-7", Properties: map[string]string{"ce_type": "payment.charged", "é": "ü"}, ScheduledAt: &at},
		{To: "audit"}, // an empty body
	})
}

func followUps(t *testing.T, ob claim.Outbox, id int64) []*claim.StoredFollowUp {
	t.Helper()
	fus, err := ob.FollowUps(ctxT(t), id)
	if err != nil {
		t.Fatalf("FollowUps(%d): %v", id, err)
	}
	return fus
}

func (s *suite) followUpsWithOutcome(t *testing.T) {
	st, ob := s.outbox(t)
	ctx := ctxT(t)
	c := mustWin(t, st, msg("", "payments", "charge 10"))
	want := sampleFollowUps(c)
	// Another owner's write is refused, and writes no follow-up.
	err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: uuid.New(), FollowUps: want})
	wantErr(t, "mark processed by another owner", err, claim.ErrStateChanged)
	if got := followUps(t, ob, c.ID); len(got) != 0 {
		t.Fatalf("a refused outcome write left %d follow-ups", len(got))
	}
	// Unnumbered follow-ups are refused before anything is written.
	bad := []claim.FollowUp{{To: "receipts"}}
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner, FollowUps: bad}); err == nil {
		t.Fatal("unnumbered follow-ups were accepted")
	}
	if got := mustGet(t, st, c.ID); got.State != claim.StateClaimed {
		t.Fatalf("a refused write changed the claim: %s", got.State)
	}
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner, FollowUps: want}); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, st, c.ID); got.State != claim.StateProcessed {
		t.Fatalf("claim %s, want processed", got.State)
	}
	got := followUps(t, ob, c.ID)
	if len(got) != 2 {
		t.Fatalf("%d follow-ups, want 2", len(got))
	}
	for i, f := range got {
		w := want[i]
		if w.Body == nil {
			w.Body = []byte{}
		}
		if f.ClaimID != c.ID || f.State != claim.FollowUpPending || f.Attempts != 0 || f.SentAt != nil || f.LeaseOwner != uuid.Nil || f.CreatedAt.IsZero() {
			t.Fatalf("follow-up %d: %+v", i+1, f)
		}
		f.FollowUp.Body = append([]byte{}, f.FollowUp.Body...)
		if !reflect.DeepEqual(f.FollowUp, w) {
			t.Fatalf("follow-up %d round trip:\n got %+v\nwant %+v", i+1, f.FollowUp, w)
		}
	}
	if got[0].MessageID != claim.FollowUpMessageID("payments", c.MessageID, 1) {
		t.Fatalf("message id %q", got[0].MessageID)
	}
	st1, err := ob.OutboxStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st1.Pending != 2 || st1.OldestPending == nil || st1.Now.Before(*st1.OldestPending) {
		t.Fatalf("outbox stats %+v", st1)
	}
	// A claim without follow-ups has none.
	if got := followUps(t, ob, c.ID+1000); len(got) != 0 {
		t.Fatalf("an unknown claim has %d follow-ups", len(got))
	}
}

func (s *suite) followUpsInBatch(t *testing.T) {
	st, ob := s.outbox(t)
	bw, ok := st.(claim.BatchWriter)
	if !ok {
		t.Skipf("%T writes no batches", st)
	}
	ctx := ctxT(t)
	a := mustWin(t, st, msg("", "payments", "a"))
	b := mustWin(t, st, msg("", "payments", "b"))
	errs, err := bw.WriteOutcomes(ctx, []claim.OutcomeWrite{
		{MarkProcessed: &claim.MarkProcessedParams{ID: a.ID, Owner: a.Owner, FollowUps: sampleFollowUps(a)}},
		{MarkProcessed: &claim.MarkProcessedParams{ID: b.ID, Owner: uuid.New(), FollowUps: sampleFollowUps(b)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil || !errors.Is(errs[1], claim.ErrStateChanged) {
		t.Fatalf("batch results %v", errs)
	}
	if n := len(followUps(t, ob, a.ID)); n != 2 {
		t.Fatalf("claim a: %d follow-ups, want 2", n)
	}
	if n := len(followUps(t, ob, b.ID)); n != 0 {
		t.Fatalf("claim b (guard failed): %d follow-ups, want 0", n)
	}
}

func (s *suite) followUpsInClaimTx(t *testing.T) {
	st, ob := s.outbox(t)
	ctx := ctxT(t)
	publish := func(ctx context.Context, n int) error {
		for i := range n {
			if err := claim.FollowUpSinkOf(ctx).Publish(claim.FollowUp{To: "ledger-events", Body: []byte(fmt.Sprint(i))}); err != nil {
				return err
			}
		}
		return nil
	}
	p := msg("", "ledger", "credit 10")
	res, err := st.ClaimTx(ctx, &claim.ClaimTxParams{Host: "h", Claim: p}, func(ctx context.Context, tx *sql.Tx) error { return publish(ctx, 3) })
	if err != nil || res.Outcome != claim.OutcomeWon {
		t.Fatalf("ClaimTx: %v %v", res.Outcome, err)
	}
	got := followUps(t, ob, res.Claim.ID)
	if len(got) != 3 {
		t.Fatalf("%d follow-ups, want 3", len(got))
	}
	for i, f := range got {
		if f.Position != i+1 || f.MessageID != claim.FollowUpMessageID("ledger", p.MessageID, i+1) || string(f.Body) != fmt.Sprint(i) {
			t.Fatalf("follow-up %d: %+v", i+1, f)
		}
	}
	// A rolled-back transaction leaves neither the claim nor a follow-up.
	q := msg("", "ledger", "fails")
	_, err = st.ClaimTx(ctx, &claim.ClaimTxParams{Claim: q}, func(ctx context.Context, tx *sql.Tx) error {
		if err := publish(ctx, 2); err != nil {
			return err
		}
		return errors.New("business rule")
	})
	if err == nil {
		t.Fatal("ClaimTx: want fn's error")
	}
	st1, err := ob.OutboxStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st1.Pending != 3 {
		t.Fatalf("%d follow-ups pending after a rollback, want the first claim's 3", st1.Pending)
	}
}

func (s *suite) processedWith(t *testing.T, st claim.Store, consumer string) *claim.Claim {
	t.Helper()
	c := mustWin(t, st, msg("", consumer, "x"))
	if err := st.MarkProcessed(ctxT(t), &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner, FollowUps: sampleFollowUps(c)}); err != nil {
		t.Fatal(err)
	}
	return c
}

func lease(t *testing.T, ob claim.Outbox, p claim.LeaseFollowUpsParams) []*claim.StoredFollowUp {
	t.Helper()
	got, err := ob.LeaseFollowUps(ctxT(t), &p)
	if err != nil {
		t.Fatalf("LeaseFollowUps: %v", err)
	}
	return got
}

func (s *suite) followUpLease(t *testing.T) {
	st, ob := s.outbox(t)
	ctx := ctxT(t)
	a := s.processedWith(t, st, "payments")
	b := s.processedWith(t, st, "payments")
	relay1, relay2 := uuid.New(), uuid.New()

	if _, err := ob.LeaseFollowUps(ctx, &claim.LeaseFollowUpsParams{For: time.Minute}); err == nil {
		t.Fatal("a lease without an owner was accepted")
	}
	// Of one claim only, bounded.
	got := lease(t, ob, claim.LeaseFollowUpsParams{Owner: relay1, For: time.Hour, ClaimID: b.ID, Limit: 1})
	if len(got) != 1 || got[0].ClaimID != b.ID || got[0].Position != 1 || got[0].LeaseOwner != relay1 || got[0].Attempts != 1 || got[0].LeaseUntil == nil {
		t.Fatalf("leased %+v", got)
	}
	// The rest, oldest first; a leased row is not leased again.
	got = lease(t, ob, claim.LeaseFollowUpsParams{Owner: relay1, For: time.Hour})
	if len(got) != 3 || got[0].ClaimID != a.ID || got[1].ClaimID != a.ID || got[2].ClaimID != b.ID || got[2].Position != 2 {
		t.Fatalf("leased %d: %v", len(got), got)
	}
	if got := lease(t, ob, claim.LeaseFollowUpsParams{Owner: relay2, For: time.Hour}); len(got) != 0 {
		t.Fatalf("leased rows were leased again: %d", len(got))
	}
	// Marked sent by its lease's owner only.
	fa1 := &claim.FollowUpLeaseParams{ClaimID: a.ID, Position: 1, Owner: relay2}
	wantErr(t, "mark sent by another relay", ob.MarkFollowUpSent(ctx, fa1), claim.ErrStateChanged)
	fa1.Owner = relay1
	if err := ob.MarkFollowUpSent(ctx, fa1); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "mark sent twice", ob.MarkFollowUpSent(ctx, fa1), claim.ErrStateChanged)
	wantErr(t, "mark an unknown follow-up", ob.MarkFollowUpSent(ctx, &claim.FollowUpLeaseParams{ClaimID: a.ID, Position: 9, Owner: relay1}), claim.ErrNotFound)
	if f := followUps(t, ob, a.ID)[0]; f.State != claim.FollowUpSent || f.SentAt == nil {
		t.Fatalf("marked follow-up: %+v", f)
	}
	// An expired lease (the relay died between its send and its mark) is
	// taken by another relay, which sends again with the same MessageId;
	// the first relay's mark is then refused.
	s.backdateFollowUps(t, st, a.ID, 2*time.Hour)
	got = lease(t, ob, claim.LeaseFollowUpsParams{Owner: relay2, For: time.Hour})
	if len(got) != 1 || got[0].ClaimID != a.ID || got[0].Position != 2 || got[0].Attempts != 2 || got[0].LeaseOwner != relay2 {
		t.Fatalf("re-leased %+v", got)
	}
	fa2 := &claim.FollowUpLeaseParams{ClaimID: a.ID, Position: 2, Owner: relay1}
	wantErr(t, "mark sent under a lost lease", ob.MarkFollowUpSent(ctx, fa2), claim.ErrStateChanged)
	fa2.Owner = relay2
	if err := ob.MarkFollowUpSent(ctx, fa2); err != nil {
		t.Fatal(err)
	}
	st1, err := ob.OutboxStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st1.Pending != 2 {
		t.Fatalf("%d pending, want claim b's 2", st1.Pending)
	}
}

func (s *suite) followUpLeaseRace(t *testing.T) {
	st, ob := s.outbox(t)
	const claims = 10
	for range claims {
		s.processedWith(t, st, "payments")
	}
	var (
		mu    sync.Mutex
		seen  = map[string]int{}
		wg    sync.WaitGroup
		errCh = make(chan error, 8)
	)
	for range 8 {
		wg.Go(func() {
			owner := uuid.New()
			for {
				got, err := ob.LeaseFollowUps(ctxT(t), &claim.LeaseFollowUpsParams{Owner: owner, For: time.Hour, Limit: 3})
				if err != nil {
					if claim.Transient(err) {
						continue
					}
					errCh <- err
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, f := range got {
					seen[f.MessageID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errCh)
	for err := range errCh {
		t.Fatal(err)
	}
	if len(seen) != 2*claims {
		t.Fatalf("%d follow-ups leased, want %d", len(seen), 2*claims)
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("follow-up %s leased %d times", id, n)
		}
	}
}

func (s *suite) followUpRetry(t *testing.T) {
	st, ob := s.outbox(t)
	ctx := ctxT(t)
	a := s.processedWith(t, st, "payments")
	relay := uuid.New()
	got := lease(t, ob, claim.LeaseFollowUpsParams{Owner: relay, For: time.Hour, ClaimID: a.ID, Limit: 1})
	if len(got) != 1 {
		t.Fatalf("leased %d", len(got))
	}
	p := &claim.RetryFollowUpParams{FollowUpLeaseParams: claim.FollowUpLeaseParams{ClaimID: a.ID, Position: 1, Owner: uuid.New()}, Error: "entity not found", RetryIn: time.Hour}
	wantErr(t, "retry by another relay", ob.RetryFollowUp(ctx, p), claim.ErrStateChanged)
	p.Owner = relay
	if err := ob.RetryFollowUp(ctx, p); err != nil {
		t.Fatal(err)
	}
	f := followUps(t, ob, a.ID)[0]
	if f.State != claim.FollowUpPending || f.LastError != "entity not found" || f.NextAttemptAt == nil || f.LeaseUntil != nil {
		t.Fatalf("retried follow-up: %+v", f)
	}
	// Not due for an hour: only position 2 is leased.
	got = lease(t, ob, claim.LeaseFollowUpsParams{Owner: relay, For: time.Hour})
	if len(got) != 1 || got[0].Position != 2 {
		t.Fatalf("leased %+v", got)
	}
	s.backdateFollowUps(t, st, a.ID, 2*time.Hour)
	got = lease(t, ob, claim.LeaseFollowUpsParams{Owner: relay, For: time.Hour, ClaimID: a.ID})
	if len(got) != 2 || got[0].Position != 1 || got[0].Attempts != 2 {
		t.Fatalf("leased after the backoff %+v", got)
	}
}

func (s *suite) followUpPurge(t *testing.T) {
	st, ob := s.outbox(t)
	ctx := ctxT(t)
	pending := s.processedWith(t, st, "payments")
	sent := s.processedWith(t, st, "payments")
	relay := uuid.New()
	for _, f := range lease(t, ob, claim.LeaseFollowUpsParams{Owner: relay, For: time.Hour, ClaimID: sent.ID}) {
		if err := ob.MarkFollowUpSent(ctx, &claim.FollowUpLeaseParams{ClaimID: f.ClaimID, Position: f.Position, Owner: relay}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []*claim.Claim{pending, sent} {
		s.backdate(t, st, c.ID, 10*time.Hour)
	}
	n, err := st.PurgeProcessed(ctx, &claim.PurgeParams{OlderThan: 5 * time.Hour, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("purged %d, want 1 (a claim with a pending follow-up stays)", n)
	}
	if _, err := st.Get(ctx, sent.ID); !errors.Is(err, claim.ErrNotFound) {
		t.Fatalf("the claim whose follow-ups were sent survived: %v", err)
	}
	if got := followUps(t, ob, sent.ID); len(got) != 0 {
		t.Fatalf("the purged claim's %d follow-ups survived", len(got))
	}
	mustGet(t, st, pending.ID)
	if got := followUps(t, ob, pending.ID); len(got) != 2 {
		t.Fatalf("the kept claim has %d follow-ups, want 2", len(got))
	}
}

func (s *suite) followUpsOfARedrive(t *testing.T) {
	st, ob := s.outbox(t)
	ctx := ctxT(t)
	f := s.flagged(t, st, msg("", "payments", "x"))
	taken, err := st.TakeOver(ctx, &claim.TakeOverParams{ID: f.ID, PreviousOwner: f.Owner, Owner: uuid.New(), Path: claim.PathOperator,
		By: "operator:ann", Reason: "redrive", Route: f.Route, Fingerprint: f.Fingerprint})
	if err != nil {
		t.Fatal(err)
	}
	fus := sampleFollowUps(taken)
	// Only a redrive's own resolution carries follow-ups.
	if _, err := st.Resolve(ctx, &claim.ResolveParams{ID: f.ID, Resolution: claim.ResolutionDone, By: "ann", FollowUps: fus}); err == nil {
		t.Fatal("an operator's resolution with follow-ups was accepted")
	}
	// Another owner's resolution is refused and writes none.
	_, err = st.Resolve(ctx, &claim.ResolveParams{ID: f.ID, Owner: uuid.New(), Resolution: claim.ResolutionRedriven, By: "ann", FollowUps: fus})
	wantErr(t, "resolve by another owner", err, claim.ErrStateChanged)
	if got := followUps(t, ob, f.ID); len(got) != 0 {
		t.Fatalf("a refused resolution left %d follow-ups", len(got))
	}
	c, err := st.Resolve(ctx, &claim.ResolveParams{ID: f.ID, Owner: taken.Owner, Resolution: claim.ResolutionRedriven, By: "ann", FollowUps: fus})
	if err != nil {
		t.Fatal(err)
	}
	if c.State != claim.StateResolved {
		t.Fatalf("resolved claim %+v", c)
	}
	if got := followUps(t, ob, f.ID); len(got) != 2 || got[0].MessageID != fus[0].MessageID {
		t.Fatalf("the redrive's follow-ups: %v", got)
	}
}
