package processor_test

import (
	"strings"
	"testing"

	"github.com/sbclaim/sbclaim/internal/testkit"
)

// TestGatedSuitesFailFastWithoutTheirService runs the tests gated on a
// service with its variable pointed where nothing answers: TestServiceBus
// (SBCLAIM_TEST_SERVICEBUS_CONNECTION_STRING) and the SQL Server case of
// the protocol tests (SBCLAIM_TEST_SQLSERVER_URL; every protocol test
// opens its store the same way, through testdb) must fail at once naming
// the variable and the cause, so that they cannot rot unnoticed while no
// service runs them.
func TestGatedSuitesFailFastWithoutTheirService(t *testing.T) {
	t.Parallel()
	out := testkit.RunGated(t, "^(TestServiceBus|TestSuccessPath)$/^sqlserver$", map[string]string{
		testkit.ServiceBusEnv: testkit.UnreachableServiceBus,
		testkit.SQLServerEnv:  testkit.UnreachableSQLServer,
	})
	for _, want := range []string{
		"--- FAIL: TestServiceBus ", testkit.ServiceBusEnv + ": Service Bus at sb://127.0.0.1:1 does not answer",
		"--- FAIL: TestSuccessPath/sqlserver", testkit.SQLServerEnv + ": ", "connection refused",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the run without the services does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "not-a-password") || strings.Contains(out, "not-a-key") {
		t.Error("the output shows a secret")
	}
}
