package mssql

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	mssqldb "github.com/microsoft/go-mssqldb"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/sqlstore"
)

// claimsIndex is the name of the claims unique index. SQL Server names it
// in the text of errors 2601 ("Cannot insert duplicate key row in object
// 'dbo.Claims' with unique index 'UX_Claims_MessageId_Consumer'...") and
// 2627 ("Violation of UNIQUE KEY constraint '...'"); go-mssqldb has no
// constraint-name field, so the message is the only place to find it.
const claimsIndex = "UX_Claims_MessageId_Consumer"

// SQL Server error numbers the store classifies.
const (
	errDupKeyIndex      = 2601 // duplicate key row in a unique index
	errDupKeyConstraint = 2627 // violation of a PRIMARY KEY / UNIQUE constraint
	errDeadlockVictim   = 1205
)

// numberClasses classifies SQL Server / Azure SQL error numbers (see the
// error contract in package claim). Sources: the Azure SQL "transient
// fault" and "resource governance" tables (troubleshoot-common-errors-
// issues), SqlClient's and EF Core's transient lists, and the engine's
// error reference.
var numberClasses = map[int32]claim.Class{
	// Client-side network errors that SqlClient reports as numbers; listed
	// for servers and proxies that relay them.
	64:    claim.ClassConnection, // an error occurred during the login process (network name no longer available)
	233:   claim.ClassConnection, // error during connection initialisation before login
	10053: claim.ClassConnection, // transport-level error: connection aborted
	10054: claim.ClassConnection, // transport-level error: connection reset by the remote host
	10060: claim.ClassConnection, // network-related error: connection attempt timed out

	40501: claim.ClassBusy, // the service is currently busy (throttling)
	10928: claim.ClassBusy, // resource ID %d: the request/session limit for the database has been reached
	10929: claim.ClassBusy, // resource ID %d: minimum guarantee; the server is too busy
	10936: claim.ClassBusy, // resource ID %d: the request limit for the elastic pool has been reached
	49918: claim.ClassBusy, // cannot process request: not enough resources
	49919: claim.ClassBusy, // cannot process create or update request: too many operations in progress
	49920: claim.ClassBusy, // cannot process request: too many operations in progress
	1204:  claim.ClassBusy, // cannot obtain a LOCK resource at this time
	8645:  claim.ClassBusy, // timeout waiting for memory resources to execute the query
	8651:  claim.ClassBusy, // requested memory grant not available in the resource pool
	17197: claim.ClassBusy, // login failed due to timeout (heavy server load)

	40613: claim.ClassFailover, // database is not currently available
	40197: claim.ClassFailover, // the service has encountered an error processing your request (failover, upgrade)
	40143: claim.ClassFailover, // the service has encountered an error processing your request
	40540: claim.ClassFailover, // the service has encountered an error processing your request
	4060:  claim.ClassFailover, // cannot open database requested by the login (being moved, failing over)
	4221:  claim.ClassFailover, // login to read-secondary failed: HADR_DATABASE_WAIT_FOR_TRANSITION_TO_VERSIONING
	615:   claim.ClassFailover, // could not find database ID (stale cache during a detach/attach)
	921:   claim.ClassFailover, // database has not been recovered yet
	926:   claim.ClassFailover, // database cannot be opened, marked SUSPECT (last stage of a reconfiguration)
	976:   claim.ClassFailover, // availability database not accessible for queries (replica changing roles)
	983:   claim.ClassFailover, // availability database replica not in the PRIMARY or SECONDARY role
	42108: claim.ClassFailover, // cannot connect to the SQL pool: paused
	42109: claim.ClassFailover, // the SQL pool is warming up

	errDeadlockVictim: claim.ClassDeadlock, // chosen as deadlock victim, transaction rolled back
	3960:              claim.ClassDeadlock, // snapshot isolation transaction aborted due to update conflict
	3966:              claim.ClassDeadlock, // transaction rolled back accessing the version store
	41301:             claim.ClassDeadlock, // in-memory OLTP dependency failure
	41302:             claim.ClassDeadlock, // in-memory OLTP update conflict
	41305:             claim.ClassDeadlock, // in-memory OLTP repeatable read validation failure
	41325:             claim.ClassDeadlock, // in-memory OLTP serializable validation failure
	41839:             claim.ClassDeadlock, // transaction exceeded the maximum number of commit dependencies

	1222: claim.ClassLockTimeout, // lock request time out period exceeded (SET LOCK_TIMEOUT)

	3906: claim.ClassReadOnly, // failed to update database because the database is read-only (geo-secondary)

	40544: claim.ClassNoSpace, // the database has reached its size quota
	1105:  claim.ClassNoSpace, // could not allocate space: filegroup full
	1101:  claim.ClassNoSpace, // could not allocate a new page: insufficient disk space in filegroup
	1132:  claim.ClassNoSpace, // the elastic pool has reached its storage limit
	9002:  claim.ClassNoSpace, // the transaction log for the database is full

	229:   claim.ClassPermission, // the %ls permission was denied on the object
	230:   claim.ClassPermission, // the %ls permission was denied on the column
	262:   claim.ClassPermission, // %ls permission denied in database
	297:   claim.ClassPermission, // the user does not have permission to perform this action
	300:   claim.ClassPermission, // %ls permission was denied on object (server-level)
	916:   claim.ClassPermission, // the server principal is not able to access the database under the current security context
	18456: claim.ClassPermission, // login failed for user
}

// brokenConnTexts are fragments of errors that go-mssqldb formats with %v
// (losing the error's type) when the connection breaks while it sends a
// request or a transaction command, or during login.
var brokenConnTexts = []string{
	"failed to send SQL Batch",
	"failed to send RPC",
	"faild to send CommitXact", // sic, go-mssqldb v1.11.2
	"failed to send CommitXact",
	"failed to send RollbackXact",
	"failed to send BeginXact",
	"TLS Handshake failed",
	"connection reset by peer",
	"broken pipe",
	"i/o timeout",
}

// interpretError translates a go-mssqldb / database/sql error into the claim
// sentinels, keeping the original in the chain (errors.As still finds the
// mssql.Error):
//
//   - 2601/2627 naming the claims unique index: claim.ErrDuplicate. A unique
//     violation of any other index or constraint stays a plain error.
//   - a server error whose number (or the number of another error of the
//     same request) numberClasses lists: that class.
//   - a deadline that expired while waiting for the server, a network
//     timeout: claim.ClassTimeout.
//   - a connection that cannot be made or broke (network errors,
//     driver.ErrBadConn, io.EOF, a corrupt TDS stream, a fatal server error
//     that severed the session): claim.ClassConnection.
//   - everything else (a certificate that does not verify, bad SQL, a
//     cancelled context): unchanged.
func interpretError(err error) error {
	if err == nil {
		return nil
	}
	var ce *claim.Error
	if errors.As(err, &ce) || errors.Is(err, claim.ErrDuplicate) {
		return err // already translated
	}
	if isClaimsDuplicate(err) {
		return fmt.Errorf("%w: %w", claim.ErrDuplicate, err)
	}
	return claim.NewError(classify(err), err)
}

// sqlErrors returns the server errors in err: the one go-mssqldb reports
// and every other error of the same request (mssql.Error.All).
func sqlErrors(err error) []mssqldb.Error {
	var e mssqldb.Error
	if !errors.As(err, &e) {
		var pe *mssqldb.Error
		if !errors.As(err, &pe) || pe == nil {
			return nil
		}
		e = *pe
	}
	if len(e.All) == 0 {
		return []mssqldb.Error{e}
	}
	return append([]mssqldb.Error{e}, e.All...)
}

// isClaimsDuplicate reports whether err is a unique violation of the
// claims index, and only of that index.
func isClaimsDuplicate(err error) bool {
	for _, e := range sqlErrors(err) {
		if (e.Number == errDupKeyIndex || e.Number == errDupKeyConstraint) && namesClaimsIndex(e.Message) {
			return true
		}
	}
	return false
}

// namesClaimsIndex reports whether a 2601/2627 message names the claims
// index. The message ends with the duplicate key's value ("The duplicate
// key value is (...)."), which is message data and could contain any text
// (the index's name in quotes, the message's own wording), so only the
// part before it is searched, for the quoted index name. The key value is
// cut at the wording when it is English, and in any language at its
// opening parenthesis, which the engine writes itself: the names before
// it (dbo.Claims, the index) have none. A session in another language
// whose wording put a parenthesis before the names would make a real
// duplicate an error (the message goes back to the broker, loudly),
// never another index's violation a duplicate (completed silently).
func namesClaimsIndex(msg string) bool {
	if i := strings.Index(msg, "The duplicate key value is"); i >= 0 {
		msg = msg[:i]
	}
	if i := strings.IndexByte(msg, '('); i >= 0 {
		msg = msg[:i]
	}
	return strings.Contains(msg, "'"+claimsIndex+"'")
}

// isDeadlock reports whether err says this statement was a deadlock
// victim (and was rolled back).
func isDeadlock(err error) bool {
	for _, e := range sqlErrors(err) {
		if e.Number == errDeadlockVictim {
			return true
		}
	}
	return false
}

// classify returns the error class of err (claim.ClassNone when it is
// not a classified store failure).
func classify(err error) claim.Class {
	if errors.Is(err, context.Canceled) {
		return claim.ClassNone // the caller gave up (shutdown): not the database's fault
	}
	for _, e := range sqlErrors(err) {
		if c, ok := numberClasses[e.Number]; ok {
			return c
		}
	}
	if isCertificateError(err) || strings.Contains(err.Error(), "x509:") {
		return claim.ClassNone // a TLS configuration problem: retrying will not help
	}
	var netErr net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout()) {
		return claim.ClassTimeout
	}
	if errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		sqlstore.ErrClosedDB(err) {
		return claim.ClassConnection
	}
	var (
		streamErr mssqldb.StreamError
		serverErr mssqldb.ServerError
		tlsHeader tls.RecordHeaderError
	)
	if errors.As(err, &netErr) || errors.As(err, &streamErr) || errors.As(err, &serverErr) || errors.As(err, &tlsHeader) {
		return claim.ClassConnection
	}
	msg := err.Error()
	for _, s := range brokenConnTexts {
		if strings.Contains(msg, s) {
			return claim.ClassConnection
		}
	}
	return claim.ClassNone
}

// isCertificateError reports whether err is a server certificate that did
// not verify (wrong CA, host name, expired): configuration, not an outage.
func isCertificateError(err error) bool {
	var (
		verifyErr   *tls.CertificateVerificationError
		authErr     x509.UnknownAuthorityError
		hostErr     x509.HostnameError
		invalidCert x509.CertificateInvalidError
	)
	return errors.As(err, &verifyErr) || errors.As(err, &authErr) || errors.As(err, &hostErr) || errors.As(err, &invalidCert)
}
