package emulator

import (
	"slices"
	"strings"
	"testing"

	"github.com/sbclaim/sbclaim/internal/console"
)

// The operator console runs on the laptop in local-development mode,
// published on the loopback only (it answers only loopback Host headers
// too), with /healthz and /metrics on a port of their own, and can redrive the claims of every
// consumer with the routes that consumer's processor uses.
func TestComposeConsole(t *testing.T) {
	t.Parallel()
	compose := loadCompose(t)
	c, ok := compose.Services["console"]
	if !ok {
		t.Fatal("no console service")
	}
	env := c.Environment
	if !slices.Equal(c.Command, []string{"console"}) {
		t.Errorf("console command = %v, want [console]", c.Command)
	}
	if !slices.Equal(c.Ports, []string{"127.0.0.1:8082:8082"}) || env["SBCLAIM_CONSOLE_ADDR"] != ":8082" {
		t.Errorf("console publishes %v and listens on %q; want 127.0.0.1:8082:8082 and :8082", c.Ports, env["SBCLAIM_CONSOLE_ADDR"])
	}
	op := env["SBCLAIM_CONSOLE_LOCAL_OPERATOR"]
	if op == "" {
		t.Error("the compose console has no SBCLAIM_CONSOLE_LOCAL_OPERATOR: with no sign-in on the laptop it would refuse to start")
	} else if err := console.ValidOperatorName(op); err != nil {
		t.Errorf("SBCLAIM_CONSOLE_LOCAL_OPERATOR=%q: %v", op, err)
	}
	if _, ok := env["SBCLAIM_CONSOLE_INSECURE_TRUST_IDENTITY_HEADERS"]; ok {
		t.Error("the compose console trusts identity headers")
	}
	if env["SBCLAIM_HTTP_ADDR"] == "" || env["SBCLAIM_HTTP_ADDR"] == env["SBCLAIM_CONSOLE_ADDR"] {
		t.Errorf("the compose console's /healthz and /metrics must have their own port, have SBCLAIM_HTTP_ADDR=%q", env["SBCLAIM_HTTP_ADDR"])
	}
	if c.DependsOn["migrate"].Condition != "service_completed_successfully" {
		t.Error("the console must wait for migrate to complete")
	}
	if env["SBCLAIM_DATABASE_URL"] != compose.Services["reconciler"].Environment["SBCLAIM_DATABASE_URL"] {
		t.Error("the console and the reconciler use different databases")
	}

	// SBCLAIM_ROUTES: consumer=path pairs, each the file that consumer's
	// processors mount.
	pairs := map[string]string{}
	for part := range strings.SplitSeq(env["SBCLAIM_ROUTES"], ",") {
		consumer, path, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			t.Fatalf("console SBCLAIM_ROUTES=%q is not consumer=path pairs", env["SBCLAIM_ROUTES"])
		}
		pairs[consumer] = path
	}
	for name, svc := range compose.Services {
		consumer := svc.Environment["SBCLAIM_CONSUMER"]
		if consumer == "" {
			continue
		}
		want, ok := svc.hostFile(svc.Environment["SBCLAIM_ROUTES"])
		if !ok {
			continue // TestComposeRoutes reports it
		}
		path, ok := pairs[consumer]
		if !ok {
			t.Errorf("the console has no routes for consumer %q (service %s): its claims could not be redriven", consumer, name)
			continue
		}
		if got, ok := c.hostFile(path); !ok || got != want {
			t.Errorf("the console's routes for consumer %q are %q (mounted from %q), the processor %s uses %q", consumer, path, got, name, want)
		}
	}
}
