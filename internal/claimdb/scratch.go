package claimdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim/mssql"
	"github.com/sbclaim/sbclaim/internal/redact"
)

// A Scratch is a throwaway claims database of its own — a SQLite file in a
// new directory, a new PostgreSQL schema, or a new SQL Server database —
// so that tests and chaos runs never see each other's rows. Close removes
// it.
type Scratch struct {
	Dialect Dialect
	// URL selects the scratch database: a PostgreSQL URL carries
	// search_path for the new schema, a SQL Server URL database= for the
	// new database. It holds the base URL's credentials: show it with
	// String.
	URL string

	drop func() error
}

// ScratchOptions tune NewScratch.
type ScratchOptions struct {
	// Prefix starts the new schema's or database's name (default
	// "scratch"); a random suffix follows.
	Prefix string
	// Empty leaves the database unmigrated (for tests of the migrations).
	Empty bool
	// LockingReads leaves a SQL Server database's READ_COMMITTED_SNAPSHOT
	// off. By default it is turned on, as on Azure SQL Database, where it
	// is always on: the harder case for the claim insert.
	LockingReads bool
}

// NewScratch creates a scratch database next to the one base names:
//
//   - "" — a SQLite file in a new temporary directory;
//   - "sqlite:/path/file.db" — that file (reused as it is; Close leaves it);
//   - "postgres://..." — a new schema in that database (the login needs
//     CREATE on it);
//   - "sqlserver://..." — a new database on that server (the login needs
//     CREATE DATABASE).
//
// The database is migrated unless opts.Empty.
func NewScratch(ctx context.Context, base string, opts ScratchOptions) (*Scratch, error) {
	if opts.Prefix == "" {
		opts.Prefix = "scratch"
	}
	s := &Scratch{drop: func() error { return nil }}
	if base == "" {
		dir, err := os.MkdirTemp("", "sbclaim-"+opts.Prefix+"-")
		if err != nil {
			return nil, err
		}
		s.Dialect, s.URL = SQLite, "sqlite:"+filepath.Join(dir, "claims.db")
		s.drop = func() error { return os.RemoveAll(dir) }
	} else {
		d, err := DialectOf(base)
		if err != nil {
			return nil, err
		}
		s.Dialect = d
		switch d {
		case SQLite:
			if strings.Contains(base, ":memory:") {
				return nil, errors.New("claimdb: sqlite::memory: is one connection's database and cannot be shared; give a file path")
			}
			s.URL = base
		case Postgres:
			if s.URL, s.drop, err = newSchema(ctx, normalizePostgres(base), opts.Prefix+"_"+randomName()); err != nil {
				return nil, err
			}
		default:
			if s.URL, s.drop, err = newDatabase(ctx, base, opts.Prefix+"_"+randomName(), !opts.LockingReads); err != nil {
				return nil, err
			}
		}
	}
	if !opts.Empty {
		if err := Migrate(ctx, s.URL); err != nil {
			s.Close()
			return nil, fmt.Errorf("claimdb: migrate %s: %w", s, err)
		}
	}
	return s, nil
}

// String names the scratch database without credentials.
func (s *Scratch) String() string { return redact.URL(s.URL) }

// Close removes the scratch database (a SQLite file given by the caller
// stays). Connections to it must be closed first.
func (s *Scratch) Close() error {
	if s == nil || s.drop == nil {
		return nil
	}
	drop := s.drop
	s.drop = nil
	return drop()
}

// randomName is a lower-case suffix unique enough for concurrent runs.
func randomName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// withQuery returns rawURL with the query parameter key (any case, and
// any of aliases) set to value.
func withQuery(rawURL, key, value string, aliases ...string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", errors.New("claimdb: the database URL does not parse")
	}
	q := u.Query()
	for k := range q {
		for _, a := range append(aliases, key) {
			if strings.EqualFold(k, a) {
				q.Del(k)
			}
		}
	}
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// newSchema creates a PostgreSQL schema and returns the URL whose
// search_path selects it, and a func that drops it.
func newSchema(ctx context.Context, base, name string) (string, func() error, error) {
	u, err := withQuery(base, "search_path", name)
	if err != nil {
		return "", nil, err
	}
	db, err := sql.Open("pgx", base)
	if err != nil {
		return "", nil, fmt.Errorf("claimdb: open %s: %w", redact.URL(base), err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+name); err != nil {
		return "", nil, fmt.Errorf("claimdb: create schema %s on %s: %w", name, redact.URL(base), err)
	}
	drop := func() error {
		db, err := sql.Open("pgx", base)
		if err != nil {
			return err
		}
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := db.ExecContext(ctx, "DROP SCHEMA IF EXISTS "+name+" CASCADE"); err != nil {
			return fmt.Errorf("claimdb: drop schema %s: %w", name, err)
		}
		return nil
	}
	return u, drop, nil
}

// newDatabase creates a SQL Server database and returns the URL that
// selects it (database=, replacing any "initial catalog"), and a func that
// drops it.
func newDatabase(ctx context.Context, base, name string, snapshot bool) (string, func() error, error) {
	u, err := withQuery(base, "database", name, "initial catalog")
	if err != nil {
		return "", nil, err
	}
	admin, err := mssql.Open(ctx, base)
	if err != nil {
		return "", nil, err
	}
	quoted := "[" + name + "]"
	if _, err := admin.DB().ExecContext(ctx, "CREATE DATABASE "+quoted+";"); err != nil {
		admin.Close()
		return "", nil, fmt.Errorf("claimdb: create database %s on %s: %w", name, redact.URL(base), err)
	}
	drop := func() error {
		defer admin.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// Ends sessions still in the database; not supported on Azure SQL
		// Database, where the DROP alone works once the pools are closed.
		_, _ = admin.DB().ExecContext(ctx, "ALTER DATABASE "+quoted+" SET SINGLE_USER WITH ROLLBACK IMMEDIATE;")
		if _, err := admin.DB().ExecContext(ctx, "DROP DATABASE "+quoted+";"); err != nil {
			return fmt.Errorf("claimdb: drop database %s: %w", name, err)
		}
		return nil
	}
	if snapshot {
		// Already on (and refused) on Azure SQL Database itself.
		_, _ = admin.DB().ExecContext(ctx, "ALTER DATABASE "+quoted+" SET READ_COMMITTED_SNAPSHOT ON WITH ROLLBACK IMMEDIATE;")
	}
	return u, drop, nil
}
