// Package testdb opens real, migrated, empty claim stores for tests: a
// SQLite file in the test's temp dir, or a fresh PostgreSQL schema in the
// database named by SBCLAIM_TEST_POSTGRES_URL (skipped when unset, unless
// SBCLAIM_TEST_REQUIRE names postgres). Everything is removed when the test
// ends.
package testdb

import (
	"context"
	"database/sql"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/claimtest"
	"github.com/sbclaim/sbclaim/internal/claim/mssql"
	"github.com/sbclaim/sbclaim/internal/claim/postgres"
	"github.com/sbclaim/sbclaim/internal/claim/sqlite"
)

// Backends names the stores every protocol test runs on. PostgreSQL and SQL
// Server tests skip (naming the variable) when their URL is not set.
var Backends = []string{"sqlite", "postgres", "sqlserver"}

// SQLServerURLEnv holds the SQL Server URL of the integration tests, e.g.
// sqlserver://sa:<password>@localhost:1433 (docker compose up sqlserver).
// The login needs CREATE DATABASE: each store gets a fresh database.
const SQLServerURLEnv = "SBCLAIM_TEST_SQLSERVER_URL"

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
		u := "sqlite:" + filepath.Join(t.TempDir(), "claims.db")
		s, err := sqlite.Open(context.Background(), u)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := sqlite.Migrate(context.Background(), s.DB()); err != nil {
			t.Fatal(err)
		}
		return u
	case "postgres":
		return postgresSchemaURL(t)
	case "sqlserver":
		return sqlServerDatabaseURL(t)
	}
	t.Fatalf("testdb: unknown backend %q", backend)
	return ""
}

// SQLite opens a migrated SQLite store in a temp file.
func SQLite(t testing.TB) *sqlite.Store {
	t.Helper()
	ctx := context.Background()
	s, err := sqlite.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "claims.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := sqlite.Migrate(ctx, s.DB()); err != nil {
		t.Fatal(err)
	}
	return s
}

// Postgres opens a migrated PostgreSQL store on a fresh schema.
func Postgres(t testing.TB) *postgres.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := postgres.Open(ctx, postgresSchemaURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// postgresSchemaURL creates a schema, migrates it, drops it at cleanup, and
// returns a URL whose search_path selects it.
func postgresSchemaURL(t testing.TB) string {
	t.Helper()
	u := EmptyPostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := postgres.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := postgres.Migrate(ctx, s.DB()); err != nil {
		t.Fatal(err)
	}
	return u
}

// EmptyPostgresURL creates an empty schema (for tests of the migrations
// themselves), drops it at cleanup, and returns a URL whose search_path
// selects it. It skips, naming the variable, without
// SBCLAIM_TEST_POSTGRES_URL.
func EmptyPostgresURL(t testing.TB) string {
	t.Helper()
	base := claimtest.PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatal(err)
	}
	name := "testdb_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:16]
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+name); err != nil {
		admin.Close()
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		defer admin.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP SCHEMA "+name+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("parse %s: %v", claimtest.PostgresURLEnv, err)
	}
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// SQLServer opens a migrated SQL Server store on a fresh database.
func SQLServer(t testing.TB) *mssql.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := mssql.Open(ctx, sqlServerDatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// sqlServerDatabaseURL creates a database (READ_COMMITTED_SNAPSHOT on, as
// on Azure SQL Database, unless SBCLAIM_TEST_SQLSERVER_RCSI=off), migrates it, drops it at cleanup, and returns its
// URL.
func sqlServerDatabaseURL(t testing.TB) string {
	t.Helper()
	base := claimtest.RequireOrSkip(t, "sqlserver", SQLServerURLEnv)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, err := mssql.Open(ctx, base)
	if err != nil {
		t.Fatalf("open %s: %v", SQLServerURLEnv, err)
	}
	name := "[testdb_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:16] + "]"
	if _, err := admin.DB().ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		admin.Close()
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		defer admin.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = admin.DB().ExecContext(ctx, "ALTER DATABASE "+name+" SET SINGLE_USER WITH ROLLBACK IMMEDIATE")
		if _, err := admin.DB().ExecContext(ctx, "DROP DATABASE "+name); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	if !strings.EqualFold(os.Getenv("SBCLAIM_TEST_SQLSERVER_RCSI"), "off") {
		if _, err := admin.DB().ExecContext(ctx, "ALTER DATABASE "+name+" SET READ_COMMITTED_SNAPSHOT ON WITH ROLLBACK IMMEDIATE"); err != nil {
			t.Fatalf("turn on READ_COMMITTED_SNAPSHOT: %v", err)
		}
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("parse %s: %v", SQLServerURLEnv, err)
	}
	q := u.Query()
	q.Del("database")
	q.Set("database", strings.Trim(name, "[]"))
	u.RawQuery = q.Encode()
	s, err := mssql.Open(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := mssql.Migrate(ctx, s.DB()); err != nil {
		t.Fatal(err)
	}
	return u.String()
}
