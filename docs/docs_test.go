package docs_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// root is the repository, from this package's directory.
const root = ".."

// updateEnv, set to 1, makes TestSnippetsMatchTheirSources copy each
// snippet's source into the Markdown instead of failing.
const updateEnv = "SBCLAIM_UPDATE_SNIPPETS"

// markdownFiles returns README.md and every guide under docs/, relative
// to the repository.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	guides, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil || len(guides) < 5 {
		t.Fatalf("docs/*.md: %d files (%v)", len(guides), err)
	}
	files := []string{"README.md"}
	for _, g := range guides {
		rel, _ := filepath.Rel(root, g)
		files = append(files, filepath.ToSlash(rel))
	}
	return files
}

func readFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// block is a fenced code block of a Markdown file.
type block struct {
	lang   string
	indent string // the fence's indentation, which its lines carry too
	line   int    // of the opening fence, 1-based
	marker string // the line before the fence, trimmed
	// first and last are the indexes (in the file's lines) of the first
	// content line and of the closing fence.
	first, last int
	content     string // without the indentation, ending in "\n"
}

// codeBlocks returns the fenced code blocks of a Markdown text.
func codeBlocks(text string) []block {
	lines := strings.Split(text, "\n")
	var out []block
	for i := 0; i < len(lines); i++ {
		trimmed := strings.TrimLeft(lines[i], " \t")
		if !strings.HasPrefix(trimmed, "```") {
			continue
		}
		b := block{lang: strings.TrimSpace(strings.TrimPrefix(trimmed, "```")), indent: lines[i][:len(lines[i])-len(trimmed)], line: i + 1, first: i + 1}
		for j := i - 1; j >= 0; j-- {
			if s := strings.TrimSpace(lines[j]); s != "" {
				b.marker = s
				break
			}
		}
		var content strings.Builder
		j := i + 1
		for ; j < len(lines) && !strings.HasPrefix(strings.TrimLeft(lines[j], " \t"), "```"); j++ {
			content.WriteString(strings.TrimPrefix(lines[j], b.indent) + "\n")
		}
		b.last, b.content = j, content.String()
		out = append(out, b)
		i = j
	}
	return out
}

// withoutCode blanks the fenced code blocks of a Markdown text (fences
// included) with spaces, keeping every other byte where it was.
func withoutCode(text string) string {
	lines := strings.Split(text, "\n")
	for _, b := range codeBlocks(text) {
		for i := b.first - 1; i <= b.last && i < len(lines); i++ {
			lines[i] = strings.Repeat(" ", len(lines[i]))
		}
	}
	return strings.Join(lines, "\n")
}

var snippetMarker = regexp.MustCompile(`^<!-- snippet: (\S+) (func|region) ([\w.-]+) -->$`)

// snippetSource returns the text a marker names: a function declaration
// (without its doc comment) or a region between "// snippet:name" and
// "// endsnippet", de-indented; both end in "\n".
func snippetSource(rel, kind, name string) (string, error) {
	path := filepath.Join(root, filepath.FromSlash(rel))
	src, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	if !strings.HasSuffix(rel, ".go") {
		return "", fmt.Errorf("%s is not a Go file", rel)
	}
	if !strings.HasSuffix(rel, "_test.go") {
		tests, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*_test.go"))
		if len(tests) == 0 {
			return "", fmt.Errorf("%s: its package has no tests: take snippets from tested code", rel)
		}
	}
	switch kind {
	case "func":
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
		if err != nil {
			return "", err
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && fd.Name.Name == name {
				return string(src[fset.Position(fd.Pos()).Offset:fset.Position(fd.End()).Offset]) + "\n", nil
			}
		}
		return "", fmt.Errorf("%s has no function %s", rel, name)
	default:
		var lines []string
		in, found := false, false
		for _, line := range strings.Split(string(src), "\n") {
			s := strings.TrimSpace(line)
			switch {
			case !in && s == "// snippet:"+name:
				if found {
					return "", fmt.Errorf("%s: region %s is marked twice", rel, name)
				}
				in, found = true, true
			case in && s == "// endsnippet":
				in = false
			case in:
				lines = append(lines, line)
			}
		}
		if !found || in || len(lines) == 0 {
			return "", fmt.Errorf("%s: no region %q between // snippet:%s and // endsnippet", rel, name, name)
		}
		for len(lines) > 0 && strings.TrimSpace(lines[len(lines)-1]) == "" {
			lines = lines[:len(lines)-1]
		}
		return dedent(lines), nil
	}
}

// dedent removes the indentation every non-blank line shares.
func dedent(lines []string) string {
	prefix := ""
	first := true
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		ind := l[:len(l)-len(strings.TrimLeft(l, " \t"))]
		if first {
			prefix, first = ind, false
			continue
		}
		for !strings.HasPrefix(ind, prefix) {
			prefix = prefix[:len(prefix)-1]
		}
	}
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(strings.TrimPrefix(l, prefix) + "\n")
	}
	return b.String()
}

// TestSnippetsMatchTheirSources: every Go code block in README.md and
// docs/*.md names its source on the line before it (see the package doc),
// the source is a Go file of a tested package, and the block is the
// source's text, exactly. A snippet edited by hand, a source changed
// without its snippet, or a Go block without a source fails here.
// SBCLAIM_UPDATE_SNIPPETS=1 rewrites the blocks from their sources.
func TestSnippetsMatchTheirSources(t *testing.T) {
	update := os.Getenv(updateEnv) == "1"
	snippets := 0
	for _, file := range markdownFiles(t) {
		text := readFile(t, file)
		lines := strings.Split(text, "\n")
		changed := false
		blocks := codeBlocks(text)
		// From the last block up, so that a rewrite keeps the earlier
		// blocks' line indexes.
		for i := len(blocks) - 1; i >= 0; i-- {
			b := blocks[i]
			if b.lang != "go" {
				if snippetMarker.MatchString(b.marker) {
					t.Errorf("%s:%d: a snippet marker before a %q block: snippets are Go", file, b.line, b.lang)
				}
				continue
			}
			m := snippetMarker.FindStringSubmatch(b.marker)
			if m == nil {
				t.Errorf("%s:%d: a Go block without a source: put <!-- snippet: <file> func <Name> --> or <!-- snippet: <file> region <name> --> on the line before it (see docs/doc.go)", file, b.line)
				continue
			}
			snippets++
			want, err := snippetSource(m[1], m[2], m[3])
			if err != nil {
				t.Errorf("%s:%d: %v", file, b.line, err)
				continue
			}
			if want == b.content {
				continue
			}
			if update {
				var repl []string
				for _, l := range strings.Split(strings.TrimSuffix(want, "\n"), "\n") {
					if l == "" {
						repl = append(repl, "")
					} else {
						repl = append(repl, b.indent+l)
					}
				}
				lines = slices.Concat(lines[:b.first], repl, lines[b.last:])
				changed = true
				continue
			}
			t.Errorf("%s:%d: the snippet differs from %s (%s %s): %s\n(after changing the source: %s=1 go test ./docs -run %s)",
				file, b.line, m[1], m[2], m[3], firstDifference(b.content, want), updateEnv, t.Name())
		}
		if changed {
			if err := os.WriteFile(filepath.Join(root, filepath.FromSlash(file)), []byte(strings.Join(lines, "\n")), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: snippets rewritten from their sources", file)
		}
	}
	if snippets < 3 {
		t.Errorf("%d snippets found: the README's library section has at least 3", snippets)
	}
}

// firstDifference describes the first line where got and want differ.
func firstDifference(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < max(len(g), len(w)); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("snippet line %d is %q, the source's is %q", i+1, gl, wl)
		}
	}
	return "they differ in length"
}

// TestSnippetCheckBites: the check above finds a hand edit, a missing
// source, a missing region and a block without a marker.
func TestSnippetCheckBites(t *testing.T) {
	src, err := snippetSource("docs/library_test.go", "region", "handler-test")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(src, "func TestChargeSurvivesACrash(") || !strings.HasSuffix(src, "}\n") {
		t.Errorf("region handler-test is:\n%s", src)
	}
	edited := strings.Replace(src, `"billing"`, `"payments"`, 1)
	if edited == src || firstDifference(edited, src) == "they differ in length" {
		t.Error("a hand edit is not found")
	}
	if _, err := snippetSource("docs/library_test.go", "region", "no-such-region"); err == nil {
		t.Error("a missing region is not an error")
	}
	if _, err := snippetSource("docs/library_test.go", "func", "NoSuchFunc"); err == nil {
		t.Error("a missing function is not an error")
	}
	if _, err := snippetSource("docs/no_such_file.go", "func", "X"); err == nil {
		t.Error("a missing file is not an error")
	}
	fn, err := snippetSource("docs/docs_test.go", "func", "dedent")
	if err != nil || !strings.HasPrefix(fn, "func dedent(") || !strings.HasSuffix(fn, "}\n") {
		t.Errorf("func dedent: %q, %v", fn, err)
	}
	md := "text\n\n```go\nfunc x() {}\n```\n\n<!-- snippet: docs/docs_test.go func dedent -->\n```go\n" + fn + "```\n"
	blocks := codeBlocks(md)
	if len(blocks) != 2 || snippetMarker.MatchString(blocks[0].marker) || !snippetMarker.MatchString(blocks[1].marker) || blocks[1].content != fn {
		t.Errorf("blocks of a sample: %+v", blocks)
	}
}

// TestFirstPageCommandsAreExercised: every shell command of the README's
// first page (its "Two commands" section) is one a test or CI runs, so
// that a renamed command or flag fails the build: the dev command (its
// flags declared by cmd/dev, which TestDevCommand starts as a process) and
// the test command (run by .ci/run exactly as written).
func TestFirstPageCommandsAreExercised(t *testing.T) {
	section := section(t, readFile(t, "README.md"), "## Two commands")
	var cmds []string
	for _, b := range codeBlocks(section) {
		if b.lang != "sh" {
			continue
		}
		for _, line := range strings.Split(b.content, "\n") {
			if i := strings.Index(line, " #"); i >= 0 {
				line = line[:i]
			}
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				cmds = append(cmds, line)
			}
		}
	}
	if len(cmds) < 2 {
		t.Fatalf("the README's first page shows %d commands: want the dev command and the test command", len(cmds))
	}
	ci := readFile(t, ".ci/run")
	devMain := readFile(t, "cmd/dev/main.go")
	for _, c := range cmds {
		f := strings.Fields(c)
		switch {
		case len(f) >= 3 && f[0] == "go" && f[1] == "run" && f[2] == "./cmd/dev":
			if !strings.Contains(readFile(t, "cmd/dev/main_test.go"), "func TestDevCommand(") {
				t.Errorf("%q: cmd/dev has no TestDevCommand starting it", c)
			}
			for _, a := range f[3:] {
				if name, ok := strings.CutPrefix(a, "-"); ok {
					name, _, _ = strings.Cut(name, "=")
					if !devFlag(devMain, name) {
						t.Errorf("%q: cmd/dev declares no flag -%s", c, name)
					}
				}
			}
		case c == "go test ./...":
			if !regexp.MustCompile(`(?m)^\s*(?:\w+=(?:"[^"]*"|\S+)\s+)*go test \./\.\.\.\s*$`).MatchString(ci) {
				t.Errorf("%q: .ci/run does not run it (a line running exactly this command, environment assignments before it allowed)", c)
			}
		default:
			t.Errorf("%q is on the README's first page but nothing runs it: run it in a test or in .ci/run and add it here", c)
		}
	}
	// The flags the first page names in its text are the dev command's
	// (-race is go test's).
	flags := 0
	for _, m := range regexp.MustCompile("`-([a-z][a-z-]*)`").FindAllStringSubmatch(withoutCode(section), -1) {
		flags++
		if m[1] != "race" && !devFlag(devMain, m[1]) {
			t.Errorf("the README's first page names -%s, which cmd/dev does not declare", m[1])
		}
	}
	if flags < 3 {
		t.Errorf("the README's first page names %d flags of the dev command", flags)
	}
	if !devFlag(devMain, "dir") || devFlag(devMain, "no-such-flag") {
		t.Error("devFlag does not read cmd/dev's flags")
	}
}

// devFlag reports whether cmd/dev's main.go declares the flag name
// (fs.String("name", ...) or fs.StringVar(&v, "name", ...)).
func devFlag(devMain, name string) bool {
	return regexp.MustCompile(`fs\.\w+\((?:&[\w.]+, )?"` + regexp.QuoteMeta(name) + `",`).MatchString(devMain)
}

// section returns the part of a Markdown text from the line heading to
// the next heading of the same or a higher level.
func section(t *testing.T, text, heading string) string {
	t.Helper()
	i := strings.Index(text, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("no section %q", heading)
	}
	level := strings.Index(heading, " ")
	rest := text[i+1+len(heading):]
	for _, loc := range regexp.MustCompile(`(?m)^#{1,`+strconv.Itoa(level)+`} `).FindAllStringIndex(withoutCode(rest), -1) {
		return rest[:loc[0]]
	}
	return rest
}

// TestReadmeDevSampleMatchesTheCommand: the sample summary on the README's
// first page uses the labels cmd/dev prints.
func TestReadmeDevSampleMatchesTheCommand(t *testing.T) {
	section := section(t, readFile(t, "README.md"), "## Two commands")
	summary := readFile(t, "cmd/dev/summary.go")
	n := 0
	for _, b := range codeBlocks(section) {
		if b.lang != "" || !strings.HasPrefix(b.content, "summary of run ") {
			continue
		}
		for _, line := range strings.Split(b.content, "\n")[1:] {
			label, _, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok {
				continue
			}
			n++
			if !strings.Contains(summary, `"  `+label+`:`) {
				t.Errorf("the README's sample shows %q, which cmd/dev does not print", label+":")
			}
		}
	}
	if n < 5 {
		t.Errorf("the README's first page shows %d lines of the dev command's summary, want its sample", n)
	}
}

// TestReadmeIsShort: a newcomer reads the README to the end; everything
// else is a guide under docs/.
func TestReadmeIsShort(t *testing.T) {
	if n := strings.Count(readFile(t, "README.md"), "\n"); n >= 350 {
		t.Errorf("README.md has %d lines: keep it under 350, move detail to a guide under docs/", n)
	}
}

// slug is GitHub's anchor for a heading.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || 'a' <= r && r <= 'z' || '0' <= r && r <= '9' || r > 127 && !strings.ContainsRune("—–’“”…→", r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

var (
	headingRE = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
)

// anchors returns the anchors of a Markdown text's headings (a repeated
// heading gets -1, -2, ... as on GitHub).
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	for _, m := range headingRE.FindAllStringSubmatch(withoutCode(text), -1) {
		a := slug(m[1])
		for n := 1; out[a]; n++ {
			a = slug(m[1]) + "-" + strconv.Itoa(n)
		}
		out[a] = true
	}
	return out
}

// TestLinksResolve: every relative link of README.md and docs/*.md points
// at a file of the repository and, when it names an anchor, at a heading
// of that file.
func TestLinksResolve(t *testing.T) {
	checked := 0
	for _, file := range markdownFiles(t) {
		text := withoutCode(readFile(t, file))
		for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			rel := file
			if path != "" {
				rel = filepath.ToSlash(filepath.Join(filepath.Dir(file), path))
				if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(rel))); err != nil {
					t.Errorf("%s: link %s: no file %s", file, target, rel)
					continue
				}
			}
			checked++
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(rel, ".md") {
				t.Errorf("%s: link %s: an anchor into a file that is not Markdown", file, target)
				continue
			}
			if !anchors(readFile(t, rel))[anchor] {
				t.Errorf("%s: link %s: %s has no heading with anchor #%s", file, target, rel, anchor)
			}
		}
	}
	if checked < 50 {
		t.Errorf("only %d links checked", checked)
	}
	if got := slug("What was run where — honestly"); got != "what-was-run-where--honestly" {
		t.Errorf("slug: %q", got)
	}
}

// TestDocsIndexListsEveryGuide: docs/README.md, the table of contents,
// links every guide, and the README links the table of contents.
func TestDocsIndexListsEveryGuide(t *testing.T) {
	index := readFile(t, "docs/README.md")
	for _, file := range markdownFiles(t) {
		name, ok := strings.CutPrefix(file, "docs/")
		if !ok || name == "README.md" {
			continue
		}
		if !strings.Contains(index, "]("+name+")") && !strings.Contains(index, "]("+name+"#") {
			t.Errorf("docs/README.md does not link %s", file)
		}
	}
	if !strings.Contains(readFile(t, "README.md"), "](docs/README.md)") {
		t.Error("README.md does not link the guides' table of contents, docs/README.md")
	}
}

// TestOutcomeTableListsEveryResult: the outcome table of the operating
// guide has one row per outcome the processor reports (the "outcome" label
// of sbclaim_messages_total), read from internal/protocol's constants; the
// chaos harness's test-only "crashed" is left out.
func TestOutcomeTableListsEveryResult(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filepath.Join(root, "internal", "protocol", "protocol.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var results []string
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || vs.Type == nil || fmt.Sprint(vs.Type) != "Result" {
			return true
		}
		for _, v := range vs.Values {
			if lit, ok := v.(*ast.BasicLit); ok {
				s, _ := strconv.Unquote(lit.Value)
				if s != "crashed" {
					results = append(results, s)
				}
			}
		}
		return true
	})
	if len(results) < 10 {
		t.Fatalf("read %d results from internal/protocol", len(results))
	}
	text := readFile(t, "docs/operating.md")
	start := strings.Index(text, "| outcome | what happened | action |")
	if start < 0 {
		t.Fatal("docs/operating.md has no outcome table")
	}
	var rows []string
	for _, line := range strings.Split(text[start:], "\n")[2:] {
		m := regexp.MustCompile("^\\| `(\\w+)` \\|").FindStringSubmatch(line)
		if m == nil {
			break
		}
		rows = append(rows, m[1])
	}
	slices.Sort(results)
	slices.Sort(rows)
	if !slices.Equal(rows, results) {
		t.Errorf("the outcome table lists %v; the processor reports %v", rows, results)
	}
}

// TestConfigurationTablesMatchTheBinaries: every SBCLAIM_ variable the
// processor and the reconciler read has a row in the tables of
// docs/configuration.md or docs/console.md, and every variable a row of
// those tables names is one they read (a renamed variable fails here).
func TestConfigurationTablesMatchTheBinaries(t *testing.T) {
	variable := regexp.MustCompile(`SBCLAIM_[A-Z0-9_]*[A-Z0-9]`)
	read := map[string]bool{}
	for _, dir := range []string{"cmd/processor", "cmd/reconciler"} {
		files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
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
			for _, m := range regexp.MustCompile(`"(SBCLAIM_[A-Z0-9_]+)"`).FindAllStringSubmatch(string(src), -1) {
				read[m[1]] = true
			}
		}
	}
	if len(read) < 30 {
		t.Fatalf("read %d variables from cmd/processor and cmd/reconciler", len(read))
	}
	documented := map[string]bool{}
	for _, file := range []string{"docs/configuration.md", "docs/console.md"} {
		for _, line := range strings.Split(withoutCode(readFile(t, file)), "\n") {
			if !strings.HasPrefix(line, "| `SBCLAIM_") {
				continue
			}
			first := strings.Split(line, "|")[1]
			for _, v := range variable.FindAllString(first, -1) {
				documented[v] = true
				if !read[v] {
					t.Errorf("%s has a row for %s, which neither binary reads", file, v)
				}
			}
		}
	}
	for v := range read {
		if !documented[v] {
			t.Errorf("%s is read by a binary but has no row in docs/configuration.md or docs/console.md", v)
		}
	}
}
