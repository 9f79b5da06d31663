package operator

import (
	"fmt"
	"io/fs"

	sqlfiles "github.com/sbclaim/sbclaim/sql"
)

// Migrations returns one dialect's migrations ("sqlserver", "postgres" or
// "sqlite"), goose-formatted SQL files, for a user's own migration
// pipeline.
func Migrations(dialect string) (fs.FS, error) {
	switch dialect {
	case "sqlserver", "postgres", "sqlite":
		return sqlfiles.Dialect(dialect)
	}
	return nil, fmt.Errorf("operator: unknown dialect %q: want sqlserver, postgres or sqlite", dialect)
}
