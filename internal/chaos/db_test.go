package chaos

import (
	"context"
	"errors"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	mssqldb "github.com/microsoft/go-mssqldb"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// The SQL Server path of OpenDatabase, as far as it goes without a server
// (the build machines have none; TestChaosSQLServer and the sqlserver
// scenarios run it against one when SBCLAIM_TEST_SQLSERVER_URL is set).

func TestSQLServerDatabaseName(t *testing.T) {
	re := regexp.MustCompile(`^sbclaim_chaos_[0-9a-f]{12}$`)
	a, b := sqlServerDatabaseName(), sqlServerDatabaseName()
	if !re.MatchString(a) || !re.MatchString(b) || a == b {
		t.Fatalf("names %q, %q: want sbclaim_chaos_<12 hex>, different per run", a, b)
	}
}

func TestWithSQLServerDatabase(t *testing.T) {
	for _, raw := range []string{
		"sqlserver://sa:p%40ss@db.example:1433?encrypt=true",
		"sqlserver://sa:p%40ss@db.example:1433?database=sbclaim&encrypt=true",
		"sqlserver://sa:p%40ss@db.example:1433?Database=sbclaim&encrypt=true",
		"sqlserver://sa:p%40ss@db.example:1433?initial+catalog=sbclaim&encrypt=true",
	} {
		got, err := withSQLServerDatabase(raw, "sbclaim_chaos_0123456789ab")
		if err != nil {
			t.Fatal(err)
		}
		u, err := url.Parse(got)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		var dbKeys []string
		for k := range q {
			if strings.EqualFold(k, "database") || strings.EqualFold(k, "initial catalog") {
				dbKeys = append(dbKeys, k)
			}
		}
		if len(dbKeys) != 1 || q.Get("database") != "sbclaim_chaos_0123456789ab" || q.Get("encrypt") != "true" ||
			u.Host != "db.example:1433" || u.User.String() != "sa:p%40ss" {
			t.Errorf("%s -> %s (database keys %v)", raw, got, dbKeys)
		}
	}
	if _, err := withSQLServerDatabase("sqlserver://%zz", "x"); err == nil || strings.Contains(err.Error(), "%zz") {
		t.Errorf("bad URL: %v", err)
	}
}

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
	if ph := placeholders(DialectSQLServer); ph(1) != "@p1" || ph(2) != "@p2" {
		t.Errorf("placeholders: %s %s", ph(1), ph(2))
	}
	if keyType(DialectSQLServer) != "NVARCHAR(128)" || keyType(DialectPostgres) != "VARCHAR(128)" {
		t.Error("keyType")
	}
	for n, want := range map[int32]bool{2601: true, 2627: true, 547: false} {
		if got := isUniqueViolation(mssqldb.Error{Number: n}); got != want {
			t.Errorf("isUniqueViolation(%d) = %v", n, got)
		}
	}
	if Redact("sqlserver://sa:topsecret@h?password=also") != "sqlserver://sa:xxxxx@h?password=xxxxx" {
		t.Errorf("Redact: %s", Redact("sqlserver://sa:topsecret@h?password=also"))
	}
}
