package sbclaim_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The binaries are built on the public API: the proof that it is enough.
// Besides it they may use only their settings engine, redaction, the
// OpenTelemetry set-up (internal/telemetry) and (the reconciler) the
// operator console.
func TestCommandsUseOnlyThePublicAPI(t *testing.T) {
	allowed := map[string][]string{
		"cmd/processor":  {"internal/settings", "internal/redact"},
		"cmd/reconciler": {"internal/settings", "internal/redact", "internal/console"},
	}
	for dir, ok := range allowed {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no Go files (%v)", dir, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range parsed.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				rel, inModule := strings.CutPrefix(path, "github.com/sbclaim/sbclaim/")
				if !inModule || !strings.HasPrefix(rel, "internal/") {
					continue
				}
				permitted := false
				for _, a := range ok {
					permitted = permitted || rel == a
				}
				if !permitted {
					t.Errorf("%s imports %s: the binaries use the public API (plus %v)", f, path, ok)
				}
			}
		}
	}
}
