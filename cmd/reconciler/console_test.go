package main

import (
	"context"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// watchWriter is a log that tells when the console serves, and where.
type watchWriter struct {
	syncBuffer
	once sync.Once
	addr chan string
}

var servingLine = regexp.MustCompile(`msg="serving the operator console" addr=(\S+)`)

func (w *watchWriter) Write(p []byte) (int, error) {
	n, err := w.syncBuffer.Write(p)
	if m := servingLine.FindSubmatch([]byte(w.String())); m != nil {
		w.once.Do(func() { w.addr <- string(m[1]) })
	}
	return n, err
}

// startCommand runs a command until the returned stop is called; it waits
// for the console's "serving" log line and returns its address.
func startCommand(t *testing.T, c *cli, args ...string) (addr string, stop func() result) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	log := &watchWriter{addr: make(chan string, 1)}
	var stdout syncBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, func(k string) string { return c.env[k] }, &stdout, log) }()
	select {
	case addr = <-log.addr:
	case code := <-done:
		cancel()
		t.Fatalf("reconciler %s exited %d before serving:\n%s", strings.Join(args, " "), code, log.String())
	}
	return addr, func() result {
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
		"SBCLAIM_RUN_CONSOLE": "true", "SBCLAIM_HTTP_ADDR": freeAddr(t)})
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

// reconciler console serves the console until its context ends; in local
// development mode it says so at start-up and on every page.
func TestConsoleServes(t *testing.T) {
	url := "sqlite:" + filepath.Join(t.TempDir(), "claims.db")
	c := newCLI(t, map[string]string{"SBCLAIM_DATABASE_URL": url, "SBCLAIM_CONSOLE_ADDR": "127.0.0.1:0", "SBCLAIM_CONSOLE_LOCAL_OPERATOR": "dev"})
	c.mustRun("migrate")
	st := openStore(t, url)
	cl := claimMessage(t, st, "console-1", "payment", []byte(`{"amount":1}`), true)

	addr, stop := startCommand(t, c, "console")
	if body, code := httpGet("http://" + addr + "/healthz"); code != 200 || !strings.Contains(body, "ok") {
		t.Errorf("/healthz = %d %q", code, body)
	}
	body, code := httpGet("http://" + addr + "/claims")
	if code != 200 || !strings.Contains(body, "Local development, not signed in") || !strings.Contains(body, "console-1") {
		t.Errorf("GET /claims = %d:\n%s", code, body)
	}
	if _, code := httpGet("http://" + addr + "/claims/" + strconv.FormatInt(cl.ID, 10)); code != 200 {
		t.Errorf("GET the claim = %d", code)
	}
	r := stop()
	if r.code != exitOK {
		t.Fatalf("console exited %d:\n%s", r.code, r.stderr)
	}
	for _, want := range []string{"LOCAL DEVELOPMENT MODE", "SBCLAIM_ROUTES is not set: redrive is off", "console stopped"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("console log lacks %q:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, url) && strings.Contains(url, "@") {
		t.Error("the log shows the database URL")
	}
}

// reconciler run serves the console too when SBCLAIM_RUN_CONSOLE is true,
// read-only without a sign-in.
func TestRunServesTheConsole(t *testing.T) {
	url := "sqlite:" + filepath.Join(t.TempDir(), "claims.db")
	c := newCLI(t, map[string]string{"SBCLAIM_DATABASE_URL": url, "SBCLAIM_CONSOLE_ADDR": "127.0.0.1:0", "SBCLAIM_RUN_CONSOLE": "true",
		"SBCLAIM_HTTP_ADDR": "127.0.0.1:0", "SBCLAIM_RECONCILE_SCHEDULE": "@every 1h"})
	c.mustRun("migrate")
	addr, stop := startCommand(t, c, "run")
	body, code := httpGet("http://" + addr + "/")
	if code != 200 || !strings.Contains(body, "Read-only") {
		t.Errorf("GET / = %d:\n%s", code, body)
	}
	r := stop()
	if r.code != exitOK || !strings.Contains(r.stderr, "console stopped") || !strings.Contains(r.stderr, "read-only") {
		t.Errorf("run exited %d:\n%s", r.code, r.stderr)
	}
}

func TestConsoleHelp(t *testing.T) {
	c := newCLI(t, nil)
	r := c.run("-h")
	if !strings.Contains(r.stderr, "console ") || !strings.Contains(r.stderr, "SBCLAIM_CONSOLE_ADDR") || !strings.Contains(r.stderr, ":8082") {
		t.Errorf("-h does not list the console:\n%s", r.stderr)
	}
	r = c.run("console", "-h")
	for _, want := range []string{"SBCLAIM_CONSOLE_ADDR", "SBCLAIM_CONSOLE_LOCAL_OPERATOR", "SBCLAIM_ROUTES", "SBCLAIM_DATABASE_URL"} {
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
