// Package store opens the claims store named by a database URL, so the
// binaries select a database by configuration alone:
//
//	sqlite:/var/lib/sbclaim/claims.db   (sqlite::memory: for tests)
//	postgres://user:pass@host:5432/db?sslmode=require  (or postgresql://)
//	sqlserver://user:pass@host:1433?database=sbclaim
//
// Errors never contain the URL's password: an unknown scheme is named, the
// URL is not echoed.
package store

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
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
	DialectSQLite    Dialect = "sqlite"
	DialectPostgres  Dialect = "postgres"
	DialectSQLServer Dialect = "sqlserver"
)

var schemeRE = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]{0,30}$`)

// DialectOf returns the dialect of a database URL, or an error naming the
// unsupported scheme (never the URL itself).
func DialectOf(rawURL string) (Dialect, error) {
	scheme, _, ok := strings.Cut(rawURL, ":")
	if !ok || scheme == "" {
		return "", errors.New("database URL has no scheme (want sqlite:, postgres://, postgresql:// or sqlserver://)")
	}
	switch strings.ToLower(scheme) {
	case "sqlite":
		return DialectSQLite, nil
	case "postgres", "postgresql":
		return DialectPostgres, nil
	case "sqlserver":
		return DialectSQLServer, nil
	}
	if !schemeRE.MatchString(scheme) {
		return "", errors.New("database URL has an unrecognisable scheme (want sqlite:, postgres://, postgresql:// or sqlserver://)")
	}
	return "", fmt.Errorf("unsupported database URL scheme %q (want sqlite:, postgres://, postgresql:// or sqlserver://)", scheme)
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
	case DialectSQLite:
		s, err := sqlite.Open(ctx, rawURL)
		if err != nil {
			return nil, err
		}
		return s, nil
	case DialectPostgres:
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

// Migrate applies the embedded migrations of the URL's dialect to the
// database it names, then closes the connection. It is idempotent, and
// safe to run from several replicas at once on PostgreSQL and SQL Server
// (goose takes a database lock).
func Migrate(ctx context.Context, rawURL string) error {
	d, err := DialectOf(rawURL)
	if err != nil {
		return err
	}
	switch d {
	case DialectSQLite:
		s, err := sqlite.Open(ctx, rawURL)
		if err != nil {
			return err
		}
		defer s.Close()
		return sqlite.Migrate(ctx, s.DB())
	case DialectPostgres:
		s, err := postgres.Open(ctx, normalizePostgres(rawURL))
		if err != nil {
			return err
		}
		defer s.Close()
		return postgres.Migrate(ctx, s.DB())
	default:
		s, err := mssql.Open(ctx, rawURL)
		if err != nil {
			return err
		}
		defer s.Close()
		return mssql.Migrate(ctx, s.DB())
	}
}

// Redact returns the URL with its password (user info or a password /
// pwd query parameter) replaced, for logs and error messages.
func Redact(rawURL string) string {
	if d, err := DialectOf(rawURL); err == nil && d == DialectSQLite {
		return rawURL // a file path has no secrets
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		if d, derr := DialectOf(rawURL); derr == nil {
			return string(d) + ":(unparseable URL redacted)"
		}
		return "(unparseable URL redacted)"
	}
	q := u.Query()
	changed := false
	for k := range q {
		switch strings.ToLower(k) {
		case "password", "pwd", "sharedaccesskey", "accountkey":
			q.Set(k, "xxxxx")
			changed = true
		}
	}
	if changed {
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}
