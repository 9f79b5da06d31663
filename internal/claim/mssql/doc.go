// Package mssql is the SQL Server and Azure SQL Database claims store
// (dbo.Claims, migrations in sql/sqlserver), on github.com/microsoft/go-mssqldb.
//
// # Arbiter
//
// The unique nonclustered index UX_Claims_MessageId_Consumer decides who
// owns a message. Only errors 2601/2627 that name that index become
// claim.ErrDuplicate; a unique violation of anything else stays an error.
// ClaimBatch uses a set-based INSERT ... SELECT ... WHERE NOT EXISTS, no
// MERGE, no HOLDLOCK and no IGNORE_DUP_KEY, and falls back to per-key
// inserts when a concurrent claim makes the set-based INSERT fail (see
// ClaimBatch). It is correct with READ_COMMITTED_SNAPSHOT on (Azure SQL's
// default) and off (SQL Server's default).
//
// # Parameters
//
// Every parameterised statement is sent as an explicit call of
// sp_executesql whose parameter declarations the store writes from the
// column each parameter feeds (MessageId nvarchar(128), Consumer
// nvarchar(200), PayloadHash varbinary(32), Payload varbinary(max), ...),
// not from the values' lengths as go-mssqldb would: SQL Server caches a
// plan per statement text and declaration list, so one statement keeps
// one plan whatever its values (see call).
//
// # Clock
//
// Every time is written by SYSUTCDATETIME() and every age ("older than
// StaleAfter") is computed with DATEADD against it, never with a replica's
// clock.
//
// # Deadlines
//
// Pass a context with a deadline to every call. go-mssqldb can wait
// forever on a connection that broke inside a transaction
// (microsoft/go-mssqldb #407, #160); the context is the only way out, and
// the store passes the caller's context to every query. The URL's
// "connection timeout" (default 0, none) is best left alone in favour of
// context deadlines, as the driver's README recommends.
//
// # Errors
//
// Driver errors are translated where they happen, following the error
// contract of package claim (numberClasses lists every error number with
// its class): network failures, a broken TDS stream, a severed session and
// Azure SQL's transient errors (40613, 40197, 40501, 49918, ...) are
// store-wide and transient (claim.ErrUnavailable); a deadlock victim (1205)
// or lock timeout (1222) concerns the one call (claim.ErrAborted); a
// read-only database (3906), a full database or log (40544, 1105, 9002) or
// a missing grant (229, 18456, ...) is a store-wide refusal
// (claim.ErrRefused). The original error stays in the chain.
//
// # Not verified against a server on the build machines
//
// The build machines have no SQL Server. The T-SQL here is written against
// the SQL Server documentation and go-mssqldb's source; the conformance
// suite (claimtest) runs it against a real server when
// SBCLAIM_TEST_SQLSERVER_URL is set (for example the sqlserver service of
// docker-compose.yml).
package mssql
