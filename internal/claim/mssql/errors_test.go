package mssql

import (
	"context"
	"crypto/tls"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	mssqldb "github.com/microsoft/go-mssqldb"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// Messages as SQL Server (English) formats them.
const (
	dupClaims2601 = "Cannot insert duplicate key row in object 'dbo.Claims' with unique index 'UX_Claims_MessageId_Consumer'. The duplicate key value is (m-1, billing)."
	dupOther2601  = "Cannot insert duplicate key row in object 'dbo.Claims' with unique index 'UX_Claims_SubjectKey'. The duplicate key value is (same subject)."
	dupClaims2627 = "Violation of UNIQUE KEY constraint 'UX_Claims_MessageId_Consumer'. Cannot insert duplicate key in object 'dbo.Claims'. The duplicate key value is (m-1, billing)."
	dupPK2627     = "Violation of PRIMARY KEY constraint 'PK_Claims'. Cannot insert duplicate key in object 'dbo.Claims'. The duplicate key value is (7)."
)

func TestInterpretError(t *testing.T) {
	sqlErr := func(n int32, msg string) mssqldb.Error { return mssqldb.Error{Number: n, Class: 14, Message: msg} }
	tests := []struct {
		name        string
		err         error
		duplicate   bool
		unavailable bool
	}{
		{"2601 on the claims index", sqlErr(2601, dupClaims2601), true, false},
		{"2601 wrapped", fmt.Errorf("insert: %w", sqlErr(2601, dupClaims2601)), true, false},
		{"2601 as pointer", &mssqldb.Error{Number: 2601, Message: dupClaims2601}, true, false},
		{"2627 on the claims index", sqlErr(2627, dupClaims2627), true, false},
		{"2601 on another index", sqlErr(2601, dupOther2601), false, false},
		{"2627 on the primary key", sqlErr(2627, dupPK2627), false, false},
		{
			// The key value is data: a subject that quotes the claims
			// index's name must not make another index's violation a
			// duplicate.
			"2601 on another index whose key value names the claims index",
			sqlErr(2601, "Cannot insert duplicate key row in object 'dbo.Claims' with unique index 'UX_Claims_SubjectKey'. The duplicate key value is ('UX_Claims_MessageId_Consumer')."),
			false, false,
		},
		{"other number naming the index", sqlErr(1913, "The operation failed because an index or statistics with name 'UX_Claims_MessageId_Consumer' already exists"), false, false},
		{
			"2601 earlier in the request's error list",
			mssqldb.Error{Number: 3621, Message: "The statement has been terminated.", All: []mssqldb.Error{sqlErr(2601, dupClaims2601), {Number: 3621, Message: "The statement has been terminated."}}},
			true, false,
		},
		{"net.OpError", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, false, true},
		{"wrapped net.OpError", fmt.Errorf("query: %w", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}), false, true},
		{"DNS error", &net.DNSError{Err: "no such host", Name: "sql.example", IsNotFound: true}, false, true},
		{"driver.ErrBadConn", driver.ErrBadConn, false, true},
		{"sql.ErrConnDone", sql.ErrConnDone, false, true},
		{"io.EOF", io.EOF, false, true},
		{"io.ErrUnexpectedEOF", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), false, true},
		{"database closed", errors.New("sql: database is closed"), false, true},
		{"deadline", fmt.Errorf("query: %w", context.DeadlineExceeded), false, true},
		{"cancelled", fmt.Errorf("query: %w", context.Canceled), false, false},
		{"stream error", mssqldb.StreamError{InnerError: errors.New("unexpected token")}, false, true},
		{"server error", mssqldb.ServerError{}, false, true},
		{"tls record header", tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, false, true},
		{"tls handshake reset, formatted with %v", errors.New("TLS Handshake failed: read tcp 10.0.0.1:5000->10.0.0.2:1433: read: connection reset by peer"), false, true},
		{"tls certificate not trusted", errors.New("TLS Handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority"), false, false},
		{"send failed, formatted with %v", errors.New("failed to send RPC: write tcp: broken pipe"), false, true},
		{"commit send failed, formatted with %v (sic)", errors.New("faild to send CommitXact: write tcp: broken pipe"), false, true},
		{"4060 cannot open database", sqlErr(4060, "login error: Cannot open database \"sbclaim\" requested by the login. The login failed."), false, true},
		{"40613 database unavailable", sqlErr(40613, "Database 'sbclaim' on server 'x' is not currently available."), false, true},
		{"40197 service error", sqlErr(40197, "The service has encountered an error processing your request."), false, true},
		{"40501 service busy", sqlErr(40501, "The service is currently busy."), false, true},
		{"49918 not enough resources", sqlErr(49918, "Cannot process request. Not enough resources to process request."), false, true},
		{"1205 deadlock victim", sqlErr(1205, "Transaction (Process ID 52) was deadlocked on lock resources with another process and has been chosen as the deadlock victim. Rerun the transaction."), false, true},
		{"18456 login failed is configuration", sqlErr(18456, "login error: Login failed for user 'sbclaim'."), false, false},
		{"229 permission denied", sqlErr(229, "The DELETE permission was denied on the object 'Claims'."), false, false},
		{"syntax error", sqlErr(102, "Incorrect syntax near 'FROM'."), false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := interpretError(tc.err)
			if d := errors.Is(got, claim.ErrDuplicate); d != tc.duplicate {
				t.Errorf("ErrDuplicate = %v, want %v (%v)", d, tc.duplicate, got)
			}
			if u := errors.Is(got, claim.ErrUnavailable); u != tc.unavailable {
				t.Errorf("ErrUnavailable = %v, want %v (%v)", u, tc.unavailable, got)
			}
			if !errors.Is(got, tc.err) && !errors.As(got, new(mssqldb.Error)) {
				t.Errorf("translated error %v lost the original %v", got, tc.err)
			}
		})
	}
	if interpretError(nil) != nil {
		t.Error("interpretError(nil) != nil")
	}
	// Translating twice does not wrap twice.
	once := interpretError(mssqldb.Error{Number: 2601, Message: dupClaims2601})
	if twice := interpretError(once); twice != once {
		t.Errorf("second translation changed the error: %v", twice)
	}
}

func TestDuplicateErrorKeepsTheDriverError(t *testing.T) {
	err := interpretError(fmt.Errorf("claim batch: %w", mssqldb.Error{Number: 2601, Message: dupClaims2601}))
	var e mssqldb.Error
	if !errors.As(err, &e) || e.Number != 2601 {
		t.Fatalf("errors.As(mssql.Error) on %v: %v", err, e)
	}
}

func TestIsDeadlock(t *testing.T) {
	if !isDeadlock(fmt.Errorf("x: %w", mssqldb.Error{Number: 1205})) {
		t.Error("1205 is a deadlock")
	}
	if isDeadlock(mssqldb.Error{Number: 2601, Message: dupClaims2601}) || isDeadlock(errors.New("deadlock")) {
		t.Error("only error 1205 is a deadlock")
	}
}
