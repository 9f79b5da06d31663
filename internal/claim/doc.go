// Package claim is the protocol of sbclaim: the claims table's model and
// states, the Store every database implements, and the sentinels stores
// translate driver errors into.
//
// A claim is a marker row, unique per (MessageID, Consumer), committed
// before an external effect runs. Exactly one replica's insert wins; the
// others see a duplicate and complete their copy of the message. See
// docs/design.md ("Protocol", "States") for the per-message protocol and the
// states.
//
// # Errors: the store error contract
//
// Every Store method translates the driver's error at the store boundary
// into an *Error carrying one Class; the Class decides the sentinel the
// error wraps (errors.Is) and whether the failure concerns ONE CALL or the
// WHOLE STORE. The driver's error stays in the chain (errors.As still finds
// *pgconn.PgError, mssql.Error, *sqlite.Error). An error that is none of
// these (bad input, a unique violation of another index, a syntax error, a
// cancelled context) carries no class: ClassOf returns ClassNone.
//
//	| class        | sentinel       | scope | transient | meaning                                                      | SQL Server                                                                  | PostgreSQL                                 | SQLite                                      |
//	|--------------|----------------|-------|-----------|--------------------------------------------------------------|-----------------------------------------------------------------------------|--------------------------------------------|---------------------------------------------|
//	| connection   | ErrUnavailable | store | yes       | connection lost or cannot be made; the database cannot be opened | network errors, EOF, bad conn, TLS record, severed session (ServerError), broken TDS stream; 64, 233, 10053, 10054, 10060 | 08xxx, 57P05; connect errors, net errors, EOF, bad conn | CANTOPEN, IOERR, NOTADB, CORRUPT; bad conn, closed pool |
//	| busy         | ErrUnavailable | store | yes       | throttled, out of workers/sessions/connections/memory        | 40501, 10928, 10929, 10936, 49918, 49919, 49920, 1204, 8645, 8651, 17197     | 53000, 53200, 53300                        | BUSY (after the busy timeout), NOMEM, PROTOCOL |
//	| failover     | ErrUnavailable | store | yes       | failing over, restarting, not currently available            | 40613, 40197, 40143, 40540, 4060, 4221, 615, 921, 926, 976, 983, 42108, 42109 | 57P01, 57P02, 57P03                        | —                                           |
//	| timeout      | ErrUnavailable | store | yes       | the server did not answer before the deadline                | context deadline, network timeout                                           | context deadline, pgconn timeout           | context deadline                            |
//	| deadlock     | ErrAborted     | call  | yes       | deadlock victim, serialization or write conflict: rolled back | 1205, 3960, 3966, 41301, 41302, 41305, 41325, 41839                         | 40P01, 40001                               | BUSY_SNAPSHOT                               |
//	| lock_timeout | ErrAborted     | call  | yes       | lock wait or statement timeout: rolled back                  | 1222                                                                        | 55P03, 57014                               | LOCKED                                      |
//	| read_only    | ErrRefused     | store | no        | read-only database or transaction (geo-secondary, standby)   | 3906                                                                        | 25006                                      | READONLY (read-only file or connection)     |
//	| no_space     | ErrRefused     | store | no        | out of space or size quota, log full                         | 40544, 1105, 1101, 1132, 9002                                               | 53100                                      | FULL                                        |
//	| permission   | ErrRefused     | store | no        | missing grant, login refused                                 | 229, 230, 262, 297, 300, 916, 18456                                         | 42501, 28000, 28P01                        | PERM, AUTH                                  |
//
// What a caller does with each scope:
//
//   - call (ErrAborted): nothing was written; retry the SAME call a few
//     times after a short pause. The store is healthy: keep receiving.
//   - store, transient (ErrUnavailable): stop taking new work (do not
//     receive, do not abandon messages one by one), probe with backoff,
//     resume when the store answers. The call in flight may or may not
//     have committed.
//   - store, not transient (ErrRefused): the same as ErrUnavailable for
//     the flow of work, but it will not clear by itself: alert. Ping (a
//     read) may succeed; probe with a write (for example Heartbeat of a
//     claim that does not exist, which answers ErrStateChanged on a
//     writable store and ErrRefused on a refusing one).
//
// StoreWide(err) is true for both store-wide sentinels; Transient(err) for
// the ones expected to clear by themselves; ClassOf(err) names the class
// for logs and metric labels.
package claim
