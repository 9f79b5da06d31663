package sbclaim

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/sbclaim/sbclaim/internal/bridge"
	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claimdb/dialect"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

func init() {
	bridge.StoreOf = func(s any) claim.Store { return s.(*Store).s }
	bridge.NewStore = func(s claim.Store) any { return &Store{s: s} }
	bridge.NewClaim = func(c *claim.Claim) any { return publicClaim(c) }
	bridge.RouterOf = func(r any) sideeffects.Router { return r.(*Router).internal() }
	bridge.NewRouter = func(r sideeffects.Router) any {
		return &Router{entries: []sideeffects.Router{r}, names: map[string]bool{}}
	}
	bridge.NewRoutesFile = func(path string, r *sideeffects.HTTPRouter) any { return &RoutesFile{path: path, r: r} }
}

// Store is the claims table: SQL Server, PostgreSQL or SQLite. It is safe
// for concurrent use; one Store serves a processor and a reconciler in the
// same program.
type Store struct {
	s       claim.Store
	dialect string
}

// OpenStore opens the claims store a URL names:
//
//	sqlserver://user:pass@host:1433?database=db   (Entra ID: &fedauth=ActiveDirectoryDefault)
//	postgres://user:pass@host:5432/db
//	sqlite:/path/to/claims.db                       (sqlite::memory: for tests)
//
// The program imports the store of each dialect it opens, for its effect
// (this package links no database driver):
//
//	import _ "github.com/sbclaim/sbclaim/store/sqlite" // or store/postgres, store/sqlserver
//
// and a URL whose store is not imported is refused with an error naming
// the package. OpenStore does not create the schema (except for
// sqlite::memory:, which starts migrated): run Migrate once per database.
// Errors never contain the URL's password.
func OpenStore(ctx context.Context, url string) (*Store, error) {
	d, drv, err := dialect.Lookup(url)
	if err != nil {
		return nil, fmt.Errorf("sbclaim: open store: %w", err)
	}
	s, err := drv.Open(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("sbclaim: open store: %w", err)
	}
	return &Store{s: s, dialect: string(d)}, nil
}

// Migrate creates or upgrades the claims table in the database a URL
// names, with the migrations embedded in this module (sql/<dialect>/),
// through the store the program imports (see OpenStore). It is
// idempotent, and safe to run from several replicas at once on PostgreSQL
// and SQL Server.
func Migrate(ctx context.Context, url string) error {
	_, drv, err := dialect.Lookup(url)
	if err == nil {
		err = drv.Migrate(ctx, url)
	}
	if err != nil {
		return fmt.Errorf("sbclaim: migrate: %w", err)
	}
	return nil
}

// CheckStoreURL reports what is wrong with a database URL without
// connecting (an unknown scheme, a missing host, a dialect whose store the
// program does not import), never echoing its password.
func CheckStoreURL(url string) error {
	if err := dialect.Check(url); err != nil {
		return err
	}
	_, _, err := dialect.Lookup(url)
	return err
}

// DB returns the store's database handle, for a program's own tables in
// the claims database (a TxHandlerFunc's schema, a test reading back what
// it wrote). Never write the claims table through it: every change of a
// claim is a guarded write of the store's. On SQLite the pool has one
// connection: do not hold it while a processor runs.
func (s *Store) DB() *sql.DB {
	if d, ok := s.s.(interface{ DB() *sql.DB }); ok {
		return d.DB()
	}
	return nil
}

// Dialect returns the database's dialect: "sqlserver", "postgres" or
// "sqlite" ("" for a store this module did not open), for SQL that
// differs between them. For placeholders (@p1, $1, ?), write ? and use
// Rebind.
func (s *Store) Dialect() string { return s.dialect }

// Ping checks the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.s.Ping(ctx) }

// Close releases the store's connections.
func (s *Store) Close() error { return s.s.Close() }

// errNilStore is returned by constructors given no store.
var errNilStore = errors.New("sbclaim: a Store is required (OpenStore)")
