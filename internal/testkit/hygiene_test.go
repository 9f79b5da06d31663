package testkit_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestNoTestBindsAFixedPortOrPath scans every _test.go file of the module:
// a test must not bind a fixed port (the compose stack publishes 8080-8094
// on 127.0.0.1, and two packages' tests run at once) nor write to a fixed
// path (only under t.TempDir()). Use 127.0.0.1:0 and t.TempDir().
func TestNoTestBindsAFixedPortOrPath(t *testing.T) {
	root := moduleRoot(t)
	fset := token.NewFileSet()
	files := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		files++
		for _, v := range fixedBindings(fset, f) {
			rel, _ := filepath.Rel(root, v.pos.Filename)
			t.Errorf("%s:%d: %s", rel, v.pos.Line, v.what)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("scanned %d test files under %s: the walk missed the module", files, root)
	}
}

// TestFixedBindingsCheck shows what the scan above finds and what it
// lets through.
func TestFixedBindingsCheck(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "fixed_bindings.txt"))
	if err != nil {
		t.Fatal(err)
	}
	type vector struct {
		src  string
		want bool
	}
	var vectors []vector
	for _, line := range strings.Split(string(data), "\n") {
		want, src, ok := strings.Cut(line, "\t")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		vectors = append(vectors, vector{src: src, want: want == "true"})
	}
	if len(vectors) < 10 {
		t.Fatalf("testdata/fixed_bindings.txt holds %d vectors", len(vectors))
	}
	for _, tc := range vectors {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "x_test.go", "package x\nfunc f() {\n"+tc.src+"\n}\n", 0)
		if err != nil {
			t.Fatalf("%s: %v", tc.src, err)
		}
		if got := len(fixedBindings(fset, f)) > 0; got != tc.want {
			t.Errorf("%s: flagged %v, want %v", tc.src, got, tc.want)
		}
	}
}

type violation struct {
	pos  token.Position
	what string
}

// fixedBindings finds, in one file, string literals that bind a fixed
// port or name a fixed path:
//   - an address with a non-zero port passed to a Listen* function or set
//     as a server's Addr;
//   - a fixed address, or an empty one (which falls back to the default
//     port), given to a *_ADDR setting in an env map or t.Setenv;
//   - a literal path passed to os functions that create or remove files;
//   - a literal sqlite: URL other than sqlite::memory:.
func fixedBindings(fset *token.FileSet, f *ast.File) []violation {
	var out []violation
	add := func(n ast.Node, format string, lit string) {
		out = append(out, violation{fset.Position(n.Pos()), strings.Replace(format, "%q", strconv.Quote(lit), 1)})
	}
	// setting checks one NAME=value pair of a test's environment.
	setting := func(key, val ast.Expr) {
		k, ok := stringLit(key)
		if !ok {
			return
		}
		v, ok := stringLit(val)
		if !ok {
			return
		}
		switch {
		case strings.HasSuffix(k, "_ADDR") && v == "":
			add(val, k+` is empty: the binary falls back to its default port; use "127.0.0.1:0"`, v)
		case strings.HasSuffix(k, "_ADDR") && fixedPort(v):
			add(val, k+" binds the fixed address %q; use \"127.0.0.1:0\"", v)
		case fixedSQLite(v):
			add(val, k+" names the fixed file %q; build it from t.TempDir()", v)
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			name := funcName(n.Fun)
			switch {
			case strings.HasPrefix(name, "Listen"):
				for _, a := range n.Args {
					if v, ok := stringLit(a); ok && fixedPort(v) {
						add(a, name+" binds the fixed address %q; use \"127.0.0.1:0\"", v)
					}
				}
			case name == "Setenv" && len(n.Args) == 2:
				setting(n.Args[0], n.Args[1])
			case isOSFileFunc(n.Fun) && len(n.Args) > 0:
				if v, ok := stringLit(n.Args[0]); ok {
					add(n.Args[0], "os."+name+" on the fixed path %q; build it from t.TempDir()", v)
				}
			}
		case *ast.KeyValueExpr:
			if id, ok := n.Key.(*ast.Ident); ok && id.Name == "Addr" {
				if v, ok := stringLit(n.Value); ok && fixedPort(v) {
					add(n.Value, "a server's Addr is the fixed address %q; use \"127.0.0.1:0\"", v)
				}
				return true
			}
			setting(n.Key, n.Value)
		}
		return true
	})
	return out
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

func funcName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return e.Sel.Name
	}
	return ""
}

func isOSFileFunc(e ast.Expr) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "os" {
		return false
	}
	switch sel.Sel.Name {
	case "WriteFile", "Create", "OpenFile", "Mkdir", "MkdirAll", "Remove", "RemoveAll", "Rename", "Symlink", "Link", "Chmod", "Truncate":
		return true
	}
	return false
}

// fixedPort reports whether s is a listen address on this machine with a
// port other than 0 (such as :8081, 127.0.0.1:8080 or localhost:8094).
func fixedPort(s string) bool {
	host, port, err := net.SplitHostPort(s)
	if err != nil || port == "0" {
		return false
	}
	if _, err := strconv.Atoi(port); err != nil {
		return false
	}
	switch host {
	case "", "localhost", "0.0.0.0", "::", "::1":
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func fixedSQLite(s string) bool {
	rest, ok := strings.CutPrefix(s, "sqlite:")
	return ok && rest != "" && rest != ":memory:"
}

// moduleRoot is the directory holding go.mod, above the package's.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}
