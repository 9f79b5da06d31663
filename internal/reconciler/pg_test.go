package reconciler_test

import (
	"testing"

	"github.com/sbclaim/sbclaim/internal/claim/claimtest"
)

func openPostgres(t *testing.T) *testDB {
	claimtest.PostgresURL(t)
	t.Skip("TEMP: postgres store not landed yet")
	return nil
}
