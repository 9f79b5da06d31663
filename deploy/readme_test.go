package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// docSection returns the section of a Markdown file (README.md or a guide
// under docs/, relative to the repository) that starts with heading, up to
// the next heading of the same or a higher level ("# Title" is the whole
// guide).
func docSection(t *testing.T, file, heading string) string {
	t.Helper()
	text := "\n" + read(t, "../"+file)
	i := strings.Index(text, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("%s has no section %q", file, heading)
	}
	level := strings.Index(heading, " ")
	lines := strings.Split(text[i+1+len(heading):], "\n")
	fenced := false
	for j, line := range lines {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
		}
		if h := len(line) - len(strings.TrimLeft(line, "#")); !fenced && h >= 1 && h <= level && strings.HasPrefix(line[h:], " ") {
			lines = lines[:j]
			break
		}
	}
	return strings.Join(lines, "\n")
}

// shellBlocks returns the ```sh blocks of a section, continuation lines
// joined and comments dropped, one command per element.
func shellBlocks(section string) []string {
	var cmds []string
	for _, block := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(section, -1) {
		cur := ""
		for _, line := range strings.Split(block[1], "\n") {
			if i := strings.Index(line, " #"); i >= 0 && !strings.Contains(line[:i], "'") {
				line = line[:i]
			}
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			cur += " " + strings.TrimSuffix(line, "\\")
			if !strings.HasSuffix(line, "\\") {
				cmds = append(cmds, strings.TrimSpace(cur))
				cur = ""
			}
		}
	}
	return cmds
}

var (
	repoPath   = regexp.MustCompile(`(?:^|[\s=@"(])((?:deploy|sql|examples|emulator|cmd|internal)/[\w./-]*\w)`)
	paramFlag  = regexp.MustCompile(`-p (\w+)=`)
	outputRef  = regexp.MustCompile(`properties\.outputs\.(\w+)\.value`)
	outputDecl = regexp.MustCompile(`(?m)^output (\w+) `)
	shellVar   = regexp.MustCompile(`\$(\w+)|\$\{(\w+)\}`)
	assignment = regexp.MustCompile(`(?:^|\s)([A-Z_][A-Z0-9_]*)=`)
)

// Every command of the deploy section must work on a fresh clone: the files
// it reads exist (or an earlier command creates them), the parameters and
// outputs it names are in main.bicep, the shell variables are set before
// use, the app names are the template's, and every tool it runs is among
// the prerequisites.
func TestReadmeDeployCommands(t *testing.T) {
	t.Parallel()
	section := docSection(t, "docs/deploy.md", "# Deploy to Azure Container Apps")
	prereq := section[strings.Index(section, "## Prerequisites"):strings.Index(section, "## Steps")]
	cmds := shellBlocks(section)
	if len(cmds) < 10 {
		t.Fatalf("found only %d commands in the deploy section", len(cmds))
	}
	ps := params(t)
	outputs := map[string]bool{}
	for _, m := range outputDecl.FindAllStringSubmatch(read(t, "main.bicep"), -1) {
		outputs[m[1]] = true
	}

	created := map[string]bool{}
	set := map[string]bool{}
	tools := map[string]bool{}
	for _, c := range cmds {
		// Paths the command creates: cp's target, a redirect.
		var creates []string
		if f := strings.Fields(c); len(f) == 3 && f[0] == "cp" {
			creates = append(creates, f[2])
		}
		if m := regexp.MustCompile(`> (\S+)$`).FindStringSubmatch(c); m != nil {
			creates = append(creates, m[1])
		}
		for _, m := range repoPath.FindAllStringSubmatch(c, -1) {
			p := m[1]
			if created[p] || slices.Contains(creates, p) {
				continue
			}
			if _, err := os.Stat(filepath.Join("..", filepath.FromSlash(p))); err != nil {
				t.Errorf("README deploy step %q names %s, which the repository does not have and no earlier step creates", c, p)
			}
		}
		for _, p := range creates {
			created[p] = true
		}
		for _, m := range paramFlag.FindAllStringSubmatch(c, -1) {
			if _, ok := ps[m[1]]; !ok {
				t.Errorf("README deploy step %q sets parameter %s, which main.bicep does not declare", c, m[1])
			}
		}
		for _, m := range outputRef.FindAllStringSubmatch(c, -1) {
			if !outputs[m[1]] {
				t.Errorf("README deploy step %q reads output %s, which main.bicep does not declare", c, m[1])
			}
		}
		for _, m := range regexp.MustCompile(`\$\(cat ([^)]+)\)`).FindAllStringSubmatch(c, -1) {
			if !created[m[1]] {
				if _, err := os.Stat(filepath.Join("..", m[1])); err != nil {
					t.Errorf("README deploy step %q reads %s, which nothing creates", c, m[1])
				}
			}
		}
		// Variables: set by an assignment or a for loop before use.
		if m := regexp.MustCompile(`^for (\w+) in `).FindStringSubmatch(c); m != nil {
			set[m[1]] = true
		}
		for _, m := range shellVar.FindAllStringSubmatch(c, -1) {
			v := m[1] + m[2]
			if !set[v] {
				t.Errorf("README deploy step %q uses $%s before any step sets it", c, v)
			}
		}
		for _, m := range assignment.FindAllStringSubmatch(c, -1) {
			set[m[1]] = true
		}
		// The program the command runs: past any VAR=value prefixes.
		for _, f := range strings.Fields(c) {
			if !regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`).MatchString(f) {
				tools[f] = true
				break
			}
		}
	}
	for tool := range tools {
		switch tool {
		case "for", "do", "done", "cp", "sleep":
			continue // the shell's own
		}
		if !regexp.MustCompile("`" + regexp.QuoteMeta(tool) + "[` ]").MatchString(prereq) {
			t.Errorf("the deploy steps run %s, which the prerequisites do not name", tool)
		}
	}
	flat := strings.Join(strings.Fields(prereq), " ")
	for _, must := range []string{"go-sqlcmd", "--authentication-method", "ODBC", "firewall", "Role Based Access Control Administrator", "roleAssignments/write", "Entra admin"} {
		if !strings.Contains(flat, must) {
			t.Errorf("the prerequisites do not mention %q", must)
		}
	}

	// The order that makes the first deployment work.
	steps := strings.Join(cmds, "\n")
	order := []string{"deployApps=false", "reconciler migrate", "sql/grants/sqlserver.sql", "sqlStatements", "sleep", "deployApps=true"}
	last := -1
	for _, o := range order {
		i := strings.Index(steps, o)
		if i < last {
			t.Errorf("the deploy steps must run, in order: %v; %q comes too early or is missing", order, o)
		}
		last = i
	}
	// The names the steps use are the template's (default prefix).
	for _, name := range []string{"sbclaim-processor", "sbclaim-reconciler"} {
		if !strings.Contains(steps, "-n "+name) {
			t.Errorf("the deploy steps never name %s", name)
		}
	}
	main := read(t, "main.bicep")
	if !strings.Contains(main, "var processorAppName = '${namePrefix}-processor'") || !strings.Contains(main, "var reconcilerJobName = '${namePrefix}-reconciler'") || ps["namePrefix"].def != "sbclaim" {
		t.Error("the app names in the README steps are no longer the template's")
	}
}

var tableRow = regexp.MustCompile("(?m)^\\| `(id-sbclaim-\\w+)` \\| ([^|]+) \\| ([^|]+) \\| ([^|]+) \\|$")

// The README's privileges table is the truth: the same Azure role
// assignments as the Bicep files (identity, role, scope), the database
// roles in sqlStatements, and "reaches the code" as identitySettings says.
// The operator console's section has the console identity's row.
func TestReadmePrivilegesTable(t *testing.T) {
	t.Parallel()
	section := docSection(t, "docs/deploy.md", "# Deploy to Azure Container Apps") + docSection(t, "docs/console.md", "# Operator console")
	rows := tableRow.FindAllStringSubmatch(section, -1)
	if len(rows) < 4 {
		t.Fatalf("the deploy section's privileges table has %d rows", len(rows))
	}
	var fromReadme []string
	reaches := map[string]string{}
	for _, r := range rows {
		id, role, scope, code := r[1], strings.TrimSpace(r[2]), strings.TrimSpace(r[3]), strings.TrimSpace(r[4])
		if prev, ok := reaches[id]; ok && prev != strings.Fields(code)[0] {
			t.Errorf("%s: the table says both %q and %q about its tokens", id, prev, code)
		}
		reaches[id] = strings.Fields(code)[0]
		if m := regexp.MustCompile("^database role `(\\w+)`").FindStringSubmatch(role); m != nil {
			sym := strings.TrimPrefix(id, "id-sbclaim-") + "Identity"
			if !strings.Contains(read(t, "main.bicep"), "usersSql("+sym+".name, "+sym+".properties.principalId, '"+m[1]+"')") {
				t.Errorf("the table gives %s database role %s; sqlStatements does not", id, m[1])
			}
			continue
		}
		role = strings.TrimSpace(regexp.MustCompile(`\(.*\)`).ReplaceAllString(role, ""))
		scope = regexp.MustCompile(`\(.*\)`).ReplaceAllString(scope, "")
		for _, kind := range []string{"queue", "topic", "subscription", "namespace", "registry"} {
			if regexp.MustCompile(`\b` + kind + `\b`).MatchString(scope) {
				fromReadme = append(fromReadme, grant{id, role, kind}.String())
			}
		}
	}
	var fromBicep []string
	for _, g := range grants(t) {
		fromBicep = append(fromBicep, g.String())
	}
	slices.Sort(fromReadme)
	slices.Sort(fromBicep)
	if !slices.Equal(fromReadme, fromBicep) {
		t.Errorf("the README's privileges table says:\n  %s\nthe Bicep files assign:\n  %s",
			strings.Join(fromReadme, "\n  "), strings.Join(fromBicep, "\n  "))
	}

	main := read(t, "main.bicep")
	settings := lifecycles(t, main)
	ids := identities(t)
	for sym, name := range ids {
		want := "yes"
		if settings[sym] == "None" {
			want = "no"
		}
		if got, ok := reaches[name]; !ok {
			t.Errorf("the privileges table does not list %s", name)
		} else if got != want {
			t.Errorf("the table says %s's tokens reach the code: %q; identitySettings says lifecycle %q", name, got, settings[sym])
		}
	}
}

// The local sections' URLs (the README's compose section and its guide)
// point at ports the compose file publishes.
func TestReadmeLocalPorts(t *testing.T) {
	t.Parallel()
	section := docSection(t, "README.md", "## Docker compose: the real SDK path") + docSection(t, "docs/docker.md", "# Run it locally with Docker")
	compose := read(t, "../docker-compose.yml")
	published := map[string]bool{}
	for _, m := range regexp.MustCompile(`"127\.0\.0\.1:(\d+):\d+"`).FindAllStringSubmatch(compose, -1) {
		published[m[1]] = true
	}
	for _, m := range regexp.MustCompile(`localhost:(\d+)`).FindAllStringSubmatch(section, -1) {
		if !published[m[1]] {
			t.Errorf("README's local section uses localhost:%s, which docker-compose.yml does not publish on 127.0.0.1", m[1])
		}
	}
	for _, f := range repoPath.FindAllStringSubmatch(section, -1) {
		if _, err := os.Stat(filepath.Join("..", f[1])); err != nil {
			t.Errorf("README's local section names %s, which does not exist", f[1])
		}
	}
}
