package main

import (
	"log/slog"
	"os/exec"
	"sort"
	"strings"
	"testing"

	"github.com/sbclaim/sbclaim"
)

// maxModules bounds the third-party modules this SQLite-only consumer
// reaches (the root package's, the SQLite driver's and the migrations'):
// a new import that drags in a tree of them is a decision, not an
// accident.
const maxModules = 28

// TestLinksOnlySQLite: the program reaches no other database driver, no
// OpenTelemetry exporter, no Prometheus client (package prommetrics) and
// no routes-file parser (package routesfile), and at most maxModules
// modules.
func TestLinksOnlySQLite(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	seen := map[string]bool{}
	var modules []string
	for m := range strings.FieldsSeq(string(out)) {
		if seen[m] || strings.HasPrefix(m, "github.com/sbclaim/sbclaim") {
			continue
		}
		seen[m] = true
		modules = append(modules, m)
		for _, h := range []string{"github.com/microsoft/go-mssqldb", "github.com/jackc/pgx", "go.opentelemetry.io/otel/exporters", "google.golang.org/grpc",
			"github.com/prometheus", "go.yaml.in/yaml", "github.com/santhosh-tekuri/jsonschema", "go.opentelemetry.io/contrib/instrumentation"} {
			if m == h || strings.HasPrefix(m, h+"/") {
				t.Errorf("a SQLite-only consumer reaches %s", m)
			}
		}
	}
	if !seen["modernc.org/sqlite"] {
		t.Errorf("the SQLite driver is not linked: %v", modules)
	}
	sort.Strings(modules)
	if len(modules) > maxModules {
		t.Errorf("a SQLite-only consumer reaches %d third-party modules, more than %d:\n%s", len(modules), maxModules, strings.Join(modules, "\n"))
	}
}

// TestRunNamesTheMissingVariable: a missing setting is refused by name,
// before anything is opened.
func TestRunNamesTheMissingVariable(t *testing.T) {
	env := map[string]string{"SBCLAIM_DATABASE_URL": "sqlite:" + t.TempDir() + "/claims.db", "SBCLAIM_QUEUE": "orders"}
	err := run(t.Context(), func(k string) string { return env[k] }, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "SBCLAIM_SERVICEBUS_CONNECTION_STRING") {
		t.Fatalf("run = %v, want an error naming SBCLAIM_SERVICEBUS_CONNECTION_STRING", err)
	}
}

// TestAnUnlinkedStoreNamesItsPackage: this program links only SQLite, so
// a PostgreSQL URL is refused, by OpenStore and by the start-up check,
// with the import that would link it and without the password.
func TestAnUnlinkedStoreNamesItsPackage(t *testing.T) {
	const url = "postgres://app:s3cret@db.internal:5432/claims"
	_, err := sbclaim.OpenStore(t.Context(), url)
	for _, err := range []error{err, sbclaim.CheckStoreURL(url)} {
		if err == nil || !strings.Contains(err.Error(), `import _ "github.com/sbclaim/sbclaim/store/postgres"`) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("err = %v, want the package to import, without the password", err)
		}
	}
}
