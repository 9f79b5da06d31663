package store_test

import (
	"context"
	"errors"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/postgres"
	"github.com/sbclaim/sbclaim/internal/claim/sqlite"
	"github.com/sbclaim/sbclaim/internal/store"
	"github.com/sbclaim/sbclaim/internal/testdb"
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
		if err := store.Migrate(t.Context(), u); err != nil {
			t.Fatal(err)
		}
	}
	s, err := store.Open(t.Context(), u)
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
	s, err := store.Open(t.Context(), "sqlite::memory:")
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
		if err := store.Migrate(ctx, u.String()); err != nil {
			t.Fatalf("Migrate(%s): %v", scheme, err)
		}
	}
	s, err := store.Open(ctx, u.String())
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
	s, err := store.Open(ctx, u)
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
		_, err := store.Open(t.Context(), u)
		if err == nil {
			t.Fatalf("Open(%q) succeeded", u)
		}
		if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "word@x") {
			t.Fatalf("error leaks the URL: %v", err)
		}
		if err := store.Migrate(t.Context(), u); err == nil {
			t.Fatalf("Migrate(%q) succeeded", u)
		}
	}
	_, err := store.Open(t.Context(), "mysql://root:hunter2@db/claims")
	if !strings.Contains(err.Error(), `"mysql"`) {
		t.Fatalf("error does not name the scheme: %v", err)
	}
}

func TestDialectOf(t *testing.T) {
	for u, want := range map[string]store.Dialect{
		"sqlite:/x.db":       store.DialectSQLite,
		"sqlite::memory:":    store.DialectSQLite,
		"postgres://h/db":    store.DialectPostgres,
		"postgresql://h/db":  store.DialectPostgres,
		"sqlserver://h?db=x": store.DialectSQLServer,
		"SQLServer://h?db=x": store.DialectSQLServer,
	} {
		if got, err := store.DialectOf(u); err != nil || got != want {
			t.Errorf("DialectOf(%q) = %q, %v; want %q", u, got, err, want)
		}
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:hunter2@h:5432/db?sslmode=disable": "postgres://u:xxxxx@h:5432/db?sslmode=disable",
		"sqlserver://h:1433?database=x&password=hunter2": "sqlserver://h:1433?database=x&password=xxxxx",
		"sqlite:/var/lib/claims.db":                      "sqlite:/var/lib/claims.db",
		"postgres://h/db":                                "postgres://h/db",
	} {
		if got := store.Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
	if got := store.Redact("postgres://u:hunter2@h:bad port/db"); strings.Contains(got, "hunter2") {
		t.Errorf("Redact of an unparseable URL leaks: %q", got)
	}
}
