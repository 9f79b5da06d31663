package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// served returns the paths a binary's HTTP handlers register
// ("GET /readyz"), from its non-test sources under cmd/<binary>.
func served(t *testing.T, binary string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "cmd", binary, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("cmd/%s: no sources (%v)", binary, err)
	}
	paths := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`"GET (/[\w/.-]*)"`).FindAllStringSubmatch(string(b), -1) {
			paths[m[1]] = true
		}
	}
	return paths
}

// TestDocumentedEndpointsAreServed: every probe or metrics path
// (/healthz, /readyz, /metrics) that the compose file's port comments and
// the README's SBCLAIM_HTTP_ADDR rows promise is one the binary behind
// them serves. (The compose file once said the reconciler's port 8081
// served /readyz; it answered 404.)
func TestDocumentedEndpointsAreServed(t *testing.T) {
	t.Parallel()
	endpoint := regexp.MustCompile(`(?:^|[\s(` + "`" + `])(/(?:healthz|readyz|metrics))\b`)

	// docker-compose.yml: a service's build target (merged from an anchor
	// or its own) names its binary; a port's comment lists what it serves.
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(read(t, "../docker-compose.yml")), &doc); err != nil {
		t.Fatal(err)
	}
	services := mapValue(doc.Content[0], "services")
	if services == nil {
		t.Fatal("docker-compose.yml: no services")
	}
	checked := 0
	for i := 0; i+1 < len(services.Content); i += 2 {
		name, svc := services.Content[i].Value, services.Content[i+1]
		var s struct {
			Build struct {
				Target string `yaml:"target"`
			} `yaml:"build"`
		}
		if err := svc.Decode(&s); err != nil {
			t.Fatalf("service %s: %v", name, err)
		}
		ports := mapValue(svc, "ports")
		if ports == nil {
			continue
		}
		for _, p := range ports.Content {
			for _, m := range endpoint.FindAllStringSubmatch(p.LineComment, -1) {
				checked++
				if s.Build.Target == "" {
					t.Errorf("docker-compose.yml:%d: service %s promises %s but builds no binary of ours", p.Line, name, m[1])
				} else if !served(t, s.Build.Target)[m[1]] {
					t.Errorf("docker-compose.yml:%d: service %s promises %s, which cmd/%s does not serve", p.Line, name, m[1], s.Build.Target)
				}
			}
		}
	}
	if checked < 4 {
		t.Fatalf("only %d endpoints found in docker-compose.yml's port comments", checked)
	}

	// docs/configuration.md: the SBCLAIM_HTTP_ADDR row of each binary's table.
	for binary, row := range map[string]string{"processor": "| `SBCLAIM_HTTP_ADDR` | `:8080` |", "reconciler": "| `SBCLAIM_HTTP_ADDR` | `:8081` |"} {
		var found bool
		for _, line := range strings.Split(read(t, "../docs/configuration.md"), "\n") {
			if !strings.HasPrefix(line, row) {
				continue
			}
			found = true
			for _, m := range endpoint.FindAllStringSubmatch(line, -1) {
				if !served(t, binary)[m[1]] {
					t.Errorf("docs/configuration.md's %s row promises %s, which cmd/%s does not serve", row, m[1], binary)
				}
			}
		}
		if !found {
			t.Errorf("docs/configuration.md has no row starting %s", row)
		}
	}
}

// mapValue is the value of key in a YAML mapping node (nil: none).
func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}
