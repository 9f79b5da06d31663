package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/pressly/goose/v3"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/claimtest"
	"github.com/sbclaim/sbclaim/internal/claim/postgres"
	"github.com/sbclaim/sbclaim/internal/testkit"
	"github.com/sbclaim/sbclaim/internal/testkit/testdb"
	sqlfiles "github.com/sbclaim/sbclaim/sql"
)

// newStore opens a store on a fresh schema (search_path) of the test
// database, migrated, dropped when the test ends, so tests run in parallel
// without seeing each other's claims.
func newStore(t *testing.T) *postgres.Store { return testdb.Postgres(t) }

func TestConformance(t *testing.T) {
	testkit.PostgresURL(t)
	claimtest.Exercise(t, claimtest.Harness{
		NewStore: func(t *testing.T) claim.Store { return newStore(t) },
		DB:       func(t *testing.T, s claim.Store) *sql.DB { return s.(*postgres.Store).DB() },
		Features: claimtest.Features{
			UncommittedInsertBlocks: true,
			ExtraUniqueIndexSQL:     `CREATE UNIQUE INDEX ux_test_subject ON claims (subject)`,
			InsertClaimSQL: `INSERT INTO claims (message_id, consumer, owner, state, payload_hash)
				VALUES ($1, $2, $3::uuid, 'claimed', $4)`,
			BackdateSQL: `UPDATE claims SET
				claimed_utc   = claimed_utc   - make_interval(secs => $1),
				heartbeat_utc = heartbeat_utc - make_interval(secs => $1),
				processed_utc = processed_utc - make_interval(secs => $1),
				released_utc  = released_utc  - make_interval(secs => $1),
				flagged_utc   = flagged_utc   - make_interval(secs => $1),
				resolved_utc  = resolved_utc  - make_interval(secs => $1),
				taken_over_utc   = taken_over_utc   - make_interval(secs => $1),
				next_attempt_utc = next_attempt_utc - make_interval(secs => $1),
				late_success_utc = late_success_utc - make_interval(secs => $1),
				failed_utc       = failed_utc       - make_interval(secs => $1),
				answer_utc       = answer_utc       - make_interval(secs => $1),
				key_revised_utc  = key_revised_utc  - make_interval(secs => $1)
				WHERE id = $2`,
			BackdateFollowUpsSQL: `UPDATE claim_followups SET
				created_utc      = created_utc      - make_interval(secs => $1),
				lease_until_utc  = lease_until_utc  - make_interval(secs => $1),
				next_attempt_utc = next_attempt_utc - make_interval(secs => $1),
				sent_utc         = sent_utc         - make_interval(secs => $1)
				WHERE claim_id = $2`,
			SessionIDSQL:  `SELECT pg_backend_pid()`,
			WaitingForSQL: `SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))`,
			LockClaimSQL:  `SELECT id FROM claims WHERE id = $1 FOR UPDATE`,
			ClaimRaces:    func(s claim.Store) int64 { return s.(*postgres.Store).ClaimRaces() },
			// The owner of a table may revoke its own privileges: no
			// second role is needed (the test role has no CREATEROLE).
			RevokeWritesSQL: `REVOKE INSERT, UPDATE, DELETE ON claims FROM CURRENT_USER`,
			ReadOnly:        readOnlyStore,
		},
	})
}

// readOnlyStore opens a second store on st's schema whose sessions start
// read-only (default_transaction_read_only=on, as on a hot standby), so
// the server refuses every write with SQLSTATE 25006.
func readOnlyStore(t *testing.T, st claim.Store) claim.Store {
	t.Helper()
	var schema string
	if err := st.(*postgres.Store).DB().QueryRowContext(t.Context(), "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(testkit.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	q.Set("default_transaction_read_only", "on") // a startup parameter, as libpq's options=-c would set it
	u.RawQuery = q.Encode()
	ro, err := postgres.Open(t.Context(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ro.Close() })
	return ro
}

func TestMigrateIsIdempotent(t *testing.T) {
	s := newStore(t)
	if err := postgres.Migrate(t.Context(), s.DB()); err != nil {
		t.Fatal(err)
	}
}

func TestUnreachableServerIsUnavailable(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// Port 1 on localhost refuses connections.
	_, err := postgres.Open(ctx, "postgres://u:secret@127.0.0.1:1/db?sslmode=disable&connect_timeout=5")
	if !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("Open of an unreachable server: %v, want ErrUnavailable", err)
	}
}

// TestTryLockSpansPools: two pools on one schema (two replicas) exclude
// each other; a store on another schema (another deployment sharing the
// database) does not.
func TestTryLockSpansPools(t *testing.T) {
	u := testdb.URL(t, "postgres")
	open := func() *postgres.Store {
		s, err := postgres.Open(t.Context(), u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b := open(), open() // two pools, as two replicas would have
	other := newStore(t)
	ctx := t.Context()
	name := fmt.Sprintf("reconciler-%s", uuid.NewString())
	unlock, ok, err := a.TryLock(ctx, name)
	if err != nil || !ok {
		t.Fatalf("TryLock on a: %v %v", ok, err)
	}
	if _, ok, err := b.TryLock(ctx, name); err != nil || ok {
		t.Fatalf("TryLock on b while a holds it: ok %v, err %v", ok, err)
	}
	unlockOther, ok, err := other.TryLock(ctx, name)
	if err != nil || !ok {
		t.Fatalf("TryLock on another schema while a holds it: ok %v, err %v", ok, err)
	}
	unlockOther(ctx)
	if err := unlock(ctx); err != nil {
		t.Fatal(err)
	}
	unlockB, ok, err := b.TryLock(ctx, name)
	if err != nil || !ok {
		t.Fatalf("TryLock on b after a unlocked: %v %v", ok, err)
	}
	unlockB(ctx)
}

// TestUpgradeFromTheFirstSchema: a schema created by migration 00001, with
// claims in it, upgrades through 00002; its claims read, take over
// (recording the taker's route) and finish; 00002 goes down and up again.
func TestUpgradeFromTheFirstSchema(t *testing.T) {
	ctx := t.Context()
	s, err := postgres.Open(ctx, testdb.EmptyPostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fsys, err := sqlfiles.Dialect("postgres")
	if err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, s.DB(), fsys)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 1); err != nil {
		t.Fatal(err)
	}
	owner := uuid.New()
	if _, err := s.DB().ExecContext(ctx, `INSERT INTO claims (message_id, consumer, owner, state, payload_hash, payload, claimed_by, claimed_utc, heartbeat_utc)
		VALUES ('old-1', 'billing', $1, 'claimed', '\x01', '\x7b7d', 'host-old', now() - interval '1 hour', now() - interval '1 hour')`, owner); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	stale, err := s.FindStale(ctx, &claim.FindStaleParams{StaleAfter: time.Minute})
	if err != nil || len(stale) != 1 || stale[0].Route != "" || stale[0].TakeOvers != 0 || stale[0].Owner != owner {
		t.Fatalf("the old claim after the upgrade: %+v %v", stale, err)
	}
	taken, err := s.TakeOver(ctx, &claim.TakeOverParams{ID: stale[0].ID, PreviousOwner: owner, Owner: uuid.New(),
		Path: claim.PathReconciler, SilentFor: time.Minute, By: "reconciler", Route: "invoice", Fingerprint: "fp"})
	if err != nil || taken.Route != "invoice" || taken.PreviousHolder != "host-old" {
		t.Fatalf("take-over of the old claim: %+v %v", taken, err)
	}
	if err := s.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: taken.ID, Owner: taken.Owner}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 1); err != nil {
		t.Fatalf("down to 1: %v", err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if got, err := s.Get(ctx, taken.ID); err != nil || got.State != claim.StateProcessed {
		t.Fatalf("after down and up: %+v %v", got, err)
	}
}

// TestUpgradeToTheFailedState: a schema at migration 00002, with claims in
// every state it knows, upgrades through 00003 (the state CHECK dropped
// and added again, new columns, the purge index rebuilt); its claims read
// unchanged, fail, take a new key and count. 00003 goes down (a failed
// claim becomes flagged, with its reason) and up again.
func TestUpgradeToTheFailedState(t *testing.T) {
	ctx := t.Context()
	s, err := postgres.Open(ctx, testdb.EmptyPostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fsys, err := sqlfiles.Dialect("postgres")
	if err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, s.DB(), fsys)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 2); err != nil {
		t.Fatal(err)
	}
	owner := uuid.New()
	ids := map[string]int64{}
	for _, st := range []string{"claimed", "processed", "flagged"} {
		var id int64
		if err := s.DB().QueryRowContext(ctx, `INSERT INTO claims (message_id, consumer, owner, state, payload_hash, payload, claimed_by,
			claimed_utc, heartbeat_utc, processed_utc, flagged_utc, flag_reason, route, fingerprint)
			VALUES ($1, 'billing', $2, $3, '\x01', '\x7b7d', 'host-old', now() - interval '1 hour', now() - interval '1 hour',
			CASE WHEN $3 = 'processed' THEN now() END, CASE WHEN $3 = 'flagged' THEN now() END,
			CASE WHEN $3 = 'flagged' THEN 'no heartbeat' ELSE '' END, 'payments', 'fp') RETURNING id`, "old-"+st, owner, st).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids[st] = id
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("upgrade: %v", err)
	}

	stale, err := s.FindStale(ctx, &claim.FindStaleParams{StaleAfter: time.Minute})
	if err != nil || len(stale) != 1 || stale[0].ID != ids["claimed"] || stale[0].Owner != owner || stale[0].Answer != nil ||
		stale[0].FailedAt != nil || stale[0].Key() != "old-claimed" || stale[0].KeyRevision != 0 || stale[0].DeadLetterSeq != nil {
		t.Fatalf("the old claimed claim after the upgrade: %+v %v", stale, err)
	}
	if got, err := s.Get(ctx, ids["processed"]); err != nil || got.State != claim.StateProcessed || got.ProcessedAt == nil {
		t.Fatalf("the old processed claim: %+v %v", got, err)
	}
	taken, err := s.TakeOver(ctx, &claim.TakeOverParams{ID: ids["claimed"], PreviousOwner: owner, Owner: uuid.New(),
		Path: claim.PathReconciler, SilentFor: time.Minute, By: "reconciler", Route: "payments", Fingerprint: "fp"})
	if err != nil {
		t.Fatal(err)
	}
	seq := int64(9)
	if err := s.Fail(ctx, &claim.FailParams{ID: ids["claimed"], Owner: taken.Owner, Reason: claim.FailRejected, Error: "HTTP 402: declined",
		Answer: &claim.Answer{Status: 402}, DeadLetterSeq: &seq}); err != nil {
		t.Fatalf("fail the old claim: %v", err)
	}
	if _, err := s.TakeOver(ctx, &claim.TakeOverParams{ID: ids["flagged"], PreviousOwner: owner, Owner: uuid.New(), Path: claim.PathOperator,
		By: "operator:ann", Reason: "cached 500", Route: "payments", Fingerprint: "fp", NewKey: true}); err != nil {
		t.Fatalf("new key for the old flagged claim: %v", err)
	}
	st, err := s.Stats(ctx)
	if err != nil || st.Failed != 1 || st.Claimed != 1 {
		t.Fatalf("stats after the upgrade: %+v %v", st, err)
	}

	if _, err := p.DownTo(ctx, 2); err != nil {
		t.Fatalf("down to 2: %v", err)
	}
	var state, reason string
	if err := s.DB().QueryRowContext(ctx, `SELECT state, flag_reason FROM claims WHERE id = $1`, ids["claimed"]).Scan(&state, &reason); err != nil {
		t.Fatal(err)
	}
	if state != "flagged" || !strings.Contains(reason, claim.FailRejected) || !strings.Contains(reason, "HTTP 402: declined") {
		t.Fatalf("a failed claim after the downgrade: %s %q, want flagged with its reason", state, reason)
	}
	if _, err := s.DB().ExecContext(ctx, `INSERT INTO claims (message_id, consumer, owner, state, payload_hash)
		VALUES ('bad', 'c', $1, 'failed', '\x01')`, uuid.New()); err == nil {
		t.Fatal("schema 00002 took a failed claim")
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if got, err := s.Get(ctx, ids["claimed"]); err != nil || got.State != claim.StateFlagged || got.FailedAt != nil {
		t.Fatalf("after down and up: %+v %v", got, err)
	}
	c, err := s.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "h", Claims: []claim.ClaimParams{{MessageID: "new-1", Consumer: "billing",
		Owner: uuid.New(), PayloadHash: claim.HashPayload(nil)}}})
	if err != nil || c[0].Outcome != claim.OutcomeWon {
		t.Fatalf("a new claim after down and up: %+v %v", c, err)
	}
	if err := s.Fail(ctx, &claim.FailParams{ID: c[0].Claim.ID, Owner: c[0].Claim.Owner, Reason: claim.FailPermanent}); err != nil {
		t.Fatalf("fail after down and up: %v", err)
	}
}
