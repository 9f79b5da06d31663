package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/pressly/goose/v3"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/claimtest"
	"github.com/sbclaim/sbclaim/internal/claim/postgres"
	"github.com/sbclaim/sbclaim/internal/testdb"
	schema "github.com/sbclaim/sbclaim/sql"
)

// newStore opens a store on a fresh schema (search_path) of the test
// database, migrated, dropped when the test ends, so tests run in parallel
// without seeing each other's claims.
func newStore(t *testing.T) *postgres.Store { return testdb.Postgres(t) }

func TestConformance(t *testing.T) {
	claimtest.PostgresURL(t)
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
				late_success_utc = late_success_utc - make_interval(secs => $1)
				WHERE id = $2`,
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
	u, err := url.Parse(claimtest.PostgresURL(t))
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
	fsys, err := schema.Dialect("postgres")
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
