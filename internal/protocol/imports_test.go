package protocol_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestImportsNoIO: the package that decides does no I/O. Everything it
// depends on is in the standard library (no store, broker, HTTP, SQL,
// metrics or tracing package, and no other package of this module), and
// it imports only fmt and time of it: no os, net, database/sql, log or
// randomness.
func TestImportsNoIO(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for path := range strings.FieldsSeq(string(out)) {
		if path != "github.com/sbclaim/sbclaim/internal/protocol" {
			t.Errorf("package protocol depends on %s: it must depend on nothing outside the standard library", path)
		}
	}
	out, err = exec.Command("go", "list", "-f", "{{join .Imports \" \"}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	allowed := map[string]bool{"fmt": true, "time": true}
	for path := range strings.FieldsSeq(string(out)) {
		if !allowed[path] {
			t.Errorf("package protocol imports %s: deciding imports only fmt and time (no I/O, no clock reading, no randomness)", path)
		}
	}
}

// TestReadsNoClock: time comes in as a fact (the database clock's
// reading, a duration), never read inside, like raft's abstract tick.
func TestReadsNoClock(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, call := range []string{"time.Now", "time.Since", "time.Until", "time.After", "time.Sleep", "time.NewTimer", "time.NewTicker", "time.Tick"} {
			if strings.Contains(string(src), call) {
				t.Errorf("%s calls %s: the decisions take the time as a fact", f, call)
			}
		}
	}
}
