package reconciler_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/postgres"
	"github.com/sbclaim/sbclaim/internal/testkit"
)

// openPostgres creates a fresh database for the test (the reconciler's
// advisory lock is database-wide, so a shared database would let tests in
// parallel packages skip each other's ticks), migrates it and drops it
// afterwards. It skips, naming the variable, when SBCLAIM_TEST_POSTGRES_URL
// is unset.
func openPostgres(t *testing.T) *testDB {
	t.Helper()
	base := testkit.PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "sbclaim_rec_" + hex.EncodeToString(b)
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	open := func(t *testing.T) *postgres.Store {
		st, err := postgres.Open(context.Background(), u.String())
		if err != nil {
			t.Fatalf("open postgres: %v", err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	st := open(t)
	if err := postgres.Migrate(ctx, st.DB()); err != nil {
		t.Fatalf("migrate postgres: %v", err)
	}
	return &testDB{dialect: "postgres", store: st, db: st.DB(),
		openAnother: func(t *testing.T) claim.Store { return open(t) }}
}
