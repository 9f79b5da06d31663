// Package claimdb opens the claims database a URL names, with all three
// stores linked in: it opens the product's store for the URL's dialect,
// applies the embedded migrations, and creates throwaway databases for
// tests and the chaos harness (Scratch). The module's tools and tests use
// it; the public API does not (it opens the stores the program imports,
// through package dialect, which reads the URLs):
//
//	sqlite:/var/lib/sbclaim/claims.db   (sqlite::memory: for tests)
//	postgres://user:pass@host:5432/db?sslmode=require  (or postgresql://)
//	sqlserver://user:pass@host:1433?database=sbclaim
//
// Errors never contain the URL's password: an unknown scheme is named, the
// URL is not echoed.
package claimdb

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/mssql"
	"github.com/sbclaim/sbclaim/internal/claim/postgres"
	"github.com/sbclaim/sbclaim/internal/claim/sqlite"
	"github.com/sbclaim/sbclaim/internal/claimdb/dialect"
)

// Dialect is the database a URL names (package dialect, which reads URLs
// without a driver).
type Dialect = dialect.Dialect

// The supported dialects.
const (
	SQLite    = dialect.SQLite
	Postgres  = dialect.Postgres
	SQLServer = dialect.SQLServer
)

// DialectOf returns the dialect of a database URL, or an error naming the
// unsupported scheme (never the URL itself).
func DialectOf(rawURL string) (Dialect, error) { return dialect.Of(rawURL) }

// Check reports what is wrong with a database URL without connecting: an
// unsupported scheme, a sqlite: URL without a path, a server URL that does
// not parse or names no host. Configuration calls it at start-up so a bad
// URL refuses to start with a clear reason.
func Check(rawURL string) error { return dialect.Check(rawURL) }

// Open opens the claims store a URL names. It does not migrate (except a
// sqlite::memory: store, which starts empty): run Migrate first.
func Open(ctx context.Context, rawURL string) (claim.Store, error) {
	d, err := DialectOf(rawURL)
	if err != nil {
		return nil, err
	}
	// Each return names its own concrete type, so a failed Open never
	// yields a non-nil interface holding a nil pointer.
	switch d {
	case SQLite:
		s, err := sqlite.Open(ctx, rawURL)
		if err != nil {
			return nil, err
		}
		return s, nil
	case Postgres:
		s, err := postgres.Open(ctx, normalizePostgres(rawURL))
		if err != nil {
			return nil, err
		}
		return s, nil
	default:
		s, err := mssql.Open(ctx, rawURL)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
}

// normalizePostgres lets the scheme's case vary (pgx wants lower case).
func normalizePostgres(rawURL string) string { return dialect.NormalizePostgres(rawURL) }

// store is what every dialect's store offers beyond claim.Store.
type store interface {
	claim.Store
	DB() *sql.DB
}

// migrate applies the dialect's embedded migrations to an open store.
func migrate(ctx context.Context, d Dialect, s store) error {
	switch d {
	case SQLite:
		return sqlite.Migrate(ctx, s.DB())
	case Postgres:
		return postgres.Migrate(ctx, s.DB())
	default:
		return mssql.Migrate(ctx, s.DB())
	}
}

// Migrate applies the embedded migrations of the URL's dialect to the
// database it names, then closes the connection. It is idempotent, and
// safe to run from several replicas at once on PostgreSQL and SQL Server
// (goose takes a database lock).
func Migrate(ctx context.Context, rawURL string) error {
	d, err := DialectOf(rawURL)
	if err != nil {
		return err
	}
	s, err := Open(ctx, rawURL)
	if err != nil {
		return err
	}
	defer s.Close()
	return migrate(ctx, d, s.(store))
}

// OpenDB opens a plain database/sql handle on the database a URL names,
// with at most maxConns connections, for code that runs its own SQL beside
// the store (the chaos harness's scenarios and benchmarks). SQL Server
// goes through the store's opener, so Entra ID and the app name work the
// same way.
func OpenDB(ctx context.Context, rawURL string, maxConns int) (*sql.DB, error) {
	d, err := DialectOf(rawURL)
	if err != nil {
		return nil, err
	}
	var db *sql.DB
	switch d {
	case SQLite:
		_, path, _ := strings.Cut(rawURL, ":")
		db, err = sql.Open("sqlite", path+"?_pragma=busy_timeout(30000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate")
	case Postgres:
		db, err = sql.Open("pgx", normalizePostgres(rawURL))
	default:
		var s *mssql.Store
		if s, err = mssql.Open(ctx, rawURL); err == nil {
			db = s.DB()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", d, err)
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	return db, nil
}
