package chaos

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

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/mssql"
	"github.com/sbclaim/sbclaim/internal/store"
)

// Dialect names the database kind of a run.
type Dialect string

// Supported dialects.
const (
	DialectSQLite    Dialect = "sqlite"
	DialectPostgres  Dialect = "postgres"
	DialectSQLServer Dialect = "sqlserver"
)

// Database is a claims database prepared for one run: its own SQLite file,
// its own PostgreSQL schema or its own SQL Server database, so runs never
// see each other's rows.
type Database struct {
	Dialect Dialect
	// URL is the store URL of this run's database (a PostgreSQL URL carries
	// search_path for the run's schema). Redacted by String.
	URL   string
	Store claim.Store

	cleanup []func()
}

// String returns a description of the database without credentials.
func (d *Database) String() string { return Redact(d.URL) }

// OpenDB opens a plain database/sql handle on the run's database (for the
// scenarios' and benchmarks' own tables). maxConns bounds the pool.
func (d *Database) OpenDB(maxConns int) (*sql.DB, error) {
	var (
		db  *sql.DB
		err error
	)
	switch d.Dialect {
	case DialectSQLite:
		path := strings.TrimPrefix(d.URL, "sqlite:")
		db, err = sql.Open("sqlite", path+"?_pragma=busy_timeout(30000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate")
	case DialectPostgres:
		db, err = sql.Open("pgx", d.URL)
	case DialectSQLServer:
		// The product's opener: the same URL handling (Entra ID, app
		// name) as the store. Its pool limits are replaced below.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var s *mssql.Store
		if s, err = mssql.Open(ctx, d.URL); err == nil {
			db = s.DB()
		}
	default:
		err = fmt.Errorf("unknown dialect %q", d.Dialect)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", d.Dialect, err)
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	return db, nil
}

// Close closes the store and removes the run's file or schema.
func (d *Database) Close() error {
	var err error
	if d.Store != nil {
		err = d.Store.Close()
	}
	for i := len(d.cleanup) - 1; i >= 0; i-- {
		d.cleanup[i]()
	}
	return err
}

// OpenDatabase prepares a fresh claims database for a run from rawURL:
// "" (a SQLite file in a new temporary directory), "sqlite:/path/file.db"
// (that file, which must not exist yet, or is reused as is), a
// "postgres://" URL (a new schema chaos_<random> in that database, dropped
// by Close) or a "sqlserver://" URL (a new database sbclaim_chaos_<random>
// on that server, READ_COMMITTED_SNAPSHOT on as on Azure SQL Database,
// dropped by Close; the login needs CREATE DATABASE), migrated and opened
// with the product's store.
func OpenDatabase(ctx context.Context, rawURL string) (*Database, error) {
	d := &Database{}
	switch {
	case rawURL == "":
		dir, err := os.MkdirTemp("", "sbclaim-chaos-")
		if err != nil {
			return nil, err
		}
		d.cleanup = append(d.cleanup, func() { os.RemoveAll(dir) })
		d.Dialect, d.URL = DialectSQLite, "sqlite:"+filepath.Join(dir, "claims.db")
	case strings.HasPrefix(rawURL, "sqlite:"):
		if strings.Contains(rawURL, ":memory:") {
			return nil, errors.New("chaos: sqlite::memory: cannot be shared by the harness's connections; give a file path or leave -db empty")
		}
		d.Dialect, d.URL = DialectSQLite, rawURL
	case strings.HasPrefix(rawURL, "postgres://"), strings.HasPrefix(rawURL, "postgresql://"):
		d.Dialect = DialectPostgres
		u, drop, err := newPostgresSchema(ctx, rawURL)
		if err != nil {
			return nil, err
		}
		d.cleanup = append(d.cleanup, drop)
		d.URL = u
	case strings.HasPrefix(strings.ToLower(rawURL), "sqlserver://"):
		d.Dialect = DialectSQLServer
		u, drop, err := newSQLServerDatabase(ctx, rawURL)
		if err != nil {
			return nil, err
		}
		d.cleanup = append(d.cleanup, drop)
		d.URL = u
	default:
		return nil, fmt.Errorf("chaos: unsupported database URL %s (want sqlite:..., postgres://... or sqlserver://...)", Redact(rawURL))
	}
	s, err := openStore(ctx, d.Dialect, d.URL)
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("chaos: open store %s: %w", Redact(d.URL), err)
	}
	d.Store = s
	return d, nil
}

// newPostgresSchema creates a schema with a random name and returns rawURL
// with search_path set to it, and a func that drops it.
func newPostgresSchema(ctx context.Context, rawURL string) (string, func(), error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "chaos_" + hex.EncodeToString(b[:])
	db, err := sql.Open("pgx", rawURL)
	if err != nil {
		return "", nil, fmt.Errorf("chaos: open postgres: %w", err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		return "", nil, fmt.Errorf("chaos: create schema %s on %s: %w", schema, Redact(rawURL), err)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", nil, fmt.Errorf("chaos: parse postgres URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	drop := func() {
		db, err := sql.Open("pgx", rawURL)
		if err != nil {
			return
		}
		defer db.Close()
		_, _ = db.ExecContext(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	}
	return u.String(), drop, nil
}

// sqlServerDatabaseName returns a fresh name for a run's database.
func sqlServerDatabaseName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "sbclaim_chaos_" + hex.EncodeToString(b[:])
}

// withSQLServerDatabase returns rawURL with its database (database= or
// "initial catalog=", any case) set to name.
func withSQLServerDatabase(rawURL, name string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", errors.New("chaos: sql server URL is not a valid URL")
	}
	q := u.Query()
	for k := range q {
		if strings.EqualFold(k, "database") || strings.EqualFold(k, "initial catalog") {
			q.Del(k)
		}
	}
	q.Set("database", name)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// newSQLServerDatabase creates a database with a random name on the server
// of rawURL (as internal/testdb does for tests) and returns the URL that
// selects it, and a func that drops it.
func newSQLServerDatabase(ctx context.Context, rawURL string) (string, func(), error) {
	name := sqlServerDatabaseName()
	u, err := withSQLServerDatabase(rawURL, name)
	if err != nil {
		return "", nil, err
	}
	admin, err := mssql.Open(ctx, rawURL)
	if err != nil {
		return "", nil, fmt.Errorf("chaos: open sql server: %w", err)
	}
	quoted := "[" + name + "]"
	if _, err := admin.DB().ExecContext(ctx, "CREATE DATABASE "+quoted+";"); err != nil {
		admin.Close()
		return "", nil, fmt.Errorf("chaos: create database %s on %s: %w", name, Redact(rawURL), err)
	}
	drop := func() {
		defer admin.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// Ends sessions still in the database; not supported on Azure SQL
		// Database, where the DROP alone works once the pools are closed.
		_, _ = admin.DB().ExecContext(ctx, "ALTER DATABASE "+quoted+" SET SINGLE_USER WITH ROLLBACK IMMEDIATE;")
		_, _ = admin.DB().ExecContext(ctx, "DROP DATABASE "+quoted+";")
	}
	// Azure SQL Database's default, and the harder case for the claim
	// insert (see mssql.Store.ClaimBatch). Already on (and refused) on
	// Azure SQL Database itself.
	_, _ = admin.DB().ExecContext(ctx, "ALTER DATABASE "+quoted+" SET READ_COMMITTED_SNAPSHOT ON WITH ROLLBACK IMMEDIATE;")
	return u, drop, nil
}

// Redact hides the secrets of a database URL (the user info's password, a
// password= or pwd= parameter).
func Redact(raw string) string { return store.Redact(raw) }
