package chaos

import (
	"strings"
	"testing"

	"github.com/sbclaim/sbclaim/internal/testkit"
)

// TestGatedRunsFailFastWithoutSQLServer runs the chaos runs gated on
// SBCLAIM_TEST_SQLSERVER_URL with it pointed where nothing answers: each
// must fail at once naming the variable and the cause.
func TestGatedRunsFailFastWithoutSQLServer(t *testing.T) {
	t.Parallel()
	out := testkit.RunGated(t, "^(TestChaosSQLServer|TestScenarios)$/^sqlserver", map[string]string{sqlServerURLEnv: testkit.UnreachableSQLServer})
	for _, want := range []string{
		"--- FAIL: TestChaosSQLServer", "--- FAIL: TestScenarios/sqlserver/two-phase",
		sqlServerURLEnv + ": chaos: open", "connection refused",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the run without SQL Server does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "not-a-password") {
		t.Error("the output shows the URL's password")
	}
}
