package claimtest

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

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

// claimReturnsItsRow: the claims a batch (and ClaimTx) returns as won
// are exactly the rows Get reads back, field for field, whatever the
// batch's mix: every optional value set or not, a payload stored or not, a
// raw key, a session, an empty body, a key twice in the batch and a key
// already claimed.
// (A store may build the won claim from what it inserted instead of reading
// every column back.)
func (s *suite) claimReturnsItsRow(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	full := msg("", "billing", `{"amount":42}`)
	full.DeliveryCount, full.SessionID = 4, "session-1"
	bare := msg("", "billing", "x")
	bare.Payload, bare.Properties, bare.Subject, bare.ContentType, bare.Entity = nil, nil, "", "", ""
	bare.Route, bare.Fingerprint = "", ""
	raw := msg("", "billing", "y")
	raw.KeyForm = claim.KeyFormRaw
	taken := mustWin(t, st, msg("", "billing", "z"))
	again := msg(taken.MessageID, "billing", "z")
	twice := msg("", "other", "w")
	empty := msg("", "billing", "")
	empty.Payload = []byte{} // an empty body, stored
	batch := []claim.ClaimParams{full, bare, again, twice, raw, twice, empty}
	res, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "host-b", Claims: batch})
	if err != nil {
		t.Fatalf("ClaimBatch: %v", err)
	}
	won := 0
	for i, r := range res {
		if r.Outcome != claim.OutcomeWon {
			continue
		}
		won++
		if got := mustGet(t, st, r.Claim.ID); !reflect.DeepEqual(r.Claim, got) {
			t.Errorf("message %d (%s): ClaimBatch returned\n%+v\nGet reads\n%+v", i, batch[i].MessageID, r.Claim, got)
		}
	}
	if won != 5 {
		t.Fatalf("won %d of the batch, want 5 (the key already claimed and the second copy are not): %+v", won, res)
	}

	tx := msg("", "billing", "t")
	r, err := st.ClaimTx(ctx, &claim.ClaimTxParams{Host: "host-c", Claim: tx}, func(context.Context, *sql.Tx) error { return nil })
	if err != nil || r.Outcome != claim.OutcomeWon {
		t.Fatalf("ClaimTx = %+v, %v", r, err)
	}
	if got := mustGet(t, st, r.Claim.ID); !reflect.DeepEqual(r.Claim, got) {
		t.Errorf("ClaimTx returned\n%+v\nGet reads\n%+v", r.Claim, got)
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
