// Package testdb opens real, migrated, empty claim stores for tests: a
// SQLite file of its own, a fresh PostgreSQL schema in the database named by
// SBCLAIM_TEST_POSTGRES_URL, or a fresh SQL Server database on the server
// named by SBCLAIM_TEST_SQLSERVER_URL (skipped when unset, unless
// SBCLAIM_TEST_REQUIRE names the database). Everything is removed when the test
// ends.
package testdb

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/mssql"
	"github.com/sbclaim/sbclaim/internal/claim/postgres"
	"github.com/sbclaim/sbclaim/internal/claim/sqlite"
	"github.com/sbclaim/sbclaim/internal/claimdb"
	"github.com/sbclaim/sbclaim/internal/testkit"
)

// Backends names the stores every protocol test runs on. PostgreSQL and SQL
// Server tests skip (naming the variable) when their URL is not set.
var Backends = []string{"sqlite", "postgres", "sqlserver"}

// SQLServerURLEnv holds the SQL Server URL of the integration tests, e.g.
// sqlserver://sa:<password>@localhost:1433 (docker compose up sqlserver).
// The login needs CREATE DATABASE: each store gets a fresh database.
const SQLServerURLEnv = testkit.SQLServerEnv

// Store is a claim store that also exposes its *sql.DB.
type Store interface {
	claim.Store
	DB() *sql.DB
}

// Open returns a fresh store of the named backend ("sqlite" or "postgres").
func Open(t testing.TB, backend string) Store {
	t.Helper()
	switch backend {
	case "sqlite":
		return SQLite(t)
	case "postgres":
		return Postgres(t)
	case "sqlserver":
		return SQLServer(t)
	}
	t.Fatalf("testdb: unknown backend %q", backend)
	return nil
}

// URL returns a database URL for a fresh, empty, migrated database of the
// named backend, for code that opens stores by URL (binaries, harnesses).
func URL(t testing.TB, backend string) string {
	t.Helper()
	switch backend {
	case "sqlite":
		return scratch(t, "", "", claimdb.ScratchOptions{})
	case "postgres":
		return scratch(t, testkit.PostgresURLEnv, testkit.PostgresURL(t), claimdb.ScratchOptions{})
	case "sqlserver":
		return scratch(t, SQLServerURLEnv, testkit.RequireOrSkip(t, "sqlserver", SQLServerURLEnv), claimdb.ScratchOptions{
			// READ_COMMITTED_SNAPSHOT is on, as on Azure SQL Database,
			// unless SBCLAIM_TEST_SQLSERVER_RCSI=off.
			LockingReads: strings.EqualFold(os.Getenv("SBCLAIM_TEST_SQLSERVER_RCSI"), "off"),
		})
	}
	t.Fatalf("testdb: unknown backend %q", backend)
	return ""
}

// scratch creates a claimdb.Scratch next to base (the value of the
// variable env, "" for a SQLite file), removed when the test ends, and
// returns its URL. A failure names the variable.
func scratch(t testing.TB, env, base string, opts claimdb.ScratchOptions) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts.Prefix = "testdb"
	sc, err := claimdb.NewScratch(ctx, base, opts)
	if err != nil && env != "" {
		t.Fatalf("%s: %v", env, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sc.Close(); err != nil {
			t.Errorf("remove %s: %v", sc, err)
		}
	})
	return sc.URL
}

// SQLite opens a migrated SQLite store in a fresh file.
func SQLite(t testing.TB) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), URL(t, "sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Postgres opens a migrated PostgreSQL store on a fresh schema.
func Postgres(t testing.TB) *postgres.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := postgres.Open(ctx, URL(t, "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// EmptyPostgresURL creates an empty schema (for tests of the migrations
// themselves), drops it at cleanup, and returns a URL whose search_path
// selects it. It skips, naming the variable, without
// SBCLAIM_TEST_POSTGRES_URL.
func EmptyPostgresURL(t testing.TB) string {
	t.Helper()
	return scratch(t, testkit.PostgresURLEnv, testkit.PostgresURL(t), claimdb.ScratchOptions{Empty: true})
}

// SQLServer opens a migrated SQL Server store on a fresh database.
func SQLServer(t testing.TB) *mssql.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := mssql.Open(ctx, URL(t, "sqlserver"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
