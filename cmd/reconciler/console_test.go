package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/console"
	"github.com/sbclaim/sbclaim/internal/testkit/testissuer"
)

// watchWriter is a log that tells when the console and the probes' port
// serve, and where.
type watchWriter struct {
	syncBuffer
	once sync.Once
	addr chan [2]string
}

var (
	servingLine = regexp.MustCompile(`msg="serving the operator console" addr=(\S+)`)
	healthLine  = regexp.MustCompile(`msg="serving /healthz, /readyz and /metrics" addr=(\S+)`)
)

func (w *watchWriter) Write(p []byte) (int, error) {
	n, err := w.syncBuffer.Write(p)
	log := []byte(w.String())
	if m, h := servingLine.FindSubmatch(log), healthLine.FindSubmatch(log); m != nil && h != nil {
		w.once.Do(func() { w.addr <- [2]string{string(m[1]), string(h[1])} })
	}
	return n, err
}

// startCommand runs a command until the returned stop is called; it waits
// for the "serving" log lines of the console and of /healthz and
// /metrics, and returns their addresses.
func startCommand(t *testing.T, c *cli, args ...string) (addr, health string, stop func() result) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	log := &watchWriter{addr: make(chan [2]string, 1)}
	var stdout syncBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, func(k string) string { return c.env[k] }, &stdout, log) }()
	select {
	case a := <-log.addr:
		addr, health = a[0], a[1]
	case code := <-done:
		cancel()
		t.Fatalf("reconciler %s exited %d before serving:\n%s", strings.Join(args, " "), code, log.String())
	case <-time.After(time.Minute):
		cancel()
		t.Fatalf("reconciler %s logged no serving lines in a minute:\n%s", strings.Join(args, " "), log.String())
	}
	return addr, health, func() result {
		cancel()
		code := <-done
		return result{code: code, stdout: stdout.String(), stderr: log.String()}
	}
}

func TestConsoleRefusesBadSettings(t *testing.T) {
	url := "sqlite:" + filepath.Join(t.TempDir(), "claims.db")
	for _, tc := range []struct{ env, value, want string }{
		{"SBCLAIM_CONSOLE_ADDR", "8082", "not host:port"},
		{"SBCLAIM_CONSOLE_ADDR", "localhost", "not host:port"},
		{"SBCLAIM_CONSOLE_ADDR", ":99999", "not a number from 0 to 65535"},
		{"SBCLAIM_CONSOLE_ADDR", ":http", "not a number"},
		{"SBCLAIM_CONSOLE_ADDR", "bad host:8082", "neither an IP address nor a host name"},
		{"SBCLAIM_CONSOLE_LOCAL_OPERATOR", "dev\x1b[2J", "control"},
		{"SBCLAIM_CONSOLE_LOCAL_OPERATOR", strings.Repeat("x", 151), "at most 150"},
		{"SBCLAIM_RUN_CONSOLE", "maybe", "want true or false"},
	} {
		cmds := []string{"console", "run"}
		if tc.env == "SBCLAIM_RUN_CONSOLE" {
			cmds = []string{"run"} // console does not read it
		}
		for _, cmd := range cmds {
			c := newCLI(t, map[string]string{"SBCLAIM_DATABASE_URL": url, tc.env: tc.value})
			r := c.run(cmd)
			if r.code != exitUsage {
				t.Errorf("%s with %s=%q exited %d, want %d", cmd, tc.env, tc.value, r.code, exitUsage)
			}
			if !strings.Contains(r.stderr, tc.env+"=") || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("%s with %s=%q: the error does not name the variable and say %q:\n%s", cmd, tc.env, tc.value, tc.want, r.stderr)
			}
		}
	}
}

// A console whose address is taken exits non-zero before serving, alone
// or inside run.
func TestConsoleThatCannotBindExits(t *testing.T) {
	url := "sqlite:" + filepath.Join(t.TempDir(), "claims.db")
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	c := newCLI(t, map[string]string{"SBCLAIM_DATABASE_URL": url, "SBCLAIM_CONSOLE_ADDR": taken.Addr().String(),
		"SBCLAIM_RUN_CONSOLE": "true", "SBCLAIM_HTTP_ADDR": freeAddr(t), "SBCLAIM_CONSOLE_LOCAL_OPERATOR": "dev"})
	c.mustRun("migrate")
	for _, cmd := range []string{"console", "run"} {
		r := c.run(cmd)
		if r.code != exitFailure || !strings.Contains(r.stderr, "listen on SBCLAIM_CONSOLE_ADDR "+taken.Addr().String()) {
			t.Errorf("%s on a taken address exited %d:\n%s", cmd, r.code, r.stderr)
		}
		if strings.Contains(r.stderr, "serving") {
			t.Errorf("%s served something:\n%s", cmd, r.stderr)
		}
	}
}

// reconciler console serves the console until its context ends, and
// /healthz and /metrics on SBCLAIM_HTTP_ADDR (the probes' port): the
// console's own port has no health check. In local development mode it
// says so at start-up and on every page, and answers only loopback hosts.
func TestConsoleServes(t *testing.T) {
	url := "sqlite:" + filepath.Join(t.TempDir(), "claims.db")
	c := newCLI(t, map[string]string{"SBCLAIM_DATABASE_URL": url, "SBCLAIM_CONSOLE_ADDR": "127.0.0.1:0", "SBCLAIM_HTTP_ADDR": "127.0.0.1:0",
		"SBCLAIM_CONSOLE_LOCAL_OPERATOR": "dev"})
	c.mustRun("migrate")
	st := openStore(t, url)
	cl := claimMessage(t, st, "console-1", "payment", []byte(`{"amount":1}`), true)

	addr, health, stop := startCommand(t, c, "console")
	if body, code := httpGet("http://" + health + "/healthz"); code != 200 || !strings.Contains(body, "ok") {
		t.Errorf("/healthz = %d %q", code, body)
	}
	if body, code := httpGet("http://" + health + "/metrics"); code != 200 || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics = %d", code)
	}
	if body, code := httpGet("http://" + health + "/claims"); code != 404 || strings.Contains(body, "console-1") {
		t.Errorf("the probes' port serves the console: GET /claims = %d", code)
	}
	body, code := httpGet("http://" + addr + "/claims")
	if code != 200 || !strings.Contains(body, "Local development, not signed in") || !strings.Contains(body, "console-1") {
		t.Errorf("GET /claims = %d:\n%s", code, body)
	}
	if _, code := httpGet("http://" + addr + "/claims/" + strconv.FormatInt(cl.ID, 10)); code != 200 {
		t.Errorf("GET the claim = %d", code)
	}
	if body, code := httpGet("http://" + addr + "/healthz"); code == 200 && strings.Contains(body, "ok") {
		t.Error("the console's port still answers /healthz")
	}
	req, _ := http.NewRequest("GET", "http://"+addr+"/claims", nil)
	req.Host = "rebind.evil.example:8082"
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("a non-loopback Host in local development mode: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	r := stop()
	if r.code != exitOK {
		t.Fatalf("console exited %d:\n%s", r.code, r.stderr)
	}
	for _, want := range []string{"LOCAL DEVELOPMENT MODE", "only requests addressed to localhost", "SBCLAIM_ROUTES is not set: redrive is off", "console stopped"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("console log lacks %q:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "listens on every interface") {
		t.Error("a console on 127.0.0.1 warns that it listens on every interface")
	}
	if strings.Contains(r.stderr, url) && strings.Contains(url, "@") {
		t.Error("the log shows the database URL")
	}
}

// reconciler run serves the console too when SBCLAIM_RUN_CONSOLE is true,
// verifying operators' tokens against SBCLAIM_CONSOLE_OIDC_ISSUER (a test
// issuer with its own key): forged identity headers get 401, a token of
// a user outside SBCLAIM_CONSOLE_ALLOWED_GROUPS 403, the issuer's token
// for the audience and an allowed group gets the page.
func TestRunServesTheConsole(t *testing.T) {
	url := "sqlite:" + filepath.Join(t.TempDir(), "claims.db")
	iss := testissuer.New(t)
	const operators = "0b5e7a1c-0000-4000-8000-0000000000a1"
	c := newCLI(t, map[string]string{"SBCLAIM_DATABASE_URL": url, "SBCLAIM_CONSOLE_ADDR": "127.0.0.1:0", "SBCLAIM_RUN_CONSOLE": "true",
		"SBCLAIM_HTTP_ADDR": "127.0.0.1:0", "SBCLAIM_RECONCILE_SCHEDULE": "@every 1h",
		"SBCLAIM_CONSOLE_OIDC_ISSUER": iss.URL, "SBCLAIM_CONSOLE_OIDC_AUDIENCE": testissuer.Audience,
		"SBCLAIM_CONSOLE_ALLOWED_GROUPS": operators})
	c.mustRun("migrate")
	addr, _, stop := startCommand(t, c, "run")
	get := func(h http.Header) (int, string) {
		req, _ := http.NewRequest("GET", "http://"+addr+"/", nil)
		req.Header = h
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get(http.Header{console.HeaderPrincipalName: {"mallory@evil.example"}, console.HeaderPrincipalID: {"forged"}}); code != 401 {
		t.Errorf("GET / with forged headers = %d, want 401", code)
	}
	if code, _ := get(http.Header{console.HeaderIDToken: {iss.Token("alice@contoso.example", "a11ce", testissuer.Claims{"aud": "other"})}}); code != 401 {
		t.Errorf("GET / with another audience's token = %d, want 401", code)
	}
	if code, _ := get(http.Header{console.HeaderIDToken: {iss.Token("eve@contoso.example", "e7e", nil)}}); code != 403 {
		t.Errorf("GET / with the token of a user in no allowed group = %d, want 403", code)
	}
	code, body := get(http.Header{console.HeaderIDToken: {iss.Token("alice@contoso.example", "a11ce", testissuer.Claims{"groups": []string{operators}})}})
	if code != 200 || !strings.Contains(body, `id="who">alice@contoso.example<`) {
		t.Errorf("GET / with the issuer's token = %d:\n%s", code, body)
	}
	r := stop()
	if r.code != exitOK || !strings.Contains(r.stderr, "console stopped") || !strings.Contains(r.stderr, "identity headers alone are refused") {
		t.Errorf("run exited %d:\n%s", r.code, r.stderr)
	}
}

// The console refuses to start without a way to verify its operators, with
// two ways, or with half of one, naming the variable.
func TestConsoleIdentitySettings(t *testing.T) {
	url := "sqlite:" + filepath.Join(t.TempDir(), "claims.db")
	const issuer = "https://login.microsoftonline.com/00000000-0000-0000-0000-000000000001/v2.0"
	for _, tc := range []struct {
		env        map[string]string
		field, say string
	}{
		{nil, "SBCLAIM_CONSOLE_OIDC_ISSUER:", "needs a way to verify who its operators are"},
		{map[string]string{"SBCLAIM_CONSOLE_OIDC_ISSUER": issuer}, "SBCLAIM_CONSOLE_OIDC_AUDIENCE:", "required with SBCLAIM_CONSOLE_OIDC_ISSUER=" + strconv.Quote(issuer)},
		{map[string]string{"SBCLAIM_CONSOLE_OIDC_AUDIENCE": "app"}, "SBCLAIM_CONSOLE_OIDC_ISSUER:", `required with SBCLAIM_CONSOLE_OIDC_AUDIENCE="app"`},
		{map[string]string{"SBCLAIM_CONSOLE_OIDC_ISSUER": issuer, "SBCLAIM_CONSOLE_OIDC_AUDIENCE": "app", "SBCLAIM_CONSOLE_LOCAL_OPERATOR": "dev"},
			`SBCLAIM_CONSOLE_LOCAL_OPERATOR="dev"`, "one way only, and SBCLAIM_CONSOLE_OIDC_ISSUER is set too"},
		{map[string]string{"SBCLAIM_CONSOLE_INSECURE_TRUST_IDENTITY_HEADERS": "true", "SBCLAIM_CONSOLE_LOCAL_OPERATOR": "dev"},
			`SBCLAIM_CONSOLE_LOCAL_OPERATOR="dev"`, "one way only"},
		{map[string]string{"SBCLAIM_CONSOLE_OIDC_ISSUER": "http://login.example/tenant", "SBCLAIM_CONSOLE_OIDC_AUDIENCE": "app"},
			`SBCLAIM_CONSOLE_OIDC_ISSUER="http://login.example/tenant"`, "must be https"},
		{map[string]string{"SBCLAIM_CONSOLE_OIDC_ISSUER": "login.microsoftonline.com", "SBCLAIM_CONSOLE_OIDC_AUDIENCE": "app"},
			`SBCLAIM_CONSOLE_OIDC_ISSUER="login.microsoftonline.com"`, "not an absolute URL"},
		{map[string]string{"SBCLAIM_CONSOLE_OIDC_ISSUER": issuer + "?x=1", "SBCLAIM_CONSOLE_OIDC_AUDIENCE": "app"},
			"SBCLAIM_CONSOLE_OIDC_ISSUER=", "no query or fragment"},
		{map[string]string{"SBCLAIM_CONSOLE_OIDC_ISSUER": issuer, "SBCLAIM_CONSOLE_OIDC_AUDIENCE": "app", "SBCLAIM_CONSOLE_ALLOWED_GROUPS": "operators"},
			`SBCLAIM_CONSOLE_ALLOWED_GROUPS="operators"`, "not an object id"},
		{map[string]string{"SBCLAIM_CONSOLE_LOCAL_OPERATOR": "dev", "SBCLAIM_CONSOLE_ALLOWED_PRINCIPALS": "0b5e7a1c-0000-4000-8000-0000000000a1"},
			`SBCLAIM_CONSOLE_ALLOWED_PRINCIPALS="0b5e7a1c-0000-4000-8000-0000000000a1"`, "only with SBCLAIM_CONSOLE_OIDC_ISSUER"},
		{map[string]string{"SBCLAIM_CONSOLE_INSECURE_TRUST_IDENTITY_HEADERS": "yes please"},
			`SBCLAIM_CONSOLE_INSECURE_TRUST_IDENTITY_HEADERS="yes please"`, "want true or false"},
	} {
		env := map[string]string{"SBCLAIM_DATABASE_URL": url, "SBCLAIM_CONSOLE_ADDR": "127.0.0.1:0", "SBCLAIM_HTTP_ADDR": "127.0.0.1:0"}
		for k, v := range tc.env {
			env[k] = v
		}
		for _, args := range [][]string{{"console"}, {"run"}} {
			if args[0] == "run" {
				env["SBCLAIM_RUN_CONSOLE"] = "true"
			}
			r := newCLI(t, env).run(args...)
			if r.code != exitUsage || !strings.Contains(r.stderr, tc.field) || !strings.Contains(r.stderr, tc.say) {
				t.Errorf("%s with %v exited %d; want %d naming %s and saying %q:\n%s", args[0], tc.env, r.code, exitUsage, tc.field, tc.say, r.stderr)
			}
		}
	}
}

func TestConsoleHelp(t *testing.T) {
	c := newCLI(t, nil)
	r := c.run("-h")
	if !strings.Contains(r.stderr, "console ") || !strings.Contains(r.stderr, "SBCLAIM_CONSOLE_ADDR") || !strings.Contains(r.stderr, ":8082") {
		t.Errorf("-h does not list the console:\n%s", r.stderr)
	}
	r = c.run("console", "-h")
	for _, want := range []string{"SBCLAIM_CONSOLE_ADDR", "SBCLAIM_HTTP_ADDR", "SBCLAIM_CONSOLE_OIDC_ISSUER", "SBCLAIM_CONSOLE_OIDC_AUDIENCE",
		"SBCLAIM_CONSOLE_ALLOWED_GROUPS", "SBCLAIM_CONSOLE_ALLOWED_PRINCIPALS",
		"SBCLAIM_CONSOLE_INSECURE_TRUST_IDENTITY_HEADERS", "SBCLAIM_CONSOLE_LOCAL_OPERATOR", "SBCLAIM_ROUTES", "SBCLAIM_DATABASE_URL"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("console -h lacks %s", want)
		}
	}
	if strings.Contains(r.stderr, "SBCLAIM_RETENTION") {
		t.Error("console -h lists a setting it does not read")
	}
	if r.code != exitOK {
		t.Errorf("console -h exited %d", r.code)
	}
}
