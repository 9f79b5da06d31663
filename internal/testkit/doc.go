// Package testkit gates the tests that need a service the machine may not
// have (PostgreSQL, SQL Server, Service Bus, a browser): a test skips,
// naming the variable to set, unless SBCLAIM_TEST_REQUIRE names the
// service, and then it fails. Its sub-packages are the rest of the test
// machinery, kept apart from what ships: testdb (fresh databases per
// test), membus (an in-memory Service Bus), fakedownstream (an idempotent
// downstream), chaos (the chaos harness and the benchmarks) and
// testissuer (an OpenID Connect issuer whose key the test generates).
package testkit
