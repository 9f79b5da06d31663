// Package sqlite is the claim.Store for SQLite (modernc.org/sqlite, pure
// Go): the embedded default for local runs, demos and tests.
//
// Deployment: one process per SQLite file. The store serialises all its
// statements on one connection (SetMaxOpenConns(1)), which is how SQLite
// behaves anyway (one writer at a time) and which makes ":memory:"
// databases work. TryLock is a process-wide lock keyed by the database file
// path, so it only excludes other stores in the same process.
//
// Because of the single connection, a ClaimTx callback must use only the
// transaction it is given: calling the store from inside it would wait for
// the connection the transaction holds.
//
// Round trips: SQLite is embedded, so there is no network round trip.
// ClaimBatch runs one transaction holding one multi-row
// INSERT ... ON CONFLICT DO NOTHING RETURNING and, when some keys already
// existed, one SELECT of those rows.
//
// Times are stored as TEXT written by strftime('%Y-%m-%dT%H:%M:%f',now):
// UTC, millisecond precision, fixed width so text order is time order. The
// now is SQLite's own 'now' (the machine clock, the same for a whole
// statement), unless a simulation switched the store to Go's time.Now()
// (UseGoClock: a testing/synctest bubble's fake clock; see clock.go).
package sqlite
