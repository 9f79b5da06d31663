package deploy

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestDockerfile checks the image properties that cannot be built here (no
// Docker engine): static binaries, a non-root distroless base, a target per
// binary with its entrypoint, and no HEALTHCHECK (Container Apps probes the
// HTTP endpoints instead).
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var instr []string // instructions, continuation lines joined, comments dropped
	cur := ""
	for _, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || trimmed == "" && cur == "" {
			continue
		}
		cur += " " + strings.TrimSuffix(trimmed, "\\")
		if !strings.HasSuffix(trimmed, "\\") {
			instr = append(instr, strings.TrimSpace(cur))
			cur = ""
		}
	}
	has := func(re string) bool {
		r := regexp.MustCompile(re)
		for _, in := range instr {
			if r.MatchString(in) {
				return true
			}
		}
		return false
	}
	for _, want := range []string{
		`^RUN .*CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ \./cmd/\.\.\.`,
		`^FROM gcr\.io/distroless/static-debian12:nonroot AS base$`,
		`^USER 65532:65532$`,
	} {
		if !has(want) {
			t.Errorf("Dockerfile has no instruction matching %s", want)
		}
	}
	for _, bin := range []string{"processor", "reconciler", "demoapi", "demosender"} {
		if !has(`^FROM base AS ` + bin + `$`) {
			t.Errorf("no %s target built on the non-root base", bin)
		}
		if !has(`^ENTRYPOINT \["/usr/local/bin/` + bin + `"\]$`) {
			t.Errorf("no %s entrypoint", bin)
		}
	}
	if has(`^HEALTHCHECK`) {
		t.Errorf("HEALTHCHECK found: Container Apps ignores it and distroless cannot run it")
	}
	if has(`^USER (root|0)\b`) {
		t.Errorf("an image runs as root")
	}
}
