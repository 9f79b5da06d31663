package chaos

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claimdb"
)

// Database is a claims database prepared for one run (a claimdb.Scratch:
// its own SQLite file, PostgreSQL schema or SQL Server database, so runs
// never see each other's rows), opened with the product's store.
type Database struct {
	*claimdb.Scratch
	Store claim.Store
}

// OpenDB opens a plain database/sql handle on the run's database (for the
// scenarios' and benchmarks' own tables). maxConns bounds the pool.
func (d *Database) OpenDB(maxConns int) (*sql.DB, error) {
	return claimdb.OpenDB(context.Background(), d.URL, maxConns)
}

// Close closes the store and removes the run's file, schema or database.
func (d *Database) Close() error {
	var err error
	if d.Store != nil {
		err = d.Store.Close()
	}
	if cerr := d.Scratch.Close(); err == nil {
		err = cerr
	}
	return err
}

// OpenDatabase prepares a fresh claims database for a run from rawURL
// (see claimdb.NewScratch: "" is a SQLite file in a new temporary
// directory; a postgres:// URL gets a new schema, a sqlserver:// URL a new
// database, both named sbclaim_chaos_<random> and dropped by Close),
// migrated and opened with the product's store, which all replicas of the
// run share.
func OpenDatabase(ctx context.Context, rawURL string) (*Database, error) {
	sc, err := claimdb.NewScratch(ctx, rawURL, claimdb.ScratchOptions{Prefix: "sbclaim_chaos"})
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	s, err := claimdb.Open(ctx, sc.URL)
	if err != nil {
		sc.Close()
		return nil, fmt.Errorf("chaos: open store %s: %w", sc, err)
	}
	return &Database{Scratch: sc, Store: s}, nil
}
