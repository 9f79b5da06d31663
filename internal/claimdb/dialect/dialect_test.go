package dialect

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// TestLookupNamesThePackageToImport: a URL whose store is not linked in is
// refused with the import that links it; once registered, it is found.
func TestLookupNamesThePackageToImport(t *testing.T) {
	_, _, err := Lookup("postgres://u:secret@db:5432/claims")
	if err == nil || !strings.Contains(err.Error(), `import _ "github.com/sbclaim/sbclaim/store/postgres"`) {
		t.Fatalf("Lookup of an unlinked dialect = %v, want the package to import", err)
	}
	if strings.Contains(err.Error(), "secret") {
		t.Fatalf("the error echoes the password: %v", err)
	}
	if _, _, err := Lookup("mysql://db/claims"); err == nil || !strings.Contains(err.Error(), `"mysql"`) {
		t.Fatalf("Lookup of an unknown scheme = %v, want it named", err)
	}

	open := func(context.Context, string) (claim.Store, error) { return nil, nil }
	migrate := func(context.Context, string) error { return nil }
	Register(Postgres, Driver{Open: open, Migrate: migrate})
	t.Cleanup(func() { mu.Lock(); delete(drivers, Postgres); mu.Unlock() })
	d, drv, err := Lookup("POSTGRESQL://db/claims")
	if err != nil || d != Postgres || drv.Open == nil {
		t.Fatalf("Lookup after Register = %v, %v, %v", d, drv.Open != nil, err)
	}
	defer func() {
		if recover() == nil {
			t.Error("a second Register of postgres did not panic")
		}
	}()
	Register(Postgres, Driver{Open: open, Migrate: migrate})
}

// TestPackageNamesTheStoreDirectory: the import an error names is a
// package of this module, for every dialect.
func TestPackageNamesTheStoreDirectory(t *testing.T) {
	for _, d := range []Dialect{SQLite, Postgres, SQLServer} {
		rel, ok := strings.CutPrefix(Package(d), "github.com/sbclaim/sbclaim/")
		if !ok {
			t.Fatalf("Package(%s) = %s, not in this module", d, Package(d))
		}
		if _, err := os.Stat(filepath.Join("..", "..", "..", rel, string(d)+".go")); err != nil {
			t.Errorf("Package(%s) = %s, which registers nothing: %v", d, Package(d), err)
		}
	}
}
