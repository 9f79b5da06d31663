// Package sqlserver links the SQL Server (and Azure SQL Database) claims
// store into a program. Import it for its effect:
//
//	import _ "github.com/sbclaim/sbclaim/store/sqlserver"
//
// and sbclaim.OpenStore and sbclaim.Migrate open and migrate sqlserver://
// URLs ("sqlserver://user:pass@host:1433?database=db"; Entra ID with
// &fedauth=ActiveDirectoryDefault). The driver is go-mssqldb; the
// migrations are goose's, embedded, and take a database lock, so replicas
// may migrate at once.
package sqlserver

import (
	"context"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/mssql"
	"github.com/sbclaim/sbclaim/internal/claimdb/dialect"
)

func init() {
	dialect.Register(dialect.SQLServer, dialect.Driver{
		Open: func(ctx context.Context, url string) (claim.Store, error) {
			s, err := mssql.Open(ctx, url)
			if err != nil {
				return nil, err
			}
			return s, nil
		},
		Migrate: func(ctx context.Context, url string) error {
			s, err := mssql.Open(ctx, url)
			if err != nil {
				return err
			}
			defer s.Close()
			return mssql.Migrate(ctx, s.DB())
		},
	})
}
