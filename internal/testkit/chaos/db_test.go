package chaos

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	mssqldb "github.com/microsoft/go-mssqldb"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claimdb"
)

// The SQL Server path of OpenDatabase, as far as it goes without a server
// (the build machines have none; TestChaosSQLServer and the sqlserver
// scenarios run it against one when SBCLAIM_TEST_SQLSERVER_URL is set).
func TestOpenDatabaseSQLServerUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Port 1 on loopback refuses connections: the SQL Server branch is
	// taken (not "unsupported database URL") and fails on the connection.
	_, err := OpenDatabase(ctx, "sqlserver://sa:topsecret@127.0.0.1:1?database=x&dial+timeout=5")
	if err == nil {
		t.Fatal("OpenDatabase of an unreachable SQL Server succeeded")
	}
	if strings.Contains(err.Error(), "unsupported") || strings.Contains(err.Error(), "topsecret") || !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("error %v: want the store's unavailable error, without the password", err)
	}
	_, err = OpenDatabase(ctx, "mysql://u:topsecret@h/db")
	if err == nil || !strings.Contains(err.Error(), "sqlserver://") || strings.Contains(err.Error(), "topsecret") {
		t.Fatalf("unsupported URL: %v", err)
	}
}

func TestSQLServerDialectSQL(t *testing.T) {
	if ph := placeholders(claimdb.SQLServer); ph(1) != "@p1" || ph(2) != "@p2" {
		t.Errorf("placeholders: %s %s", ph(1), ph(2))
	}
	if keyType(claimdb.SQLServer) != "NVARCHAR(128)" || keyType(claimdb.Postgres) != "VARCHAR(128)" {
		t.Error("keyType")
	}
	for n, want := range map[int32]bool{2601: true, 2627: true, 547: false} {
		if got := isUniqueViolation(mssqldb.Error{Number: n}); got != want {
			t.Errorf("isUniqueViolation(%d) = %v", n, got)
		}
	}
}
