package testkit

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// RequireEnv is the environment variable that turns "service not
// configured" skips into failures (comma-separated service names:
// postgres, sqlserver, servicebus, browser). CI sets it so a silent skip
// cannot pass.
const RequireEnv = "SBCLAIM_TEST_REQUIRE"

// PostgresURLEnv holds the PostgreSQL URL the tests use.
const PostgresURLEnv = "SBCLAIM_TEST_POSTGRES_URL"

// RequireOrSkip returns the value of envVar. When it is unset, the test is
// skipped with a message naming the variable, or fails when RequireEnv
// names service.
func RequireOrSkip(t testing.TB, service, envVar string) string {
	t.Helper()
	if v := os.Getenv(envVar); v != "" {
		return v
	}
	if Required(service) {
		t.Fatalf("%s is required (%s=%q) but %s is not set", service, RequireEnv, os.Getenv(RequireEnv), envVar)
	}
	t.Skipf("set %s to run the %s tests", envVar, service)
	return ""
}

// Required reports whether RequireEnv names service.
func Required(service string) bool {
	var names []string
	for _, s := range strings.Split(os.Getenv(RequireEnv), ",") {
		names = append(names, strings.ToLower(strings.TrimSpace(s)))
	}
	return slices.Contains(names, strings.ToLower(service))
}

// PostgresURL returns SBCLAIM_TEST_POSTGRES_URL, or skips (or fails, see
// RequireOrSkip) when it is unset.
func PostgresURL(t testing.TB) string {
	t.Helper()
	return RequireOrSkip(t, "postgres", PostgresURLEnv)
}
