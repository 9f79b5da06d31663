// Package claimdb opens the claims database a URL names: it tells the
// dialect from the URL, checks the URL, opens the product's store for it,
// applies the embedded migrations, and creates throwaway databases for
// tests and the chaos harness (Scratch). It is the one package outside the
// database drivers that reads a database URL:
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
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/mssql"
	"github.com/sbclaim/sbclaim/internal/claim/postgres"
	"github.com/sbclaim/sbclaim/internal/claim/sqlite"
)

// Dialect is the database a URL names.
type Dialect string

// The supported dialects.
const (
	SQLite    Dialect = "sqlite"
	Postgres  Dialect = "postgres"
	SQLServer Dialect = "sqlserver"
)

const want = "want sqlite:, postgres://, postgresql:// or sqlserver://"

// DialectOf returns the dialect of a database URL, or an error naming the
// unsupported scheme (never the URL itself).
func DialectOf(rawURL string) (Dialect, error) {
	scheme, _, ok := strings.Cut(rawURL, ":")
	if !ok || scheme == "" {
		return "", errors.New("database URL has no scheme (" + want + ")")
	}
	switch strings.ToLower(scheme) {
	case "sqlite":
		return SQLite, nil
	case "postgres", "postgresql":
		return Postgres, nil
	case "sqlserver":
		return SQLServer, nil
	}
	if !isScheme(scheme) {
		return "", errors.New("database URL has an unrecognisable scheme (" + want + ")")
	}
	return "", fmt.Errorf("unsupported database URL scheme %q (%s)", scheme, want)
}

// isScheme reports whether s may be shown as a URL scheme: a letter, then
// letters, digits, '+', '-' or '.' (so it cannot be part of a password).
func isScheme(s string) bool {
	if len(s) > 32 {
		return false
	}
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case i > 0 && (r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.'):
		default:
			return false
		}
	}
	return s != ""
}

// Check reports what is wrong with a database URL without connecting: an
// unsupported scheme, a sqlite: URL without a path, a server URL that does
// not parse or names no host. Configuration calls it at start-up so a bad
// URL refuses to start with a clear reason.
func Check(rawURL string) error {
	d, err := DialectOf(rawURL)
	if err != nil {
		return err
	}
	if d == SQLite {
		if _, path, _ := strings.Cut(rawURL, ":"); path == "" {
			return errors.New("sqlite: needs a file path (or :memory:)")
		}
		return nil
	}
	if !strings.Contains(rawURL, "://") {
		return fmt.Errorf("a %s URL starts %s://", d, d)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return errors.New("not a valid URL")
	}
	if u.Host == "" {
		return errors.New("the URL has no host")
	}
	return nil
}

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
func normalizePostgres(rawURL string) string {
	scheme, rest, _ := strings.Cut(rawURL, ":")
	return strings.ToLower(scheme) + ":" + rest
}

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
