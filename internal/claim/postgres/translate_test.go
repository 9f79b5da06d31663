package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// TestTranslate checks the PostgreSQL half of the error contract (see
// package claim): every SQLSTATE the contract names, and the client-side
// failures, map to their class; the driver's error stays in the chain.
func TestTranslate(t *testing.T) {
	pg := func(code string) error { return &pgconn.PgError{Severity: "ERROR", Code: code, Message: "m " + code} }
	tests := []struct {
		name  string
		err   error
		class claim.Class
	}{
		{"08006 connection failure", pg("08006"), claim.ClassConnection},
		{"08001 cannot connect", pg("08001"), claim.ClassConnection},
		{"08P01 protocol violation", pg("08P01"), claim.ClassConnection},
		{"57P05 idle session timeout", pg("57P05"), claim.ClassConnection},
		{"53000 insufficient resources", pg("53000"), claim.ClassBusy},
		{"53200 out of memory", pg("53200"), claim.ClassBusy},
		{"53300 too many connections", pg("53300"), claim.ClassBusy},
		{"57P01 admin shutdown", pg("57P01"), claim.ClassFailover},
		{"57P02 crash shutdown", pg("57P02"), claim.ClassFailover},
		{"57P03 cannot connect now", pg("57P03"), claim.ClassFailover},
		{"40P01 deadlock", pg("40P01"), claim.ClassDeadlock},
		{"40001 serialization failure", pg("40001"), claim.ClassDeadlock},
		{"55P03 lock not available", pg("55P03"), claim.ClassLockTimeout},
		{"57014 statement timeout", pg("57014"), claim.ClassLockTimeout},
		{"25006 read-only transaction", pg("25006"), claim.ClassReadOnly},
		{"53100 disk full", pg("53100"), claim.ClassNoSpace},
		{"42501 insufficient privilege", pg("42501"), claim.ClassPermission},
		{"28000 invalid authorization", pg("28000"), claim.ClassPermission},
		{"28P01 invalid password", pg("28P01"), claim.ClassPermission},
		{"wrapped 40P01", fmt.Errorf("mark processed: %w", pg("40P01")), claim.ClassDeadlock},
		{"42601 syntax error", pg("42601"), claim.ClassNone},
		{"23505 on another index", &pgconn.PgError{Code: "23505", ConstraintName: "ux_test_subject"}, claim.ClassNone},
		{"23514 check violation", pg("23514"), claim.ClassNone},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, claim.ClassConnection},
		{"bad conn", driver.ErrBadConn, claim.ClassConnection},
		{"conn done", sql.ErrConnDone, claim.ClassConnection},
		{"EOF", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), claim.ClassConnection},
		{"closed pool", errors.New("sql: database is closed"), claim.ClassConnection},
		{"deadline", fmt.Errorf("query: %w", context.DeadlineExceeded), claim.ClassTimeout},
		{"net timeout", &net.OpError{Op: "read", Net: "tcp", Err: timeoutErr{}}, claim.ClassTimeout},
		{"cancelled", fmt.Errorf("query: %w", context.Canceled), claim.ClassNone},
		{"plain", errors.New("boom"), claim.ClassNone},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := translate(tc.err)
			if c := claim.ClassOf(got); c != tc.class {
				t.Fatalf("class %s, want %s (%v)", c, tc.class, got)
			}
			if s := tc.class.Sentinel(); s != nil && !errors.Is(got, s) {
				t.Errorf("%v does not wrap %v", got, s)
			}
			if !errors.Is(got, tc.err) {
				t.Errorf("%v lost the original error %v", got, tc.err)
			}
			var pe *pgconn.PgError
			if errors.As(tc.err, &pe) && !errors.As(got, &pe) {
				t.Errorf("errors.As(*pgconn.PgError) fails on %v", got)
			}
			if errors.Is(got, claim.ErrDuplicate) {
				t.Errorf("%v is a duplicate", got)
			}
			if again := translate(got); again != got {
				t.Errorf("translating twice changed %v to %v", got, again)
			}
		})
	}
	dup := translate(&pgconn.PgError{Code: "23505", ConstraintName: ClaimsUniqueIndex})
	if !errors.Is(dup, claim.ErrDuplicate) || claim.ClassOf(dup) != claim.ClassNone {
		t.Errorf("claims index violation: %v (class %s)", dup, claim.ClassOf(dup))
	}
	if translate(nil) != nil {
		t.Error("translate(nil) != nil")
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }
