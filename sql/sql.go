// Package sql embeds the claims table migrations, one directory per
// dialect (sql/sqlserver, sql/postgres, sql/sqlite), so the binaries can
// migrate a database without files on disk. sql/grants holds the SQL
// Server roles a deployment creates by hand.
//
// Users do not import this package: sbclaim.Migrate runs the migrations,
// and operator.Migrations returns one dialect's files for a user's own
// goose pipeline. Inside the module it is imported under the name sqlfiles,
// beside database/sql.
//
// The migrations are plain SQL files run by pressly/goose/v3. Each dialect
// creates the same tables: the claims, with a sequential bigint key, the
// unique index on (message id, consumer) that is the only arbiter of
// duplicates, a partial index over unfinished claims for the reconciler
// and a partial index over finished claims for the purge; (00004) the
// claims' append-only history, one row per change of a claim's owner or
// state, indexed by claim; and (00009) the claims' follow-up messages (the
// outbox), keyed by claim and position, with a partial index over the
// pending ones.
package sql

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
