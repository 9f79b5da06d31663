// Package sqlite links the SQLite claims store into a program. Import it
// for its effect:
//
//	import _ "github.com/sbclaim/sbclaim/store/sqlite"
//
// and sbclaim.OpenStore and sbclaim.Migrate open and migrate sqlite: URLs
// ("sqlite:/path/claims.db"; "sqlite::memory:" starts migrated, for
// tests). The driver is modernc.org/sqlite, pure Go (no cgo); the
// migrations are goose's, embedded. One process per database file: the
// store keeps one connection, and its locks exclude only the stores of
// the same process.
package sqlite

import (
	"context"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/sqlite"
	"github.com/sbclaim/sbclaim/internal/claimdb/dialect"
)

func init() {
	dialect.Register(dialect.SQLite, dialect.Driver{
		Open: func(ctx context.Context, url string) (claim.Store, error) {
			s, err := sqlite.Open(ctx, url)
			if err != nil {
				return nil, err
			}
			return s, nil
		},
		Migrate: func(ctx context.Context, url string) error {
			s, err := sqlite.Open(ctx, url)
			if err != nil {
				return err
			}
			defer s.Close()
			return sqlite.Migrate(ctx, s.DB())
		},
	})
}
