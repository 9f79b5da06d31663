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

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/claimtest"
	"github.com/sbclaim/sbclaim/internal/claim/postgres"
	"github.com/sbclaim/sbclaim/internal/testdb"
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
				resolved_utc  = resolved_utc  - make_interval(secs => $1)
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
