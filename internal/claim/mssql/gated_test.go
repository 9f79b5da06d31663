package mssql

import (
	"strings"
	"testing"

	"github.com/sbclaim/sbclaim/internal/testkit"
)

// TestGatedSuitesFailFastWithoutSQLServer runs the whole package with
// SBCLAIM_TEST_SQLSERVER_URL pointed where nothing answers: the tests
// gated on it (the conformance suite, the migrations, the chunking) must
// fail at once naming the variable and the cause, so that they cannot
// rot unnoticed while no SQL Server runs them; the others still pass.
func TestGatedSuitesFailFastWithoutSQLServer(t *testing.T) {
	out := testkit.RunGated(t, ".", map[string]string{URLEnv: testkit.UnreachableSQLServer})
	for _, want := range []string{
		"--- FAIL: TestConformance", "--- FAIL: TestMigrateIsIdempotent", "--- FAIL: TestLargeBatchIsChunked",
		URLEnv + ": open admin connection", "connection refused",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the run without SQL Server does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "to run the sqlserver tests") {
		t.Errorf("a test skipped for want of SQL Server although %s names sqlserver:\n%s", testkit.RequireEnv, out)
	}
	if strings.Contains(out, "not-a-password") {
		t.Error("the output shows the URL's password")
	}
}
