// Package dialect reads a claims database URL without a database driver:
// it tells the dialect from the scheme, checks the URL, and keeps the
// registry of the stores linked into the program. The public packages
// store/sqlite, store/postgres and store/sqlserver register their
// dialect here when imported, so that the root package opens any URL
// whose store the program imports, and links no driver itself:
//
//	sqlite:/var/lib/sbclaim/claims.db   (sqlite::memory: for tests)
//	postgres://user:pass@host:5432/db?sslmode=require  (or postgresql://)
//	sqlserver://user:pass@host:1433?database=sbclaim
//
// Errors never contain the URL's password: an unknown scheme is named, the
// URL is not echoed.
package dialect

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"

	"github.com/sbclaim/sbclaim/internal/claim"
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

// Of returns the dialect of a database URL, or an error naming the
// unsupported scheme (never the URL itself).
func Of(rawURL string) (Dialect, error) {
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
	d, err := Of(rawURL)
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

// NormalizePostgres lets the scheme's case vary (pgx wants lower case).
func NormalizePostgres(rawURL string) string {
	scheme, rest, _ := strings.Cut(rawURL, ":")
	return strings.ToLower(scheme) + ":" + rest
}

// Driver is what a store package registers for its dialect.
type Driver struct {
	// Open opens the claims store a URL of the dialect names.
	Open func(ctx context.Context, rawURL string) (claim.Store, error)
	// Migrate applies the dialect's embedded migrations to the database
	// a URL names.
	Migrate func(ctx context.Context, rawURL string) error
}

var (
	mu      sync.RWMutex
	drivers = map[Dialect]Driver{}
)

// Register makes a dialect's store available to Lookup. A store package
// calls it from its init; registering a dialect twice panics, as
// database/sql.Register does.
func Register(d Dialect, drv Driver) {
	if drv.Open == nil || drv.Migrate == nil {
		panic("dialect: Register " + string(d) + " without Open or Migrate")
	}
	mu.Lock()
	defer mu.Unlock()
	if _, dup := drivers[d]; dup {
		panic("dialect: Register called twice for " + string(d))
	}
	drivers[d] = drv
}

// Package is the import path of the public package that registers d.
func Package(d Dialect) string {
	return "github.com/sbclaim/sbclaim/store/" + string(d)
}

// Lookup returns the registered store of the URL's dialect, or an error
// naming the package to import when none is linked into the program.
func Lookup(rawURL string) (Dialect, Driver, error) {
	d, err := Of(rawURL)
	if err != nil {
		return "", Driver{}, err
	}
	mu.RLock()
	drv, ok := drivers[d]
	mu.RUnlock()
	if !ok {
		return d, Driver{}, fmt.Errorf("no %s store is linked into this program: import _ %q", d, Package(d))
	}
	return d, drv, nil
}
