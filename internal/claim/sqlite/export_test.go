package sqlite

import (
	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/sqlstore"
)

// OverviewQueries returns Overview's statements and their arguments, for
// the plan tests.
func OverviewQueries(p *claim.OverviewParams) (names, sqls []string, args [][]any, err error) {
	o, err := sqlstore.ValidateOverview(p)
	if err != nil {
		return nil, nil, nil, err
	}
	for _, q := range overviewQueries(o) {
		names, sqls, args = append(names, q.name), append(sqls, q.sql), append(args, q.args)
	}
	return names, sqls, args, nil
}
