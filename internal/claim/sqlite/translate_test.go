package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"testing"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// TestCodeClass checks the SQLite half of the error contract (see package
// claim) for every result code it names, primary and extended.
func TestCodeClass(t *testing.T) {
	for code, want := range map[int]claim.Class{
		sqlite3.SQLITE_CANTOPEN:           claim.ClassConnection,
		sqlite3.SQLITE_CANTOPEN_ISDIR:     claim.ClassConnection,
		sqlite3.SQLITE_IOERR:              claim.ClassConnection,
		sqlite3.SQLITE_IOERR_WRITE:        claim.ClassConnection,
		sqlite3.SQLITE_NOTADB:             claim.ClassConnection,
		sqlite3.SQLITE_CORRUPT:            claim.ClassConnection,
		sqlite3.SQLITE_BUSY:               claim.ClassBusy,
		sqlite3.SQLITE_BUSY_RECOVERY:      claim.ClassBusy,
		sqlite3.SQLITE_BUSY_TIMEOUT:       claim.ClassBusy,
		sqlite3.SQLITE_NOMEM:              claim.ClassBusy,
		sqlite3.SQLITE_PROTOCOL:           claim.ClassBusy,
		sqlite3.SQLITE_BUSY_SNAPSHOT:      claim.ClassDeadlock,
		sqlite3.SQLITE_LOCKED:             claim.ClassLockTimeout,
		sqlite3.SQLITE_LOCKED_SHAREDCACHE: claim.ClassLockTimeout,
		sqlite3.SQLITE_READONLY:           claim.ClassReadOnly,
		sqlite3.SQLITE_READONLY_DBMOVED:   claim.ClassReadOnly,
		sqlite3.SQLITE_READONLY_DIRECTORY: claim.ClassReadOnly,
		sqlite3.SQLITE_FULL:               claim.ClassNoSpace,
		sqlite3.SQLITE_PERM:               claim.ClassPermission,
		sqlite3.SQLITE_AUTH:               claim.ClassPermission,
		sqlite3.SQLITE_ERROR:              claim.ClassNone,
		sqlite3.SQLITE_CONSTRAINT_CHECK:   claim.ClassNone,
		sqlite3.SQLITE_INTERRUPT:          claim.ClassNone,
		sqlite3.SQLITE_MISUSE:             claim.ClassNone,
	} {
		if got := codeClass(code); got != want {
			t.Errorf("codeClass(%d %s) = %s, want %s", code, sqlite.ErrorCodeString[code], got, want)
		}
	}
}

func TestTranslate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   error
		class claim.Class
	}{
		{"bad conn", driver.ErrBadConn, claim.ClassConnection},
		{"conn done", fmt.Errorf("x: %w", sql.ErrConnDone), claim.ClassConnection},
		{"EOF", io.EOF, claim.ClassConnection},
		{"closed", errors.New("sql: database is closed"), claim.ClassConnection},
		{"deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), claim.ClassTimeout},
		{"cancelled", context.Canceled, claim.ClassNone},
		{"plain", errors.New("boom"), claim.ClassNone},
	} {
		got := translate(tc.err)
		if c := claim.ClassOf(got); c != tc.class || !errors.Is(got, tc.err) {
			t.Errorf("%s: %v has class %s, want %s (or lost the original)", tc.name, got, c, tc.class)
		}
	}
	if translate(nil) != nil {
		t.Error("translate(nil) != nil")
	}

	// Real driver errors: a read-only connection, and unique violations.
	ctx := context.Background()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "x.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	for _, q := range []string{
		"CREATE TABLE claims (message_id TEXT, consumer TEXT, subject TEXT)",
		"CREATE UNIQUE INDEX ux ON claims (message_id, consumer)",
		"CREATE UNIQUE INDEX ux_subject ON claims (subject)",
		"INSERT INTO claims VALUES ('m', 'c', 's')",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	_, err = db.ExecContext(ctx, "INSERT INTO claims VALUES ('m', 'c', 'other')")
	if got := translate(err); !errors.Is(got, claim.ErrDuplicate) || claim.ClassOf(got) != claim.ClassNone {
		t.Errorf("claims index violation: %v", got)
	}
	_, err = db.ExecContext(ctx, "INSERT INTO claims VALUES ('n', 'c', 's')")
	if got := translate(err); err == nil || errors.Is(got, claim.ErrDuplicate) || claim.ClassOf(got) != claim.ClassNone {
		t.Errorf("other index violation: %v", got)
	}
	if _, err := db.ExecContext(ctx, "PRAGMA query_only = ON"); err != nil {
		t.Fatal(err)
	}
	_, err = db.ExecContext(ctx, "INSERT INTO claims VALUES ('x', 'c', 'x')")
	got := translate(err)
	var se *sqlite.Error
	if claim.ClassOf(got) != claim.ClassReadOnly || !errors.Is(got, claim.ErrRefused) || !errors.As(got, &se) {
		t.Errorf("write on a read-only connection: %v (class %s)", got, claim.ClassOf(got))
	}
	if again := translate(got); again != got {
		t.Errorf("translating twice changed %v", got)
	}
}
