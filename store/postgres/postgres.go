// Package postgres links the PostgreSQL claims store into a program.
// Import it for its effect:
//
//	import _ "github.com/sbclaim/sbclaim/store/postgres"
//
// and sbclaim.OpenStore and sbclaim.Migrate open and migrate postgres://
// and postgresql:// URLs ("postgres://user:pass@host:5432/db?sslmode=require";
// search_path selects a schema). The driver is pgx, through database/sql;
// the migrations are goose's, embedded, and take a database lock, so
// replicas may migrate at once.
package postgres

import (
	"context"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/postgres"
	"github.com/sbclaim/sbclaim/internal/claimdb/dialect"
)

func init() {
	dialect.Register(dialect.Postgres, dialect.Driver{
		Open: func(ctx context.Context, url string) (claim.Store, error) {
			s, err := postgres.Open(ctx, dialect.NormalizePostgres(url))
			if err != nil {
				return nil, err
			}
			return s, nil
		},
		Migrate: func(ctx context.Context, url string) error {
			s, err := postgres.Open(ctx, dialect.NormalizePostgres(url))
			if err != nil {
				return err
			}
			defer s.Close()
			return postgres.Migrate(ctx, s.DB())
		},
	})
}
