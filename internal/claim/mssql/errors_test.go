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
	"strings"
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
	const (
		none       = claim.ClassNone
		connection = claim.ClassConnection
		busy       = claim.ClassBusy
		failover   = claim.ClassFailover
		timeout    = claim.ClassTimeout
		deadlock   = claim.ClassDeadlock
		lock       = claim.ClassLockTimeout
		readOnly   = claim.ClassReadOnly
		noSpace    = claim.ClassNoSpace
		permission = claim.ClassPermission
	)
	tests := []struct {
		name      string
		err       error
		duplicate bool
		class     claim.Class
	}{
		{"2601 on the claims index", sqlErr(2601, dupClaims2601), true, none},
		{"2601 wrapped", fmt.Errorf("insert: %w", sqlErr(2601, dupClaims2601)), true, none},
		{"2601 as pointer", &mssqldb.Error{Number: 2601, Message: dupClaims2601}, true, none},
		{"2627 on the claims index", sqlErr(2627, dupClaims2627), true, none},
		{"2601 on another index", sqlErr(2601, dupOther2601), false, none},
		{"2627 on the primary key", sqlErr(2627, dupPK2627), false, none},
		{
			// The key value is data: a subject that quotes the claims
			// index's name must not make another index's violation a
			// duplicate.
			"2601 on another index whose key value names the claims index",
			sqlErr(2601, "Cannot insert duplicate key row in object 'dbo.Claims' with unique index 'UX_Claims_SubjectKey'. The duplicate key value is ('UX_Claims_MessageId_Consumer')."),
			false, none,
		},
		{"other number naming the index", sqlErr(1913, "The operation failed because an index or statistics with name 'UX_Claims_MessageId_Consumer' already exists"), false, none},
		{
			"2601 earlier in the request's error list",
			mssqldb.Error{Number: 3621, Message: "The statement has been terminated.", All: []mssqldb.Error{sqlErr(2601, dupClaims2601), {Number: 3621, Message: "The statement has been terminated."}}},
			true, none,
		},
		{
			"1205 earlier in the request's error list",
			mssqldb.Error{Number: 3621, Message: "The statement has been terminated.", All: []mssqldb.Error{sqlErr(1205, "deadlocked"), {Number: 3621}}},
			false, deadlock,
		},
		{"net.OpError", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, false, connection},
		{"wrapped net.OpError", fmt.Errorf("query: %w", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}), false, connection},
		{"net timeout", &net.OpError{Op: "read", Net: "tcp", Err: timeoutErr{}}, false, timeout},
		{"DNS error", &net.DNSError{Err: "no such host", Name: "sql.example", IsNotFound: true}, false, connection},
		{"driver.ErrBadConn", driver.ErrBadConn, false, connection},
		{"sql.ErrConnDone", sql.ErrConnDone, false, connection},
		{"io.EOF", io.EOF, false, connection},
		{"io.ErrUnexpectedEOF", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), false, connection},
		{"database closed", errors.New("sql: database is closed"), false, connection},
		{"deadline", fmt.Errorf("query: %w", context.DeadlineExceeded), false, timeout},
		{"cancelled", fmt.Errorf("query: %w", context.Canceled), false, none},
		{"stream error", mssqldb.StreamError{InnerError: errors.New("unexpected token")}, false, connection},
		{"server error", mssqldb.ServerError{}, false, connection},
		{"tls record header", tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, false, connection},
		{"tls handshake reset, formatted with %v", errors.New("TLS Handshake failed: read tcp 10.0.0.1:5000->10.0.0.2:1433: read: connection reset by peer"), false, connection},
		{"tls certificate not trusted", errors.New("TLS Handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority"), false, none},
		{"send failed, formatted with %v", errors.New("failed to send RPC: write tcp: broken pipe"), false, connection},
		{"commit send failed, formatted with %v (sic)", errors.New("faild to send CommitXact: write tcp: broken pipe"), false, connection},
		{"1205 deadlock victim", sqlErr(1205, "Transaction (Process ID 52) was deadlocked on lock resources with another process and has been chosen as the deadlock victim. Rerun the transaction."), false, deadlock},
		{"3960 snapshot update conflict", sqlErr(3960, "Snapshot isolation transaction aborted due to update conflict."), false, deadlock},
		{"1222 lock timeout", sqlErr(1222, "Lock request time out period exceeded."), false, lock},
		{"3906 read-only database", sqlErr(3906, "Failed to update database \"sbclaim\" because the database is read-only."), false, readOnly},
		{"40544 size quota", sqlErr(40544, "The database 'sbclaim' has reached its size quota."), false, noSpace},
		{"9002 log full", sqlErr(9002, "The transaction log for database 'sbclaim' is full due to 'LOG_BACKUP'."), false, noSpace},
		{"1105 filegroup full", sqlErr(1105, "Could not allocate space for object 'dbo.Claims' in database 'sbclaim' because the 'PRIMARY' filegroup is full."), false, noSpace},
		{"229 permission denied", sqlErr(229, "The INSERT permission was denied on the object 'Claims'."), false, permission},
		{"18456 login failed", sqlErr(18456, "login error: Login failed for user 'sbclaim'."), false, permission},
		{"syntax error", sqlErr(102, "Incorrect syntax near 'FROM'."), false, none},
		{"2628 string truncation", sqlErr(2628, "String or binary data would be truncated."), false, none},
	}
	// Every number of the contract, with its class.
	numbers := map[int32]claim.Class{
		64: connection, 233: connection, 10053: connection, 10054: connection, 10060: connection,
		40501: busy, 10928: busy, 10929: busy, 10936: busy, 49918: busy, 49919: busy, 49920: busy,
		1204: busy, 8645: busy, 8651: busy, 17197: busy,
		40613: failover, 40197: failover, 40143: failover, 40540: failover, 4060: failover, 4221: failover,
		615: failover, 921: failover, 926: failover, 976: failover, 983: failover, 42108: failover, 42109: failover,
		1205: deadlock, 3960: deadlock, 3966: deadlock, 41301: deadlock, 41302: deadlock, 41305: deadlock,
		41325: deadlock, 41839: deadlock,
		1222:  lock,
		3906:  readOnly,
		40544: noSpace, 1105: noSpace, 1101: noSpace, 1132: noSpace, 9002: noSpace,
		229: permission, 230: permission, 262: permission, 297: permission, 300: permission, 916: permission, 18456: permission,
	}
	for n, c := range numbers {
		tests = append(tests, struct {
			name      string
			err       error
			duplicate bool
			class     claim.Class
		}{fmt.Sprintf("number %d", n), sqlErr(n, "m"), false, c})
	}
	if len(numberClasses) != len(numbers) {
		t.Errorf("numberClasses has %d numbers; the test lists %d", len(numberClasses), len(numbers))
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := interpretError(tc.err)
			if d := errors.Is(got, claim.ErrDuplicate); d != tc.duplicate {
				t.Errorf("ErrDuplicate = %v, want %v (%v)", d, tc.duplicate, got)
			}
			if c := claim.ClassOf(got); c != tc.class {
				t.Errorf("class %s, want %s (%v)", c, tc.class, got)
			}
			for _, s := range []error{claim.ErrUnavailable, claim.ErrAborted, claim.ErrRefused} {
				if errors.Is(got, s) != (s == tc.class.Sentinel()) {
					t.Errorf("errors.Is(%v, %v) = %v", got, s, errors.Is(got, s))
				}
			}
			if !errors.Is(got, tc.err) && !errors.As(got, new(mssqldb.Error)) {
				t.Errorf("translated error %v lost the original %v", got, tc.err)
			}
			if again := interpretError(got); again.Error() != got.Error() || claim.ClassOf(again) != tc.class {
				t.Errorf("second translation changed the error: %v", again)
			}
		})
	}
	if interpretError(nil) != nil {
		t.Error("interpretError(nil) != nil")
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

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

// The texts of errors 2601 and 2627 as SQL Server documents them (the
// English sys.messages entries), with their placeholders: %.*ls is a name
// the engine fills in, %ls the constraint kind or the duplicate key value,
// which the engine writes in parentheses ("(m-1, billing)").
const (
	text2601 = "Cannot insert duplicate key row in object '%.*ls' with unique index '%.*ls'. The duplicate key value is %ls."
	text2627 = "Violation of %ls constraint '%.*ls'. Cannot insert duplicate key in object '%.*ls'. The duplicate key value is %ls."
)

// sqlMessage fills a message text's placeholders in order, as the engine
// does (no quoting or escaping of what it fills in).
func sqlMessage(text string, args ...string) string {
	var b strings.Builder
	for i := 0; ; i++ {
		j := strings.Index(text, "%")
		if j < 0 {
			b.WriteString(text)
			break
		}
		b.WriteString(text[:j])
		text = text[j:]
		for _, ph := range []string{"%.*ls", "%ls"} {
			if strings.HasPrefix(text, ph) {
				b.WriteString(args[i])
				text = text[len(ph):]
				break
			}
		}
	}
	return b.String()
}

// Only the index name in its own place counts: the duplicate key value at
// the end is message data, and a key that quotes the claims index's name,
// or repeats the message's own wording, must not make another index's
// violation a duplicate, nor hide the claims index's own.
func TestNamesClaimsIndex(t *testing.T) {
	if got, want := sqlMessage(text2601, "dbo.Claims", claimsIndex, "(m-1, billing)"), dupClaims2601; got != want {
		t.Fatalf("sqlMessage:\n %s\nwant\n %s", got, want)
	}
	const (
		other = "UX_Claims_SubjectKey"
		// tail is a key value that repeats a 2601 message's wording,
		// naming the claims index in quotes.
		tail = "(x'. with unique index '" + claimsIndex + "'. The duplicate key value is (m-1, billing), billing)"
	)
	for _, tc := range []struct {
		name   string
		number int32
		msg    string
		want   bool
	}{
		{"2601, claims index", 2601, sqlMessage(text2601, "dbo.Claims", claimsIndex, "(m-1, billing)"), true},
		{"2627, claims index as a UNIQUE KEY constraint", 2627, sqlMessage(text2627, "UNIQUE KEY", claimsIndex, "dbo.Claims", "(m-1, billing)"), true},
		{"2601, claims index, key names another index in quotes and repeats the wording", 2601,
			sqlMessage(text2601, "dbo.Claims", claimsIndex, "(The duplicate key value is '"+other+"', billing)"), true},
		{"2601, claims index, key with quotes and parentheses", 2601, sqlMessage(text2601, "dbo.Claims", claimsIndex, "(it's (a) ')', billing)"), true},
		{"2627, claims index, key repeats a whole message", 2627, sqlMessage(text2627, "UNIQUE KEY", claimsIndex, "dbo.Claims", tail), true},

		{"2601, another index", 2601, sqlMessage(text2601, "dbo.Claims", other, "(same subject)"), false},
		{"2601, another index, key is the claims index's name in quotes", 2601, sqlMessage(text2601, "dbo.Claims", other, "('"+claimsIndex+"')"), false},
		{"2601, another index, key repeats the wording naming the claims index", 2601, sqlMessage(text2601, "dbo.Claims", other, tail), false},
		{"2601, an index whose name starts with the claims index's", 2601, sqlMessage(text2601, "dbo.Claims", claimsIndex+"_Old", "(m-1, billing)"), false},
		{"2627, another UNIQUE KEY constraint, key names the claims index", 2627, sqlMessage(text2627, "UNIQUE KEY", "UQ_Claims_Subject", "dbo.Claims", "(it's '"+claimsIndex+"')"), false},
		{"2627, primary key", 2627, sqlMessage(text2627, "PRIMARY KEY", "PK_Claims", "dbo.Claims", "(7)"), false},
		{"2627, primary key, key repeats the wording naming the claims index", 2627, sqlMessage(text2627, "PRIMARY KEY", "PK_Claims", "dbo.Claims", tail), false},

		// A session in another language has other wording, unknown here
		// (these stand-ins are not real translations); the names are
		// still quoted and the engine still writes the key value last,
		// in parentheses.
		{"other language, claims index", 2601, "[xx] 'dbo.Claims' '" + claimsIndex + "' [xx] (m-1, billing).", true},
		{"other language, another index, key names the claims index", 2601, "[xx] 'dbo.Claims' '" + other + "' [xx] ('" + claimsIndex + "', billing).", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := namesClaimsIndex(tc.msg); got != tc.want {
				t.Errorf("namesClaimsIndex = %v, want %v for\n %s", got, tc.want, tc.msg)
			}
			err := interpretError(fmt.Errorf("claim batch: %w", mssqldb.Error{Number: tc.number, Class: 14, State: 1, Message: tc.msg}))
			if errors.Is(err, claim.ErrDuplicate) != tc.want {
				t.Errorf("interpretError: ErrDuplicate %v, want %v (%v)", errors.Is(err, claim.ErrDuplicate), tc.want, err)
			}
			if !tc.want && claim.ClassOf(err) != claim.ClassNone {
				t.Errorf("another index's violation classified %s, want a plain error", claim.ClassOf(err))
			}
			var e mssqldb.Error
			if !errors.As(err, &e) || e.Message != tc.msg {
				t.Errorf("the driver's error is lost: %v", err)
			}
			// The same text under any other number is not a duplicate.
			if errors.Is(interpretError(mssqldb.Error{Number: 2628, Message: tc.msg}), claim.ErrDuplicate) {
				t.Error("error 2628 with this text is a duplicate")
			}
		})
	}
}
