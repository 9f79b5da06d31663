// Package schema embeds the claims table migrations, one directory per
// dialect, so the binaries can migrate a database without files on disk.
//
// The migrations are plain SQL files run by pressly/goose/v3:
//
//	migrations, _ := schema.Dialect("postgres")
//	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations)
//
// Each dialect creates the same table: a sequential bigint key, the unique
// index on (message id, consumer) that is the only arbiter of duplicates,
// a partial index over unfinished claims for the reconciler, and a partial
// index over finished claims for the purge.
package schema

import (
	"embed"
	"io/fs"
)

// FS holds every dialect's migrations under sqlserver/, postgres/ and sqlite/.
//
//go:embed sqlserver/*.sql postgres/*.sql sqlite/*.sql
var FS embed.FS

// Dialect returns the migrations of one dialect directory ("sqlserver",
// "postgres" or "sqlite") as a file system rooted at that directory.
func Dialect(name string) (fs.FS, error) {
	return fs.Sub(FS, name)
}
