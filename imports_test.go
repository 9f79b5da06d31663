package sbclaim_test

import (
	"os/exec"
	"sort"
	"strings"
	"testing"
)

// heavy are the modules the root package must not reach: database drivers
// and migrations (in the store packages), OpenTelemetry's SDK and
// exporters with gRPC (in otelsetup), the cron scheduler (in operator),
// the Prometheus client (in prommetrics), the routes file's YAML, JSON
// Schema and otelhttp (in routesfile).
var heavy = []string{
	"github.com/microsoft/go-mssqldb",
	"github.com/jackc/pgx",
	"modernc.org/sqlite",
	"modernc.org/libc",
	"github.com/pressly/goose",
	"go.opentelemetry.io/otel/sdk",
	"go.opentelemetry.io/otel/exporters",
	"go.opentelemetry.io/contrib/exporters",
	"google.golang.org/grpc",
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity",
	"github.com/robfig/cron",
	"github.com/prometheus",
	"go.yaml.in/yaml",
	"github.com/santhosh-tekuri/jsonschema",
	"go.opentelemetry.io/contrib/instrumentation",
}

// maxRootModules bounds the third-party modules the root package reaches,
// so that a new import that drags in a tree of them is a decision, not an
// accident.
const maxRootModules = 16

// TestRootImportsLight: importing the root package links no database
// driver, no migration tool, no OpenTelemetry exporter, no metrics library
// and no routes-file parser.
func TestRootImportsLight(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	modules := map[string]bool{}
	for m := range strings.FieldsSeq(string(out)) {
		if m != "github.com/sbclaim/sbclaim" {
			modules[m] = true
		}
	}
	var all []string
	for m := range modules {
		all = append(all, m)
		for _, h := range heavy {
			if m == h || strings.HasPrefix(m, h+"/") {
				t.Errorf("the root package reaches %s: keep it behind a package of its own (store/..., otelsetup, operator, prommetrics, routesfile)", m)
			}
		}
	}
	sort.Strings(all)
	if len(all) > maxRootModules {
		t.Errorf("the root package reaches %d third-party modules, more than %d:\n%s", len(all), maxRootModules, strings.Join(all, "\n"))
	}
}
