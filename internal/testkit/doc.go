// Package testkit gates the tests that need a service the machine may not
// have (PostgreSQL, SQL Server, Service Bus, a browser): a test skips,
// naming the variable to set, unless SBCLAIM_TEST_REQUIRE names the
// service, and then it fails. So that a gated suite cannot rot while
// nothing runs it, CheckServiceBus makes a Service Bus suite fail at once,
// naming the variable and the cause, when its namespace does not answer,
// and RunGated re-runs gated tests in a child process against addresses
// where nothing answers, on every test run, to prove they still build,
// find their fixtures and fail fast. Its sub-packages are the rest of the
// test machinery, kept apart from what ships: testdb (fresh databases per
// test), membus (an in-memory Service Bus), fakedownstream (an idempotent
// downstream), chaos (the chaos harness and the benchmarks) and
// testissuer (an OpenID Connect issuer whose key the test generates).
package testkit
