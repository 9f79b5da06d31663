package claimtest

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// This file forces, on a real store, the error classes of the contract in
// package claim that a test can force: a deadlock (the call's own
// failure), a read-only database and a missing grant (store-wide
// refusals). Each checks the class, the sentinel and the scope the store
// reports, and that nothing was written.

// wantClass fails unless err is of class want, with the sentinel and
// scope the contract gives it.
func wantClass(t *testing.T, what string, err error, want claim.Class) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s: no error, want class %s", what, want)
	case claim.ClassOf(err) != want:
		t.Errorf("%s: class %s, want %s (%v)", what, claim.ClassOf(err), want, err)
	case !errors.Is(err, want.Sentinel()) || claim.StoreWide(err) != want.StoreWide() || claim.Transient(err) != want.Transient():
		t.Errorf("%s: %v: Is(%v) %v, StoreWide %v, Transient %v", what, err, want.Sentinel(), errors.Is(err, want.Sentinel()), claim.StoreWide(err), claim.Transient(err))
	}
	for _, s := range []error{claim.ErrUnavailable, claim.ErrAborted, claim.ErrRefused, claim.ErrStateChanged, claim.ErrDuplicate} {
		if err != nil && s != want.Sentinel() && errors.Is(err, s) {
			t.Errorf("%s: %v also wraps %v", what, err, s)
		}
	}
}

// sessionID returns the database session id of tx.
func (s *suite) sessionID(t *testing.T, ctx context.Context, tx *sql.Tx) int64 {
	t.Helper()
	var id int64
	if err := tx.QueryRowContext(ctx, s.h.Features.SessionIDSQL).Scan(&id); err != nil {
		t.Fatalf("session id: %v", err)
	}
	return id
}

// waitBlockedBy returns once the database reports a session waiting for a
// lock held by session holder: the call under test is parked on that lock.
// It fails if returned says the call finished first. This is the
// database's own lock table, polled: no duration is guessed.
func (s *suite) waitBlockedBy(t *testing.T, ctx context.Context, db *sql.DB, holder int64, returned <-chan struct{}) {
	t.Helper()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		var n int64
		if err := db.QueryRowContext(ctx, s.h.Features.WaitingForSQL, holder).Scan(&n); err != nil {
			t.Fatalf("sessions waiting for session %d: %v", holder, err)
		}
		if n > 0 {
			return
		}
		select {
		case <-returned:
			t.Fatalf("the call returned while it should be waiting for session %d's lock", holder)
		case <-ctx.Done():
			t.Fatalf("no session started waiting for session %d: %v", holder, ctx.Err())
		case <-tick.C:
		}
	}
}

// deadlock forms a deadlock between a raw transaction and the store's
// PurgeProcessed, and checks that the store reports the call's own,
// transient failure (ErrAborted, class deadlock), wrote nothing, and that
// the same call succeeds when retried.
//
// No store method can deadlock with another store method on demand (each
// is one statement, and the multi-row ones take rows in an order the plan
// decides), so one side is raw SQL and the other is the store: the
// transaction locks claim B, PurgeProcessed deletes claim A (the older,
// so first) and waits for B, the transaction then asks for A, and the
// database must break the cycle. SQL Server is told to spare the raw
// transaction (SurviveDeadlockSQL). PostgreSQL aborts the session whose
// deadlock_timeout expires first while the cycle exists, the one that
// began waiting first: the store's; should the raw transaction be chosen
// all the same (its check ran first on a loaded machine), the round is
// run again, at most five times.
func (s *suite) deadlock(t *testing.T) {
	f := s.h.Features
	if f.SessionIDSQL == "" || f.WaitingForSQL == "" || f.LockClaimSQL == "" {
		t.Skip("this database serialises writers: two transactions never wait for each other, so no deadlock can form")
	}
	st := s.h.NewStore(t)
	db := s.h.DB(t, st)
	ctx := ctxT(t)
	processed := func() *claim.Claim {
		c := mustWin(t, st, msg("", "billing", "b"))
		if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner}); err != nil {
			t.Fatal(err)
		}
		return c
	}
	for round := 1; ; round++ {
		if round > 5 {
			t.Fatal("in 5 rounds the store's call was never the deadlock's victim")
		}
		a, b := processed(), processed()
		s.backdate(t, st, a.ID, 3*time.Hour)
		s.backdate(t, st, b.ID, 2*time.Hour)
		warm(t, db, 2)

		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if f.SurviveDeadlockSQL != "" {
			if _, err := tx.ExecContext(ctx, f.SurviveDeadlockSQL); err != nil {
				t.Fatal(err)
			}
		}
		holder := s.sessionID(t, ctx, tx)
		if _, err := tx.ExecContext(ctx, f.LockClaimSQL, b.ID); err != nil {
			t.Fatalf("lock claim %d: %v", b.ID, err)
		}
		type result struct {
			n   int64
			err error
		}
		done := make(chan result, 1)
		returned := make(chan struct{})
		go func() {
			n, err := st.PurgeProcessed(ctx, &claim.PurgeParams{OlderThan: time.Hour, Limit: 10})
			done <- result{n, err}
			close(returned)
		}()
		s.waitBlockedBy(t, ctx, db, holder, returned) // the store holds A, waits for B
		_, rawErr := tx.ExecContext(ctx, f.LockClaimSQL, a.ID)
		_ = tx.Rollback()
		r := <-done
		switch {
		case r.err != nil:
			wantClass(t, "PurgeProcessed, the deadlock victim", r.err, claim.ClassDeadlock)
			if rawErr != nil {
				t.Fatalf("both sides failed: store %v, raw %v", r.err, rawErr)
			}
			// Nothing was written: both claims are still there.
			mustGet(t, st, a.ID)
			mustGet(t, st, b.ID)
			// The same call, retried, succeeds.
			n, err := st.PurgeProcessed(ctx, &claim.PurgeParams{OlderThan: time.Hour, Limit: 10})
			if err != nil || n != 2 {
				t.Fatalf("PurgeProcessed retried after the deadlock: %d %v, want 2 deleted", n, err)
			}
			return
		case rawErr != nil:
			t.Logf("round %d: the database chose the raw transaction as the victim (%v); again", round, rawErr)
			if r.n != 2 {
				t.Fatalf("round %d: PurgeProcessed deleted %d claims after the raw transaction's abort, want 2", round, r.n)
			}
		case r.n == 2:
			// The store's call reached B before it locked A (the order in
			// which its plan visits the two rows is the database's choice,
			// not the test's): it waited on B,
			// holding nothing the raw transaction needed. No deadlock this
			// round; again.
			t.Logf("round %d: PurgeProcessed waited on B before locking A: no deadlock; again", round)
		default:
			t.Fatalf("round %d: no deadlock, yet PurgeProcessed deleted %d claims, want 2", round, r.n)
		}
	}
}

// refusal checks that every write of st fails with class want while reads
// and Ping work, and that nothing changed. prepare builds the claims with
// a writable store, then returns the refusing one.
func (s *suite) refusal(t *testing.T, want claim.Class, prepare func(t *testing.T, st claim.Store) claim.Store) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	flagged := s.flagged(t, st, msg("", "billing", "b"))
	claimed := mustWin(t, st, msg("", "billing", "b"))
	released := mustWin(t, st, msg("", "billing", "b"))
	if err := st.Release(ctx, &claim.ReleaseParams{ID: released.ID, Owner: released.Owner, Error: "e"}); err != nil {
		t.Fatal(err)
	}
	processed := mustWin(t, st, msg("", "billing", "b"))
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: processed.ID, Owner: processed.Owner}); err != nil {
		t.Fatal(err)
	}
	s.backdate(t, st, processed.ID, 10*time.Hour)
	stale := mustWin(t, st, msg("", "billing", "b"))
	s.backdate(t, st, stale.ID, 2*time.Hour)
	// The write probe on a writable store: a guarded update of no claim.
	missing := claimed.ID + 1_000_000
	wantErr(t, "Heartbeat of a missing claim on a writable store", st.Heartbeat(ctx, &claim.HeartbeatParams{ID: missing, Owner: claimed.Owner}), claim.ErrStateChanged)

	ro := prepare(t, st)
	if err := ro.Ping(ctx); err != nil {
		t.Fatalf("Ping on a store that refuses writes: %v (reads still work)", err)
	}
	_, err := ro.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "h", Claims: []claim.ClaimParams{msg("", "billing", "b")}})
	wantClass(t, "ClaimBatch", err, want)
	called := false
	_, err = ro.ClaimTx(ctx, &claim.ClaimTxParams{Host: "h", Claim: msg("", "ledger", "b")}, func(context.Context, *sql.Tx) error { called = true; return nil })
	wantClass(t, "ClaimTx", err, want)
	if called {
		t.Error("ClaimTx called fn on a store that refuses writes")
	}
	_, err = ro.TakeOver(ctx, redelivery(released, "h", 2))
	wantClass(t, "TakeOver", err, want)
	wantClass(t, "Heartbeat", ro.Heartbeat(ctx, &claim.HeartbeatParams{ID: claimed.ID, Owner: claimed.Owner}), want)
	wantClass(t, "Heartbeat of a missing claim (the write probe)", ro.Heartbeat(ctx, &claim.HeartbeatParams{ID: missing, Owner: claimed.Owner}), want)
	wantClass(t, "RecordAttempt", ro.RecordAttempt(ctx, &claim.RecordAttemptParams{ID: claimed.ID, Owner: claimed.Owner, Error: "e"}), want)
	wantClass(t, "Release", ro.Release(ctx, &claim.ReleaseParams{ID: claimed.ID, Owner: claimed.Owner, Error: "e"}), want)
	wantClass(t, "MarkProcessed", ro.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: claimed.ID, Owner: claimed.Owner}), want)
	// A batch of outcome writes fails as a whole: the batch error has the
	// class, and nothing is written (checked with the claims below).
	errs, err := batchWriter(t, ro).WriteOutcomes(ctx, []claim.OutcomeWrite{
		{Heartbeat: &claim.HeartbeatParams{ID: claimed.ID, Owner: claimed.Owner}},
		{MarkProcessed: &claim.MarkProcessedParams{ID: stale.ID, Owner: stale.Owner}},
	})
	wantClass(t, "WriteOutcomes", err, want)
	if errs != nil {
		t.Errorf("WriteOutcomes that failed as a whole returned per-write results %v", errs)
	}
	_, err = ro.FlagStale(ctx, &claim.FlagStaleParams{StaleAfter: time.Hour, Limit: 10})
	wantClass(t, "FlagStale", err, want)
	_, err = ro.Resolve(ctx, &claim.ResolveParams{ID: flagged.ID, Resolution: claim.ResolutionDone, By: "op"})
	wantClass(t, "Resolve", err, want)
	_, err = ro.PurgeProcessed(ctx, &claim.PurgeParams{OlderThan: time.Hour, Limit: 10})
	wantClass(t, "PurgeProcessed", err, want)

	// Reads work, and nothing was written.
	for _, c := range []struct {
		c     *claim.Claim
		state claim.State
	}{{claimed, claim.StateClaimed}, {released, claim.StateReleased}, {stale, claim.StateClaimed}, {flagged, claim.StateFlagged}, {processed, claim.StateProcessed}} {
		got, err := ro.Get(ctx, c.c.ID)
		if err != nil {
			t.Fatalf("Get(%d) on a store that refuses writes: %v", c.c.ID, err)
		}
		if got.State != c.state || got.Attempts != 0 || got.Owner != c.c.Owner {
			t.Errorf("claim %d changed: state %s, attempts %d, owner %s; want %s, 0, %s", c.c.ID, got.State, got.Attempts, got.Owner, c.state, c.c.Owner)
		}
	}
	if rows, err := ro.List(ctx, &claim.ListParams{}); err != nil || len(rows) != 5 {
		t.Errorf("List on a store that refuses writes: %d rows, %v; want the 5 claims", len(rows), err)
	}
}

// readOnly: a read-only database (a geo-secondary, a standby after a
// failover) refuses every write as read_only, a store-wide refusal.
func (s *suite) readOnly(t *testing.T) {
	if s.h.Features.ReadOnly == nil {
		t.Skip("Features.ReadOnly is nil for this database")
	}
	s.refusal(t, claim.ClassReadOnly, s.h.Features.ReadOnly)
}

// noGrants: an identity without INSERT, UPDATE and DELETE on the claims
// table has every write refused as permission, a store-wide refusal.
func (s *suite) noGrants(t *testing.T) {
	if s.h.Features.RevokeWritesSQL == "" {
		t.Skip(cmp.Or(s.h.Features.NoGrantsReason, "Features.RevokeWritesSQL is empty for this database"))
	}
	s.refusal(t, claim.ClassPermission, func(t *testing.T, st claim.Store) claim.Store {
		if _, err := s.h.DB(t, st).ExecContext(ctxT(t), s.h.Features.RevokeWritesSQL); err != nil {
			t.Fatalf("revoke writes: %v", err)
		}
		return st
	})
}

// warm opens n connections of db at once (at most the pool's limit) and
// returns them to the pool, so the calls of a race find live sessions
// instead of logging in inside the timed part.
func warm(t *testing.T, db *sql.DB, n int) {
	t.Helper()
	if max := db.Stats().MaxOpenConnections; max > 0 && n > max {
		n = max
	}
	ctx := ctxT(t)
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatalf("warm the pool: %v", err)
		}
		conns = append(conns, c)
		if err := c.PingContext(ctx); err != nil {
			t.Fatalf("warm the pool: %v", err)
		}
	}
}

func (s *suite) closed(t *testing.T) {
	st := s.h.NewStore(t)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	_, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{Claims: []claim.ClaimParams{msg("", "billing", "b")}})
	wantErr(t, "ClaimBatch on a closed store", err, claim.ErrUnavailable)
	wantErr(t, "Ping on a closed store", st.Ping(ctx), claim.ErrUnavailable)
	_, err = st.Get(ctx, 1)
	wantErr(t, "Get on a closed store", err, claim.ErrUnavailable)
}
