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

// transientNumbers are server errors after which nothing was written and
// the same request can succeed later: the database is (briefly) not there,
// or the statement was chosen as a deadlock victim / timed out on a lock
// and rolled back. They become claim.ErrUnavailable, which makes the
// processor abandon the message for redelivery.
var transientNumbers = map[int32]bool{
	errDeadlockVictim: true,
	1222:              true, // lock request time out period exceeded
	4060:              true, // cannot open database requested by the login
	4221:              true, // login to read-secondary failed: long wait on HADR_DATABASE_WAIT_FOR_TRANSITION_TO_VERSIONING
	10928:             true, // resource ID: the request limit for the database has been reached
	10929:             true, // resource ID: minimum guarantee not available
	40143:             true, // the service has encountered an error processing your request
	40197:             true, // the service has encountered an error processing your request (failover)
	40501:             true, // the service is currently busy
	40540:             true, // the service has encountered an error processing your request
	40613:             true, // database is not currently available
	42108:             true, // cannot connect to the SQL pool since it is paused
	42109:             true, // the SQL pool is warming up
	49918:             true, // cannot process request: not enough resources
	49919:             true, // cannot process create or update request: too many operations in progress
	49920:             true, // cannot process request: too many operations in progress
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
//   - a connection that cannot be made or broke (network errors,
//     driver.ErrBadConn, io.EOF, a corrupt TDS stream, a fatal server error
//     that severed the session, Azure SQL's transient errors, a deadline that
//     expired while waiting for the server): claim.ErrUnavailable.
//   - everything else (login failed, permission denied, bad SQL, a
//     cancelled context): unchanged.
func interpretError(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, claim.ErrDuplicate) || errors.Is(err, claim.ErrUnavailable) {
		return err // already translated
	}
	if isClaimsDuplicate(err) {
		return fmt.Errorf("%w: %w", claim.ErrDuplicate, err)
	}
	if isUnavailable(err) {
		return fmt.Errorf("%w: %w", claim.ErrUnavailable, err)
	}
	return err
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
// key value is (...)."), which is message data and could contain any text,
// so only the part before it is searched, for the quoted index name.
// (A server in another language has other wording; then the whole message
// is searched, still for the name in quotes.)
func namesClaimsIndex(msg string) bool {
	if i := strings.Index(msg, "The duplicate key value is"); i >= 0 {
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

func isUnavailable(err error) bool {
	if errors.Is(err, context.Canceled) {
		return false // the caller gave up (shutdown): not the database's fault
	}
	if isCertificateError(err) || strings.Contains(err.Error(), "x509:") {
		return false // a TLS configuration problem: retrying will not help
	}
	if errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		sqlstore.ErrClosedDB(err) {
		return true
	}
	var (
		netErr    net.Error
		streamErr mssqldb.StreamError
		serverErr mssqldb.ServerError
		tlsHeader tls.RecordHeaderError
	)
	if errors.As(err, &netErr) || errors.As(err, &streamErr) || errors.As(err, &serverErr) || errors.As(err, &tlsHeader) {
		return true
	}
	for _, e := range sqlErrors(err) {
		if transientNumbers[e.Number] {
			return true
		}
	}
	msg := err.Error()
	for _, s := range brokenConnTexts {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
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
