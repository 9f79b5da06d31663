// Package claimtest is the conformance suite every claim.Store must pass.
// Each dialect package calls Exercise once with a Harness that creates
// fresh, migrated, empty stores, and a Features value that says what
// differs between databases (the dialect-specific SQL the suite needs).
package claimtest

import (
	"bytes"
	"context"
	"database/sql"
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

// Harness tells the suite how to get stores of one dialect.
type Harness struct {
	// NewStore returns a fresh, migrated, EMPTY store for one test
	// (t.Cleanup closes it).
	NewStore func(t *testing.T) claim.Store
	// DB returns the *sql.DB behind a store from NewStore (for raw SQL in
	// tests).
	DB       func(t *testing.T, s claim.Store) *sql.DB
	Features Features
}

// Features describes what differs between databases. The SQL strings use
// the dialect's own placeholders; the suite passes arguments in the order
// documented on each field.
type Features struct {
	// UncommittedInsertBlocks: an uncommitted claim in tx A makes tx B's
	// insert wait (PostgreSQL, SQL Server). SQLite serialises writers and
	// cannot run this test.
	UncommittedInsertBlocks bool

	// ExtraUniqueIndexSQL creates a second unique index on the claims
	// table's subject column (no arguments). The suite uses it to prove
	// that a unique violation of any index but the claims index is an
	// error, not a duplicate.
	ExtraUniqueIndexSQL string

	// InsertClaimSQL inserts a bare claimed row (the other columns take
	// their defaults or the database clock). Arguments: message id,
	// consumer, owner (uuid as a string), payload hash ([]byte).
	InsertClaimSQL string

	// BackdateSQL moves every time column of one claim (claimed,
	// heartbeat, processed, released, flagged, resolved, taken over, next
	// attempt, late success, failed, answer, key revised; NULLs stay NULL)
	// back by a number of seconds, so staleness tests do not sleep.
	// Arguments: seconds (int64), claim id (int64).
	BackdateSQL string

	// Locks and races (the concurrency tests, and the deadlock test of
	// errors.go). Empty or nil on a database that serialises writers
	// (SQLite): the assertions that need two writers at once skip, saying
	// so.

	// SessionIDSQL returns the id of the session that runs it (no
	// arguments; one integer column).
	SessionIDSQL string
	// WaitingForSQL counts the sessions waiting for a lock that a session
	// holds (argument: that session's id from SessionIDSQL; one integer
	// column).
	WaitingForSQL string
	// LockClaimSQL takes a row lock on one claim without changing anything
	// the store reads (argument: claim id).
	LockClaimSQL string
	// SurviveDeadlockSQL, run first in a raw transaction, makes the
	// database pick the other session as the victim of a deadlock (SQL
	// Server: SET DEADLOCK_PRIORITY HIGH). Empty: the database aborts the
	// session whose deadlock check runs first, the one that waited first
	// (PostgreSQL); the deadlock test arranges for that to be the store's.
	SurviveDeadlockSQL string
	// ClaimRaces returns the store's count of claims that met another
	// transaction's in-flight claim of the same key in the claims unique
	// index (see postgres.Store.ClaimRaces, mssql.Store.ClaimRaces). The
	// race tests assert that it moved: without it they could pass without
	// racing. nil: the database serialises writers.
	ClaimRaces func(s claim.Store) int64

	// Error classes (errors.go).

	// ReadOnly returns a store on st's database whose writes the database
	// refuses as read-only while its reads work (PostgreSQL: a pool with
	// default_transaction_read_only=on; SQLite: a query_only connection;
	// SQL Server: the database set READ_ONLY). It may return st itself.
	// nil skips the test.
	ReadOnly func(t *testing.T, st claim.Store) claim.Store
	// RevokeWritesSQL takes INSERT, UPDATE and DELETE on the claims table
	// away from the store's own identity (no arguments), so every write is
	// refused for a missing grant while reads work. Empty skips the test,
	// with NoGrantsReason.
	RevokeWritesSQL string
	NoGrantsReason  string
}

// Exercise runs the conformance suite against h.
func Exercise(t *testing.T, h Harness) {
	for _, f := range []struct {
		name string
		sql  string
	}{{"ExtraUniqueIndexSQL", h.Features.ExtraUniqueIndexSQL}, {"InsertClaimSQL", h.Features.InsertClaimSQL}, {"BackdateSQL", h.Features.BackdateSQL}} {
		if f.sql == "" {
			t.Fatalf("Harness.Features.%s is empty", f.name)
		}
	}
	s := &suite{h: h}
	tests := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"ClaimWinsAndRoundTrips", s.claimWinsAndRoundTrips},
		{"InvalidClaimIsRejected", s.invalidClaim},
		{"ConcurrentClaimsOfOneKeyHaveOneWinner", s.concurrentClaims},
		{"SameKeyUnderTwoConsumersIsTwoClaims", s.twoConsumers},
		{"KeysDifferingOnlyInCaseAreTwoClaims", s.caseSensitiveKeys},
		{"SameKeyOtherPayloadIsConflict", s.conflict},
		{"UncommittedInsertBlocksSecondClaim", s.uncommittedInsertBlocks},
		{"OtherUniqueViolationIsAnErrorNotADuplicate", s.otherUniqueViolation},
		{"BatchClassifiesEveryMessageInOrder", s.batchMixed},
		{"ClaimTx", s.claimTx},
		{"LifecycleClaimReleaseTakeOverProcess", s.lifecycle},
		{"GuardedOpsRefuseWrongOwnerOrState", s.guardedOps},
		{"TakeOverHasExactlyOneWinner", s.takeOverOnce},
		{"FlagStaleSkipsFreshHeartbeat", s.flagSkipsFresh},
		{"FlagStaleFlagsReleasedNotTakenOver", s.flagReleased},
		{"FlagStaleIsBounded", s.flagBounded},
		{"FlagStaleVersusMarkProcessedNeverBoth", s.flagVersusProcess},
		{"Resolve", s.resolve},
		{"ListFiltersAndPages", s.list},
		{"PurgeProcessed", s.purge},
		{"Stats", s.stats},
		{"TimesComeFromTheDatabaseClock", s.dbClock},
		{"TryLock", s.tryLock},
		{"ClosedStoreIsUnavailable", s.closed},
		{"DeadlockIsAbortedForTheCallOnly", s.deadlock},
		{"ReadOnlyDatabaseRefusesEveryWrite", s.readOnly},
		{"MissingGrantRefusesEveryWrite", s.noGrants},
	}
	tests = append(tests, s.takeOverTests()...)
	tests = append(tests, s.failedTests()...)
	tests = append(tests, s.consoleTests()...)
	tests = append(tests, s.batchTests()...)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t)
		})
	}
}

type suite struct{ h Harness }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var seq atomic.Int64

// msg returns claim params for a fresh key (unless id is given) and body.
func msg(id, consumer, body string) claim.ClaimParams {
	if id == "" {
		id = fmt.Sprintf("msg-%d-%s", seq.Add(1), uuid.NewString()[:8])
	}
	return claim.ClaimParams{
		MessageID:     id,
		Consumer:      consumer,
		Owner:         uuid.New(),
		Route:         "route-" + consumer,
		Fingerprint:   "fp-1",
		Entity:        "orders/billing",
		Subject:       "subject-" + id,
		ContentType:   "application/json",
		Properties:    map[string]string{"ce_source": "test", "k": id},
		PayloadHash:   claim.HashPayload([]byte(body)),
		Payload:       []byte(body),
		DeliveryCount: 1,
	}
}

// claimOne claims p as a new delivery would: with a fresh owner token.
func claimOne(t *testing.T, s claim.Store, p claim.ClaimParams) claim.ClaimResult {
	t.Helper()
	p.Owner = uuid.New()
	res, err := s.ClaimBatch(ctxT(t), &claim.ClaimBatchParams{Host: "host-a", Claims: []claim.ClaimParams{p}})
	if err != nil {
		t.Fatalf("ClaimBatch(%s/%s): %v", p.MessageID, p.Consumer, err)
	}
	if len(res) != 1 {
		t.Fatalf("ClaimBatch returned %d results for 1 message", len(res))
	}
	return res[0]
}

func mustWin(t *testing.T, s claim.Store, p claim.ClaimParams) *claim.Claim {
	t.Helper()
	res := claimOne(t, s, p)
	if res.Outcome != claim.OutcomeWon {
		t.Fatalf("claim %s/%s: outcome %s, want won", p.MessageID, p.Consumer, res.Outcome)
	}
	return res.Claim
}

func mustGet(t *testing.T, s claim.Store, id int64) *claim.Claim {
	t.Helper()
	c, err := s.Get(ctxT(t), id)
	if err != nil {
		t.Fatalf("Get(%d): %v", id, err)
	}
	return c
}

func (s *suite) backdate(t *testing.T, st claim.Store, id int64, by time.Duration) {
	t.Helper()
	if _, err := s.h.DB(t, st).ExecContext(ctxT(t), s.h.Features.BackdateSQL, int64(by/time.Second), id); err != nil {
		t.Fatalf("backdate claim %d: %v", id, err)
	}
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: error %v, want %v", what, err, want)
	}
}

func (s *suite) claimWinsAndRoundTrips(t *testing.T) {
	st := s.h.NewStore(t)
	p := msg("", "billing", `{"amount":42}`)
	p.DeliveryCount = 3
	c := mustWin(t, st, p)
	if c.ID <= 0 || c.Owner == uuid.Nil || c.State != claim.StateClaimed {
		t.Fatalf("won claim: ID %d, Owner %s, State %s", c.ID, c.Owner, c.State)
	}
	if c.ClaimedAt.IsZero() || !c.HeartbeatAt.Equal(c.ClaimedAt) {
		t.Fatalf("won claim times: ClaimedAt %v, HeartbeatAt %v (want equal, non-zero)", c.ClaimedAt, c.HeartbeatAt)
	}
	got := mustGet(t, st, c.ID)
	if got.MessageID != p.MessageID || got.Consumer != p.Consumer || got.Owner != c.Owner ||
		got.Entity != p.Entity || got.Subject != p.Subject || got.ContentType != p.ContentType ||
		!bytes.Equal(got.PayloadHash, p.PayloadHash) || !bytes.Equal(got.Payload, p.Payload) ||
		got.DeliveryCount != 3 || got.ClaimedBy != "host-a" || got.State != claim.StateClaimed ||
		len(got.Properties) != 2 || got.Properties["k"] != p.MessageID {
		t.Fatalf("Get does not round-trip the claim:\n got %+v\nwant %+v", got, p)
	}
	if !got.ClaimedAt.Equal(c.ClaimedAt) || got.ProcessedAt != nil || got.ReleasedAt != nil ||
		got.FlaggedAt != nil || got.ResolvedAt != nil || got.Attempts != 0 {
		t.Fatalf("fresh claim: %+v", got)
	}
	_, err := st.Get(ctxT(t), c.ID+1000)
	wantErr(t, "Get(missing)", err, claim.ErrNotFound)

	// Payload storage off: nil payload stays nil.
	p2 := msg("", "billing", "x")
	p2.Payload = nil
	c2 := mustWin(t, st, p2)
	if got := mustGet(t, st, c2.ID); got.Payload != nil {
		t.Fatalf("payload stored although nil: %q", got.Payload)
	}
}

func (s *suite) invalidClaim(t *testing.T) {
	st := s.h.NewStore(t)
	for name, p := range map[string]claim.ClaimParams{
		"empty message id":    msg("", "c", "b"),
		"message id too long": msg(strings.Repeat("x", claim.MaxMessageIDLength+1), "c", "b"),
		"empty consumer":      msg("", "", "b"),
		"no payload hash":     msg("", "c", "b"),
	} {
		switch name {
		case "empty message id":
			p.MessageID = ""
		case "no payload hash":
			p.PayloadHash = nil
		}
		_, err := st.ClaimBatch(ctxT(t), &claim.ClaimBatchParams{Claims: []claim.ClaimParams{p}})
		if err == nil {
			t.Errorf("%s: ClaimBatch succeeded", name)
		}
	}
	// The longest allowed key works.
	mustWin(t, st, msg(strings.Repeat("é", claim.MaxMessageIDLength), "c", "b"))
}

// concurrentClaims: 50 callers claim one key at once; exactly one wins and
// every other gets the winner's claim as a duplicate. The connections are
// opened and warmed before, and the callers parked on a barrier, so the
// claims run at the same time rather than one per login. The race itself
// is asserted (Features.ClaimRaces): at least one loser met the winner's
// claim while it was in flight in the claims unique index. A round in
// which the scheduler still ran them one after the other is run again, at
// most maxRaceRounds times, each with a fresh key.
func (s *suite) concurrentClaims(t *testing.T) {
	st := s.h.NewStore(t)
	races := s.h.Features.ClaimRaces
	var before int64
	if races != nil {
		before = races(st)
	}
	const n = 50
	raced := false
	rounds := 0
	for rounds < maxRaceRounds && !raced {
		rounds++
		s.claimRace(t, st, n, fmt.Sprintf("billing-%d", rounds))
		raced = races != nil && races(st) > before
		if races == nil {
			break
		}
	}
	t.Run("RaceWasObserved", func(t *testing.T) {
		if races == nil {
			t.Skip("this database serialises writers (SQLite: one writer at a time): concurrent claims never meet in the index, so there is no race to observe")
		}
		if !raced {
			t.Fatalf("in %d rounds of %d concurrent claims of one key, no loser met the winner's in-flight claim (ClaimRaces stayed %d): the index's race path was never exercised", rounds, n, before)
		}
		t.Logf("raced in round %d: ClaimRaces %d -> %d", rounds, before, races(st))
	})
}

// maxRaceRounds bounds the rounds of a race test that must observe a race.
const maxRaceRounds = 20

// claimRace runs one round of concurrentClaims under consumer.
func (s *suite) claimRace(t *testing.T, st claim.Store, n int, consumer string) {
	t.Helper()
	p := msg("", consumer, "same body")
	warm(t, s.h.DB(t, st), n)
	var (
		wg      sync.WaitGroup
		ready   sync.WaitGroup
		start   = make(chan struct{})
		results = make([]claim.ClaimResult, n)
		errs    = make([]error, n)
	)
	ctx := ctxT(t)
	ready.Add(n)
	for i := range n {
		p := p
		p.Owner = uuid.New() // each goroutine is another delivery
		wg.Go(func() {
			params := &claim.ClaimBatchParams{Host: fmt.Sprintf("host-%d", i), Claims: []claim.ClaimParams{p}}
			ready.Done()
			<-start
			res, err := st.ClaimBatch(ctx, params)
			if err == nil && len(res) == 1 {
				results[i] = res[0]
			}
			errs[i] = err
		})
	}
	ready.Wait() // every caller is parked on the barrier
	close(start)
	wg.Wait()
	var won, dup int
	var winner int64
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("goroutine %d: %v", i, errs[i])
		}
		switch results[i].Outcome {
		case claim.OutcomeWon:
			won++
			winner = results[i].Claim.ID
		case claim.OutcomeDuplicate:
			dup++
		default:
			t.Fatalf("goroutine %d: outcome %s", i, results[i].Outcome)
		}
	}
	if won != 1 || dup != n-1 {
		t.Fatalf("%d won, %d duplicate; want 1 and %d", won, dup, n-1)
	}
	for i := range n {
		if results[i].Claim == nil || results[i].Claim.ID != winner {
			t.Fatalf("goroutine %d: claim %+v, want ID %d", i, results[i].Claim, winner)
		}
	}
	rows, err := st.List(ctx, &claim.ListParams{Consumer: consumer})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Fatalf("%d rows for one key, want 1", len(rows))
	}
}

// caseSensitiveKeys: keys compare exactly in every store (SQL Server's
// default collation is case-insensitive; the claims table overrides it),
// in one batch and across calls.
func (s *suite) caseSensitiveKeys(t *testing.T) {
	st := s.h.NewStore(t)
	base := "Order-" + uuid.NewString()[:8]
	lower := msg(strings.ToLower(base), "billing", "b")
	upper := msg(strings.ToUpper(base), "billing", "b")
	res, err := st.ClaimBatch(ctxT(t), &claim.ClaimBatchParams{Claims: []claim.ClaimParams{lower, upper}})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Outcome != claim.OutcomeWon || res[1].Outcome != claim.OutcomeWon {
		t.Fatalf("outcomes %s, %s: want both won", res[0].Outcome, res[1].Outcome)
	}
	mixed := msg(base, "billing", "b")
	if got := claimOne(t, st, mixed); got.Outcome != claim.OutcomeWon {
		t.Fatalf("mixed-case key: %s, want won", got.Outcome)
	}
}

func (s *suite) twoConsumers(t *testing.T) {
	st := s.h.NewStore(t)
	p := msg("", "billing", "b")
	a := mustWin(t, st, p)
	p.Consumer = "shipping"
	b := mustWin(t, st, p)
	if a.ID == b.ID || a.Owner == b.Owner {
		t.Fatalf("two consumers share a claim: %d/%s and %d/%s", a.ID, a.Owner, b.ID, b.Owner)
	}
	if res := claimOne(t, st, p); res.Outcome != claim.OutcomeDuplicate || res.Claim.ID != b.ID {
		t.Fatalf("second claim under shipping: %s (claim %+v)", res.Outcome, res.Claim)
	}
}

func (s *suite) conflict(t *testing.T) {
	st := s.h.NewStore(t)
	p := msg("", "billing", "body one")
	first := mustWin(t, st, p)
	dup := claimOne(t, st, p)
	if dup.Outcome != claim.OutcomeDuplicate || dup.Claim.ID != first.ID || dup.Claim.State != claim.StateClaimed ||
		!bytes.Equal(dup.Claim.PayloadHash, p.PayloadHash) || dup.Claim.Owner != first.Owner {
		t.Fatalf("same payload: %s %+v", dup.Outcome, dup.Claim)
	}
	p.PayloadHash = claim.HashPayload([]byte("body two"))
	res := claimOne(t, st, p)
	if res.Outcome != claim.OutcomeConflict || res.Claim.ID != first.ID || !bytes.Equal(res.Claim.PayloadHash, first.PayloadHash) {
		t.Fatalf("other payload: %s %+v", res.Outcome, res.Claim)
	}
}

// uncommittedInsertBlocks: a claim of a key that another transaction has
// inserted but not committed waits for that transaction (the database's
// lock table shows the store's session waiting for it, before the
// transaction ends), then is a duplicate if it committed, or wins if it
// rolled back. The committed case is the index's race path, and
// Features.ClaimRaces must count it.
func (s *suite) uncommittedInsertBlocks(t *testing.T) {
	f := s.h.Features
	if !f.UncommittedInsertBlocks {
		t.Skip("Features.UncommittedInsertBlocks is false for this database (SQLite serialises writers: the second insert cannot start while the first is open)")
	}
	if f.SessionIDSQL == "" || f.WaitingForSQL == "" {
		t.Fatal("Features.UncommittedInsertBlocks needs SessionIDSQL and WaitingForSQL")
	}
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "Commit", false: "Rollback"}[commit], func(t *testing.T) {
			st := s.h.NewStore(t)
			db := s.h.DB(t, st)
			ctx := ctxT(t)
			warm(t, db, 3)
			p := msg("", "billing", "b")
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			holder := s.sessionID(t, ctx, tx)
			if _, err := tx.ExecContext(ctx, f.InsertClaimSQL, p.MessageID, p.Consumer, uuid.NewString(), p.PayloadHash); err != nil {
				t.Fatalf("raw insert: %v", err)
			}
			var racesBefore int64
			if f.ClaimRaces != nil {
				racesBefore = f.ClaimRaces(st)
			}
			type result struct {
				res claim.ClaimResult
				err error
			}
			done := make(chan result, 1)
			returned := make(chan struct{})
			go func() {
				defer close(returned)
				res, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "b", Claims: []claim.ClaimParams{p}})
				if err == nil && len(res) != 1 {
					err = fmt.Errorf("%d results", len(res))
				}
				var r result
				r.err = err
				if err == nil {
					r.res = res[0]
				}
				done <- r
			}()
			// B waits for A: the database says so, while A is still open.
			s.waitBlockedBy(t, ctx, db, holder, returned)
			select {
			case r := <-done:
				t.Fatalf("claim returned while another transaction held an uncommitted claim: %+v %v", r.res, r.err)
			default:
			}
			if commit {
				err = tx.Commit()
			} else {
				err = tx.Rollback()
			}
			if err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil {
				t.Fatal(r.err)
			}
			want := claim.OutcomeDuplicate
			if !commit {
				want = claim.OutcomeWon
			}
			if r.res.Outcome != want {
				t.Fatalf("after A's %s: B got %s, want %s", map[bool]string{true: "commit", false: "rollback"}[commit], r.res.Outcome, want)
			}
			if commit && f.ClaimRaces != nil {
				if after := f.ClaimRaces(st); after <= racesBefore {
					t.Fatalf("B met A's in-flight claim but ClaimRaces stayed %d", after)
				}
			}
		})
	}
}

func (s *suite) otherUniqueViolation(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	if _, err := s.h.DB(t, st).ExecContext(ctx, s.h.Features.ExtraUniqueIndexSQL); err != nil {
		t.Fatalf("extra unique index: %v", err)
	}
	a := msg("", "billing", "b")
	a.Subject = "same subject"
	mustWin(t, st, a)
	b := msg("", "billing", "b")
	b.Subject = "same subject"
	res, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{Claims: []claim.ClaimParams{b}})
	if err == nil {
		t.Fatalf("claim violating another unique index succeeded: %+v", res)
	}
	if errors.Is(err, claim.ErrDuplicate) || errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("other unique violation reported as %v", err)
	}
	called := false
	_, err = st.ClaimTx(ctx, &claim.ClaimTxParams{Claim: b}, func(context.Context, *sql.Tx) error { called = true; return nil })
	if err == nil || errors.Is(err, claim.ErrDuplicate) || called {
		t.Fatalf("ClaimTx with another unique violation: err %v, fn called %v", err, called)
	}
	rows, err := st.List(ctx, &claim.ListParams{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Fatalf("%d rows after the failed claims, want 1", len(rows))
	}
}

func (s *suite) batchMixed(t *testing.T) {
	st := s.h.NewStore(t)
	dup := msg("", "billing", "dup")
	conf := msg("", "billing", "conf")
	existingDup := mustWin(t, st, dup)
	existingConf := mustWin(t, st, conf)
	conf.PayloadHash = claim.HashPayload([]byte("other"))

	x := msg("", "billing", "x")
	y := msg("", "billing", "y")
	yOther := y
	yOther.PayloadHash = claim.HashPayload([]byte("y other"))
	batch := []claim.ClaimParams{x, dup, conf, x, y, yOther, dup}
	want := []claim.Outcome{claim.OutcomeWon, claim.OutcomeDuplicate, claim.OutcomeConflict,
		claim.OutcomeDuplicate, claim.OutcomeWon, claim.OutcomeConflict, claim.OutcomeDuplicate}

	res, err := st.ClaimBatch(ctxT(t), &claim.ClaimBatchParams{Host: "h", Claims: batch})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(batch) {
		t.Fatalf("%d results for %d messages", len(res), len(batch))
	}
	for i := range res {
		if res[i].Outcome != want[i] || res[i].Claim == nil {
			t.Fatalf("message %d (%s): outcome %s, want %s", i, batch[i].MessageID, res[i].Outcome, want[i])
		}
		if res[i].Claim.MessageID != batch[i].MessageID {
			t.Fatalf("message %d: result for %s, want %s", i, res[i].Claim.MessageID, batch[i].MessageID)
		}
	}
	if res[1].Claim.ID != existingDup.ID || res[2].Claim.ID != existingConf.ID || res[6].Claim.ID != existingDup.ID {
		t.Fatal("duplicate/conflict results do not point at the existing claims")
	}
	if res[3].Claim.ID != res[0].Claim.ID || res[5].Claim.ID != res[4].Claim.ID {
		t.Fatal("intra-batch duplicates do not point at the batch's own winner")
	}
	if res[0].Claim == res[3].Claim {
		t.Fatal("results share a *Claim")
	}
	rows, err := st.List(ctxT(t), &claim.ListParams{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 {
		t.Fatalf("%d rows, want 4", len(rows))
	}
	// An empty batch is no work.
	if res, err := st.ClaimBatch(ctxT(t), &claim.ClaimBatchParams{}); err != nil || len(res) != 0 {
		t.Fatalf("empty batch: %v %v", res, err)
	}
}

var errHandler = errors.New("handler failed")

func (s *suite) claimTx(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	p := msg("", "ledger", "credit 10")
	var sawMarker int
	res, err := st.ClaimTx(ctx, &claim.ClaimTxParams{Host: "h", Claim: p}, func(ctx context.Context, tx *sql.Tx) error {
		// The marker is visible inside the transaction.
		return tx.QueryRowContext(ctx, "SELECT count(*) FROM claims").Scan(&sawMarker)
	})
	if err != nil {
		t.Fatal(err)
	}
	if sawMarker != 1 {
		t.Fatalf("fn saw %d claims in its transaction, want 1", sawMarker)
	}
	if res.Outcome != claim.OutcomeWon || res.Claim.State != claim.StateProcessed || res.Claim.ProcessedAt == nil || res.Claim.Payload != nil {
		t.Fatalf("ClaimTx won: %s %+v", res.Outcome, res.Claim)
	}
	got := mustGet(t, st, res.Claim.ID)
	if got.State != claim.StateProcessed || got.ProcessedAt == nil || got.Payload != nil {
		t.Fatalf("committed marker: %+v", got)
	}

	// Duplicate and conflict: fn is not called.
	for _, tc := range []struct {
		hash []byte
		want claim.Outcome
	}{{p.PayloadHash, claim.OutcomeDuplicate}, {claim.HashPayload([]byte("other")), claim.OutcomeConflict}} {
		q := p
		q.Owner = uuid.New() // another delivery
		q.PayloadHash = tc.hash
		called := false
		res, err := st.ClaimTx(ctx, &claim.ClaimTxParams{Claim: q}, func(context.Context, *sql.Tx) error { called = true; return nil })
		if err != nil || called || res.Outcome != tc.want || res.Claim.ID != got.ID {
			t.Fatalf("ClaimTx again: outcome %s (want %s), fn called %v, err %v", res.Outcome, tc.want, called, err)
		}
	}

	// fn fails: everything rolls back and fn's error comes back.
	f := msg("", "ledger", "fails")
	_, err = st.ClaimTx(ctx, &claim.ClaimTxParams{Claim: f}, func(context.Context, *sql.Tx) error {
		return fmt.Errorf("wrapped: %w", errHandler)
	})
	if !errors.Is(err, errHandler) {
		t.Fatalf("ClaimTx fn error: %v, want %v", err, errHandler)
	}
	if res := claimOne(t, st, f); res.Outcome != claim.OutcomeWon {
		t.Fatalf("claim after a rolled back ClaimTx: %s, want won", res.Outcome)
	}
}

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

func (s *suite) tryLock(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	name := "claimtest-" + uuid.NewString()
	unlock, ok, err := st.TryLock(ctx, name)
	if err != nil || !ok {
		t.Fatalf("first TryLock: ok %v, err %v", ok, err)
	}
	if _, ok2, err := st.TryLock(ctx, name); err != nil || ok2 {
		t.Fatalf("second TryLock while held: ok %v, err %v; want not ok", ok2, err)
	}
	other, ok, err := st.TryLock(ctx, name+"-other")
	if err != nil || !ok {
		t.Fatalf("TryLock of another name: ok %v, err %v", ok, err)
	}
	if err := other(ctx); err != nil {
		t.Fatal(err)
	}
	if err := unlock(ctx); err != nil {
		t.Fatalf("unlock: %v", err)
	}
	again, ok, err := st.TryLock(ctx, name)
	if err != nil || !ok {
		t.Fatalf("TryLock after unlock: ok %v, err %v", ok, err)
	}
	if err := again(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Ping(ctx); err != nil {
		t.Fatal(err)
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
