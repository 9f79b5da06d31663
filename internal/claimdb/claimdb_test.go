package claimdb_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/postgres"
	"github.com/sbclaim/sbclaim/internal/claim/sqlite"
	"github.com/sbclaim/sbclaim/internal/claimdb"
	"github.com/sbclaim/sbclaim/internal/testkit"
	"github.com/sbclaim/sbclaim/internal/testkit/testdb"
)

func claimOne(t *testing.T, s claim.Store) {
	t.Helper()
	res, err := s.ClaimBatch(t.Context(), &claim.ClaimBatchParams{Host: "h", Claims: []claim.ClaimParams{{
		Owner:     uuid.New(),
		MessageID: "m-1", Consumer: "billing", PayloadHash: claim.HashPayload([]byte("b")),
	}}})
	if err != nil || len(res) != 1 || res[0].Outcome != claim.OutcomeWon {
		t.Fatalf("claim: %v %v", res, err)
	}
}

func TestSQLite(t *testing.T) {
	u := "sqlite:" + filepath.Join(t.TempDir(), "claims.db")
	for range 2 { // idempotent
		if err := claimdb.Migrate(t.Context(), u); err != nil {
			t.Fatal(err)
		}
	}
	s, err := claimdb.Open(t.Context(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.(*sqlite.Store); !ok {
		t.Fatalf("Open(%s) returned %T", u, s)
	}
	claimOne(t, s)
}

func TestSQLiteMemory(t *testing.T) {
	s, err := claimdb.Open(t.Context(), "sqlite::memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	claimOne(t, s)
}

func TestPostgres(t *testing.T) {
	ctx := t.Context()
	u, err := url.Parse(testdb.EmptyPostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, scheme := range []string{"postgres", "postgresql", "POSTGRES"} {
		u.Scheme = scheme
		if err := claimdb.Migrate(ctx, u.String()); err != nil {
			t.Fatalf("Migrate(%s): %v", scheme, err)
		}
	}
	s, err := claimdb.Open(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.(*postgres.Store); !ok {
		t.Fatalf("Open returned %T", s)
	}
	claimOne(t, s)
}

func TestSQLServerDispatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// Nothing listens on port 1: the mssql store must be the one failing,
	// as unavailable, without the password in its error.
	const u = "sqlserver://sa:hunter2@127.0.0.1:1?database=sbclaim&dial+timeout=5"
	s, err := claimdb.Open(ctx, u)
	if err == nil {
		s.Close()
		t.Fatal("Open of an unreachable SQL Server succeeded")
	}
	if strings.Contains(err.Error(), "unsupported") {
		t.Fatalf("sqlserver:// not dispatched: %v", err)
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error leaks the password: %v", err)
	}
	if !errors.Is(err, claim.ErrUnavailable) {
		t.Logf("note: mssql.Open error is not ErrUnavailable: %v", err)
	}
}

func TestUnknownScheme(t *testing.T) {
	for _, u := range []string{"mysql://root:hunter2@db:3306/claims", "hunter2", "file:/tmp/x.db", "s3cr3t pass:word@x"} {
		_, err := claimdb.Open(t.Context(), u)
		if err == nil {
			t.Fatalf("Open(%q) succeeded", u)
		}
		if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "word@x") {
			t.Fatalf("error leaks the URL: %v", err)
		}
		if err := claimdb.Migrate(t.Context(), u); err == nil {
			t.Fatalf("Migrate(%q) succeeded", u)
		}
	}
	_, err := claimdb.Open(t.Context(), "mysql://root:hunter2@db/claims")
	if !strings.Contains(err.Error(), `"mysql"`) {
		t.Fatalf("error does not name the scheme: %v", err)
	}
}

func TestDialectOf(t *testing.T) {
	for u, want := range map[string]claimdb.Dialect{
		"sqlite:/x.db":       claimdb.SQLite,
		"sqlite::memory:":    claimdb.SQLite,
		"postgres://h/db":    claimdb.Postgres,
		"postgresql://h/db":  claimdb.Postgres,
		"sqlserver://h?db=x": claimdb.SQLServer,
		"SQLServer://h?db=x": claimdb.SQLServer,
	} {
		if got, err := claimdb.DialectOf(u); err != nil || got != want {
			t.Errorf("DialectOf(%q) = %q, %v; want %q", u, got, err, want)
		}
	}
}

func TestCheck(t *testing.T) {
	for u, want := range map[string]string{
		"sqlite:/x.db":                       "",
		"sqlite::memory:":                    "",
		"sqlite:":                            "needs a file path",
		"postgres://u:p@h:5432/db":           "",
		"postgresql://h/db":                  "",
		"postgres:/no-host":                  "starts postgres://",
		"postgres:///db":                     "no host",
		"sqlserver://h:1433?database=x":      "",
		"sqlserver://sa:p@host:port:bad/%zz": "not a valid URL",
		"mysql://root:hunter2@db/claims":     `unsupported database URL scheme "mysql"`,
		"hunter2":                            "no scheme",
	} {
		err := claimdb.Check(u)
		switch {
		case want == "" && err != nil:
			t.Errorf("Check(%q) = %v, want nil", u, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("Check(%q) = %v, want an error containing %q", u, err, want)
		case err != nil && strings.Contains(err.Error(), "hunter2"):
			t.Errorf("Check(%q) leaks the URL: %v", u, err)
		}
	}
}

// A scratch database is migrated, private to its creator, and gone after
// Close.
func TestScratch(t *testing.T) {
	bases := map[string]string{"sqlite": ""}
	if u := os.Getenv(testkit.PostgresURLEnv); u != "" {
		bases["postgres"] = u
	}
	for name, base := range bases {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			a, err := claimdb.NewScratch(ctx, base, claimdb.ScratchOptions{Prefix: "claimdbtest"})
			if err != nil {
				t.Fatal(err)
			}
			b, err := claimdb.NewScratch(ctx, base, claimdb.ScratchOptions{Prefix: "claimdbtest"})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if a.URL == b.URL {
				t.Fatalf("two scratch databases share %s", a)
			}
			s, err := claimdb.Open(ctx, a.URL)
			if err != nil {
				t.Fatal(err)
			}
			claimOne(t, s) // migrated: the claims table exists
			sb, err := claimdb.Open(ctx, b.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			if rows, err := sb.List(ctx, &claim.ListParams{}); err != nil || len(rows) != 0 {
				t.Fatalf("the second scratch database sees the first's rows: %v %v", rows, err)
			}
			s.Close()
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if s, err := claimdb.Open(ctx, a.URL); err == nil {
				_, lerr := s.List(ctx, &claim.ListParams{})
				s.Close()
				if lerr == nil {
					t.Fatalf("%s still has a claims table after Close", a)
				}
			}
		})
	}
}
